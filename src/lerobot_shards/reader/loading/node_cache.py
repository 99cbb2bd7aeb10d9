"""A stream's side of the node-local cache: the node's schedule from the plan, and a clock.

``fetch/cached.py`` reads spans through the node's cache folder; it needs to know, for the
episode being read and for the cached episodes a miss may evict, when this node reads it next.
This module computes that from the plan (``plan/next_use.py``): the parts of every rank and
worker of this node, this epoch and the next, as the planner makes them in every process alike
(the rest of an epoch after an elastic resume included). Entries are cache keys, not episodes:
two episodes with the same bytes (a mixture's members over one dataset) are one entry, read
whenever either is. Times are draws (``epoch * samples + draw``); the store compares them across
processes and jobs as wall clock times, so they are turned into seconds at this process's
measured pace.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import fsspec
import numpy as np
from tqdm.auto import tqdm

from lerobot_shards.format import CHECKSUM_ALGO
from lerobot_shards.reader.fetch.cached import CachedReads
from lerobot_shards.reader.fetch.ranged import Span
from lerobot_shards.reader.meta.catalog import Catalog, SpanRead
from lerobot_shards.reader.plan.elastic import Checkpoint, Ordering, Part, Planner
from lerobot_shards.reader.plan.next_use import (
    NEVER,
    NodeReads,
    admission_times,
    residents_at,
    span_for,
)
from lerobot_shards.reader.plan.nodes import Nodes
from lerobot_shards.reader.plan.pool import admission_order

DEFAULT_SECONDS_PER_DRAW = 0.01
"""The pace a job's clock starts from, until one of its processes has measured its own."""
MEASURE_DRAWS = 4096
"""Draws over which a process measures its pace (and checks its job's clock against it)."""


class NodeSchedule:
    """When this node reads each cache entry, for one stream (one process's part).

    Args:
        reads: the cache the stream reads through.
        planner: the dataset's planner.
        ordering: the stream's order settings.
        num_parts: parts of an epoch over all ranks.
        nodes: the nodes fresh epochs are shared out over (``fresh_parts``).
        node_parts: the parts of this node's ranks and workers.
        catalog: the datasets read.
        origin: the checkpoint the stream's first epochs are the rest of (an elastic resume).
        start: ``(epoch, draws)`` where the stream starts.
        job: names the schedule in the cache (processes with one schedule share it).
    """

    def __init__(
        self,
        reads: CachedReads,
        planner: Planner,
        ordering: Ordering,
        num_parts: int,
        nodes: Nodes | int,
        node_parts: Sequence[int],
        catalog: Catalog,
        origin: Checkpoint | None = None,
        start: tuple[int, int] = (0, 0),
        job: str = "",
    ) -> None:
        self.reads = reads
        self._planner = planner
        self._ordering = ordering
        self._num_parts = num_parts
        self._nodes = nodes
        self._node_parts = list(node_parts)
        self._catalog = catalog
        self._origin = origin
        self._start = start
        self._job = job or _job_name(ordering, num_parts, nodes, node_parts, catalog)
        self._schedules: dict[int, NodeReads] = {}
        self._part_reads: dict[tuple, _PartReads] = {}
        self._by_epoch: dict[int, NodeReads] = {}
        self._per_epoch: int | None = None
        self._keys: KeyNumbers | None = None
        self._key_of_id: np.ndarray | None = None
        self._started: tuple[float, int] | None = None  # (monotonic clock, draw) of a reading
        self._clock: tuple[float, float] | None = None  # the job's (start, pace): _wall
        self.clock: Callable[[], tuple[int, int]] | None = None
        """Where the stream is, ``(epoch, draws)`` (set by the stream): a fetch runs ahead of
        the draws, and an entry read between the stream's time and the fetched piece's
        admission is still to come."""

    def reader(self, part: Part, piece: int) -> SpanRead:
        """How piece ``piece`` of ``part`` is read: through the cache, at its admission."""
        return partial(self.read, part=part, piece=piece)

    def read(
        self, fs: fsspec.AbstractFileSystem, span: Span, *, retries: int, part: Part, piece: int
    ) -> bytes | memoryview:
        """Piece ``piece`` of ``part``'s bytes, through the cache, at the piece's admission."""
        now = self._admitted_at(part, piece)
        self._keep_time(now)
        since = now if self.clock is None else min(now, self.time(*self.clock()))
        episode = int(part.episodes[piece])
        return self._through_cache(fs, span, retries, part.epoch, episode, now, since)

    def fill(self, epoch: int, threads: int, progress: bool = True) -> tuple[int, int]:
        """Download ahead what this node reads in the rest of ``epoch`` (from where the stream
        starts), soonest first, as far as the cache admits it, on ``threads`` threads:
        ``(episodes read, their bytes)``."""
        start = self.time(epoch, self._start[1] if self._start[0] == epoch else 0)
        first = self.schedule(epoch).first_reads(start, self.time(epoch + 1, 0))
        episodes = self._catalog.episodes
        keys = self.key(episodes)
        episode_of_key = dict(zip(keys[::-1].tolist(), episodes[::-1].tolist(), strict=True))

        def one(key: int) -> int:
            episode = episode_of_key[key]
            member, own = self._catalog.locate(episode)
            span = member.selection.span(own)
            self._through_cache(member.fs, span, 5, epoch, episode, start - 1, start)
            return span.size

        count = total = 0
        with (
            ThreadPoolExecutor(threads) as pool,
            tqdm(total=len(first), unit="episode", disable=not progress, desc="cache fill") as bar,
        ):
            for size in pool.map(one, first.tolist()):
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
        entries' next reads counted from ``since`` (reads not yet made)."""
        schedule = self.schedule(epoch)
        keys = self.keys()

        def priority(key: str) -> float | None:  # None: another job's key, the store decides
            other = keys.number(key)
            if other is None:
                return None
            return self._wall(schedule.next_use(other, since - 1), now)

        member, own = self._catalog.locate(episode)
        key = int(self.key(episode))
        return self.reads.read(
            fs,
            span,
            retries=retries,
            next_use=self._wall(schedule.next_use(key, now), now),
            priority=priority,
            label=f"{member.root} episode {own}",
            job=self._job,
        )

    def schedule(self, epoch: int) -> NodeReads:
        """The node's fetches over ``epoch`` and ``epoch + 1`` (each epoch's computed once)."""
        if epoch not in self._schedules:
            reads = self._epoch_reads(epoch).merge(self._epoch_reads(epoch + 1))
            # keep two: a part's end warms the next epoch up while its last fetches finish
            self._schedules = {e: s for e, s in self._schedules.items() if e >= epoch - 1}
            self._schedules[epoch] = reads
            self._by_epoch = {e: r for e, r in self._by_epoch.items() if e >= epoch - 1}
            self._part_reads = {k: v for k, v in self._part_reads.items() if k[0] >= epoch - 1}
        return self._schedules[epoch]

    def _epoch_reads(self, epoch: int) -> NodeReads:
        """The node's fetches in ``epoch``: every one of its parts'."""
        if epoch not in self._by_epoch:
            reads = [self._reads_of(part) for part in self._parts(epoch)]
            times = np.concatenate([r.times for r in reads]) if reads else np.zeros(0, np.int64)
            keys = np.concatenate([r.keys for r in reads]) if reads else np.zeros(0, np.int64)
            self._by_epoch[epoch] = NodeReads.of(times, keys, span_for(self.keys().count))
        return self._by_epoch[epoch]

    def time(self, epoch: int, draws: int) -> int:
        """The node's clock at a part's ``draws``-th draw of ``epoch``: fresh epochs last
        ``samples`` draws each; the rest of an epoch after an elastic resume ends where the
        epoch would have (its parts are shorter: the draws before were made before)."""
        return epoch * self._samples() + self._skipped(epoch) + draws

    def _parts(self, epoch: int) -> list[Part]:
        """This node's parts of ``epoch`` as the stream plans them."""
        if self._origin is not None:
            for parts in self._planner.segments(self._origin, self._ordering, self._num_parts):
                if parts[0].epoch == epoch:
                    return [parts[p] for p in self._node_parts]
        fresh = self._planner.fresh_parts(self._ordering, self._num_parts, epoch, self._nodes)
        return [fresh[p] for p in self._node_parts]

    def _skipped(self, epoch: int) -> int:
        """Draws of ``epoch`` made before its parts start (a rest's), on the node's clock."""
        parts = self._parts(epoch)
        if not parts or parts[0].positions is None:
            return 0
        return self._samples() - max(p.num_samples for p in parts)

    def _reads_of(self, part: Part) -> _PartReads:
        """A part's fetches on the node's clock (computed once per part). A part the stream
        starts inside refetches its pool's residents where it starts; what it read before is
        past."""
        cache_key = (part.epoch, part.entropy)
        if cache_key not in self._part_reads:
            order, draws = self._admissions(part)
            base = self.time(part.epoch, 0)
            at = np.full(len(part.episodes), base, dtype=np.int64)
            at[order] = draws + base
            epoch, start = self._start
            if part.epoch == epoch and start:
                again = residents_at(draws, self._ordering.buffer_size, start)
                at[order[again]] = base + start
                keep = again | (draws > start)
                order, draws = order[keep], np.where(again, start, draws)[keep]
            keys = self.key(part.episodes)[order]  # the pieces' episodes ascend: a fast lookup
            self._part_reads[cache_key] = _PartReads(draws + base, keys, at)
        return self._part_reads[cache_key]

    def _admissions(self, part: Part) -> tuple[np.ndarray, np.ndarray]:
        """``(pieces, draws)`` of a part's admissions, in order, at their estimated draws."""
        counts = part.table.counts
        order = admission_order(counts, part.entropy, self._ordering.shuffle)
        piece_bytes = None
        if self._ordering.byte_budget is not None:
            cost, pieces = (
                self._catalog.cost,
                zip(
                    part.episodes[order].tolist(),
                    part.starts[order].tolist(),
                    part.stops[order].tolist(),
                    strict=True,
                ),
            )
            piece_bytes = np.fromiter((cost(*p) for p in pieces), np.int64, len(order))
        times = admission_times(
            counts[order], self._ordering.buffer_size, piece_bytes, self._ordering.byte_budget
        )
        return order, times

    def keys(self) -> KeyNumbers:
        """The cache keys of the selected episodes (in ``catalog.episodes`` order), numbered."""
        if self._keys is None:
            digests = [member.selection.digests for member in self._catalog.members]
            self._keys = KeyNumbers(np.concatenate(digests or [np.zeros((0, 32), np.uint8)]))
        return self._keys

    def key(self, episodes: np.ndarray | int) -> np.ndarray:
        """The key numbers of global episode ids (a table indexed by id where the ids are
        dense enough, else a search)."""
        if self._key_of_id is None:
            ids, keys = self._catalog.episodes, self.keys().episodes
            top = int(ids.max()) + 1 if len(ids) else 0
            if top <= 4 * len(ids) + 1024:
                self._key_of_id = np.full(top, -1, dtype=np.int64)
                self._key_of_id[ids] = keys
            else:
                self._key_of_id = np.zeros(0, dtype=np.int64)
        if len(self._key_of_id):
            return self._key_of_id[episodes]
        return self.keys().episodes[np.searchsorted(self._catalog.episodes, episodes)]

    def _admitted_at(self, part: Part, piece: int) -> int:
        """The draw time of ``part``'s admission of ``piece`` (where the stream starts, for a
        piece resident there)."""
        return int(self._reads_of(part).at[piece])

    def _samples(self) -> int:
        """A fresh epoch's samples per part (every part yields as many with padding)."""
        if self._per_epoch is None:
            fresh = self._planner.fresh_parts(self._ordering, self._num_parts, 0, self._nodes)
            self._per_epoch = max((p.num_samples for p in fresh), default=0)
        return self._per_epoch

    def _keep_time(self, now: int) -> None:
        """The job's clock (``CachedReads.job_clock``), checked against this process's pace
        every :data:`MEASURE_DRAWS` draws."""
        wall = time.monotonic()
        if self._clock is None:
            self._clock = self.reads.job_clock(self._job, now, DEFAULT_SECONDS_PER_DRAW)
        if self._started is None or now < self._started[1]:
            self._started = (wall, now)
        elif now - self._started[1] >= MEASURE_DRAWS:
            pace = (wall - self._started[0]) / (now - self._started[1])
            self._clock = self.reads.job_clock(self._job, now, max(pace, 1e-9))
            self._started = (wall, now)

    def _wall(self, when: int, now: int) -> float:
        """Draw time ``when`` on the job's clock (``time.time()`` seconds); never: inf. One
        clock for every hint of the job keeps them in the order of its draws."""
        if when >= NEVER:
            return math.inf
        if self._clock is None:
            self._keep_time(now)
        start, pace = self._clock
        return start + when * pace


@dataclass(frozen=True)
class _PartReads:
    """A part's fetches: cache key ``keys[i]`` at node time ``times[i]``; piece ``p`` fetched
    at node time ``at[p]``."""

    times: np.ndarray
    keys: np.ndarray
    at: np.ndarray


class KeyNumbers:
    """Cache keys (checksums) as numbers: equal checksums one number, numbered in the order
    they first come. Made from the selections' 32-byte digests sorted as integers (a dict of a
    million checksum texts took 5 s in each DataLoader worker); where no two digests share
    their first eight bytes (every checksum its own) each episode's number is its position.

    Args:
        digests: each selected episode's checksum digest, an ``(n, 32)`` byte matrix.
    """

    def __init__(self, digests: np.ndarray) -> None:
        self._words = np.ascontiguousarray(digests, dtype=np.uint8).reshape(-1, 32).view("<u8")
        heads = self._words[:, 0].copy()
        order = np.argsort(heads)
        if not (heads[order][1:] == heads[order][:-1]).any():  # every checksum its own
            self.count = len(order)
            """How many distinct keys."""
            self.episodes = np.arange(len(order), dtype=np.int64)
            """Each selected episode's key number."""
            self._rows, self._numbers = order, order  # each key's row, sorted; its number
            self._heads = heads[order]
            return
        order = np.argsort(heads, kind="stable")
        ranked = self._words[order]
        differ = (ranked[1:] != ranked[:-1]).any(axis=1)
        if (differ & (ranked[1:, 0] == ranked[:-1, 0])).any():  # equal heads, other digests
            order = np.lexsort(self._words.T[::-1])  # every byte (stable, the first eight first)
            ranked = self._words[order]
            differ = (ranked[1:] != ranked[:-1]).any(axis=1)
        new = np.concatenate([[True], differ])
        firsts = order[new]  # each key's first episode (the sorts are stable)
        number = np.empty(len(firsts), np.int64)
        number[np.argsort(firsts, kind="stable")] = np.arange(len(firsts))
        self.count = len(firsts)
        self.episodes = np.empty(len(order), np.int64)
        self.episodes[order] = number[np.cumsum(new) - 1]
        self._rows, self._numbers = firsts, number
        self._heads = ranked[new, 0]

    def number(self, key: str) -> int | None:
        """The number of cache key ``key`` (a checksum's text); None if it is none of these."""
        algo, _, text = key.partition(":")
        if algo != CHECKSUM_ALGO or len(text) != 64:
            return None
        try:
            words = np.frombuffer(bytes.fromhex(text), "<u8")
        except ValueError:
            return None
        lo = int(np.searchsorted(self._heads, words[0], "left"))
        hi = int(np.searchsorted(self._heads, words[0], "right"))
        for at in range(lo, hi):
            if (self._words[self._rows[at]] == words).all():
                return int(self._numbers[at])
        return None


def _job_name(
    ordering: Ordering,
    num_parts: int,
    nodes: Nodes | int,
    node_parts: Sequence[int],
    catalog: Catalog,
) -> str:
    """What names a schedule in the cache: every process with the same order settings, layout,
    node and datasets computes the same schedule."""
    datasets = [(str(m.root), m.selection.fingerprint) for m in catalog.members]
    what = repr((ordering, num_parts, nodes, list(node_parts), datasets))
    return hashlib.sha256(what.encode()).hexdigest()[:16]
