"""A stream's side of the node-local cache: the node's schedule from the plan, and a clock.

``fetch/cached.py`` reads spans through the node's cache folder; it needs to know, for the
episode being read and for every episode cached, when this node reads it next. This module
computes that from the plan (``plan/next_use.py``): the fresh parts of every rank and worker of
this node, this epoch and the next, as the planner makes them in every process alike. Times are
draws (``epoch * samples + draw``); the store compares them across processes and jobs as wall
clock times, so they are turned into seconds at this process's measured pace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import fsspec
from tqdm.auto import tqdm

from lerobot_shards.reader.fetch.cached import CachedReads
from lerobot_shards.reader.fetch.ranged import Span
from lerobot_shards.reader.meta.catalog import Catalog, SpanRead
from lerobot_shards.reader.plan.elastic import Ordering, Part, Planner
from lerobot_shards.reader.plan.next_use import NEVER, NodeReads, admissions, node_reads

DEFAULT_SECONDS_PER_DRAW = 0.01
"""The pace assumed until this process has measured its own."""


class NodeSchedule:
    """When this node reads each episode, for one stream (one process's part)."""

    def __init__(
        self,
        reads: CachedReads,
        planner: Planner,
        ordering: Ordering,
        num_parts: int,
        nodes: int,
        node_parts: Sequence[int],
        catalog: Catalog,
    ) -> None:
        self.reads = reads
        self._planner = planner
        self._ordering = ordering
        self._num_parts = num_parts
        self._nodes = nodes
        self._node_parts = list(node_parts)
        self._catalog = catalog
        self._schedules: dict[int, NodeReads] = {}
        self._own: dict[int, dict[int, int]] = {}  # id(part) -> piece -> draw time
        self._keys: dict[str, int] | None = None
        self._started: tuple[float, int] | None = None  # (wall clock, draw time) of a first read
        self._pace = DEFAULT_SECONDS_PER_DRAW
        self.clock: Callable[[], int] | None = None
        """The stream's draw time (set by the stream): a fetch runs ahead of the draws, and an
        entry read between the stream's time and the fetched piece's admission is still to
        come."""

    def reader(self, part: Part, piece: int) -> SpanRead:
        """How piece ``piece`` of ``part`` is read: through the cache, at its admission."""
        return partial(self.read, part=part, piece=piece)

    def read(
        self, fs: fsspec.AbstractFileSystem, span: Span, *, retries: int, part: Part, piece: int
    ) -> bytes | memoryview:
        """Piece ``piece`` of ``part``'s bytes, through the cache, at the piece's admission."""
        now = self._admitted_at(part, piece)
        self._measure(now)
        since = now if self.clock is None else min(now, self.clock())  # reads still to come
        episode = int(part.episodes[piece])
        return self._through_cache(fs, span, retries, part.epoch, episode, now, since)

    def fill(self, epoch: int, threads: int, progress: bool = True) -> tuple[int, int]:
        """Download ahead what this node reads in ``epoch``, soonest first, as far as the cache
        admits it, on ``threads`` threads: ``(episodes read, their bytes)``."""
        fresh = self._planner.fresh_parts(self._ordering, self._num_parts, epoch, self._nodes)
        start = epoch * self._samples(fresh)
        schedule = self.schedule(epoch)
        first: dict[int, None] = {}  # the epoch's episodes in the order of their first read
        for when, episode in zip(schedule.times.tolist(), schedule.episodes.tolist(), strict=True):
            if when < start + self._samples(fresh):
                first.setdefault(episode, None)

        def one(episode: int) -> int:
            member, own = self._catalog.locate(episode)
            span = member.selection.span(own)
            self._through_cache(member.fs, span, 5, epoch, episode, start - 1, start)
            return span.size

        count = total = 0
        with (
            ThreadPoolExecutor(threads) as pool,
            tqdm(total=len(first), unit="episode", disable=not progress, desc="cache fill") as bar,
        ):
            for size in pool.map(one, first):
                count, total = count + 1, total + size
                bar.update()
        return count, total

    def _through_cache(
        self,
        fs: fsspec.AbstractFileSystem,
        span: Span,
        retries: int,
        epoch: int,
        episode: int,
        now: int,
        since: int,
    ) -> bytes | memoryview:
        """``episode``'s span read at draw time ``now`` through the cache; the other cached
        episodes' next reads counted from ``since`` (reads not yet made)."""
        schedule = self.schedule(epoch)
        keys = self.keys()

        def priority(key: str) -> float | None:  # None: another job's key, the store decides
            other = keys.get(key)
            if other is None:
                return None
            return self._wall(schedule.next_use(other, since - 1), now)

        member, own = self._catalog.locate(episode)
        return self.reads.read(
            fs,
            span,
            retries=retries,
            next_use=self._wall(schedule.next_use(episode, now), now),
            priority=priority,
            label=f"{member.root} episode {own}",
        )

    def schedule(self, epoch: int) -> NodeReads:
        """The node's fetches over ``epoch`` and ``epoch + 1`` (computed once per epoch)."""
        if epoch not in self._schedules:
            parts = []
            for e in (epoch, epoch + 1):
                fresh = self._planner.fresh_parts(self._ordering, self._num_parts, e, self._nodes)
                for p in self._node_parts:
                    part = fresh[p]
                    start = e * self._samples(fresh)
                    parts.append((start, part.episodes, part.plan(self._ordering, self._cost)))
            # keep two: a part's end warms the next epoch up while its last fetches finish
            self._schedules = {e: s for e, s in self._schedules.items() if e >= epoch - 1}
            self._schedules[epoch] = node_reads(parts)
        return self._schedules[epoch]

    def keys(self) -> dict[str, int]:
        """Global episode id of each of the catalog's checksums (a cache entry's key)."""
        if self._keys is None:
            self._keys = {}
            for member, episodes in zip(
                self._catalog.members, self._catalog.episodes_of, strict=True
            ):
                self._keys.update(zip(member.selection.checksums, episodes.tolist(), strict=True))
        return self._keys

    def _admitted_at(self, part: Part, piece: int) -> int:
        """The draw time of ``part``'s admission of ``piece`` (a resumed part's too)."""
        own = self._own.get(id(part))
        if own is None:
            positions, pieces = admissions(part.plan(self._ordering, self._cost))
            start = part.epoch * part.num_samples
            own = {int(k): int(p) + start for p, k in zip(positions, pieces, strict=True)}
            self._own = {id(part): own}
        return own.get(piece, part.epoch * part.num_samples)

    def _samples(self, parts: Sequence[Part]) -> int:
        return max((p.num_samples for p in parts), default=0)

    def _cost(self, episode: int, start: int, stop: int) -> int:
        return self._catalog.cost(episode, start, stop)

    def _measure(self, now: int) -> None:
        """This process's seconds per draw, from its first read to this one."""
        wall = time.monotonic()
        if self._started is None:
            self._started = (wall, now)
        elif now - self._started[1] >= 64:
            self._pace = (wall - self._started[0]) / (now - self._started[1])

    def _wall(self, when: int, now: int) -> float:
        """Draw time ``when`` as a wall-clock time (``time.time()`` seconds; ``now`` is the
        present), never: inf. Times before ``now`` keep their order below it."""
        if when >= NEVER:
            return math.inf
        return time.time() + (when - now) * self._pace
