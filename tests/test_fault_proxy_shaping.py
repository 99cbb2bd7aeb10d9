"""The proxy's traffic shaping (what ``scripts/bench_cache.py`` puts between the reader and its
S3 server): a shaped answer takes at least its latency plus its bytes over the bandwidth, and
shaping is off until asked for. Only lower bounds on time: a busy machine only adds to them."""

from __future__ import annotations

import http.client
import os
import time
from pathlib import Path

import pytest
from fault_proxy import FaultProxy
from support.http_server import StaticServer

SIZE = 600_000


def _timed_get(proxy: FaultProxy, path: str) -> tuple[float, bytes]:
    host, port = proxy.endpoint_url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        started = time.monotonic()
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        return time.monotonic() - started, body
    finally:
        conn.close()


@pytest.fixture
def served(tmp_path: Path) -> tuple[FaultProxy, bytes]:
    data = os.urandom(SIZE)
    (tmp_path / "blob.bin").write_bytes(data)
    with StaticServer(tmp_path) as upstream, FaultProxy(upstream.url) as proxy:
        yield proxy, data


def test_a_shaped_get_takes_the_latency_plus_its_bytes_over_the_bandwidth(served) -> None:
    proxy, data = served
    proxy.set_shaping(latency_s=0.2, bandwidth=1e6)
    elapsed, body = _timed_get(proxy, "/blob.bin")
    assert body == data
    assert elapsed >= 0.2 + SIZE / 1e6, f"{elapsed:.3f} s"
    (request,) = proxy.log
    assert request.body_bytes == SIZE


def test_shaping_is_off_until_set_and_off_again_when_reset(served) -> None:
    proxy, data = served
    assert (proxy.latency_s, proxy.bandwidth_bytes_per_s) == (0.0, None)
    proxy.set_shaping(latency_s=0.1, bandwidth=5e6)
    proxy.set_shaping()
    assert (proxy.latency_s, proxy.bandwidth_bytes_per_s) == (0.0, None)
    assert _timed_get(proxy, "/blob.bin")[1] == data


@pytest.mark.parametrize("latency_s, bandwidth", [(-0.1, None), (0.0, 0.0), (0.0, -1.0)])
def test_bad_shaping_is_refused(served, latency_s: float, bandwidth: float | None) -> None:
    with pytest.raises(ValueError, match="shaping"):
        served[0].set_shaping(latency_s=latency_s, bandwidth=bandwidth)
