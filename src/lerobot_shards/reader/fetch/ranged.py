"""Episode byte spans from any fsspec filesystem: verified, retried, prefetched within a budget.

One ranged read per episode (the manifest's ``offset`` and ``size`` inside its shard), checked
against the manifest checksum. Object stores fail transiently (resets, 5xx, timeouts, short
bodies), so a read is retried with exponential backoff before it becomes an error that names
the shard and the episode. A checksum mismatch is retried too, from the same budget: a torn
read gives different wrong bytes each time, while a corrupt shard gives the same wrong bytes
twice, which ends the retries at once as corruption. Every retry is logged (a warning of the
``lerobot_shards.reader.fetch.ranged`` logger), so flaky storage shows.

:class:`Prefetcher` runs the loading of the next admissions of a plan (fetch and demux) in a
small thread pool while the consumer draws from the resident episodes, so the stream rarely
waits on I/O, and keeps what is resident plus in flight within the byte budget.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, NamedTuple, TypeVar

import fsspec
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.format import FormatError, checksum
from lerobot_shards.reader.fetch import mapped

log = logging.getLogger("lerobot_shards.reader.fetch")  # the fetch package's logger, as documented

E = TypeVar("E")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_END = object()
FETCH_THREAD = "lerobot-shards-fetch"

# Errors that say the path is wrong, not that the network hiccupped: retrying cannot help.
_PERMANENT = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)
# Client libraries under fsspec backends whose errors are network trouble (checked by module
# name so none of them has to be installed).
_TRANSIENT_MODULES = ("aiohttp", "botocore", "aiobotocore", "urllib3", "requests", "http")


CHECKED_SPAN_BYTES = 64 * 2**20
"""Spans larger than this are checked against the shard's size before they are read (a local
read allocates what the span asks for, whatever the file holds)."""


class FetchError(OSError):
    """An episode's bytes could not be read, even after retries."""


class SpanError(FormatError):
    """An episode's span ends past the end of its shard."""


class RangeIgnoredError(FormatError):
    """The server answered a byte range with more bytes than asked (it ignores ``Range``)."""


class ChecksumError(FormatError):
    """An episode's bytes do not match the manifest checksum: the shard is corrupt."""


class Span(NamedTuple):
    """Where an episode's bytes are and what they must hash to."""

    episode: int
    path: str
    """Full path or URL of the shard, for the filesystem."""
    offset: int
    size: int
    checksum: str


def is_transient(exc: BaseException) -> bool:
    """Whether a failed read is worth retrying (network and server trouble, short reads)."""
    if isinstance(exc, _PERMANENT):
        return False
    if isinstance(exc, OSError | TimeoutError | asyncio.TimeoutError):
        return True
    if isinstance(exc, fsspec.exceptions.FSTimeoutError):
        return True
    return type(exc).__module__.split(".")[0] in _TRANSIENT_MODULES


def read_span(
    fs: fsspec.AbstractFileSystem,
    span: Span,
    *,
    retries: int = 5,
    backoff_s: float = 0.05,
    max_backoff_s: float = 5.0,
) -> bytes | memoryview:
    """Read and verify one episode's bytes with a single ranged read (plus retries); a local
    shard's are mapped, not read (``mapped.py``).

    Transient errors and checksum mismatches are retried ``retries`` times in all, sleeping
    ``backoff_s * 2**attempt`` (capped) in between; two reads with the same wrong checksum are
    a corrupt shard, not retried further. Errors name the shard and the episode.
    """
    where = f"{span.path} (episode {span.episode})"
    if span.size > CHECKED_SPAN_BYTES:  # before a read that would allocate all of it
        _check_span_fits(fs, span, where)
    wrong: list[str] = []  # checksums of the reads that did not match, in order
    attempt = 0
    while True:
        try:
            data = _read(fs, span)
            if len(data) > span.size:  # retrying cannot help: refused at once
                raise RangeIgnoredError(
                    f"{where}: asked for the {span.size} bytes at offset {span.offset}, the "
                    f"server sent {len(data)}: it ignores byte ranges (a static server without "
                    "range support answers with the whole file), and only the whole-shard "
                    "spans the converter writes can be read from it"
                )
            if len(data) != span.size:
                _check_span_fits(fs, span, where)  # a shard shorter than its span: no retry
                raise FetchError(
                    f"{where}: short read, {len(data)} of {span.size} bytes at offset {span.offset}"
                )
        except (RangeIgnoredError, SpanError):
            raise
        except Exception as exc:
            if not is_transient(exc):
                raise FetchError(f"{where}: cannot read the episode's bytes: {exc!r}") from exc
            if attempt >= retries:
                raise FetchError(
                    f"{where}: reading bytes {span.offset}..{span.offset + span.size} failed "
                    f"{attempt + 1} times, last error: {exc!r}"
                ) from exc
            problem = repr(exc)
        else:
            got = checksum(data)
            if got == span.checksum:
                return data
            if got in wrong:
                raise ChecksumError(
                    f"{where}: checksum mismatch, the manifest says {span.checksum} but the "
                    f"{span.size} bytes at offset {span.offset} hash to {got} (read twice): "
                    "the shard is corrupt"
                )
            wrong.append(got)
            if attempt >= retries:
                raise ChecksumError(
                    f"{where}: checksum mismatch on {len(wrong)} reads of the {span.size} bytes "
                    f"at offset {span.offset}, each different (torn reads: the storage or the "
                    f"network garbles them); the manifest says {span.checksum}"
                )
            problem = f"checksum mismatch ({got})"
        attempt += 1
        _back_off(where, problem, attempt, retries, backoff_s, max_backoff_s)


def _read(fs: fsspec.AbstractFileSystem, span: Span) -> bytes | memoryview:
    """The span's bytes: from a local shard mapped (``mapped.py`` says why), else read."""
    if isinstance(fs, LocalFileSystem) and mapped.enabled():
        view = mapped.map_span(fs._strip_protocol(span.path), span.offset, span.size)
        if view is not None:
            return view
    return fs.cat_file(span.path, start=span.offset, end=span.offset + span.size)


def _check_span_fits(fs: fsspec.AbstractFileSystem, span: Span, where: str) -> None:
    """Refuse a span that ends past its shard's end (a manifest that lies about it)."""
    shard_size = fs.size(span.path)
    if span.offset + span.size > shard_size:
        raise SpanError(
            f"{where}: the manifest's span ends at byte {span.offset + span.size}, the shard "
            f"has {shard_size}"
        )


def _back_off(
    where: str, problem: str, attempt: int, retries: int, backoff_s: float, max_backoff_s: float
) -> None:
    """Log retry ``attempt`` (from 1) of ``retries`` and sleep ``backoff_s * 2**(attempt - 1)``,
    at most ``max_backoff_s``: one schedule for every read the reader retries."""
    delay = min(max_backoff_s, backoff_s * 2 ** (attempt - 1))
    log.warning("%s: %s; retry %d of %d in %.2f s", where, problem, attempt, retries, delay)
    time.sleep(delay)


def retry_transient(
    call: Callable[[], V],
    where: str,
    *,
    retries: int = 5,
    backoff_s: float = 0.05,
    max_backoff_s: float = 5.0,
) -> V:
    """``call()``, retried on transient errors as an episode's read is (logged, backing off).

    A flaky store fails a dataset's small metadata files as it fails episodes, and with
    botocore's retries off nothing below retries a 500 (:class:`RetryingReads`)."""
    attempt = 0
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if attempt >= retries:
                raise FetchError(
                    f"{where}: failed {attempt + 1} times, last error: {exc!r}"
                ) from exc
            attempt += 1
            _back_off(where, repr(exc), attempt, retries, backoff_s, max_backoff_s)


class RetryingReads:
    """A filesystem whose ``cat_file`` retries transient errors (:func:`retry_transient`), each
    read on its own: what a dataset's ``index.json``, manifest and ``meta/`` are read through
    when it is opened. Everything else is the filesystem's."""

    def __init__(self, fs: fsspec.AbstractFileSystem, retries: int = 5) -> None:
        self.fs = fs
        self.retries = retries

    def cat_file(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        return retry_transient(
            lambda: self.fs.cat_file(path, start=start, end=end), path, retries=self.retries
        )

    def __getattr__(self, name: str) -> object:
        return getattr(self.fs, name)


ADMIT = "admit"
EVICT = "evict"


class Prefetcher(Generic[K, V]):
    """Load the pieces a plan admits, ahead of time, in a thread pool, within a byte budget.

    ``load(key)`` does the work (fetch and demux); ``size(key)`` is what the piece costs
    against ``byte_budget``. :meth:`run` walks a plan's events, looks ahead for the next
    ``depth`` admissions and starts loading each while resident plus in-flight bytes stay within
    the budget. Loads start in admission order and stop at the first that does not fit, so the
    next admission the plan makes always fits once the plan's own evictions are done: the
    lookahead never deadlocks and never exceeds the budget.
    """

    def __init__(
        self,
        load: Callable[[K], V],
        size: Callable[[K], int],
        *,
        byte_budget: int | None = None,
        depth: int = 2,
        threads: int = 2,
        lookahead_events: int = 1 << 16,
    ) -> None:
        self._load = load
        self._size = size
        self._budget = byte_budget
        self._depth = max(0, depth)
        self._threads = max(1, threads)
        self._max_events = lookahead_events
        self._futures: dict[K, Future[V]] = {}
        self.resident_bytes = 0
        """Bytes of pieces the plan has admitted and not yet evicted."""
        self.in_flight_bytes = 0
        """Bytes of pieces loading (or loaded) ahead of their admission."""
        self.peak_bytes = 0
        """Most resident plus in-flight bytes seen."""

    def run(
        self, events: Iterable[E], role: Callable[[E], tuple[str | None, K]]
    ) -> Iterator[tuple[E, Future[V] | None]]:
        """Yield ``(event, the load's Future if it is an admission else None)`` in plan order.

        ``role(event)`` is ``(ADMIT, key)``, ``(EVICT, key)`` or ``(None, key)`` for a draw.
        An admission is yielded as soon as its load has started, not when it is done: the
        consumer waits for a piece only when it first needs it, so draws from pieces already
        loaded go on while the rest of a filling pool loads.
        """
        pool = ThreadPoolExecutor(self._threads, thread_name_prefix=FETCH_THREAD)
        window: deque[tuple[E, str | None, K]] = deque()
        upcoming: deque[K] = deque()  # keys of the admissions in the window, in order
        source = iter(events)
        exhausted = False
        try:
            while True:
                while not exhausted and len(upcoming) <= self._depth:
                    if len(window) >= self._max_events:
                        break
                    event = next(source, _END)
                    if event is _END:
                        exhausted = True
                        break
                    kind, key = role(event)
                    window.append((event, kind, key))
                    if kind == ADMIT:
                        upcoming.append(key)
                if not window:
                    return
                event, kind, key = window.popleft()
                if kind == ADMIT:
                    upcoming.popleft()
                    future = self._admit(pool, key)
                    self._schedule(pool, upcoming)  # the next ones load while this one finishes
                    yield event, future
                else:
                    if kind == EVICT:
                        self.resident_bytes -= self._size(key)
                    self._schedule(pool, upcoming)
                    yield event, None
        finally:
            for future in self._futures.values():
                future.cancel()
            self._futures.clear()
            # A generator left to the garbage collector may be closed on one of the fetch
            # threads, which cannot join itself: it then leaves the loads running to finish.
            in_fetch_thread = threading.current_thread().name.startswith(FETCH_THREAD)
            pool.shutdown(wait=not in_fetch_thread, cancel_futures=True)

    def _schedule(self, pool: ThreadPoolExecutor, upcoming: deque[K]) -> None:
        for n, key in enumerate(upcoming):
            if n >= self._depth:
                return
            if key in self._futures:
                continue
            size = self._size(key)
            if self._budget is not None and (
                self.resident_bytes + self.in_flight_bytes + size > self._budget
            ):
                return
            self._futures[key] = pool.submit(self._load, key)
            self.in_flight_bytes += size
            self._note_peak()

    def _admit(self, pool: ThreadPoolExecutor, key: K) -> Future[V]:
        """The admitted piece's load: prefetched, or started now (it fits: the plan says so)."""
        size = self._size(key)
        future = self._futures.pop(key, None)
        if future is None:
            future = pool.submit(self._load, key)
        else:
            self.in_flight_bytes -= size
        self.resident_bytes += size
        self._note_peak()
        return future

    def _note_peak(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.resident_bytes + self.in_flight_bytes)
