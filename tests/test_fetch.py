"""reader/fetch/ranged.py: verified ranged reads with retries; the prefetcher's budget and order."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from lerobot_shards.format import checksum
from lerobot_shards.reader.fetch.ranged import (
    ADMIT,
    EVICT,
    ChecksumError,
    FetchError,
    Prefetcher,
    RetryingReads,
    Span,
    read_span,
)

PAYLOAD = bytes(range(256)) * 40  # 10240 bytes


class FlakyMemoryFS(MemoryFileSystem):
    """The real in-memory filesystem, with a script of failures for the next reads.

    Each entry of ``script`` is applied to one ``cat_file`` call, in order: an exception to
    raise, ``"short"`` to return half the bytes, ``"flip"`` to return the bytes with one bit
    changed (the same each time: a corrupt shard), ``"torn"`` to change a different bit each
    time (a torn read). When the script runs out, reads are normal.
    """

    protocol = "flakymem"
    cachable = False

    def __init__(self, script=(), **kw):
        super().__init__(**kw)
        self.script = list(script)
        self.calls: list[tuple[str, int, int]] = []

    def cat_file(self, path, start=None, end=None, **kw):
        self.calls.append((path, start, end))
        data = super().cat_file(path, start=start, end=end, **kw)
        if not self.script:
            return data
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        if step == "short":
            return data[: len(data) // 2]
        if step == "flip":
            return bytes([data[0] ^ 1]) + data[1:]
        if step == "torn":  # a different byte each time
            n = len(self.calls) % len(data)
            return data[:n] + bytes([data[n] ^ 1]) + data[n + 1 :]
        return data


def _span(path="/shards/000/episode-000003.tar", offset=1024, size=4096) -> Span:
    return Span(3, path, offset, size, checksum(PAYLOAD[offset : offset + size]))


def _fs(*script) -> FlakyMemoryFS:
    fs = FlakyMemoryFS(script)
    fs.pipe_file("/shards/000/episode-000003.tar", PAYLOAD)
    return fs


def test_one_ranged_read_of_exactly_the_span(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(PAYLOAD)
    span = _span(str(path), offset=100, size=5000)
    assert read_span(fsspec.filesystem("file"), span) == PAYLOAD[100:5100]
    fs = _fs()
    assert read_span(fs, _span()) == PAYLOAD[1024:5120]
    assert fs.calls == [("/shards/000/episode-000003.tar", 1024, 5120)]


@pytest.mark.parametrize(
    "script",
    [
        [ConnectionResetError("reset by peer"), TimeoutError("slow"), "short"],
        [fsspec.exceptions.FSTimeoutError(), OSError(5, "EIO")],
    ],
)
def test_transient_errors_are_retried(script):
    fs = _fs(*script)
    assert read_span(fs, _span(), backoff_s=0.001) == PAYLOAD[1024:5120]
    assert len(fs.calls) == len(script) + 1


def test_backoff_grows_exponentially():
    fs = _fs(*[ConnectionResetError()] * 3)
    began = time.perf_counter()
    read_span(fs, _span(), backoff_s=0.02)
    assert time.perf_counter() - began >= 0.02 + 0.04 + 0.08


def test_persistent_failure_names_shard_and_episode():
    fs = _fs(*[ConnectionResetError("reset by peer")] * 10)
    with pytest.raises(FetchError, match=r"episode-000003\.tar \(episode 3\).*failed 4 times"):
        read_span(fs, _span(), retries=3, backoff_s=0.001)
    assert len(fs.calls) == 4


def test_missing_shard_is_not_retried():
    fs = _fs()
    with pytest.raises(FetchError, match=r"nope\.tar \(episode 3\).*FileNotFoundError"):
        read_span(fs, _span("/shards/nope.tar"), backoff_s=0.001)
    assert len(fs.calls) == 1


def test_torn_read_is_retried_once():
    fs = _fs("flip")
    assert read_span(fs, _span()) == PAYLOAD[1024:5120]
    assert len(fs.calls) == 2


def test_torn_reads_are_retried_within_the_budget_and_logged(caplog):
    fs = _fs("torn", ConnectionResetError("reset"), "torn", "torn")
    with caplog.at_level("WARNING", logger="lerobot_shards.reader.fetch"):
        assert read_span(fs, _span(), retries=4, backoff_s=0.001) == PAYLOAD[1024:5120]
    assert len(fs.calls) == 5
    retries = [r.getMessage() for r in caplog.records]
    assert len(retries) == 4
    assert all(m.startswith("/shards/000/episode-000003.tar (episode 3): ") for m in retries)
    assert [m.split(": ", 1)[1].split(" (")[0].split(";")[0] for m in retries] == [
        "checksum mismatch",
        "ConnectionResetError('reset')",
        "checksum mismatch",
        "checksum mismatch",
    ]
    assert retries[-1].endswith("retry 4 of 4 in 0.01 s")


def test_torn_reads_past_the_budget_name_shard_and_episode():
    fs = _fs(*["torn"] * 10)
    with pytest.raises(
        ChecksumError,
        match=r"episode-000003\.tar \(episode 3\): checksum mismatch on 4 reads .*torn reads",
    ):
        read_span(fs, _span(), retries=3, backoff_s=0.001)
    assert len(fs.calls) == 4


def test_metadata_reads_retry_each_read_on_its_own(caplog):
    """Opening a dataset reads its small files through ``RetryingReads``: each read is retried
    on transient errors (logged), a missing file is not retried, and past the retries the error
    names the file."""
    fs = _fs(ConnectionResetError("reset"), TimeoutError("slow"))
    fs.pipe_file("/index.json", b"{}")
    reads = RetryingReads(fs, retries=2)
    with caplog.at_level("WARNING", logger="lerobot_shards.reader.fetch"):
        assert reads.cat_file("/index.json", start=0) == b"{}"
    assert [m.split(": ")[0] for m in caplog.messages] == ["/index.json"] * 2
    assert reads.exists("/index.json")  # everything else is the filesystem's
    with pytest.raises(FileNotFoundError):
        reads.cat_file("/manifest.parquet", start=0)
    fs.script = [ConnectionResetError("reset")] * 3
    with pytest.raises(FetchError, match=r"^/index\.json: failed 3 times, last error: Conn"):
        reads.cat_file("/index.json", start=0)
    assert len(fs.calls) == 3 + 1 + 3


def test_checksum_mismatch_is_corruption():
    fs = _fs("flip", "flip", "flip")
    with pytest.raises(
        ChecksumError, match=r"episode-000003\.tar \(episode 3\): checksum mismatch.*corrupt"
    ):
        read_span(fs, _span())
    assert len(fs.calls) == 2


# ------------------------------------------------------------------------------ prefetcher


class Ev(NamedTuple):
    kind: str | None
    key: int


def _role(event: Ev):
    return event.kind, event.key


def _plan(admits: list[int], draws_between: int = 3) -> list[Ev]:
    """Admit two, then alternately draw, evict the oldest and admit the next."""
    events = [Ev(ADMIT, admits[0]), Ev(ADMIT, admits[1])]
    resident = [admits[0], admits[1]]
    for key in admits[2:]:
        events += [Ev(None, -1)] * draws_between
        events.append(Ev(EVICT, resident.pop(0)))
        events.append(Ev(ADMIT, key))
        resident.append(key)
    events += [Ev(None, -1)] * draws_between
    events += [Ev(EVICT, k) for k in resident]
    return events


def test_prefetch_order_values_and_budget():
    sizes = {k: 10 + k for k in range(8)}
    plan = _plan(list(range(8)))
    seen_budget: list[int] = []
    lock = threading.Lock()
    prefetcher: Prefetcher

    def load(key: int) -> str:
        with lock:
            seen_budget.append(prefetcher.resident_bytes + prefetcher.in_flight_bytes)
        return f"episode {key}"

    budget = 2 * 17 + 16  # two residents and one more in flight at most
    prefetcher = Prefetcher(load, sizes.__getitem__, byte_budget=budget, depth=3, threads=2)
    out = [(e, None if v is None else v.result()) for e, v in prefetcher.run(plan, _role)]
    assert [e for e, _ in out] == plan
    assert [v for e, v in out if e.kind == ADMIT] == [f"episode {k}" for k in range(8)]
    assert all(v is None for e, v in out if e.kind != ADMIT)
    assert max(seen_budget) <= budget and prefetcher.peak_bytes <= budget
    assert prefetcher.resident_bytes == 0 and prefetcher.in_flight_bytes == 0


def test_prefetch_runs_ahead_of_admission():
    """Loads of the next admissions start while the consumer still draws from earlier ones."""
    started: list[int] = []
    plan = _plan(list(range(6)), draws_between=5)
    prefetcher = Prefetcher(started.append, lambda k: 1, depth=2, threads=1)
    in_flight_at = []
    for event, loading in prefetcher.run(plan, _role):
        if loading is not None:
            loading.result()  # as the stream does before drawing from it
        in_flight_at.append(prefetcher.in_flight_bytes)
        if event == Ev(ADMIT, 1):
            # Admissions 2 and 3 are five draws and an eviction away, and already loading.
            assert prefetcher.in_flight_bytes == 2 and prefetcher.resident_bytes == 2
    assert started == list(range(6))
    assert max(in_flight_at) == 2
    assert prefetcher.peak_bytes == 4  # two resident plus two prefetched


def test_prefetch_error_surfaces_where_its_load_is_awaited_and_stops_the_pool():
    def load(key: int) -> int:
        if key == 3:
            raise ChecksumError("shard-3 (episode 3): checksum mismatch")
        return key

    prefetcher = Prefetcher(load, lambda k: 1, depth=4, threads=2)
    admitted = []
    with pytest.raises(ChecksumError, match=r"episode 3"):
        for event, value in prefetcher.run(_plan(list(range(6))), _role):
            if event.kind == ADMIT:
                admitted.append(value.result())
    assert admitted == [0, 1, 2]
    assert not [t for t in threading.enumerate() if t.name.startswith("lerobot-shards-fetch")]


def test_prefetch_closed_early_leaves_no_thread():
    gen: Iterator = Prefetcher(lambda k: k, lambda k: 1, depth=3).run(_plan(list(range(6))), _role)
    next(gen)
    gen.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("lerobot-shards-fetch")]


def test_prefetch_closed_on_one_of_its_own_fetch_threads():
    """A generator the garbage collector finalizes may be closed on a fetch thread: closing
    must not try to join that thread (``RuntimeError: cannot join current thread``)."""
    errors: list[BaseException] = []
    gen: Iterator
    suspended = threading.Event()  # the consumer is out of the generator: it may be closed

    def load(key: int) -> int:
        if key == 3:
            suspended.wait(30)
            try:
                gen.close()
            except BaseException as error:  # what closing raised is the finding
                errors.append(error)
        return key

    gen = Prefetcher(load, lambda k: 1, depth=3, threads=1).run(_plan(list(range(6))), _role)
    for event, value in gen:
        if event.kind == ADMIT and event.key == 2:
            value.result()
            break
    suspended.set()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(
        t.name.startswith("lerobot-shards-fetch") for t in threading.enumerate()
    ):
        time.sleep(0.05)
    assert errors == []
    assert not [t for t in threading.enumerate() if t.name.startswith("lerobot-shards-fetch")]


# ------------------------------------------------------------------------------ object store


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    from support.s3 import isolated_aws_env, running_s3_server

    with pytest.MonkeyPatch.context() as mp, running_s3_server() as server:
        for name, value in isolated_aws_env(
            server.endpoint_url, tmp_path_factory.mktemp("aws")
        ).items():
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, value)
        yield server


def test_s3_ranged_reads_through_faults(s3):
    bucket = s3.new_bucket()
    s3.filesystem(direct=True).pipe_file(f"{bucket}/shards/000/episode-000003.tar", PAYLOAD)
    fs = s3.filesystem()
    span = _span(f"{bucket}/shards/000/episode-000003.tar")
    s3.proxy.clear()
    assert read_span(fs, span) == PAYLOAD[1024:5120]
    gets = s3.proxy.requests("GET", path_contains="episode-000003")
    assert [(r.range, r.body_bytes) for r in gets] == [("bytes=1024-5119", 4096)]

    s3.proxy.set_faults(0.5, seed=1, methods=["GET"])
    try:
        for _ in range(5):
            assert read_span(fs, span, backoff_s=0.001) == PAYLOAD[1024:5120]
    finally:
        s3.proxy.set_faults(0.0)
    assert any(r.fault for r in s3.proxy.requests("GET"))
