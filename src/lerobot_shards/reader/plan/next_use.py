"""A node's future reads, from the plan: when each episode is fetched next on this node.

Why. A node-local cache of remote episodes (``reader/fetch/cache.py``) is shared by every rank
and DataLoader worker of the node. Caches that evict by recency keep little of a reshuffled
epoch; this reader knows its future instead: the order is a pure function of the seed, the
epoch and the layout, so every process of a node computes the same schedule of the node's
fetches (one per admission into a pool) and keeps what is read soonest (Belady's rule).

Time is counted in draws: a part's admission at its ``k``-th draw of epoch ``e`` happens at time
``e * samples + k``, ``samples`` being a part's samples per epoch. Parts advance in step (each
yields the same number of samples, and DDP and the DataLoader's round robin keep them together),
so one clock serves the whole node. Pure and numpy only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from lerobot_shards.reader.plan.pool import Admit, Draws, Event

NEVER = np.iinfo(np.int64).max
"""The next use of an episode the schedule does not read again."""


class NodeReads:
    """Every fetch of a node's parts over some epochs: ``episodes[i]`` at draw time
    ``times[i]``, sorted by time (ties in part order)."""

    def __init__(self, times: np.ndarray, episodes: np.ndarray) -> None:
        self.times = np.asarray(times, dtype=np.int64)
        self.episodes = np.asarray(episodes, dtype=np.int64)
        by_episode = np.argsort(self.episodes, kind="stable")  # each one's times ascending
        self._owners = self.episodes[by_episode]
        self._times = self.times[by_episode]

    def next_uses(self, episodes: np.ndarray, after: int) -> np.ndarray:
        """Each episode's first fetch at a time later than ``after`` (:data:`NEVER` if none)."""
        episodes = np.asarray(episodes, dtype=np.int64)
        lo = np.searchsorted(self._owners, episodes, side="left")
        hi = np.searchsorted(self._owners, episodes, side="right")
        out = np.full(len(episodes), NEVER, dtype=np.int64)
        for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
            k = a + int(np.searchsorted(self._times[a:b], after, side="right"))
            if k < b:
                out[i] = self._times[k]
        return out

    def next_use(self, episode: int, after: int) -> int:
        """``episode``'s first fetch later than ``after`` (:data:`NEVER` if none)."""
        return int(self.next_uses(np.asarray([episode]), after)[0])


def admissions(events: Iterable[Event]) -> tuple[np.ndarray, np.ndarray]:
    """``(draw positions, pieces)`` of a part plan's admissions: the fetches, in order."""
    positions, pieces, drawn = [], [], 0
    for event in events:
        if type(event) is Draws:
            drawn += len(event.pieces)
        elif type(event) is Admit:
            positions.append(drawn)
            pieces.append(event.piece)
    return np.asarray(positions, dtype=np.int64), np.asarray(pieces, dtype=np.int64)


def node_reads(parts: Sequence[tuple[int, np.ndarray, Iterable[Event]]]) -> NodeReads:
    """The node's schedule from its parts: ``(time of the part's first draw, the part's episode
    of each piece, the part's plan events)`` for each part of each epoch the schedule covers."""
    times, episodes = [], []
    for start, piece_episodes, events in parts:
        positions, pieces = admissions(events)
        times.append(positions + start)
        episodes.append(np.asarray(piece_episodes, dtype=np.int64)[pieces])
    if not times:
        empty = np.zeros(0, dtype=np.int64)
        return NodeReads(empty, empty)
    all_times, all_episodes = np.concatenate(times), np.concatenate(episodes)
    order = np.argsort(all_times, kind="stable")
    return NodeReads(all_times[order], all_episodes[order])


def belady_bytes(reads: np.ndarray, sizes: np.ndarray, limit: int) -> int:
    """Bytes a cache of ``limit`` bytes downloads over the read sequence ``reads`` (episode
    indices into ``sizes``) under Belady's rule: on a miss, the episode is kept if evicting
    what is read farthest in the future (and later than it) makes room.

    The offline yardstick for the online cache: the same rule with the whole future known, in
    the units and order the node's schedule reads. Byte sizes make the truly optimal policy a
    hard problem; this is the rule the cache follows, as the issue asks it to be measured."""
    reads = np.asarray(reads, dtype=np.int64)
    nxt = np.full(len(reads), NEVER, dtype=np.int64)
    last: dict[int, int] = {}
    for i in range(len(reads) - 1, -1, -1):
        e = int(reads[i])
        nxt[i] = last.get(e, NEVER)
        last[e] = i
    cached: dict[int, int] = {}  # episode -> its next read
    used = downloaded = 0
    for i, e in enumerate(reads.tolist()):
        if e in cached:
            cached[e] = int(nxt[i])
            continue
        size = int(sizes[e])
        downloaded += size
        mine = int(nxt[i])
        if mine == NEVER or size > limit:
            continue
        victims, room = [], limit - used
        for other, when in sorted(cached.items(), key=lambda kv: -kv[1]):
            if room >= size or when <= mine:
                break
            victims.append(other)
            room += int(sizes[other])
        if room < size:
            continue
        for other in victims:
            used -= int(sizes[other])
            del cached[other]
        cached[e] = mine
        used += size
    return downloaded
