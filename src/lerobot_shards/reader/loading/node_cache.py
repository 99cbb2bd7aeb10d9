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
from collections.abc import Sequence
from functools import partial

import fsspec

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

    def reader(self, part: Part, piece: int) -> SpanRead:
        """How piece ``piece`` of ``part`` is read: through the cache, at its admission."""
        return partial(self.read, part=part, piece=piece)

    def read(
        self, fs: fsspec.AbstractFileSystem, span: Span, *, retries: int, part: Part, piece: int
    ) -> bytes | memoryview:
        """Piece ``piece`` of ``part``'s bytes, through the cache, at the piece's admission."""
        now = self._admitted_at(part, piece)
        self._measure(now)
        schedule = self.schedule(part.epoch)
        episode = int(part.episodes[piece])
        keys = self.keys()

        def priority(key: str) -> float | None:  # None: another job's key, the store decides
            other = keys.get(key)
            return None if other is None else self._wall(schedule.next_use(other, now), now)

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
            self._schedules = {epoch: node_reads(parts)}  # the older epochs are past
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
        """Draw time ``when`` as a wall-clock time (``time.time()`` seconds); never: inf."""
        if when >= NEVER:
            return math.inf
        return time.time() + max(0, when - now) * self._pace
