"""A real S3-compatible server for the tests: moto's server mode on 127.0.0.1, in its own process.

sortpack talks HTTP to it through pyarrow's S3 filesystem, as it would to S3 or MinIO. An IAM
user with full S3 access is made first; ``checking_credentials`` switches moto's
authentication on, so a wrong key is refused as a real store refuses it.

Every request reaches moto through ``CountingProxy``, a small HTTP forwarder of ours that
records each request's method and path as it arrives: the tests count requests from that
record, never from what moto or Werkzeug print (whose log lines change between releases:
Werkzeug 3.1.9 colours those of non-200 responses where colorama is not installed).
"""
from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

REGION = "us-east-1"
BAD_KEY = {"AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG0", "AWS_SECRET_ACCESS_KEY": "not-the-secret"}


# hop-by-hop headers (RFC 9110 7.6.1) and the body's framing: the proxy frames each body itself
_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
                  "expect", "content-length"))


class _Forward(BaseHTTPRequestHandler):
    """One client connection to the proxy: each request recorded, then sent on to moto and its answer back."""

    protocol_version = "HTTP/1.1"  # keep-alive, as the AWS SDK's connections expect
    server: CountingProxy

    def log_message(self, format, *args) -> None:  # noqa: A002 (the base class's name)
        """Print nothing: the record is ``CountingProxy.requests``."""

    def _body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(parts)
        length = self.headers.get("Content-Length")
        return self.rfile.read(int(length)) if length is not None else None

    def _forward(self) -> None:
        self.server.record(self.command, self.path)
        body = self._body()
        upstream = http.client.HTTPConnection(*self.server.upstream, timeout=120)
        try:
            upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for name, value in self.headers.items():  # Host among them: the signature covers it
                if name.lower() not in _HOP:
                    upstream.putheader(name, value)
            if body is not None:
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            answer = upstream.getresponse()
            data = answer.read()
            self.send_response_only(answer.status, answer.reason)
            for name, value in answer.getheaders():
                if name.lower() not in _HOP:
                    self.send_header(name, value)
            if self.command != "HEAD":
                self.send_header("Content-Length", str(len(data)))
            elif answer.getheader("Content-Length") is not None:  # a HEAD tells the object's size
                self.send_header("Content-Length", answer.getheader("Content-Length"))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:
            self.send_error(502)
        finally:
            upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = do_PATCH = do_OPTIONS = _forward


class CountingProxy(ThreadingHTTPServer):
    """An HTTP forwarder on 127.0.0.1 that records (method, path and query) of every request before sending it on."""

    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]):
        super().__init__(("127.0.0.1", 0), _Forward)
        self.upstream = upstream
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, name="s3-counting-proxy", daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        """Return the proxy's URL."""
        return f"http://127.0.0.1:{self.server_address[1]}"

    def record(self, method: str, path: str) -> None:
        """Add one request to the record."""
        with self._lock:
            self.requests.append((method, path))

    def since(self, mark: int) -> list[tuple[str, str]]:
        """Return the requests recorded after the first ``mark``."""
        with self._lock:
            return list(self.requests[mark:])

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)


class S3Server:
    """A moto S3 server process behind a counting proxy: its endpoint (the proxy's), the credentials it accepts,
    the env that reaches it and the requests it was sent."""

    def __init__(self, proc: subprocess.Popen, proxy: CountingProxy, key: str, secret: str, log: Path):
        self.proc, self.proxy, self.key, self.secret, self.log = proc, proxy, key, secret, log
        self.endpoint = proxy.endpoint

    def log_mark(self) -> int:
        """Return how many requests the server was sent so far (for ``requests_since``)."""
        return len(self.proxy.since(0))

    def requests_since(self, mark: int) -> list[tuple[str, str]]:
        """Return (method, path and query) of every request sent to the server after ``mark``, in arrival order."""
        return self.proxy.since(mark)

    def env(self, **extra: str) -> dict:
        """Return the environment variables a sortpack process needs to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": REGION,
                "AWS_EC2_METADATA_DISABLED": "true", "SORTPACK_OBJECT_TIMEOUT": "5",
                "SORTPACK_OBJECT_RETRIES": "2", **extra}

    @contextlib.contextmanager
    def checking_credentials(self):
        """Within the block, the server refuses requests whose access key it does not know.

        Outside it moto accepts any key: its signature check refuses some requests pyarrow
        signs correctly (ListObjectsV2), so it is switched on only where a test needs a
        refused key, and requests made inside fail at the key, before any signature.
        """
        def set_count(value: bytes) -> None:
            req = urllib.request.Request(f"{self.endpoint}/moto-api/reset-auth", data=value, method="POST",
                                         headers={"Content-Type": "text/plain"})
            urllib.request.urlopen(req, timeout=5).read()

        set_count(b"0")
        try:
            yield
        finally:
            set_count(b"inf")

    def client(self):
        """Return a boto3 S3 client with the accepted credentials."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=self.key,
                            aws_secret_access_key=self.secret)

    def bucket(self, name: str) -> str:
        """Create bucket ``name`` (if new) and return its URL."""
        c = self.client()
        if name not in {b["Name"] for b in c.list_buckets().get("Buckets", [])}:
            c.create_bucket(Bucket=name)
        return f"s3://{name}"

    def upload(self, path: Path, url: str) -> str:
        """Put local file ``path`` at ``url`` (``s3://bucket/key``) and return the URL."""
        bucket, key = url[len("s3://"):].split("/", 1)
        self.client().put_object(Bucket=bucket, Key=key, Body=Path(path).read_bytes())
        return url

    def upload_tree(self, local: Path, url: str) -> list[str]:
        """Put every file below ``local`` at the same relative key below ``url``; return their URLs."""
        return [self.upload(p, f"{url.rstrip('/')}/{p.relative_to(local).as_posix()}")
                for p in sorted(Path(local).rglob("*")) if p.is_file()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> S3Server:
    """Start moto's server on a free port, make a user with S3 access, switch authentication on."""
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # what the server prints, read only to say why it did not start (requests are counted by the proxy)
    log = Path(tempfile.mkstemp(prefix="moto-", suffix=".log")[1])
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=sink, stderr=sink, env={**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"})
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).read()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
    proxy = CountingProxy(("127.0.0.1", port))
    endpoint = proxy.endpoint
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="bootstrap",
                       aws_secret_access_key="bootstrap")
    iam.create_user(UserName="sortpack")
    iam.put_user_policy(UserName="sortpack", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="sortpack")["AccessKey"]
    return S3Server(proc, proxy, key["AccessKeyId"], key["SecretAccessKey"], log)


def stop_server(server: S3Server) -> None:
    """End the proxy and the server process."""
    server.proxy.stop()
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
    server.log.unlink(missing_ok=True)
