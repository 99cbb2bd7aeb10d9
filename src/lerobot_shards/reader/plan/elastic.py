"""Elastic resume: finish an epoch under a different rank/worker layout than the checkpoint's.

Pure and numpy only: nothing here fetches or decodes. A checkpoint names a layout (world size,
DataLoader workers), the settings that shape the order (:class:`Ordering`), an epoch and the
samples every rank's consumer took (``offset``, equal on every rank: a DDP checkpoint is taken
at the same step everywhere). Each old part's share of that offset follows from the
DataLoader's round-robin over workers (:func:`consumed_per_worker`; sample by sample where a
batch mixes every worker's samples: ``interleave.py``), and the frames it consumed
are the first draws of its plan, found by replaying the planner (:func:`drawn`).

The rest of the epoch is the epoch's frames minus those consumed. :meth:`Planner.rest_parts`
splits it over the new layout's parts, a pure function of the seed, the epoch, the remaining
set and the new layout: the episodes holding remaining frames are laid end to end in a seeded
order (ascending with ``shuffle=False``), each with its remaining frame positions ascending,
and the sequence is cut into parts whose sizes differ by at most one frame, as
:func:`~lerobot_shards.reader.plan.partition.split_parts` cuts a fresh epoch. A piece of such a part
holds an arbitrary subset of an episode's frames: its pool runs over ``0..count-1`` and each
drawn position is mapped through the piece's array of frame positions (:class:`Part`), so fresh
epochs keep their reference order untouched. With padding every part yields the same number of
samples for the rest of the epoch; the next epoch starts fresh with the new layout.

Node affinity (``Ordering.node_affinity`` with several ``Layout.nodes``) shapes fresh epochs only:
a checkpoint records its nodes and affinity, its consumed frames are replayed with its own
(node-affine) parts, and the rest of its epoch is split as any rest is, over all the new
layout's parts, whatever their nodes; node affinity, under the new layout's nodes, resumes
with the next fresh epoch.

A checkpoint taken while such a rest was running records the checkpoint the rest was planned
from (``origin``): the frames consumed in that epoch are then the origin's plus the first
draws of each rest part, so elastic resumes nest. With ``repeat=True`` the old parts may stand
in two consecutive epochs; the rest is then one segment per epoch, in order, then fresh epochs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from lerobot_shards.reader.plan.mixture import Units
from lerobot_shards.reader.plan.nodes import Nodes, part_groups
from lerobot_shards.reader.plan.partition import (
    Pieces,
    node_places,
    samples_per_part,
    split_nodes,
    split_part,
    split_parts,
)
from lerobot_shards.reader.plan.pool import DRAW_RULE, READER_GROUP, first_draws, plan_part

# Entropy word of the rest split's and the rest pools' random streams: apart from the fresh
# split's (0xFFFF_FFFF) and every fresh pool's ([seed, epoch] or [seed, epoch, part]).
_REST_STREAM = 0xFFFF_FFFE

Cost = Callable[[int, int, int], int]
"""``cost(episode, start, stop)``: bytes a piece of rows ``start:stop`` holds while resident."""


def consumed_per_worker(
    offset: int, per_worker: Sequence[int], batch_size: int, repeat: bool
) -> tuple[list[int], int]:
    """Samples each DataLoader worker had produced once the consumer took ``offset`` samples.

    The DataLoader asks workers ``0..W-1`` in turn for a batch (of ``batch_size`` samples, the
    last one of a finite worker stream short) and skips a worker once it is exhausted, so its
    output is the workers' batches in round-major order. Also returns the worker whose batch
    comes next. ``per_worker`` is each worker's samples per epoch; with ``repeat`` the streams
    run on and every batch is full.
    """
    workers = len(per_worker)
    b = max(1, batch_size)
    if repeat:
        batches, partial = divmod(offset, b)
        rounds, nxt = divmod(batches, workers)
        taken = [rounds * b + (b if w < nxt else 0) for w in range(workers)]
        taken[nxt] += partial
        return taken, nxt
    # Closed form, in the workers' number: round r gives worker w min(b, max(0, c_w - r b))
    # samples, so the first R rounds give min(c_w, R b). Find the last whole round the offset
    # covers, then walk that round's batches (a batch per sample of the rank, built for a
    # fresh start's batch size of 1, took gigabytes at a million episodes).
    counts = [int(c) for c in per_worker]

    def through(rounds: int) -> int:
        return sum(min(c, rounds * b) for c in counts)

    lo, hi = 0, max((-(-c // b) for c in counts), default=0)
    if through(hi) <= offset:
        return counts, 0
    while lo < hi:  # the most rounds whose samples the offset covers
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if through(mid) <= offset else (lo, mid - 1)
    taken = [min(c, lo * b) for c in counts]
    end = sum(taken)
    for w, c in enumerate(counts):
        size = min(max(c - lo * b, 0), b)
        if end + size > offset:
            taken[w] += offset - end
            return taken, w
        taken[w] += size
        end += size
    raise AssertionError("the round after the last covered one ends past the offset")


@dataclass(frozen=True)
class Layout:
    """Ranks and DataLoader workers per rank (0: the process iterates itself, one part), and the
    nodes the ranks run on (:class:`~lerobot_shards.reader.plan.nodes.Nodes`; an ``int`` is
    that many equal nodes of consecutive ranks)."""

    world_size: int
    num_workers: int
    nodes: Nodes | int = 1

    def __post_init__(self) -> None:
        nodes = self.nodes
        if not isinstance(nodes, Nodes):
            nodes = Nodes.even(self.world_size, int(nodes))
        if nodes.world_size != self.world_size:
            raise ValueError(f"nodes of {nodes.world_size} ranks for a world of {self.world_size}")
        object.__setattr__(self, "nodes", nodes)

    @property
    def workers(self) -> int:
        return max(1, self.num_workers)

    @property
    def num_parts(self) -> int:
        return self.world_size * self.workers


def node_parts(layout: Layout, rank: int) -> list[int]:
    """The parts of every rank and DataLoader worker on the node of ``rank`` (each rank's
    workers' parts consecutive: ``part_index``)."""
    return layout.nodes.node_parts(rank, layout.workers)


@dataclass(frozen=True)
class Ordering:
    """The dataset settings that shape the order of an epoch, besides the layout."""

    seed: int
    shuffle: bool
    buffer_size: int
    byte_budget: int | None
    pad: bool
    repeat: bool
    node_affinity: bool = False
    """With several nodes, each node reads the same frames every epoch (``split_nodes``)."""
    draw_rule: int = DRAW_RULE
    """The pool's draw rule (``pool.py``'s ``RULES``): new orderings draw by the current one;
    a checkpoint's records the one it was drawn by (1 when its state does not say)."""

    def node_shares(self, nodes: Nodes | int, num_parts: int) -> tuple[tuple[int, ...], ...]:
        """The groups of parts a fresh epoch of ``num_parts`` parts is first shared out over
        (each node's, ``nodes.part_groups``); without affinity, or on one node, one group."""
        groups = part_groups(nodes, num_parts) if self.node_affinity else ()
        return groups if len(groups) > 1 else (tuple(range(num_parts)),)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """Every rank's consumer took ``offset`` samples of the stream that starts at ``epoch``
    (or, with ``origin``, of the rest planned from ``origin``) under ``layout``/``ordering``."""

    epoch: int
    offset: int
    batch_size: int
    layout: Layout
    ordering: Ordering
    origin: Checkpoint | None = None
    mixed_batches: bool = False
    """Each batch held every worker's samples, taken one at a time in turn (``interleave.py``):
    the round robin over workers went sample by sample, not batch by batch."""


@dataclass(frozen=True, eq=False)
class Part:
    """One part's frames of one epoch, as the pool draws them.

    Piece ``i`` is episode ``episodes[i]``, a part of the epoch's unit ``units[i]``
    (:class:`~lerobot_shards.reader.plan.mixture.Units`); its frames lie in rows
    ``starts[i]:stops[i]`` (what is fetched and decoded). ``positions`` is None for a fresh
    epoch's part (every row of the range is a frame of the piece, and the pool draws rows
    directly); for a rest part,
    ``positions[i]`` holds the piece's frame positions, ascending, and the pool draws indices
    into it. ``entropy`` seeds the pool; ``num_samples`` counts the draws, padding included.
    """

    epoch: int
    units: np.ndarray
    episodes: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    positions: tuple[np.ndarray, ...] | None
    entropy: tuple[int, ...]
    num_samples: int
    table: Pieces = field(init=False)

    def __post_init__(self) -> None:
        if self.positions is None:
            table = Pieces(self.episodes, self.starts, self.stops)
        else:
            counts = np.fromiter((len(p) for p in self.positions), np.int64, len(self.positions))
            table = Pieces(self.episodes, np.zeros_like(counts), counts)
        object.__setattr__(self, "table", table)

    @property
    def num_frames(self) -> int:
        return int(self.table.counts.sum())

    def position(self, piece: int, frame: int) -> int:
        """The episode frame position of a draw (``piece``, ``frame``) of this part's plan."""
        if self.positions is None:
            return frame
        return int(self.positions[piece][frame])

    def frames(self) -> tuple[np.ndarray, np.ndarray]:
        """``(units, positions)`` of every frame the part owns (episode frame positions)."""
        counts = self.table.counts
        units = np.repeat(self.units, counts)
        if self.positions is None:
            starts = np.repeat(self.starts - np.cumsum(counts) + counts, counts)
            return units, starts + np.arange(len(units))
        if not len(self.positions):
            return units, np.zeros(0, dtype=np.int64)
        return units, np.concatenate(self.positions).astype(np.int64)

    def plan(self, ordering: Ordering, cost: Cost | None, start: int = 0):
        """This part's planner events (``plan_part``), fast-forwarded by ``start`` draws."""
        piece_bytes = None
        if ordering.byte_budget is not None:
            if cost is None:
                raise ValueError("a byte budget needs the pieces' costs")
            piece_bytes = [
                cost(e, s, t)
                for e, s, t in zip(
                    self.episodes.tolist(), self.starts.tolist(), self.stops.tolist(), strict=True
                )
            ]
        return plan_part(
            self.table,
            piece_bytes,
            buffer_size=ordering.buffer_size,
            byte_budget=ordering.byte_budget,
            seed=list(self.entropy),
            shuffle=ordering.shuffle,
            num_samples=self.num_samples,
            start=start,
            group=READER_GROUP,
            rule=ordering.draw_rule,
        )


class Planner:
    """Elastic planning over the samples of each epoch (pure: no I/O).

    An epoch's samples are its :class:`~lerobot_shards.reader.plan.mixture.Units` (``epoch_units``;
    by default every frame of ``episodes`` once, in ascending episode order, the same every
    epoch), numbered ``0..total-1`` unit by unit (sample ids); consumed and remaining sets are
    boolean masks over those ids. Every epoch has the same number of samples. ``cost`` gives a
    piece's resident bytes (needed only when an ordering has a byte budget).
    """

    def __init__(
        self,
        episodes: np.ndarray,
        lengths: np.ndarray,
        cost: Cost | None = None,
        epoch_units: Callable[[int], Units] | None = None,
    ) -> None:
        self._constant = Units.whole(episodes, lengths)
        self._epoch_units = epoch_units
        self._units: dict[int, Units] = {}
        self._bounds: tuple = (None, None, None, None)
        self.total = self._make_units(0).total
        self.cost = cost
        self._fresh: dict[tuple, list[Part]] = {}
        self._fresh_one: dict[tuple, Part] = {}
        self._segments: dict[tuple, list[list[Part]]] = {}
        self._consumed: dict[tuple, np.ndarray] = {}
        self._positions: dict[Checkpoint, list[tuple[Part, int]]] = {}

    # ------------------------------------------------------------------ sample ids

    def units(self, epoch: int) -> Units:
        """Epoch ``epoch``'s units."""
        if epoch not in self._units:
            units = self._make_units(epoch)
            if units.total != self.total:
                raise ValueError(f"epoch {epoch} has {units.total} samples, not {self.total}")
            if len(self._units) >= 8:  # an endless stream plans epoch after epoch: keep few
                del self._units[next(iter(self._units))]
            self._units[epoch] = units
        return self._units[epoch]

    def _table(self, epoch: int) -> tuple[Units, np.ndarray, np.ndarray]:
        """The epoch's units with each one's first sample id and one past its last (made when
        a resume numbers samples, for the last epoch asked: 16 MB at a million episodes)."""
        units = self.units(epoch)
        if self._bounds[0] != epoch or self._bounds[1] is not units:
            ends = np.cumsum(units.counts)
            self._bounds = (epoch, units, ends - units.counts, ends)
        return units, self._bounds[2], self._bounds[3]

    def _make_units(self, epoch: int) -> Units:
        return self._constant if self._epoch_units is None else self._epoch_units(epoch)

    def ids(self, epoch: int, units: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Sample ids of epoch ``epoch``'s frames ``positions`` (within their episodes) of
        units ``units``."""
        table, begins, _ = self._table(epoch)
        units = np.asarray(units, dtype=np.int64)
        return begins[units] + np.asarray(positions, dtype=np.int64) - table.starts[units]

    # ------------------------------------------------------------------ parts of an epoch

    def fresh_parts(
        self, ordering: Ordering, num_parts: int, epoch: int, nodes: Nodes | int = 1
    ) -> list[Part]:
        """A fresh epoch's parts, exactly as the reader streams them: its units split as
        ``split_parts`` splits episodes; with node affinity over ``nodes`` nodes, as
        ``split_nodes`` splits them, each unit placed where its episode stands in
        ``node_places`` of every selected episode (so a node's units are the same every epoch
        whenever the units are)."""
        groups = ordering.node_shares(nodes, num_parts)
        key = (ordering.seed, ordering.shuffle, ordering.pad, num_parts, epoch, groups)
        if key not in self._fresh:
            table = self.units(epoch)
            units = np.arange(len(table.episodes))
            if len(groups) > 1:
                every = self._constant.episodes
                places = node_places(every, ordering.seed, ordering.shuffle)
                by_node = split_nodes(
                    units,
                    table.counts,
                    [len(g) for g in groups],
                    place=places[np.searchsorted(every, table.episodes)],
                    seed=ordering.seed,
                    epoch=epoch,
                    shuffle=ordering.shuffle,
                )
                split: list[Pieces] = [by_node[0]] * num_parts
                for p, pieces in zip([p for g in groups for p in g], by_node, strict=True):
                    split[p] = pieces
            else:
                split = split_parts(
                    units,
                    table.counts,
                    num_parts,
                    seed=ordering.seed,
                    epoch=epoch,
                    shuffle=ordering.shuffle,
                )
            samples = samples_per_part(self.total, num_parts, ordering.pad, groups)
            if len(self._fresh) >= 8:  # an endless stream plans epoch after epoch: keep few
                del self._fresh[next(iter(self._fresh))]
            self._fresh[key] = [
                self._part(table, pieces, ordering, epoch, num_parts, p, samples[p])
                for p, pieces in enumerate(split)
            ]
        return self._fresh[key]

    def fresh_part(
        self, ordering: Ordering, num_parts: int, epoch: int, part: int, nodes: Nodes | int = 1
    ) -> Part:
        """``fresh_parts(...)[part]``, made alone where it can be (one node's share of whole
        units, :func:`split_part`): a DataLoader worker's epoch start then works in
        proportion to its own episodes, not to every part's."""
        groups = ordering.node_shares(nodes, num_parts)
        key = (ordering.seed, ordering.shuffle, ordering.pad, num_parts, epoch, groups)
        if key in self._fresh or len(groups) > 1:
            return self.fresh_parts(ordering, num_parts, epoch, nodes)[part]
        table = self.units(epoch)
        if not (table.counts > 0).all():  # units without frames: split_parts leaves them out
            return self.fresh_parts(ordering, num_parts, epoch, nodes)[part]
        own = (key, part)
        if own not in self._fresh_one:
            pieces = split_part(
                table.counts, num_parts, part, seed=ordering.seed, epoch=epoch,
                shuffle=ordering.shuffle,
            )  # fmt: skip
            samples = self.part_samples(ordering, num_parts, nodes)[part]
            if len(self._fresh_one) >= 8:
                del self._fresh_one[next(iter(self._fresh_one))]
            self._fresh_one[own] = self._part(
                table, pieces, ordering, epoch, num_parts, part, samples
            )
        return self._fresh_one[own]

    def part_samples(self, ordering: Ordering, num_parts: int, nodes: Nodes | int = 1) -> list[int]:
        """Samples each part of a fresh epoch yields (``fresh_parts``' ``num_samples``), with
        no part made."""
        return samples_per_part(
            self.total, num_parts, ordering.pad, ordering.node_shares(nodes, num_parts)
        )

    @staticmethod
    def _part(
        table: Units, pieces: Pieces, ordering: Ordering, epoch: int, num_parts: int, p: int,
        samples: int,
    ) -> Part:  # fmt: skip
        """Part ``p`` of a fresh epoch: ``pieces`` of the units of ``table``."""
        return Part(
            epoch,
            pieces.episodes,
            table.episodes[pieces.episodes],
            *_offset_by(table.starts[pieces.episodes], pieces.starts, pieces.stops),
            None,
            (ordering.seed, epoch) if num_parts == 1 else (ordering.seed, epoch, p),
            samples,
        )

    def rest_parts(
        self, ordering: Ordering, num_parts: int, epoch: int, remaining: np.ndarray
    ) -> list[Part]:
        """The remaining samples of ``epoch`` (a mask over sample ids) split over ``num_parts``.

        Units in a seeded order (``default_rng([seed, epoch, 2**32-2, num_parts])``;
        ascending with ``shuffle=False``), each one's remaining positions ascending, cut into
        parts of sizes differing by at most one. With padding every part yields ``ceil(rest /
        num_parts)``; a part left with no frame (fewer frames than parts) repeats one frame of
        the rest, the ``p % rest``-th of the sequence.
        """
        table, begins, ends = self._table(epoch)
        ids = np.flatnonzero(remaining)
        rows = np.searchsorted(ends, ids, side="right")
        positions = ids - begins[rows] + table.starts[rows]
        used, first, counts = np.unique(rows, return_index=True, return_counts=True)
        if ordering.shuffle and len(used) > 1:
            rng = np.random.default_rng([ordering.seed, epoch, _REST_STREAM, num_parts])
            order = rng.permutation(len(used))
        else:
            order = np.arange(len(used))
        # The sequence: unit by unit in `order`, each one's frames ascending.
        firsts, lens = first[order], counts[order]
        seq_index = np.repeat(firsts - np.cumsum(lens) + lens, lens) + np.arange(len(ids))
        seq_rows, seq_pos = rows[seq_index], positions[seq_index]
        rest = len(ids)
        sizes = samples_per_part(rest, num_parts, pad=False)
        samples = [-(-rest // num_parts)] * num_parts if ordering.pad else sizes
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        parts = []
        for p in range(num_parts):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            if lo == hi and samples[p]:
                lo, hi = p % rest, p % rest + 1  # nothing of its own: repeat one frame
            part_rows, part_pos = seq_rows[lo:hi], seq_pos[lo:hi]
            # Group by unit (a part holds each unit's frames contiguously in the sequence).
            cut = np.flatnonzero(np.diff(part_rows)) + 1
            groups = np.split(part_pos, cut) if hi > lo else []
            unit_ids = part_rows[np.concatenate([[0], cut])] if hi > lo else []
            unit_ids = np.asarray(unit_ids, dtype=np.int64)
            sort = np.argsort(unit_ids, kind="stable")
            groups = [groups[i] for i in sort.tolist()]
            parts.append(
                Part(
                    epoch,
                    unit_ids[sort],
                    table.episodes[unit_ids[sort]],
                    np.array([g[0] for g in groups], dtype=np.int64),
                    np.array([g[-1] + 1 for g in groups], dtype=np.int64),
                    tuple(groups),
                    (ordering.seed, epoch, _REST_STREAM, num_parts, p),
                    samples[p],
                )
            )
        return parts

    # ------------------------------------------------------------------ streams

    def stream(
        self,
        origin: Checkpoint | None,
        epoch: int,
        ordering: Ordering,
        num_parts: int,
        part: int,
        nodes: Nodes | int = 1,
    ) -> Iterator[Part]:
        """The epochs part ``part`` streams in order: the rest planned from ``origin`` (one
        segment per epoch), or the fresh epoch ``epoch``; then, with ``repeat``, fresh epochs
        on and on (over ``nodes`` nodes)."""
        if origin is not None:
            segments = self.segments(origin, ordering, num_parts)
            for parts in segments:
                yield parts[part]
            if not ordering.repeat:
                return
            epoch = segments[-1][0].epoch + 1
        while True:
            yield self.fresh_part(ordering, num_parts, epoch, part, nodes)
            if not ordering.repeat:
                return
            epoch += 1

    def locate(
        self,
        origin: Checkpoint | None,
        epoch: int,
        ordering: Ordering,
        num_parts: int,
        part: int,
        taken: int,
        nodes: Nodes | int = 1,
    ) -> tuple[Part, int, Iterator[Part]]:
        """Where a part's stream stands after ``taken`` samples: the epoch's part, the draws
        made in it, and the parts that follow."""
        stream = self.stream(origin, epoch, ordering, num_parts, part, nodes)
        current = next(stream)
        while True:
            if taken < current.num_samples or not ordering.repeat:
                return current, min(taken, current.num_samples), stream
            taken -= current.num_samples
            if not current.num_samples and not self.total:
                return current, 0, stream
            current = next(stream)

    def segments(self, origin: Checkpoint, ordering: Ordering, num_parts: int) -> list[list[Part]]:
        """The rest planned from ``origin``: per epoch from the earliest to the latest one its
        parts stood in, that epoch's remaining frames split over ``num_parts``."""
        key = (origin, ordering, num_parts)
        if key not in self._segments:
            where = self.positions(origin)
            lo = min(p.epoch for p, _ in where)
            hi = max(p.epoch for p, _ in where)
            self._segments[key] = [
                self.rest_parts(ordering, num_parts, x, ~self.consumed(origin, x))
                for x in range(lo, hi + 1)
            ]
        return self._segments[key]

    def positions(self, checkpoint: Checkpoint) -> list[tuple[Part, int]]:
        """For every part of the checkpoint's layout, its epoch's part and the draws it made."""
        key = checkpoint
        if key not in self._positions:
            c = checkpoint
            workers, parts, nodes = c.layout.workers, c.layout.num_parts, c.layout.nodes
            located = [
                self.locate(c.origin, c.epoch, c.ordering, parts, q, 0, nodes) for q in range(parts)
            ]
            where = []
            for rank in range(c.layout.world_size):
                mine = range(rank * workers, (rank + 1) * workers)
                per_worker = [located[q][0].num_samples for q in mine]
                unit = 1 if c.mixed_batches else c.batch_size
                taken, _ = consumed_per_worker(c.offset, per_worker, unit, c.ordering.repeat)
                for q, t in zip(mine, taken, strict=True):
                    part, k, _ = self.locate(c.origin, c.epoch, c.ordering, parts, q, t, nodes)
                    where.append((part, k))
            self._positions[key] = where
        return self._positions[key]

    def rest_epoch(self, checkpoint: Checkpoint) -> int:
        """The first epoch of the rest planned from ``checkpoint``."""
        return min(p.epoch for p, _ in self.positions(checkpoint))

    def consumed(self, checkpoint: Checkpoint, epoch: int) -> np.ndarray:
        """Mask of the samples of ``epoch`` consumed by the checkpoint (padding aside)."""
        key = (checkpoint, epoch)
        if key in self._consumed:
            return self._consumed[key]
        c = checkpoint
        mask = np.zeros(self.total, dtype=bool)
        parts = c.layout.num_parts
        if c.origin is not None:
            segments = self.segments(c.origin, c.ordering, parts)
            if epoch in [s[0].epoch for s in segments]:
                mask |= self.consumed(c.origin, epoch)
        for q, (part, k) in enumerate(self.positions(c)):
            if part.epoch < epoch:
                continue
            if part.epoch > epoch:  # this part finished `epoch`: all of it is consumed
                stream = self.stream(c.origin, c.epoch, c.ordering, parts, q, c.layout.nodes)
                for earlier in stream:
                    if earlier.epoch == epoch:
                        mask[self.ids(epoch, *earlier.frames())] = True
                        break
            else:
                mask[drawn(part, c.ordering, k, self)] = True
        self._consumed[key] = mask
        return mask


def _offset_by(
    offsets: np.ndarray, starts: np.ndarray, stops: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``starts`` and ``stops`` moved by ``offsets`` (as they are where all are 0: whole
    episodes' units, no copy of a million entries)."""
    if not offsets.any():
        return starts, stops
    return offsets + starts, offsets + stops


def drawn(part: Part, ordering: Ordering, k: int, planner: Planner) -> np.ndarray:
    """Sample ids of the first ``k`` draws of a part's plan (a replay of the planner)."""
    if not k:
        return np.empty(0, dtype=np.int64)
    pieces, frames = first_draws(part.plan(ordering, planner.cost), k)
    if part.positions is not None:  # through the pieces' position arrays, laid end to end
        counts = part.table.counts
        frames = part.frames()[1][(np.cumsum(counts) - counts)[pieces] + frames]
    return planner.ids(part.epoch, part.units[pieces], frames)
