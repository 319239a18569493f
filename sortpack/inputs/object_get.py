"""One signed GET of a small S3 object: its bytes, size, ETag and Last-Modified in one request.

pyarrow's S3 filesystem opens every object with a HEAD before it reads (its Python API takes
a path, never the listing's size), so a small object costs two requests there. Where the
listing already gave the size, ``get_small`` asks for the whole object with one ranged GET
of at most ``limit`` bytes; the response's headers carry what the HEAD would have said
(``Content-Range``'s total size, ``ETag``, ``Last-Modified``).

It is taken only where its answer is the same as pyarrow's: static keys in the environment
(``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, optionally ``AWS_SESSION_TOKEN``: the first
source of the AWS chain pyarrow follows too), the same endpoint (``AWS_ENDPOINT_URL_S3`` or
``AWS_ENDPOINT_URL``, else AWS's own) and region. Anything else (profiles, instance roles,
GCS) is pyarrow's, as is every GET that does not answer 200/206 with the whole object: the
caller then reads through pyarrow, which reports a failure with its own message. A refused
signature, a redirect or a connection that fails twice turns this path off for the process,
so a misconfiguration costs one request, not one per object.

Requests are AWS Signature Version 4 (stdlib ``hmac``/``hashlib``), over one kept-alive
``http.client`` connection per thread.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import http.client
import os
import re
import threading
import time
from typing import NamedTuple
from urllib.parse import quote

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")  # virtual-hosted style needs one DNS label
_RANGE_TOTAL = re.compile(r"/(\d+)\s*$")


class Setup(NamedTuple):
    """Where and as whom a signed GET goes: the endpoint, the region and the static keys."""

    scheme: str  # "http" or "https"
    host: str  # host[:port] of an endpoint override, "" for AWS's own endpoints
    region: str
    key: str
    secret: str
    token: str | None

    def __repr__(self) -> str:
        return f"Setup({self.scheme}://{self.host or 'aws'}, {self.region}, key {self.key})"  # never the secret


class Got(NamedTuple):
    """What one GET of a whole object returned: its bytes and the headers a HEAD would have given."""

    body: bytes
    size: int
    etag: str | None
    last_modified: str | None


def setup_from_env(region: str) -> Setup | None:
    """Return the signed-GET setup of this process's environment, or None where pyarrow must do the request.

    ``region`` is the region pyarrow's filesystem signs for (``S3FileSystem.region``).
    """
    key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    scheme, host = "https", ""
    if endpoint:
        scheme, _, rest = endpoint.partition("://") if "://" in endpoint else ("https", "", endpoint)
        if scheme not in ("http", "https") or "/" in rest.rstrip("/") or not rest:
            return None  # an endpoint with a path: leave it to pyarrow
        host = rest.rstrip("/")
    return Setup(scheme, host, region, key, secret, os.environ.get("AWS_SESSION_TOKEN") or None)


def _target(setup: Setup, bucket: str, key: str) -> tuple[str, str]:
    """Return the Host and the path of an object's request (path style on an override, as pyarrow)."""
    path_key = "/" + quote(key, safe="/~")
    if setup.host:
        return setup.host, "/" + quote(bucket, safe="~") + path_key
    if _DNS_BUCKET.match(bucket) and "." not in bucket:
        return f"{bucket}.s3.{setup.region}.amazonaws.com", path_key
    return f"s3.{setup.region}.amazonaws.com", "/" + quote(bucket, safe="~") + path_key


@functools.lru_cache(maxsize=8)
def _signing_key(secret: str, day: str, region: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


def signed_headers(setup: Setup, host: str, path: str, headers: dict[str, str], amz_date: str) -> dict[str, str]:
    """Return ``headers`` with Host, the x-amz headers and the SigV4 ``Authorization`` of a GET of ``path``."""
    out = {**headers, "host": host, "x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": amz_date}
    if setup.token:
        out["x-amz-security-token"] = setup.token
    names = sorted(k.lower() for k in out)
    low = {k.lower(): " ".join(str(v).split()) for k, v in out.items()}
    signed = ";".join(names)
    canonical = "\n".join(["GET", path, "", *(f"{n}:{low[n]}" for n in names), "", signed, EMPTY_SHA256])
    day = amz_date[:8]
    scope = f"{day}/{setup.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    sig = hmac.new(_signing_key(setup.secret, day, setup.region), to_sign.encode(), hashlib.sha256).hexdigest()
    out["Authorization"] = f"AWS4-HMAC-SHA256 Credential={setup.key}/{scope}, SignedHeaders={signed}, Signature={sig}"
    return out


_off: set[Setup] = set()  # setups whose requests were refused or could not connect: pyarrow's from then on
_local = threading.local()  # one kept-alive connection per thread and endpoint


def _connection(scheme: str, host: str, timeout: float) -> http.client.HTTPConnection:
    conns = _local.__dict__.setdefault("conns", {})
    conn = conns.get((scheme, host))
    if conn is None:
        if scheme == "https":
            import ssl

            ctx = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
            conn = http.client.HTTPSConnection(host, timeout=timeout, context=ctx)
        else:
            conn = http.client.HTTPConnection(host, timeout=timeout)
        conns[(scheme, host)] = conn
    return conn


def _drop(scheme: str, host: str) -> None:
    conn = _local.__dict__.get("conns", {}).pop((scheme, host), None)
    if conn is not None:
        conn.close()


def get_small(setup: Setup, bucket: str, key: str, limit: int, timeout: float) -> Got | None:
    """Return the whole object ``bucket/key`` from one GET of at most ``limit`` bytes, or None (pyarrow's turn).

    None: this setup is off, the object is larger than ``limit``, the store answered anything
    but the object (missing, refused: pyarrow's request then says why), or the connection failed.
    """
    if setup in _off:
        return None
    host, path = _target(setup, bucket, key)
    for attempt in (0, 1):  # a kept-alive connection the server closed fails once: a fresh one retries
        conn = _connection(setup.scheme, host, timeout)
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers = signed_headers(setup, host, path, {"Range": f"bytes=0-{limit - 1}"}, amz_date)
        try:
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            if int(resp.getheader("Content-Length") or 0) > limit:  # a server that ignored the Range
                _drop(setup.scheme, host)
                return None
            body = resp.read()
        except (OSError, ValueError, http.client.HTTPException):
            _drop(setup.scheme, host)
            if attempt:
                _off.add(setup)
                return None
            continue
        if resp.status in (301, 307, 400, 401, 403):  # another region, a refused key or signature
            _off.add(setup)
            return None
        if resp.status not in (200, 206):
            return None
        size = len(body)
        if resp.status == 206:
            m = _RANGE_TOTAL.search(resp.getheader("Content-Range") or "")
            if m is None:
                return None
            size = int(m.group(1))
        if size != len(body):
            return None  # larger than limit: read by ranged GETs as a large object
        return Got(body, size, resp.getheader("ETag"), resp.getheader("Last-Modified"))
    return None
