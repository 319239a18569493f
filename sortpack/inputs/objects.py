"""Object-store inputs (``s3://``, ``gs://``): the one place sortpack opens pyarrow's S3 and GCS filesystems.

An input named by URL is read through ``pyarrow.fs``: a Parquet row group or an Arrow
record batch is a ranged GET of its bytes (a random-access file over the object), so
each rank fetches only what it reads; a JSONL or CSV object is read whole by the one
rank that parses it, as a local file is.

Credentials and endpoints come from the standard places the AWS and Google SDKs read
(``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE``
and ``~/.aws/credentials``, ``AWS_REGION``/``AWS_DEFAULT_REGION``; for GCS the
application-default credentials); the endpoint of an S3-compatible server from
``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL``, of a GCS emulator from
``STORAGE_EMULATOR_HOST``. None of them is ever written to a
manifest. Timeouts and retries are bounded so that an unreachable endpoint fails in
seconds, not minutes: ``SORTPACK_OBJECT_TIMEOUT`` (seconds per connect and request,
default 30) and ``SORTPACK_OBJECT_RETRIES`` (attempts per request, default 3).

Requests: an object found by a listing carries the listing's size (``Listed``). A
listed S3 object below ``WHOLE_BYTES`` is read whole with one signed GET whose headers give
its ETag (``object_get``: static keys in the environment); any other object is opened with
one HEAD (its size, ETag and Last-Modified) and, when small, read whole with one GET. A small
object is then kept (``_Small``, least recently used first out past ``CACHE_BYTES``), so
describing, hashing and reading it again cost no request: one request per listed small
object, two otherwise, ``prefetch`` fetching many at once from threads. A larger object is
read by ranged GETs of what is asked.

Every failure becomes one ``SortpackError`` line naming the URL and what went wrong.
"""
from __future__ import annotations

import functools
import os
import re
import threading
from collections import OrderedDict
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from ..env import env_int, env_text
from ..errors import SortpackError, one_line

if TYPE_CHECKING:
    import pyarrow.fs as pafs  # imported where a URL is read: a job of local files never loads it (nor TLS)

SCHEMES = ("s3", "gs", "gcs")
WHOLE_BYTES = 1 << 20  # an object this small is read whole in one GET (about one round trip's worth of bytes)
CACHE_BYTES = 64 << 20  # small objects kept per process
PREFETCH_THREADS = 16  # requests in flight while many objects are described
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def url_scheme(path: str) -> str | None:
    """Return the scheme of ``path`` when it is a URL (``s3``, ``gs``...), else None."""
    m = _URL.match(path if isinstance(path, str) else str(path))
    return m.group(1).lower() if m else None


def is_url(path: str) -> bool:
    """Return whether ``path`` names an object in an object store (``s3://`` or ``gs://``)."""
    # asked about every object at every step: a listed one answers without a regex
    return isinstance(path, Listed) or url_scheme(path) in SCHEMES


def check_scheme(path: str) -> None:
    """Raise one line when ``path`` is a URL of a scheme sortpack cannot read."""
    scheme = url_scheme(path)
    if scheme is not None and scheme not in SCHEMES and scheme != "file":
        raise SortpackError(f"{path}: unsupported URL scheme {scheme!r} (inputs are local paths, "
                            "s3:// or gs:// URLs)")


def split_url(url: str) -> tuple[str, str]:
    """Return the scheme and the filesystem path (``bucket/key``) of an object URL."""
    m = _URL.match(url)
    if m is None or m.group(1).lower() not in SCHEMES:
        raise SortpackError(f"{url}: not an s3:// or gs:// URL")
    path = m.group(2).strip("/")
    if not path:
        raise SortpackError(f"{url}: the URL names no bucket")
    return m.group(1).lower(), path


def join_url(scheme: str, path: str) -> str:
    """Return the URL of filesystem path ``path`` (``bucket/key``) under ``scheme``."""
    return f"{scheme}://{path}"


@functools.cache
def _filesystem(scheme: str) -> pafs.FileSystem:
    """Return the (cached, per process) filesystem of a scheme, configured from the environment."""
    import pyarrow.fs as pafs

    timeout = float(env_int("SORTPACK_OBJECT_TIMEOUT") or 30)
    attempts = max(1, env_int("SORTPACK_OBJECT_RETRIES") or 3)
    if scheme == "s3":
        kw: dict[str, Any] = {"connect_timeout": timeout, "request_timeout": timeout,
                              "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=attempts)}
        endpoint = env_text("AWS_ENDPOINT_URL_S3") or env_text("AWS_ENDPOINT_URL")
        if endpoint:
            kw["endpoint_override"] = endpoint
            kw["scheme"] = "http" if endpoint.startswith("http://") else "https"
        region = env_text("AWS_REGION") or env_text("AWS_DEFAULT_REGION")
        if region:
            kw["region"] = region
        return pafs.S3FileSystem(**kw)
    gcs: dict[str, Any] = {"retry_time_limit": timedelta(seconds=timeout * attempts)}
    emulator = env_text("STORAGE_EMULATOR_HOST")  # the Google client libraries' emulator setting
    if emulator:
        gcs["scheme"] = "https" if emulator.startswith("https://") else "http"
        gcs["endpoint_override"] = emulator.split("://", 1)[-1]
        gcs["anonymous"] = True
    return pafs.GcsFileSystem(**gcs)


def filesystem(url: str) -> tuple[pafs.FileSystem, str]:
    """Return the filesystem that reads ``url`` and the object's path in it."""
    scheme, path = split_url(url)
    try:
        return _filesystem("gs" if scheme == "gcs" else scheme), path
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise SortpackError(f"{url}: cannot set up the {scheme} filesystem ({one_line(exc)})") from None


_DENIED = ("access_denied", "accessdenied", "invalidaccesskeyid", "invalid_access_key", "signaturedoesnotmatch",
           "signature_does_not_match", "forbidden", "403", "credential", "unauthorized", "401")


def object_error(url: str, exc: BaseException) -> SortpackError:
    """Return the one-line error of a failed request for ``url``: missing, denied, unreachable or other."""
    text = one_line(exc)
    low = text.lower()
    if isinstance(exc, FileNotFoundError) or "nosuchkey" in low or "not found" in low or "does not exist" in low:
        why = "no such object"
        if "bucket" in low:
            why = "no such bucket"
    elif any(w in low for w in _DENIED):
        why = ("access denied: check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE)"
               if url_scheme(url) == "s3" else "access denied: check the credentials (GOOGLE_APPLICATION_CREDENTIALS)")
    elif any(w in low for w in ("network_connection", "could not connect", "couldn't connect", "timed out",
                                "timeout", "resolve host", "connection refused")):
        setting = "AWS_ENDPOINT_URL" if url_scheme(url) == "s3" else "STORAGE_EMULATOR_HOST"
        why = f"cannot reach the endpoint (check {setting} and the network)"
    else:
        why = "request failed"
    return SortpackError(f"{url}: {why} ({text})")


def is_request_error(exc: BaseException) -> bool:
    """Return whether ``exc`` is a failed request to the store (not bad data in an object)."""
    text = one_line(exc)
    return isinstance(exc, FileNotFoundError) or any(w in text for w in ("AWS Error", "curl", "GCS", "google"))


class Listed(str):
    """An object's URL that remembers the size its listing (or the HEAD that found it) gave.

    Discovery returns these; they travel with the paths to every rank (pickled with the
    size), so opening a small one needs no HEAD. Everywhere else it is the URL string.
    """

    size: int

    def __new__(cls, url: str, size: int) -> Listed:
        self = super().__new__(cls, url)
        self.size = int(size)
        return self

    def __reduce__(self) -> tuple:
        return Listed, (str(self), self.size)


class ObjectInfo(NamedTuple):
    """What opening an object says (its HEAD, or the one GET of a small listed one): size, time, version tag."""

    size: int
    mtime_ns: int | None
    etag: str | None  # S3's ETag, or GCS's generation: changes with every write of the object


def _meta(meta: dict) -> dict[str, str]:
    return {k.decode() if isinstance(k, bytes) else str(k): v.decode() if isinstance(v, bytes) else str(v)
            for k, v in (meta or {}).items()}


def _info(meta: dict, size: int) -> ObjectInfo:
    """Return the ObjectInfo of a HEAD response's headers."""
    tag = meta.get("ETag") or meta.get("etag") or meta.get("x-goog-generation") or meta.get("generation")
    mtime = _parse_time(meta.get("Last-Modified") or meta.get("last-modified") or meta.get("mtime"))
    return ObjectInfo(int(size), mtime, tag.strip('"') if tag else None)


class _Small:
    """The small objects this process read whole: their HEAD and their bytes, least recently used first out."""

    def __init__(self, budget: int):
        self.budget = budget
        self.items: OrderedDict[str, tuple[ObjectInfo, pa.Buffer]] = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()

    def get(self, url: str) -> tuple[ObjectInfo, pa.Buffer] | None:
        """Return the kept HEAD and bytes of ``url`` (None: not kept)."""
        with self.lock:
            got = self.items.get(url)
            if got is not None:
                self.items.move_to_end(url)
            return got

    def put(self, url: str, info: ObjectInfo, buf: pa.Buffer) -> None:
        """Keep ``url``'s HEAD and bytes, dropping the least recently used past the budget."""
        with self.lock:
            if url in self.items:
                return
            self.items[url] = (info, buf)
            self.bytes += buf.size
            while self.bytes > self.budget and len(self.items) > 1:
                _, (_, old) = self.items.popitem(last=False)
                self.bytes -= old.size

    def clear(self) -> None:
        """Forget every kept object."""
        with self.lock:
            self.items.clear()
            self.bytes = 0


_SMALL = _Small(CACHE_BYTES)


def _get_listed(url: Listed, fs: pafs.FileSystem, path: str) -> tuple[ObjectInfo, pa.Buffer] | None:
    """Return a small listed S3 object's ObjectInfo and bytes from one signed GET, or None (pyarrow's turn)."""
    if not 0 < url.size <= WHOLE_BYTES or url_scheme(url) != "s3":
        return None
    from . import object_get

    setup = object_get.setup_from_env(getattr(fs, "region", None) or "us-east-1")
    if setup is None:
        return None
    bucket, _, key = path.partition("/")
    got = object_get.get_small(setup, bucket, key, WHOLE_BYTES, float(env_int("SORTPACK_OBJECT_TIMEOUT") or 30))
    if got is None:
        return None
    return ObjectInfo(got.size, _parse_time(got.last_modified), got.etag.strip('"') if got.etag else None), \
        pa.py_buffer(got.body)


def _open(url: str) -> tuple[ObjectInfo, pa.NativeFile]:
    """Return the HEAD of ``url`` and a random-access file over it: its kept bytes, or the store's file.

    A listed S3 object below WHOLE_BYTES not kept yet costs one GET (``_get_listed``); any other
    small one one HEAD and one GET (the whole object), then kept; a larger one one HEAD, and
    ranged GETs as it is read.
    """
    kept = _SMALL.get(url)
    if kept is not None:
        return kept[0], pa.BufferReader(kept[1])
    fs, path = filesystem(url)
    got = _get_listed(url, fs, path) if isinstance(url, Listed) else None
    if got is not None:
        _SMALL.put(url, *got)
        return got[0], pa.BufferReader(got[1])
    try:
        fh = fs.open_input_file(path)
        info = _info(_meta(fh.metadata()), fh.size())
        if info.size > WHOLE_BYTES:
            return info, fh
        with fh:
            buf = fh.read_buffer()
    except (OSError, pa.ArrowException) as exc:
        raise object_error(url, exc) from None
    _SMALL.put(url, info, buf)
    return info, pa.BufferReader(buf)


def head(url: str) -> ObjectInfo:
    """Return the size, mtime and ETag (or generation) of object ``url`` (``_open``'s requests, none when kept)."""
    info, fh = _open(url)
    fh.close()
    return info


def prefetch(urls: list[str], threads: int = PREFETCH_THREADS) -> None:
    """Read the HEAD (and the bytes of the small ones) of many objects at once, from threads.

    What is described, hashed and read next is then served from memory (``_open``); a failed
    request is left for that later call to report, with its URL.
    """
    todo = [u for u in urls if is_url(u) and _SMALL.get(u) is None]
    if len(todo) < 2:
        return

    def one(url: str) -> None:
        try:
            _open(url)[1].close()
        except SortpackError:
            pass

    filesystem(todo[0])  # made once, before the threads share it
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(threads, len(todo))) as pool:
        list(pool.map(one, todo))


def _parse_time(text: str | None) -> int | None:
    """Return nanoseconds since the epoch of an ISO-8601 or HTTP date, or None."""
    if not text:
        return None
    for parse in (lambda t: datetime.fromisoformat(t.replace("Z", "+00:00")),
                  lambda t: datetime.strptime(t, "%a, %d %b %Y %H:%M:%S %Z").replace(tzinfo=timezone.utc)):
        try:
            return int(parse(text).timestamp() * 1e9)
        except ValueError:
            continue
    return None


def lookup(url: str) -> tuple[str, str]:
    """Return ``("file", the URL as Listed)``, ``("prefix", url)`` (objects below it) or ``("missing", url)``."""
    import pyarrow.fs as pafs

    fs, path = filesystem(url)
    try:
        info = fs.get_file_info(path)
    except (OSError, pa.ArrowException) as exc:
        raise object_error(url, exc) from None
    if info.type == pafs.FileType.File:
        return "file", Listed(url, info.size or 0)
    if info.type == pafs.FileType.Directory:
        return "prefix", url
    return "missing", url


def list_objects(url: str) -> list[tuple[Listed, int]]:
    """Return the URL (with its listed size) and size of every object below prefix ``url``, in sorted key order."""
    import pyarrow.fs as pafs

    fs, path = filesystem(url)
    scheme = url_scheme(url) or "s3"
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except (OSError, pa.ArrowException) as exc:
        raise object_error(url, exc) from None
    found = sorted((i.path, int(i.size or 0)) for i in infos if i.type == pafs.FileType.File)
    return [(Listed(join_url(scheme, p), n), n) for p, n in found]


def open_input(path: str) -> pa.NativeFile:
    """Return a random-access file over ``path``: memory-mapped when local, ranged GETs when a URL."""
    if not is_url(path):
        return pa.memory_map(path, "r")
    return _open(path)[1]


def size_of(path: str) -> int:
    """Return the byte size of a local file or an object."""
    return head(path).size if is_url(path) else os.path.getsize(path)


def read_all(path: str) -> pa.Buffer:
    """Return the whole content of a local file or an object as one buffer."""
    with open_input(path) as fh:
        return fh.read_buffer()


def read_head(path: str, n: int) -> bytes:
    """Return the first ``n`` bytes of a local file or an object (one ranged GET)."""
    if not is_url(path):
        with open(path, "rb") as fh:
            return fh.read(n)
    with open_input(path) as fh:
        return fh.read_at(min(n, fh.size()), 0)


def glob_regex(pattern: str) -> re.Pattern:
    """Return the regex of a glob over ``/``-separated keys: ``*`` and ``?`` stay within a name, ``**`` spans names."""
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[":
            j = pattern.find("]", i + 2)
            if j < 0:
                out.append(re.escape(c))
                i += 1
            else:
                body = pattern[i + 1:j]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = j + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


def glob_objects(url: str) -> list[tuple[Listed, int]]:
    """Return the URL and size of every object whose URL matches glob ``url``, in sorted order (as ``glob.glob``)."""
    scheme, path = split_url(url)
    names = path.split("/")
    fixed = []
    for name in names:
        if re.search(r"[*?\[]", name):
            break
        fixed.append(name)
    if not fixed:
        raise SortpackError(f"{url}: a glob needs a fixed bucket name")
    base = join_url(scheme, "/".join(fixed))
    rx = glob_regex(path)
    # as Python's glob: wildcards do not match a name starting with "." (a pattern may name one)
    dotted = "/." in "/" + path
    return [(u, s) for u, s in list_objects(base)
            if rx.match(split_url(u)[1]) and (dotted or "/." not in "/" + split_url(u)[1])]
