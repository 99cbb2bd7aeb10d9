"""The fault-injecting proxy itself, and what s3fs does with the faults it injects.

These pin down the test tool (each fault is what it says, seeded, stoppable), the retry
behaviour the reader builds on (through 20% faults s3fs reads still succeed; with every request
failing a read fails in bounded time), and the reader's own retries: with every layer below
them off, they alone carry whole epochs through 20% faults, torn bodies and stalls included.
The readers here read without the node-local cache (``cache=False``): every epoch goes to the
store, and through its faults (tests/test_cache.py tests the cache).
"""

from __future__ import annotations

import gc
import http.client
import logging
import multiprocessing
import os
import socket
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
import s3fs
from botocore.exceptions import BotoCoreError
from fault_proxy import ALL_FAULT_KINDS, FAULT_KINDS, FaultProxy
from support.batches import assert_same_items, epochs
from support.s3 import S3Bucket, S3Server

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset

pytestmark = pytest.mark.timeout(180)

AV1 = "av1_multifile"
FRAMES = 74


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


def test_a_torn_body_has_the_length_and_not_the_bytes(s3_bucket: S3Bucket, blob, blob_url):
    _, data = blob
    s3_bucket.proxy.set_faults(1.0, kinds=["torn"])
    bodies = [_get(s3_bucket.proxy, blob_url) for _ in range(2)]
    for status, body in bodies:
        assert status == 200
        assert len(body) == len(data)
        assert body[: len(data) // 2] == data[: len(data) // 2]
        half = len(data) // 2
        assert all(a != b for a, b in zip(body[half:], data[half:], strict=True))
    assert bodies[0] != bodies[1], "two torn reads of the same range should differ"
    assert [r.fault for r in s3_bucket.proxy.log] == ["torn"] * 2


def test_a_stall_answers_nothing_then_closes(s3_bucket: S3Bucket, blob_url) -> None:
    s3_bucket.proxy.set_faults(1.0, kinds=["stall"])
    s3_bucket.proxy.stall_s = 0.5
    try:
        started = time.monotonic()
        with pytest.raises(http.client.RemoteDisconnected):
            _get(s3_bucket.proxy, blob_url)
        assert time.monotonic() - started >= 0.5
    finally:
        s3_bucket.proxy.stall_s = 2.0
    assert [r.fault for r in s3_bucket.proxy.log] == ["stall"]


def test_faults_can_target_paths(s3_bucket: S3Bucket, blob, blob_url) -> None:
    _, data = blob
    s3_bucket.proxy.set_faults(1.0, path_contains="/shards/")
    assert _get(s3_bucket.proxy, blob_url) == (200, data)


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


# ------------------------------------------------------------------ the reader through faults


@pytest.fixture(scope="module")
def s3_av1(s3_server: S3Server, golden_dir: Path) -> tuple[S3Bucket, str]:
    """The golden dataset converted to a fresh bucket (around the proxy: no faults there)."""
    bucket = S3Bucket(s3_server, s3_server.new_bucket("faults"))
    url = bucket.url(AV1)
    lerobot_shards.convert(
        str(golden_dir / AV1),
        url,
        dest_storage_options=bucket.server.direct_storage_options,
        workers=0,
        progress=False,
    )
    return bucket, url


WORKERS = [0, 2]  # direct iteration, and a DataLoader with 2 workers (from the forkserver)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_epoch_through_faults_equals_the_epoch_without(
    s3_av1: tuple[S3Bucket, str], num_workers: int
) -> None:
    """20% of requests broken (seeded): the same items in the same order, each index once."""
    bucket, url = s3_av1
    proxy = bucket.proxy
    options = bucket.storage_options
    proxy.set_faults(0.0)
    clean = epochs(
        ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3), num_workers
    )
    for epoch in clean:
        assert sorted(int(i["index"]) for i in epoch) == list(range(FRAMES))
    assert [int(i["index"]) for i in clean[0]] != [int(i["index"]) for i in clean[1]]

    # Seed 1788 breaks shard and metadata reads with each kind of fault (the draw is keyed by
    # request, so this holds run after run).
    proxy.set_faults(0.2, seed=1788)
    proxy.clear()
    # Opening the dataset (index.json, manifest, meta/) goes through the faults too.
    faulty = epochs(
        ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3), num_workers
    )
    proxy.set_faults(0.0)
    for got, want in zip(faulty, clean, strict=True):
        assert_same_items(got, want)
    shard_faults = Counter(r.fault for r in proxy.requests("GET", path_contains="/shards/"))
    assert set(shard_faults) - {None} == set(FAULT_KINDS), shard_faults
    assert {r.fault for r in proxy.log if "/shards/" not in r.path} - {None} == set(FAULT_KINDS)


@pytest.mark.parametrize("num_workers", WORKERS)
def test_reader_gives_up_in_bounded_time_naming_shard_and_episode(
    s3_av1: tuple[S3Bucket, str], num_workers: int
) -> None:
    """Every request failing: bounded retries, an error naming the shard and the episode, and
    no DataLoader worker or fetch thread left behind."""
    bucket, url = s3_av1
    # botocore's own retries off, so one fs read is s3fs's loops only (see the test above).
    options = {**bucket.storage_options, "config_kwargs": {"retries": {"total_max_attempts": 1}}}
    ds = ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3)
    ds.fetch_retries = 2
    bucket.proxy.set_faults(1.0, seed=0)
    children = set(multiprocessing.active_children())
    threads = set(threading.enumerate())
    started = time.monotonic()
    where = rf"{AV1}/shards/000/episode-\d{{6}}\.tar \(episode \d\)"
    with pytest.raises(OSError, match=rf"{where}: reading bytes \d+\.\.\d+ failed 3 times"):
        epochs(ds, num_workers, count=1)
    elapsed = time.monotonic() - started
    bucket.proxy.set_faults(0.0)
    assert elapsed < 90, f"gave up after {elapsed:.0f} s"
    gc.collect()
    left = [p for p in multiprocessing.active_children() if p not in children]
    for p in left:
        p.join(timeout=10)
    assert not [p for p in left if p.is_alive()], "a DataLoader worker is still running"
    fetchers = [t for t in set(threading.enumerate()) - threads if "lerobot-shards" in t.name]
    assert not fetchers, fetchers


# ------------------------------------------------- the reader's own retries, alone

SEED_WORKERS = 0
"""Breaks shard reads of 2 workers' 2 epochs with torn bodies and stalls among others."""

# What each fault looks like in the reader's retry warnings.
_CAUSES = {
    "torn": "checksum mismatch",
    "500": "internal error",
    "503": "reduce your request rate",
    "stall": "ReadTimeoutError",
    "short": "ContentLengthError",
}


def _cause(message: str) -> str:
    found = [kind for kind, text in _CAUSES.items() if text in message]
    if not found and any(t in message for t in ("reset", "Disconnected", "ConnectionClosed")):
        return "reset"
    return found[0] if len(found) == 1 else f"other: {message}"


@pytest.fixture
def readers_retries_only(s3_av1: tuple[S3Bucket, str], monkeypatch: pytest.MonkeyPatch) -> dict:
    """The README's storage options (botocore's retries off) with 1 s timeouts, and s3fs's
    own retry loop off too (it has no option for it: ``S3FileSystem.retries``, a class
    attribute, 5), in this process. Left below the reader: aiohttp's one resend of a request
    whose reused keep-alive connection was reset before any answer.

    A stall holds its request 10 s: the client's 1 s read timeout ends it first even when a
    loaded machine runs the client's timer late (at 1.5 s a late timer saw the connection
    close instead, and aiohttp resent the request)."""
    bucket, _ = s3_av1
    monkeypatch.setattr(s3fs.S3FileSystem, "retries", 1)
    monkeypatch.setattr(bucket.proxy, "stall_s", 10.0)
    config = {"retries": {"total_max_attempts": 1}, "read_timeout": 1, "connect_timeout": 1}
    return {**bucket.storage_options, "config_kwargs": config}


def _object(message: str) -> str:
    """The object a retry warning of the reader names, as the proxy logs its path."""
    where = message.split(": ", 1)[0].removeprefix("s3://")
    return "/" + where.split(" (episode ")[0]


def _account_for_retries(log: list, messages: list[str], reads: Counter) -> Counter:
    """Match the reader's retry warnings (``messages``) to what the proxy did (``log``), object
    by object, where each object has to be read ``reads[path]`` times; return, by object, the
    read timeouts that no injected stall explains: genuine slowness (a loaded machine now and
    then answers later than the client's 1 s timeout), which the reader retries as it must.

    Each request the proxy saw is one attempt of the reader's, or aiohttp's resend of a request
    reset before any answer. Each attempt is a needed read or one retry, for its injected fault
    (500, 503, short body, torn body, reset: the same cause; stall: a read timeout), or a read
    timeout if its answer, faulty or not, came too late. So, for every object: no cause but
    the injected ones; no more retries for a fault than it was injected; the proxy answered
    (without a fault) the reads plus some ``late`` answers; and the timeouts are the stalls, the
    late answers, the faults seen as timeouts instead and, at most, the resets not retried as
    such. With no genuine slowness this is: every fault but a reset is exactly one retry with
    its cause, the proxy answered exactly the reads. A retry below the reader (botocore's,
    s3fs's) answers a request without a retry of the reader's, and this fails."""
    genuine: Counter = Counter()
    for path in sorted({r.path for r in log} | set(reads) | {_object(m) for m in messages}):
        injected = Counter(r.fault for r in log if r.path == path and r.fault)
        late = sum(1 for r in log if r.path == path and not r.fault) - reads[path]
        retried = Counter(_cause(m) for m in messages if _object(m) == path)
        where = (path, "injected", dict(injected), "retried", dict(retried), "late", late)
        assert set(retried) <= set(ALL_FAULT_KINDS), where
        unseen = {k: injected[k] - retried[k] for k in ALL_FAULT_KINDS if k != "stall"}
        assert min(unseen.values()) >= 0 and late >= 0, where
        timeouts = retried["stall"]
        not_resets = injected["stall"] + late + sum(n for k, n in unseen.items() if k != "reset")
        assert 0 <= timeouts - not_resets <= unseen["reset"], where
        genuine[path] = timeouts - injected["stall"]
    return +genuine


def _report_genuine(genuine: Counter, phase: str) -> None:
    """Say (in the warnings summary) how many read timeouts were the machine's, not faults."""
    if genuine:
        warnings.warn(
            f"{phase}: {genuine.total()} read timeout(s) no injected stall explains (a slow "
            f"machine: answers came late), each matched and retried: {dict(genuine)}",
            stacklevel=2,
        )


def test_the_readers_own_retries_carry_epochs_through_twenty_percent_faults(
    s3_av1: tuple[S3Bucket, str], readers_retries_only: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the reader retries. Opening the dataset through 20% faults (seeded), then 3 epochs
    through 20% faults of every kind on the shard reads, torn bodies and stalls included: the
    same items in the same order as without faults. Every fault but a reset (aiohttp resends
    those on a reused connection) is one retry of the reader's on the same object, by cause:
    nothing below it retried (:func:`_account_for_retries`). A read that timed out on an answer
    the proxy sent (the machine was slow, not faulty) is a retry too, counted apart, matched to
    that answer and reported; it draws the object's next fault early, so the seeded draws
    then reach further: more faults, never fewer."""
    bucket, url = s3_av1
    proxy = bucket.proxy
    options = readers_retries_only
    count = 3
    proxy.set_faults(0.0)
    proxy.clear()
    clean_ds = ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3)
    # Opening reads each metadata file once; an epoch reads each shard once.
    meta_reads = Counter({r.path for r in proxy.log})
    proxy.clear()
    clean = epochs(clean_ds, 0, count)
    shard_reads = Counter({r.path: count for r in proxy.log})
    assert len(meta_reads) == 5 and len(shard_reads) == 6, (meta_reads, shard_reads)
    for epoch in clean:
        assert sorted(int(i["index"]) for i in epoch) == list(range(FRAMES))

    caplog.set_level(logging.WARNING, logger="lerobot_shards.reader.fetch")
    # Seed 2 breaks the metadata reads with a 500, a short body and a stall.
    proxy.set_faults(0.2, seed=2, kinds=[*FAULT_KINDS, "stall"])
    proxy.clear()
    caplog.clear()
    ds = ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3)
    genuine = _account_for_retries(proxy.log, caplog.messages, meta_reads)
    _report_genuine(genuine, "opening")
    faults = Counter(r.fault for r in proxy.log if r.fault)
    drawn = Counter({"500": 1, "short": 1, "stall": 1})
    assert faults == drawn if not genuine else faults >= drawn, (faults, genuine)

    # Seed 0 breaks shard reads with every kind of fault over the 3 epochs.
    proxy.set_faults(0.2, seed=0, kinds=ALL_FAULT_KINDS, path_contains="/shards/")
    proxy.clear()
    caplog.clear()
    faulty = epochs(ds, 0, count)
    proxy.set_faults(0.0)
    for got, want in zip(faulty, clean, strict=True):
        assert_same_items(got, want)
    assert all(r.fault or r.status == 206 for r in proxy.log)
    faults = Counter(r.fault for r in proxy.log if r.fault)
    assert set(faults) == set(ALL_FAULT_KINDS), faults
    genuine = _account_for_retries(proxy.log, caplog.messages, shard_reads)
    _report_genuine(genuine, "3 epochs")


def test_readme_options_carry_dataloader_workers_through_torn_reads_and_stalls(
    s3_av1: tuple[S3Bucket, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's options as users run them (botocore's retries off, s3fs's in place) in 2
    DataLoader workers, through 20% faults of every kind on the shard reads: 2 epochs equal
    the epochs without faults. Torn bodies pass s3fs and botocore: the reader's checksum
    catches them and its retries read them again."""
    bucket, url = s3_av1
    proxy = bucket.proxy
    monkeypatch.setattr(proxy, "stall_s", 1.5)
    config = {"retries": {"total_max_attempts": 1}, "read_timeout": 1}
    options = {**bucket.storage_options, "config_kwargs": config}
    proxy.set_faults(0.0)
    clean = epochs(ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3), 2)
    ds = ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3)
    proxy.set_faults(0.2, seed=SEED_WORKERS, kinds=ALL_FAULT_KINDS, path_contains="/shards/")
    proxy.clear()
    faulty = epochs(ds, 2)
    proxy.set_faults(0.0)
    for got, want in zip(faulty, clean, strict=True):
        assert_same_items(got, want)
    faults = Counter(r.fault for r in proxy.log if r.fault)
    assert {"torn", "stall"} <= set(faults), faults


@pytest.mark.parametrize("num_workers", WORKERS)
def test_torn_reads_past_the_retries_name_shard_and_episode(
    s3_av1: tuple[S3Bucket, str], readers_retries_only: dict, num_workers: int
) -> None:
    """Every shard read torn: the reader retries and then says which shard and episode, and
    that its reads differed (torn, not a corrupt shard). No stalls here: a 30 s read timeout,
    so that a slow answer on a loaded machine is not one more retry (the error counts them)."""
    bucket, url = s3_av1
    config = {**readers_retries_only["config_kwargs"], "read_timeout": 30}
    options = {**readers_retries_only, "config_kwargs": config}
    ds = ShardedLeRobotDataset(url, cache=False, storage_options=options, seed=3)
    ds.fetch_retries = 2
    bucket.proxy.set_faults(1.0, kinds=["torn"], path_contains="/shards/")
    bucket.proxy.clear()
    where = rf"{AV1}/shards/000/episode-\d{{6}}\.tar \(episode \d\)"
    children = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match=rf"{where}: checksum mismatch on 3 reads .*torn reads"):
        epochs(ds, num_workers, count=1)
    _assert_no_worker_left(children)
    bucket.proxy.set_faults(0.0)
    assert {r.fault for r in bucket.proxy.log} == {"torn"}


# ------------------------------------------------- the object store goes away mid-epoch


def _assert_no_worker_left(before: set) -> None:
    """Every DataLoader worker started since ``before`` has stopped (after the failed
    iteration's traceback, which holds its iterator, is collected)."""
    gc.collect()
    left = [p for p in multiprocessing.active_children() if p not in before]
    for p in left:
        p.join(timeout=10)
    assert not [p for p in left if p.is_alive()], "a DataLoader worker is still running"


class Gate:
    """A proxy in front of the S3 server that goes away (``down``: its port refuses, open
    connections close) and comes back on the same port (``up``): what a client sees of an
    object store that restarts. The store's data stays, as a real store's does (moto's own
    restart would lose it)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.proxy = FaultProxy(upstream).start()
        self.port = _address(self.proxy)[1]
        self.served: list = []
        """The requests of each proxy that went down, in order."""

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def down(self) -> None:
        self.proxy.stop()
        self.served.append(self.proxy.log)

    def up(self) -> None:
        self.proxy = FaultProxy(self.upstream, port=self.port).start()

    def close(self) -> None:
        self.proxy.stop()


class _FirstRetry(logging.Handler):
    """Sets ``seen`` at the reader's first retry warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        self.seen.set()


@pytest.fixture
def gate(s3_av1: tuple[S3Bucket, str]) -> Iterator[Gate]:
    bucket, _ = s3_av1
    gate = Gate(bucket.server.direct_endpoint_url)
    yield gate
    gate.close()


@pytest.fixture
def retry_warnings() -> Iterator[_FirstRetry]:
    handler = _FirstRetry()
    logger = logging.getLogger("lerobot_shards.reader.fetch")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _through(options: dict, endpoint_url: str) -> dict:
    client = {**options["client_kwargs"], "endpoint_url": endpoint_url}
    return {**options, "client_kwargs": client}


OUTAGE = {"seed": 3, "buffer_size": 2}  # a small pool: episodes are fetched all epoch long


def test_the_reader_retries_through_an_object_store_outage(
    s3_av1: tuple[S3Bucket, str],
    readers_retries_only: dict,
    gate: Gate,
    retry_warnings: _FirstRetry,
) -> None:
    """The store goes away after the first item and comes back 1 s after the reader's first
    failed read, within its retries (8: 11 s of backoff): the epoch completes with the same
    items in the same order as an epoch without the outage, and the episodes still to fetch
    came from the store once it was back."""
    bucket, url = s3_av1
    bucket.proxy.set_faults(0.0)
    clean = list(
        ShardedLeRobotDataset(url, cache=False, storage_options=readers_retries_only, **OUTAGE)
    )
    assert sorted(int(i["index"]) for i in clean) == list(range(FRAMES))

    ds = ShardedLeRobotDataset(
        url,
        cache=False,
        storage_options=_through(readers_retries_only, gate.endpoint_url),
        **OUTAGE,
    )
    ds.fetch_retries = 8
    got = []
    restart = None
    for item in ds:
        got.append(item)
        if restart is None:
            gate.down()

            def come_back() -> None:
                retry_warnings.seen.wait(60)
                time.sleep(1.0)
                gate.up()

            restart = threading.Thread(target=come_back, daemon=True)
            restart.start()
    restart.join(timeout=60)
    assert_same_items(got, clean)
    refused = [m for m in retry_warnings.messages if "Could not connect" in m]
    assert refused, retry_warnings.messages
    assert all("/shards/" in m for m in retry_warnings.messages)
    assert gate.proxy.requests("GET", path_contains="/shards/"), "nothing fetched after it"


def test_an_outage_past_the_retries_fails_clearly_and_the_checkpoint_resumes_exactly(
    s3_av1: tuple[S3Bucket, str],
    readers_retries_only: dict,
    gate: Gate,
    retry_warnings: _FirstRetry,
) -> None:
    """The store goes away after the first item and stays away past the reader's retries
    (2): the epoch fails with an error naming the shard and the episode. The store comes
    back; a new reader loads the last checkpoint (``state_dict()`` every 8 items, as a
    training loop saves one every few steps) and yields exactly the uninterrupted epoch's
    tail from there, in order."""
    bucket, url = s3_av1
    bucket.proxy.set_faults(0.0)
    clean = list(
        ShardedLeRobotDataset(url, cache=False, storage_options=readers_retries_only, **OUTAGE)
    )
    options = _through(readers_retries_only, gate.endpoint_url)
    ds = ShardedLeRobotDataset(url, cache=False, storage_options=options, **OUTAGE)
    ds.fetch_retries = 2
    got: list[dict] = []
    checkpoint = (0, ds.state_dict())
    where = rf"{AV1}/shards/000/episode-\d{{6}}\.tar \(episode \d\)"
    with pytest.raises(OSError, match=rf"{where}: reading bytes \d+\.\.\d+ failed 3 times"):
        for item in ds:
            got.append(item)
            if len(got) == 1:
                gate.down()
            if len(got) % 8 == 0:
                checkpoint = (len(got), ds.state_dict())
    assert 0 < len(got) < FRAMES
    assert_same_items(got, clean[: len(got)])
    taken, state = checkpoint
    assert state["offset"] == taken and taken > 0

    gate.up()  # the store is back: resume from the checkpoint, as a restarted job would
    resumed = ShardedLeRobotDataset(url, cache=False, storage_options=options, **OUTAGE)
    resumed.load_state_dict(state)
    assert_same_items(list(resumed), clean[taken:])


def test_an_outage_past_the_retries_in_dataloader_workers_resumes_exactly(
    s3_av1: tuple[S3Bucket, str], gate: Gate
) -> None:
    """The same with 2 DataLoader workers (from the forkserver, s3fs's retries in place there:
    the README's configuration) and batches of 4: the loader fails naming shard and episode;
    a new ``ShardedDataLoader`` loads the last ``loader.state_dict()`` (every 2 batches) and
    delivers exactly the uninterrupted run's remaining batches."""
    from support.batches import assert_same_batch

    from lerobot_shards import ShardedDataLoader

    bucket, url = s3_av1
    bucket.proxy.set_faults(0.0)
    options = {
        **bucket.storage_options,
        "config_kwargs": {"retries": {"total_max_attempts": 1}, "read_timeout": 1},
    }

    def loader(storage_options: dict) -> ShardedDataLoader:
        # One episode resident and none fetched ahead: each worker fetches all epoch long.
        ds = ShardedLeRobotDataset(
            url, cache=False, storage_options=storage_options, seed=3, buffer_size=1
        )
        ds.prefetch_depth = 0
        ds.fetch_retries = 2
        return ShardedDataLoader(ds, batch_size=4, num_workers=2)

    clean = list(loader(options))
    assert sorted(int(i) for b in clean for i in b["index"]) == list(range(FRAMES))
    through = _through(options, gate.endpoint_url)
    interrupted = loader(through)
    got: list[dict] = []
    checkpoint = (0, interrupted.state_dict())
    where = rf"{AV1}/shards/000/episode-\d{{6}}\.tar \(episode \d\)"
    children = set(multiprocessing.active_children())
    with pytest.raises(OSError, match=rf"{where}: reading bytes \d+\.\.\d+ failed 3 times"):
        for batch in interrupted:
            got.append(batch)
            if len(got) == 1:
                gate.down()
            if len(got) % 2 == 0:
                checkpoint = (len(got), interrupted.state_dict())
    _assert_no_worker_left(children)
    assert 0 < len(got) < len(clean)
    for ours, theirs in zip(got, clean, strict=False):
        assert_same_batch(ours, theirs)
    taken, state = checkpoint
    assert taken > 0

    gate.up()
    resumed = loader(through)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == len(clean) - taken
    for ours, theirs in zip(rest, clean[taken:], strict=True):
        assert_same_batch(ours, theirs)
