"""Split the selected frames into disjoint parts, one per (rank, DataLoader worker).

Pure and numpy only: the parts are a function of the frame counts, the seed, the epoch and the
number of parts. Every frame lands in exactly one part and part sizes differ by at most one
frame, so with padding every part yields the same number of samples and DDP never waits on a
rank that ran out early.

With node affinity (:func:`split_nodes`) the frames are first cut into one share per node, the
same every epoch and in proportion to the node's parts (nodes may hold unequal numbers of
ranks), and each node's share is then split over that node's parts.

A part is a sequence of :class:`Piece` (a frame range of one episode). Parts are returned as
:class:`Pieces`, an array-backed sequence: a million-episode manifest would cost over a second
as a list of Python objects, and the planner reads the arrays directly.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np

# Entropy word that keeps the split's random stream apart from every pool's
# ([seed, epoch] or [seed, epoch, part]); part indices never reach it.
_SPLIT_STREAM = 0xFFFF_FFFF
# Entropy word of the node order ([seed, word]) and of each node's split ([seed, epoch, word,
# nodes, node, parts per node]): apart from the split's, the rest's, the cycles' and the pools'.
_NODE_STREAM = 0xFFFF_FFFC


@dataclass(frozen=True, slots=True)
class Piece:
    """Frames ``start <= f < stop`` (positions within the episode) of one episode."""

    episode: int
    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start


class Pieces(Sequence[Piece]):
    """An immutable sequence of pieces stored as three int64 arrays.

    Indexing gives :class:`Piece` objects; ``episodes``, ``starts``, ``stops`` and ``counts``
    give the arrays. Compares equal to any sequence of the same pieces (a list included).
    """

    __slots__ = ("episodes", "starts", "stops")

    def __init__(self, episodes: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> None:
        self.episodes = np.asarray(episodes, dtype=np.int64)
        self.starts = np.asarray(starts, dtype=np.int64)
        self.stops = np.asarray(stops, dtype=np.int64)
        if not (self.episodes.shape == self.starts.shape == self.stops.shape):
            raise ValueError("episodes, starts and stops must have the same length")
        if self.episodes.ndim != 1:
            raise ValueError("episodes, starts and stops must be one-dimensional")
        if np.any(self.stops < self.starts) or np.any(self.starts < 0):
            raise ValueError("every piece needs 0 <= start <= stop")

    @classmethod
    def of(cls, pieces: Sequence[Piece]) -> Pieces:
        """The same pieces as arrays (a no-op for a :class:`Pieces`)."""
        if isinstance(pieces, Pieces):
            return pieces
        return cls(
            np.fromiter((p.episode for p in pieces), np.int64, len(pieces)),
            np.fromiter((p.start for p in pieces), np.int64, len(pieces)),
            np.fromiter((p.stop for p in pieces), np.int64, len(pieces)),
        )

    @property
    def counts(self) -> np.ndarray:
        return self.stops - self.starts

    def __len__(self) -> int:
        return len(self.episodes)

    @overload
    def __getitem__(self, index: int) -> Piece: ...
    @overload
    def __getitem__(self, index: slice) -> Pieces: ...
    def __getitem__(self, index: int | slice) -> Piece | Pieces:
        if isinstance(index, slice):
            return Pieces(self.episodes[index], self.starts[index], self.stops[index])
        return Piece(int(self.episodes[index]), int(self.starts[index]), int(self.stops[index]))

    def __iter__(self) -> Iterator[Piece]:
        return map(Piece, self.episodes.tolist(), self.starts.tolist(), self.stops.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        if len(other) != len(self):
            return False
        if not isinstance(other, Pieces) and not all(isinstance(p, Piece) for p in other):
            return False
        other = Pieces.of(other)
        return (
            np.array_equal(self.episodes, other.episodes)
            and np.array_equal(self.starts, other.starts)
            and np.array_equal(self.stops, other.stops)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(p) for p in self[:3])
        more = f", ... {len(self) - 3} more" if len(self) > 3 else ""
        return f"Pieces([{shown}{more}])"


def split_parts(
    episodes: np.ndarray,
    lengths: np.ndarray,
    num_parts: int,
    *,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[Pieces]:
    """Split the selected frames into ``num_parts`` disjoint parts that together hold every frame.

    The episodes with at least one frame are laid end to end in a seeded order (ascending with
    ``shuffle=False``; the permutation comes from ``default_rng([seed, epoch, 2**32-1,
    num_parts])``, a stream no pool uses) and the resulting frame sequence is cut into
    ``num_parts`` contiguous ranges whose sizes differ by at most one frame (the first
    ``total % num_parts`` parts hold one more). So at most ``num_parts - 1`` episodes are cut and
    each part is a few whole episodes plus at most two pieces. Each part's pieces are sorted by
    episode. ``num_parts == 1`` gives every episode whole, sorted by episode, whatever ``shuffle``.
    With ``shuffle=False`` part ``p`` holds a contiguous range of the global frame order.
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}")
    episodes, lengths = _checked(episodes, lengths)[:2]
    if num_parts == 1:
        return [Pieces(episodes, np.zeros_like(lengths), lengths)]
    order = None
    if shuffle:
        rng = np.random.default_rng([seed, epoch, _SPLIT_STREAM, num_parts])
        order = rng.permutation(len(episodes))
    return _cut_whole(episodes, lengths, order, num_parts)


def split_part(
    lengths: np.ndarray, num_parts: int, part: int, *, seed: int, epoch: int, shuffle: bool = True
) -> Pieces:
    """``split_parts(np.arange(len(lengths)), lengths, ...)[part]``, computed alone: what one
    DataLoader worker streams, without the other parts. Every length must be at least 1.

    The order is the same permutation (an int32 one: half the bytes), and the part's ends are
    found a block of the order at a time, so what is allocated beyond the permutation is the
    part's own pieces: a worker of 32 parts of a million episodes holds a thirty-second of
    them, not every part's."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    if not 0 <= part < num_parts:
        raise ValueError(f"part {part} is not one of {num_parts}")
    if num_parts == 1:
        return Pieces(np.arange(n), np.zeros(n, np.int64), lengths)
    order = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    if shuffle:
        np.random.default_rng([seed, epoch, _SPLIT_STREAM, num_parts]).shuffle(order)
    total = int(lengths.sum())
    sizes = samples_per_part(total, num_parts, pad=False)
    lo = sum(sizes[:part])
    hi = lo + sizes[part]
    # first: episodes ending at or before lo; last: one past the last beginning before hi
    first = last = 0
    ends: dict[int, int] = {}  # ends[at] of the two episodes that may be cut
    begun = 0
    for block in range(0, n, _ORDER_BLOCK):
        block_ends = begun + np.cumsum(lengths[order[block : block + _ORDER_BLOCK]])
        first += int(np.searchsorted(block_ends, lo, side="right"))
        last += int(np.searchsorted(block_ends, hi, side="left"))
        ends.update({block + i: int(block_ends[i]) for i in (0, len(block_ends) - 1)})
        begun = int(block_ends[-1])
    last = min(last + (hi > 0), n)
    for at in (first, last - 1):  # the end of each of the two ends of the part
        if 0 <= at < n and at not in ends:
            block = at - at % _ORDER_BLOCK
            ends[at] = int(lengths[order[block : at + 1]].sum()) + (ends[block - 1] if block else 0)
    rows = np.sort(order[first:last]).astype(np.int64)
    starts = np.zeros(len(rows), np.int64)
    stops = lengths[rows]
    for at, cut in ((first, True), (last - 1, False)):
        if not first <= at < last:
            continue
        row = int(order[at])
        begin = ends[at] - int(lengths[row])
        k = int(np.searchsorted(rows, row))
        if cut:
            starts[k] = max(begin, lo) - begin
        else:
            stops[k] = min(ends[at], hi) - begin
    return Pieces(rows, starts, stops)


_ORDER_BLOCK = 65536
"""Entries of the order summed at a time by :func:`split_part`."""


def split_nodes(
    episodes: np.ndarray,
    lengths: np.ndarray,
    parts_per_node: Sequence[int],
    *,
    place: np.ndarray,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> list[Pieces]:
    """Node affinity: ``sum(parts_per_node)`` parts, node ``n`` holding the ``parts_per_node[n]``
    parts after those of the nodes before it, whose frames are the same every epoch.

    The episodes with at least one frame are laid end to end ascending by ``place`` (each
    episode's place in an order that does not depend on the epoch: :func:`node_places`; ties by
    episode) and cut into one contiguous share per node, node ``n``'s of
    :func:`node_share_sizes` frames (``total * k_n / P`` rounded by largest remainder, ``k_n``
    its parts, ``P`` all parts; equal nodes: sizes differing by at most one frame, the first
    ``total % nodes`` one more). Each share's pieces are then laid end to end in the epoch's
    order (``default_rng([seed, epoch, 2**32-4, nodes, node, k_n])``; ascending with
    ``shuffle=False``) and cut into ``k_n`` parts the same way. A share holds ``q * k_n +
    floor(f * k_n)`` to ``q * k_n + ceil(f * k_n)`` frames (``total / P = q + f``), so every part
    holds ``floor`` or ``ceil(total / P)``: the sizes :func:`split_parts` gives, so padding
    (:func:`samples_per_part`) is unchanged. Each part's pieces are sorted by episode.
    """
    counts = [int(k) for k in parts_per_node]
    if not counts or min(counts) < 1:
        raise ValueError(f"every node needs at least one part: {counts}")
    place = np.asarray(place, dtype=np.int64)
    if place.shape != np.shape(episodes):
        raise ValueError("place must give every episode its place")
    episodes, lengths, kept = _checked(episodes, lengths)
    place = place[kept]
    by_place = np.argsort(place, kind="stable")
    laid = Pieces(episodes[by_place], np.zeros_like(lengths), lengths[by_place])
    shares = _cut(laid, node_share_sizes(int(lengths.sum()), counts))
    parts = []
    for node, (share, k) in enumerate(zip(shares, counts, strict=True)):
        if shuffle and k > 1:
            entropy = [seed, epoch, _NODE_STREAM, len(counts), node, k]
            order = np.random.default_rng(entropy).permutation(len(share))
            share = Pieces(share.episodes[order], share.starts[order], share.stops[order])
        parts += _cut(share, samples_per_part(int(share.counts.sum()), k, pad=False))
    return parts


def node_share_sizes(total: int, parts_per_node: Sequence[int]) -> list[int]:
    """Frames of each node's share: ``total * k_n / P`` by largest remainder (ties to the
    lower node), ``k_n`` the node's parts and ``P`` all parts. Equal nodes get sizes that differ
    by at most one frame, the first ``total % nodes`` one more (:func:`samples_per_part`)."""
    num_parts = sum(parts_per_node)
    exact = [total * k for k in parts_per_node]
    sizes = [e // num_parts for e in exact]
    by_remainder = sorted(range(len(sizes)), key=lambda n: (-(exact[n] % num_parts), n))
    for n in by_remainder[: total - sum(sizes)]:
        sizes[n] += 1
    return sizes


def node_places(episodes: np.ndarray, seed: int, shuffle: bool = True) -> np.ndarray:
    """Each episode's place in the order node shares are cut from: a permutation drawn from the
    seed alone (``default_rng([seed, 2**32-4])``), never from the epoch, so a node reads the
    same episodes every epoch; the episodes' own order with ``shuffle=False``."""
    episodes = np.asarray(episodes, dtype=np.int64)
    if not shuffle:
        return np.argsort(np.argsort(episodes, kind="stable"), kind="stable")
    return np.random.default_rng([seed, _NODE_STREAM]).permutation(len(episodes))


def _checked(
    episodes: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | slice]:
    """The episodes with at least one frame and their lengths, sorted by episode, and where
    each came from in the input; refuses negative lengths and an episode given twice."""
    episodes = np.asarray(episodes, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if episodes.shape != lengths.shape or episodes.ndim != 1:
        raise ValueError("episodes and lengths must be one-dimensional and of the same length")
    if np.any(lengths < 0):
        bad = int(episodes[np.argmax(lengths < 0)])
        raise ValueError(f"Episode {bad} has a negative frame count")
    if len(episodes) and (lengths > 0).all() and (episodes[1:] > episodes[:-1]).all():
        return episodes, lengths, slice(None)  # as a manifest gives them: no copy
    kept = np.flatnonzero(lengths > 0)
    kept = kept[np.argsort(episodes[kept], kind="stable")]
    episodes, lengths = episodes[kept], lengths[kept]
    if len(episodes) and np.any(episodes[1:] == episodes[:-1]):
        dup = int(episodes[1:][episodes[1:] == episodes[:-1]][0])
        raise ValueError(f"Episode {dup} is selected twice")
    return episodes, lengths, kept


def _cut_whole(
    episodes: np.ndarray, lengths: np.ndarray, order: np.ndarray | None, num_parts: int
) -> list[Pieces]:
    """:func:`_cut` of whole episodes (sorted, none empty) laid end to end in ``order`` (None:
    as they are), made from the order and the running frame count alone: each part's episodes
    are a slice of the order, sorted, whole but for the first and the last. A million episodes
    cut this way allocate a third of what laying every piece out did, at every epoch's start
    in every DataLoader worker."""
    ends = np.cumsum(lengths if order is None else lengths[order])
    total = int(ends[-1]) if len(ends) else 0
    sizes = np.asarray(samples_per_part(total, num_parts, pad=False), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = []
    for p in range(num_parts):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        first = int(np.searchsorted(ends, lo, side="right"))
        # one past the last episode beginning before hi (an episode begins where one ends)
        last = int(np.searchsorted(ends[:-1], hi, side="left")) + (hi > 0) if len(ends) else 0
        rows = np.arange(first, last) if order is None else np.sort(order[first:last])
        starts = np.zeros(len(rows), np.int64)
        stops = lengths[rows]
        for at, cut in ((first, True), (last - 1, False)):  # the two ends: maybe cut
            if not first <= at < last:
                continue
            row = at if order is None else int(order[at])
            begin = int(ends[at]) - int(lengths[row])
            k = int(np.searchsorted(rows, row))
            if cut:
                starts[k] = max(begin, lo) - begin
            else:
                stops[k] = min(int(ends[at]), hi) - begin
        parts.append(Pieces(episodes[rows], starts, stops))
    return parts


def _cut(pieces: Pieces, sizes: Sequence[int]) -> list[Pieces]:
    """``pieces`` laid end to end in the given order, cut into contiguous ranges of ``sizes``
    frames (summing to the pieces' frames); each range's pieces sorted by episode."""
    episodes, offsets, lengths = pieces.episodes, pieces.starts, pieces.counts
    ends = np.cumsum(lengths)  # global frame position one past each piece
    begins = ends - lengths
    bounds = np.concatenate([[0], np.cumsum(np.asarray(sizes, dtype=np.int64))])
    parts = []
    for p in range(len(sizes)):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(begins, hi, side="left"))  # one past the last overlapping
        eps = episodes[first:last]
        starts = np.maximum(begins[first:last], lo) - begins[first:last] + offsets[first:last]
        stops = np.minimum(ends[first:last], hi) - begins[first:last] + offsets[first:last]
        sort = np.argsort(eps, kind="stable")
        parts.append(Pieces(eps[sort], starts[sort], stops[sort]))
    return parts


def part_index(rank: int, world_size: int, worker_id: int, num_workers: int) -> tuple[int, int]:
    """``(part, num_parts)`` of a DataLoader worker on a rank; ``num_workers=0`` counts as one.

    A rank's workers hold consecutive parts, so with ``shuffle=False`` a rank covers one
    contiguous range of the global frame order.
    """
    workers = max(num_workers, 1)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world_size {world_size}")
    if not 0 <= worker_id < workers:
        raise ValueError(f"worker_id {worker_id} is outside num_workers {num_workers}")
    return rank * workers + worker_id, world_size * workers


def samples_per_part(
    total_frames: int,
    num_parts: int,
    pad: bool = True,
    groups: Sequence[Sequence[int]] | None = None,
) -> list[int]:
    """Samples each part yields per epoch.

    ``pad=True``: every part yields ``ceil(total / num_parts)``; the ``num_parts * ceil - total
    < num_parts`` extra samples (at most one per part) repeat frames of the part's own.
    ``pad=False``: each part's own frame count, as :func:`split_parts` makes them (or, with
    ``groups``, each node's parts, as :func:`split_nodes` makes them).
    """
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}")
    if groups is not None and len(groups) > 1 and not pad:
        if sorted(p for g in groups for p in g) != list(range(num_parts)):
            raise ValueError(f"the nodes' parts {groups} are not the {num_parts} parts")
        out = [0] * num_parts
        shares = node_share_sizes(total_frames, [len(g) for g in groups])
        for group, share in zip(groups, shares, strict=True):
            for p, n in zip(group, samples_per_part(share, len(group), False), strict=True):
                out[p] = n
        return out
    base, extra = divmod(total_frames, num_parts)
    if not pad:
        return [base + 1] * extra + [base] * (num_parts - extra)
    if 0 < total_frames < num_parts:
        raise ValueError(
            f"{total_frames} frames cannot give {num_parts} parts (ranks x workers) equal "
            "padded lengths: some part would have no frame of its own to repeat; use fewer "
            "ranks or workers, or turn padding off"
        )
    return [-(-total_frames // num_parts)] * num_parts
