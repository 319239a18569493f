"""A real S3-compatible server for the tests: moto's server mode on 127.0.0.1, in its own process.

sortpack talks HTTP to it through pyarrow's S3 filesystem, as it would to S3 or MinIO. An IAM
user with full S3 access is made first; ``checking_credentials`` switches moto's
authentication on, so a wrong key is refused as a real store refuses it.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REGION = "us-east-1"
BAD_KEY = {"AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG0", "AWS_SECRET_ACCESS_KEY": "not-the-secret"}


class S3Server:
    """A moto S3 server process: its endpoint, the credentials it accepts and the env that reaches it."""

    def __init__(self, proc: subprocess.Popen, endpoint: str, key: str, secret: str, log: Path):
        self.proc, self.endpoint, self.key, self.secret, self.log = proc, endpoint, key, secret, log

    def log_mark(self) -> int:
        """Return where the server's request log ends now (for ``requests_since``)."""
        return self.log.stat().st_size

    def requests_since(self, mark: int) -> list[tuple[str, str]]:
        """Return (method, path and query) of every request the server logged after ``mark``."""
        time.sleep(0.3)  # the server writes its line after the response
        with open(self.log, "rb") as f:
            f.seek(mark)
            text = f.read().decode(errors="replace")
        return re.findall(r'"([A-Z]+) (\S+) HTTP/[0-9.]+"', text)

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
    # the server logs one line per request (werkzeug's): tests count the requests sortpack makes
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
                pytest.fail("moto server did not start")
            time.sleep(0.2)
    iam = boto3.client("iam", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="bootstrap",
                       aws_secret_access_key="bootstrap")
    iam.create_user(UserName="sortpack")
    iam.put_user_policy(UserName="sortpack", PolicyName="s3", PolicyDocument=json.dumps(
        {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="sortpack")["AccessKey"]
    return S3Server(proc, endpoint, key["AccessKeyId"], key["SecretAccessKey"], log)


def stop_server(server: S3Server) -> None:
    """End the server process."""
    server.proc.terminate()
    try:
        server.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
    server.log.unlink(missing_ok=True)
