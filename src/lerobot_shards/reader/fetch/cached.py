"""Episode spans read through the node-local cache: downloaded at most once while cached.

A hit is the cached file, mapped and verified against the manifest checksum (a changed file is
dropped with a warning and fetched again, never served). A miss is fetched as always
(``ranged.read_span``: retried, verified) and kept if the cache admits it: the caller says when
the episode is read next on this node and how soon every other cached episode is
(``reader/plan/next_use.py``), and the store keeps what is read soonest (Belady's rule). While
another process of the node downloads the same episode, this one waits for it rather than
downloading it twice.

The cache never stops training: a folder that cannot be written, a full disk or a broken
database makes the first failure a warning and every later read uncached.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import fsspec

from lerobot_shards.reader.fetch.cache import CacheStore, CacheUnavailable, Ready, Reservation, Wait
from lerobot_shards.reader.fetch.cache_files import network_filesystem
from lerobot_shards.reader.fetch.ranged import Span, read_span

log = logging.getLogger("lerobot_shards.reader.fetch")

WAIT_S = 600.0
"""How long a read waits for another process's download of the same episode before it reads
the episode itself (a download that slow has stalled or died)."""


class CachedReads:
    """Spans through one cache folder (``directory``, ``limit_bytes``), in any process: the
    store is opened on first use in each process (a forked worker opens its own)."""

    def __init__(self, directory: str | os.PathLike, limit_bytes: int | None) -> None:
        self.directory = Path(directory)
        self.limit_bytes = limit_bytes
        remote = network_filesystem(self.directory)
        if remote is not None:
            log.warning(
                "the episode cache %s is on a network filesystem (%s at %s): its SQLite "
                "database is unsafe across hosts and every hit is read over the network again; "
                "give it a folder on a local disk of each node (cache_dir=, --cache-dir or "
                "LEROBOT_SHARDS_CACHE_DIR, e.g. a node-local scratch disk or /tmp)",
                self.directory,
                *remote,
            )
        self._store: CacheStore | None = None
        self._pid: int | None = None
        self._broken = False
        self._opening = threading.Lock()

    def __getstate__(self) -> dict:
        state = {**self.__dict__, "_store": None, "_pid": None}
        del state["_opening"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _opening=threading.Lock())

    def store(self) -> CacheStore | None:
        """This process's store (opened by the first of its fetch threads to ask), or None
        once the cache has failed here (warned once)."""
        with self._opening:
            if not self._broken and self._pid != os.getpid():
                self._store, self._pid = None, os.getpid()
                try:
                    self._store = CacheStore(self.directory, self.limit_bytes)
                except CacheUnavailable as exc:
                    self._give_up(exc)
            return self._store

    def read(
        self,
        fs: fsspec.AbstractFileSystem,
        span: Span,
        *,
        retries: int,
        next_use: float,
        priority: Callable[[str], float | None],
        label: str,
    ) -> bytes | memoryview:
        """The span's verified bytes, from the cache or fetched (and cached if admitted).

        ``next_use``: when this node reads the episode again after this read (``time.time()``
        scale; ``math.inf``: never); ``priority(key)``: the same for any cached key this reader
        knows, None for a key that is not its own (another job's)."""
        store = self.store()
        if store is None:
            return read_span(fs, span, retries=retries)
        try:
            data = store.get(span.checksum, span.size)
            if data is not None:
                return data
            outcome = store.reserve(span.checksum, span.size, next_use, priority, label)
            if isinstance(outcome, Ready | Wait):
                if isinstance(outcome, Wait):
                    store.wait_ready(span.checksum, WAIT_S)
                data = store.get(span.checksum, span.size)
                return data if data is not None else read_span(fs, span, retries=retries)
        except CacheUnavailable as exc:
            self._give_up(exc)
            return read_span(fs, span, retries=retries)
        if not isinstance(outcome, Reservation):  # not admitted: read through
            return read_span(fs, span, retries=retries)
        try:
            data = read_span(fs, span, retries=retries)
        except BaseException:
            outcome.abort()
            raise
        try:
            outcome.commit(data)
        except CacheUnavailable as exc:
            self._give_up(exc)
        return data

    def _give_up(self, exc: Exception) -> None:
        """Warn once and stream uncached from now on in this process."""
        if not self._broken:
            log.warning(
                "the episode cache in %s cannot be used (%s); streaming uncached",
                self.directory,
                exc,
            )
        self._broken = True
        if self._store is not None:
            self._store.close()
            self._store = None
