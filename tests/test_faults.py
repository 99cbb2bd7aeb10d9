"""The fault-injecting proxy itself, and what s3fs does with the faults it injects.

These pin down the test tool (each fault is what it says, seeded, stoppable) and the retry
behaviour the reader builds on: through 20% faults s3fs reads still succeed; with every request
failing a read fails in bounded time.
"""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections import Counter

import aiohttp
import pytest
import s3fs
from botocore.exceptions import BotoCoreError
from fault_proxy import FAULT_KINDS, FaultProxy
from support.s3 import S3Bucket

pytestmark = pytest.mark.timeout(120)


def _address(proxy: FaultProxy) -> tuple[str, int]:
    host, port = proxy.endpoint_url.removeprefix("http://").split(":")
    return host, int(port)


def _get(proxy: FaultProxy, url: str, **headers: str) -> tuple[int, bytes]:
    """GET a presigned ``url`` through ``proxy`` with plain http.client (one connection)."""
    conn = http.client.HTTPConnection(*_address(proxy), timeout=10)
    try:
        conn.request("GET", url.removeprefix(proxy.endpoint_url), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture
def blob(s3_bucket: S3Bucket) -> tuple[str, bytes]:
    """A 64 KiB object of random bytes, written around the proxy; returns (bucket/key, bytes)."""
    data = os.urandom(64 * 1024)
    path = f"{s3_bucket.name}/blob.bin"
    s3_bucket.server.direct_filesystem.pipe_file(path, data)
    return path, data


@pytest.fixture
def blob_url(s3_bucket: S3Bucket, blob) -> str:
    """A presigned URL of the blob through the proxy, for requests without an S3 client."""
    return s3_bucket.server.filesystem().url(blob[0], expires=600)


def test_proxy_forwards_and_records_ranged_reads(s3_bucket: S3Bucket, blob) -> None:
    path, data = blob
    fs = s3_bucket.server.filesystem()
    assert fs.cat_file(path, start=100, end=5100) == data[100:5100]
    (req,) = s3_bucket.proxy.log
    assert (req.method, req.path, req.range, req.status, req.body_bytes, req.fault) == (
        "GET",
        f"/{path}",
        "bytes=100-5099",
        206,
        5000,
        None,
    )


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_is_what_it_says(s3_bucket: S3Bucket, blob, blob_url, kind: str) -> None:
    _, data = blob
    s3_bucket.proxy.set_faults(1.0, kinds=[kind])
    if kind == "reset":
        with pytest.raises(ConnectionResetError):
            _get(s3_bucket.proxy, blob_url)
    elif kind == "short":
        # The header promises the whole body; half of it arrives, then the connection closes.
        with pytest.raises(http.client.IncompleteRead) as err:
            _get(s3_bucket.proxy, blob_url)
        assert err.value.partial == data[: len(data) // 2]
    else:
        status, body = _get(s3_bucket.proxy, blob_url)
        assert status == int(kind)
        assert b"<Error><Code>" in body
    assert [r.fault for r in s3_bucket.proxy.log] == [kind]


def test_faults_are_seeded(s3_bucket: S3Bucket, blob_url) -> None:
    runs = []
    for _ in range(2):
        s3_bucket.proxy.set_faults(0.5, seed=7, kinds=["500", "503"])
        s3_bucket.proxy.clear()
        statuses = [_get(s3_bucket.proxy, blob_url, Range="bytes=0-9")[0] for _ in range(30)]
        runs.append(statuses)
    assert runs[0] == runs[1]
    assert set(runs[0]) == {206, 500, 503}
    s3_bucket.proxy.set_faults(0.5, seed=8, kinds=["500", "503"])
    assert [_get(s3_bucket.proxy, blob_url, Range="bytes=0-9")[0] for _ in range(30)] != runs[0]


def test_faults_can_target_methods(s3_bucket: S3Bucket, blob, blob_url) -> None:
    _, data = blob
    s3_bucket.proxy.set_faults(1.0, methods=["PUT"])
    assert _get(s3_bucket.proxy, blob_url) == (200, data)


def test_s3fs_reads_survive_twenty_percent_faults(s3_bucket: S3Bucket, blob) -> None:
    path, data = blob
    fs = s3_bucket.server.filesystem()
    s3_bucket.proxy.set_faults(0.2, seed=0)
    for i in range(60):
        start = i * 1000
        assert fs.cat_file(path, start=start, end=start + 3000) == data[start : start + 3000]
    faults = Counter(r.fault for r in s3_bucket.proxy.log if r.fault)
    assert set(faults) == set(FAULT_KINDS), faults


def test_s3fs_gives_up_in_bounded_time_when_every_request_fails(s3_bucket: S3Bucket, blob) -> None:
    """With botocore's own retries off, s3fs's retry loops still end within seconds.

    (With botocore's defaults, connection resets alone take minutes: s3fs retries 5 times
    around 5 botocore attempts around aiohttp's one reconnect, 5 times again for ranged reads.)
    """
    path, _ = blob
    fs = s3fs.S3FileSystem(
        skip_instance_cache=True,
        config_kwargs={"retries": {"total_max_attempts": 1}},
        **s3_bucket.storage_options,
    )
    s3_bucket.proxy.set_faults(1.0, seed=0)
    started = time.monotonic()
    # Which type surfaces depends on the last fault: s3fs translates some, not all.
    with pytest.raises((OSError, BotoCoreError, aiohttp.ClientError)):
        fs.cat_file(path, start=0, end=1000)
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"gave up after {elapsed:.1f}s"
    assert len(s3_bucket.proxy.log) <= 5 * 5 * 2, "more attempts than s3fs + aiohttp allow"


def test_stop_closes_open_connections() -> None:
    """Stopping the proxy ends even a client that holds a keep-alive connection open."""
    with socket.create_server(("127.0.0.1", 0)) as upstream:
        host, port = upstream.getsockname()
        proxy = FaultProxy(f"http://{host}:{port}").start()
        client = socket.create_connection(_address(proxy))
        client.settimeout(10)
        time.sleep(0.2)  # let the handler thread take the connection
        started = time.monotonic()
        proxy.stop()
        assert client.recv(1) == b""
        assert time.monotonic() - started < 5
        client.close()
