"""A node's future reads, from the plan: when each episode is fetched next on this node.

Why. A node-local cache of remote episodes (``reader/fetch/cache.py``) is shared by every rank
and DataLoader worker of the node. Caches that evict by recency keep little of a reshuffled
epoch; this reader knows its future instead: the order is a pure function of the seed, the
epoch and the layout, so every process of a node computes the same schedule of the node's
fetches (one per admission into a pool) and keeps what is read soonest (Belady's rule).

Time is counted in draws: a part's admission at its ``k``-th draw of epoch ``e`` happens at time
``e * samples + k``, ``samples`` being a part's samples per epoch. Parts advance in step (each
yields the same number of samples, and DDP and the DataLoader's round robin keep them together),
so one clock serves the whole node.

What is exact and what is estimated. Which pieces a part admits, and in which order, is exact:
the pool's shuffle of its pieces (``pool.admission_order``). When each admission happens would
take a replay of every draw of every part of the node (a million episodes: 150 million draws,
minutes per process and epoch), so it is estimated from the frames alone, in time proportional
to the pieces: a pool of ``B`` residents drawn uniformly empties them at one frame per draw, so
piece ``j`` (``j >= B``) joins when the frames of the pieces before it are drawn but for about
half of the last ``B`` pieces' (:func:`admission_times`). Within a part the order of its reads is
therefore exact, across epochs too; between parts of a node the estimate decides, and a cache
only needs which of two reads comes first.

Pure and numpy only.
"""

from __future__ import annotations

import numpy as np

NEVER = np.iinfo(np.int64).max
"""The next use of an episode the schedule does not read again."""


def admission_times(
    counts: np.ndarray,
    buffer_size: int,
    piece_bytes: np.ndarray | None = None,
    byte_budget: int | None = None,
) -> np.ndarray:
    """Estimated draw at which each of a part's admissions happens, ``counts[j]`` being the
    frames of the ``j``-th piece admitted (``pool.admission_order``).

    The pool holds at most ``buffer_size`` pieces (and, with a ``byte_budget``, pieces of at
    most that many bytes): the first ones that fit join at draw 0; any later piece ``j`` joins
    once the pool has room, when the pieces up to ``g`` have left (``j - buffer_size``, or
    later where the budget holds fewer) and about half of the frames of those still resident
    are drawn: ``(F[g + 1] + F[j]) / 2``, ``F[i]`` being the frames of the pieces before
    ``i``. Non-decreasing in ``j``, so a part's reads keep their exact order."""
    counts = np.asarray(counts, dtype=np.int64)
    n = len(counts)
    frames = np.concatenate([[0], np.cumsum(counts)])
    gone = np.arange(n, dtype=np.int64) - buffer_size  # the last piece that has left by then
    if byte_budget is not None and piece_bytes is not None:
        spent = np.concatenate([[0], np.cumsum(np.asarray(piece_bytes, dtype=np.int64))])
        first = np.searchsorted(spent, spent[1:] - byte_budget, side="left")  # oldest fitting
        gone = np.maximum(gone, first - 1)
    times = (frames[np.maximum(gone + 1, 0)] + frames[:n]) // 2
    times[gone < 0] = 0
    return np.maximum.accumulate(times) if n else times


def residents_at(times: np.ndarray, buffer_size: int, start: int) -> np.ndarray:
    """Which admissions (of :func:`admission_times`) are still resident at draw ``start``:
    joined by then, and the one ``buffer_size`` after each not joined yet. A part resumed at
    ``start`` fetches these again then."""
    times = np.asarray(times, dtype=np.int64)
    joined = times <= start
    later = np.concatenate([times[buffer_size:], np.full(min(buffer_size, len(times)), NEVER)])
    return joined & (later > start)


class NodeReads:
    """Every fetch of a node's parts over some epochs: entry ``key`` at draw time ``time``,
    kept as one sorted array of ``key * span + time`` (each key's times ascending), so a next
    use is one binary search and two epochs' reads merge in linear time."""

    def __init__(self, reads: np.ndarray, span: int) -> None:
        self._reads = reads
        self._span = span

    @classmethod
    def of(cls, times: np.ndarray, keys: np.ndarray, span: int) -> NodeReads:
        """The reads ``keys[i]`` at ``times[i]`` (``0 <= time < span``)."""
        times = np.asarray(times, dtype=np.int64)
        if len(times) and (times.min() < 0 or times.max() >= span):
            raise ValueError(f"draw times must lie in 0..{span - 1}")
        return cls(np.sort(np.asarray(keys, dtype=np.int64) * span + times), span)

    def merge(self, other: NodeReads) -> NodeReads:
        """These reads and ``other``'s (two sorted runs: merged, not sorted anew)."""
        both = np.concatenate([self._reads, other._reads])
        return NodeReads(np.sort(both, kind="stable"), self._span)

    def next_use(self, key: int, after: int) -> int:
        """``key``'s first fetch later than ``after`` (:data:`NEVER` if none)."""
        span = self._span
        at = int(np.searchsorted(self._reads, key * span + max(after, -1), side="right"))
        if at < len(self._reads) and int(self._reads[at]) // span == key:
            return int(self._reads[at]) % span
        return NEVER

    def first_reads(self, since: int, until: int) -> np.ndarray:
        """The keys read in ``since <= time < until``, in the order of their first read then."""
        keys, times = np.divmod(self._reads, self._span)
        window = (times >= since) & (times < until)
        keys, times = keys[window], times[window]
        first = np.unique(keys, return_index=True)[1]  # each key's earliest (times ascending)
        return keys[first[np.argsort(times[first], kind="stable")]]


def span_for(keys: int) -> int:
    """The ``span`` of :class:`NodeReads` over ``keys`` entries: the most draws an int64 keeps
    beside the key number."""
    return 1 << (62 - max(1, int(keys)).bit_length())


def belady_bytes(reads: np.ndarray, sizes: np.ndarray, limit: int) -> int:
    """Bytes a cache of ``limit`` bytes downloads over the read sequence ``reads`` (episode
    indices into ``sizes``) under Belady's rule: on a miss, the episode is kept if evicting
    what is read farthest in the future (and later than it) makes room.

    The offline form of the rule the cache follows, in the units and order the node's schedule
    reads. With episodes of one size it is the optimum (Belady); with sizes that differ the
    optimum is a hard problem and this rule may download more than it (tests/
    test_cache_optimum.py measures by how much on small cases against an exact search)."""
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
