"""HTTP(S) roots: a converted dataset served by a real static server on loopback
(``support/http_server.py``: byte ranges as static servers, CDNs and the Hub's file endpoints
answer them), read through fsspec's HTTP filesystem. The epochs equal the local root's, item
for item, through DataLoader workers; network faults in front of the server (resets, 5xx, short
and torn bodies) are retried from the reader's budget to the same epochs; a server that ignores
``Range`` still gives the same items (each span is a whole shard), and a span it cannot serve
is refused at once, never read as wrong bytes. The converter reads a source over HTTP too."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest
from fault_proxy import FAULT_KINDS, FaultProxy
from support.batches import assert_same_items, epochs
from support.http_server import StaticServer
from support.required import importorskip

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.format import checksum
from lerobot_shards.reader.fetch.ranged import RangeIgnoredError, Span, read_span

importorskip("aiohttp", reason="fsspec's HTTP filesystem needs aiohttp (pip install fsspec[http])")

FRAMES = 74  # the golden av1_multifile dataset, by its meta/info.json


@pytest.fixture(scope="module")
def local_epochs(av1: Path) -> dict[int, list[list[dict]]]:
    """The local root's first two epochs, directly and through 2 DataLoader workers (the
    order depends on the layout)."""
    clean = {
        workers: epochs(ShardedLeRobotDataset(str(av1), seed=3), workers) for workers in (0, 2)
    }
    for epoch in [*clean[0], *clean[2]]:
        assert sorted(int(i["index"]) for i in epoch) == list(range(FRAMES))
    return clean


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_http_root_streams_the_local_roots_epochs(av1, local_epochs, num_workers):
    with StaticServer(av1) as server:
        served = epochs(ShardedLeRobotDataset(server.url, seed=3, cache=False), num_workers)
    for got, want in zip(served, local_epochs[num_workers], strict=True):
        assert_same_items(got, want)


def test_faults_in_front_of_the_server_are_retried_to_the_same_epochs(av1, local_epochs):
    with StaticServer(av1) as server, FaultProxy(server.url) as proxy:
        proxy.set_faults(0.2, seed=11, kinds=(*FAULT_KINDS, "torn"))
        ds = ShardedLeRobotDataset(proxy.endpoint_url, seed=3, cache=False)
        ds.fetch_retries = 8
        served = epochs(ds, 2)
        faults = Counter(r.fault for r in proxy.requests("GET", path_contains="/shards/"))
    for got, want in zip(served, local_epochs[2], strict=True):
        assert_same_items(got, want)
    assert set(faults) - {None} == {*FAULT_KINDS, "torn"}, faults


def test_a_server_that_ignores_range_gives_the_same_items(av1, local_epochs):
    """The converter writes one tar per episode whose span is the whole file, so even a server
    that answers every range with the whole file sends exactly each episode's bytes."""
    with StaticServer(av1, honour_range=False) as server:
        served = epochs(ShardedLeRobotDataset(server.url, seed=3, cache=False), 0)
    for got, want in zip(served, local_epochs[0], strict=True):
        assert_same_items(got, want)


def test_a_partial_span_from_a_server_that_ignores_range_is_refused_at_once(av1):
    shard = sorted((av1 / "shards").rglob("*.tar"))[0]
    part = shard.read_bytes()[512:1536]
    span = Span(0, "", offset=512, size=len(part), checksum=checksum(part))
    with StaticServer(av1) as server:  # ranges honoured: the part itself
        fs = fsspec.filesystem("http")
        url = f"{server.url}/{shard.relative_to(av1).as_posix()}"
        assert read_span(fs, span._replace(path=url)) == part
    with StaticServer(av1, honour_range=False) as server:
        url = f"{server.url}/{shard.relative_to(av1).as_posix()}"
        with pytest.raises(RangeIgnoredError, match="ignores byte ranges") as refused:
            read_span(fs, span._replace(path=url), backoff_s=10)  # no retry: no sleep
    assert "episode 0" in str(refused.value)


def test_convert_reads_a_source_over_http(golden_dir, av1, tmp_path):
    with StaticServer(golden_dir) as server:
        lerobot_shards.convert(
            f"{server.url}/av1_multifile", str(tmp_path / "from-http"), workers=0, progress=False
        )
    ours = pq.read_table(tmp_path / "from-http" / "manifest.parquet")
    local = pq.read_table(av1 / "manifest.parquet")
    assert ours.column("checksum").to_pylist() == local.column("checksum").to_pylist()
