"""One signed GET of a small S3 object: sortpack.inputs.object_get, against AWS's example and moto."""
from __future__ import annotations

import datetime
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sortpack.inputs import object_get
from sortpack.inputs.object_get import Setup, get_small, setup_from_env, signed_headers

AWS_EXAMPLE = Setup("https", "", "us-east-1", "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", None)


def test_the_signature_of_aws_s_get_object_example():
    # Signature Version 4 documentation, "GET Object" example (a ranged GET of examplebucket/test.txt)
    got = signed_headers(AWS_EXAMPLE, "examplebucket.s3.amazonaws.com", "/test.txt", {"Range": "bytes=0-9"},
                         "20130524T000000Z")
    assert got["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")
    assert AWS_EXAMPLE.secret not in repr(AWS_EXAMPLE)


@given(key=st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=30),
       bucket=st.from_regex(r"[a-z0-9][a-z0-9.-]{1,20}[a-z0-9]", fullmatch=True),
       region=st.sampled_from(["us-east-1", "eu-west-3", "ap-southeast-2"]),
       token=st.one_of(st.none(), st.text("abcXYZ019+/=", min_size=1, max_size=40)),
       host=st.sampled_from(["", "127.0.0.1:9000"]))
def test_the_signature_equals_botocore_s(key, bucket, region, token, host):
    # botocore (boto3's signer) is the oracle: same request, same time, same Authorization
    auth = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    setup = Setup("http" if host else "https", host, region, "AKIDEXAMPLE", "s3cr3t/+key", token)
    target_host, path = object_get._target(setup, bucket, key)
    when = datetime.datetime(2026, 11, 27, 18, 0, 5)
    mine = signed_headers(setup, target_host, path, {"Range": "bytes=0-1048575"}, when.strftime("%Y%m%dT%H%M%SZ"))
    req = AWSRequest(method="GET", url=f"{setup.scheme}://{target_host}{path}", headers={"Range": "bytes=0-1048575"})
    with mock.patch.object(auth, "get_current_datetime", lambda: when):
        auth.S3SigV4Auth(Credentials(setup.key, setup.secret, token), "s3", region).add_auth(req)
    assert mine["Authorization"] == req.headers["Authorization"]


def test_setup_from_the_environment(monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    assert setup_from_env("us-east-1") is None  # no static keys: pyarrow's chain (profiles, roles)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    assert setup_from_env("eu-west-1") == Setup("https", "", "eu-west-1", "k", "s", None)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/")
    assert setup_from_env("us-east-1")[:2] == ("http", "127.0.0.1:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://minio.local:9000")
    assert setup_from_env("us-east-1")[:2] == ("https", "minio.local:9000")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://proxy.local/s3")  # a path: left to pyarrow
    assert setup_from_env("us-east-1") is None
    assert object_get._target(Setup("https", "", "eu-west-1", "k", "s", None), "my-bucket", "a b/c+d.jsonl") == \
        ("my-bucket.s3.eu-west-1.amazonaws.com", "/a%20b/c%2Bd.jsonl")
    assert object_get._target(Setup("https", "", "eu-west-1", "k", "s", None), "my.bucket", "x") == \
        ("s3.eu-west-1.amazonaws.com", "/my.bucket/x")


@pytest.mark.slow
def test_one_get_returns_what_a_head_and_a_get_return(s3_server):
    s3_server.bucket("direct")
    client = s3_server.client()
    body = b'{"text": "abc"}\n' * 10
    client.put_object(Bucket="direct", Key="d/x y.jsonl", Body=body)
    setup = Setup("http", s3_server.endpoint.split("://")[1], "us-east-1", s3_server.key, s3_server.secret, None)
    mark = s3_server.log_mark()
    got = get_small(setup, "direct", "d/x y.jsonl", 1 << 20, 5.0)
    head = client.head_object(Bucket="direct", Key="d/x y.jsonl")
    assert got is not None and got.body == body and got.size == len(body)
    assert got.etag == head["ETag"]
    assert datetime.datetime.strptime(got.last_modified, "%a, %d %b %Y %H:%M:%S %Z").replace(
        tzinfo=datetime.timezone.utc) == head["LastModified"]
    assert [m for m, _ in s3_server.requests_since(mark)] == ["GET", "HEAD"]  # ours, then boto3's
    # larger than the limit: None (read by ranged GETs as a large object); missing: None, still on
    assert get_small(setup, "direct", "d/x y.jsonl", 100, 5.0) is None
    assert get_small(setup, "direct", "d/none.jsonl", 1 << 20, 5.0) is None
    assert setup not in object_get._off


def test_a_refused_key_or_an_unreachable_endpoint_turns_the_path_off(s3_server):
    s3_server.bucket("direct")
    s3_server.client().put_object(Bucket="direct", Key="k.jsonl", Body=b"{}\n")
    host = s3_server.endpoint.split("://")[1]
    wrong = Setup("http", host, "us-east-1", "AKIAWRONGWRONGWRONG0", "nope", None)
    with s3_server.checking_credentials():
        mark = s3_server.log_mark()
        assert get_small(wrong, "direct", "k.jsonl", 1 << 20, 5.0) is None
        assert wrong in object_get._off
        assert get_small(wrong, "direct", "k.jsonl", 1 << 20, 5.0) is None  # off: no request
        assert len(s3_server.requests_since(mark)) == 1
    closed = Setup("http", "127.0.0.1:9", "us-east-1", "k", "s", None)
    assert get_small(closed, "b", "k.jsonl", 1 << 20, 2.0) is None and closed in object_get._off


@pytest.mark.slow
def test_requests_are_counted_whatever_the_server_prints(tmp_path, monkeypatch):
    # Werkzeug 3.1.9 colours the log line of a non-200 answer where colorama is missing (a fresh venv): the
    # tests count the requests the server was sent, so a ranged GET, a missing key and a refused key all count
    from botocore.exceptions import ClientError

    from object_store import BAD_KEY, start_server, stop_server

    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "colorama.py").write_text("raise ImportError('not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", str(hide))  # the server process only: this one imported what it needs
    server = start_server()
    try:
        server.bucket("count")
        client = server.client()
        client.put_object(Bucket="count", Key="k.jsonl", Body=b'{"text": "abc"}\n' * 10)
        mark = server.log_mark()
        assert client.get_object(Bucket="count", Key="k.jsonl", Range="bytes=0-9")["Body"].read() == b'{"text": "'
        with pytest.raises(ClientError):
            client.get_object(Bucket="count", Key="none.jsonl")
        host = server.endpoint.split("://")[1]
        with server.checking_credentials():
            wrong = Setup("http", host, "us-east-1", BAD_KEY["AWS_ACCESS_KEY_ID"], "nope", None)
            assert get_small(wrong, "count", "k.jsonl", 1 << 20, 5.0) is None
        got = [(m, p.split("?")[0]) for m, p in server.requests_since(mark) if p.startswith("/count/")]
        assert got == [("GET", "/count/k.jsonl"), ("GET", "/count/none.jsonl"), ("GET", "/count/k.jsonl")]
    finally:
        stop_server(server)
        object_get._off.clear()
