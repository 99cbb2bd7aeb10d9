"""The exact-coverage episode pool: the order in which one part's frames are drawn.

Pure and numpy only. :func:`reference_draws` is the reference algorithm, written as a plain
linear walk; :func:`plan_part` produces the same order draw for draw, fast enough to skip
millions of draws on resume, and reports what it admits (so the reader can prefetch) and evicts
(so it can release bytes).

A draw picks a resident episode uniformly, then the next of its shuffled frames. Picking in
proportion to the frames left (a uniformly random resident frame) was the first rule; it wastes
the pool while episodes wait to be admitted: an episode's frames then run out ever more slowly,
so the pool fills with nearly spent episodes that are rarely drawn, and a batch of 32 from 64
residents mixed about 21 episodes instead of the 25 of uniform picks (16 residents: 9 instead of
14). Every frame is still drawn exactly once, whatever the rule.

The tail of a part. Once no episode waits (from the start when the pool holds the whole part),
nothing refills the pool, and uniform picks finish the short episodes first and leave a few
long ones to the end of the part, whose last batches then hold one or two episodes. So the tail
is drawn as one shuffle of the residents' remaining frames (``rng.shuffle`` of each resident's
position repeated by its frames left): every remaining order equally likely, each draw a
uniformly random remaining frame, the episodes running out together at the end. On 24 episodes
of 300-500 frames held whole by 2 workers' pools, batches of 32 of the two workers mix 17.9
distinct episodes instead of 16.5 (a global shuffle: 17.7; ``scripts/bench_mixing.py``); where
the pool is smaller than its part, only the draws after the last admission change (288 such
episodes: 28.2 instead of 27.8), as every draw before is that of uniform picks, random number
for random number. Weighting the tail's picks by the square of the frames left mixed no better
(17.9), by its square root worse (17.6); always the episode with the most left mixes more (20.7)
but is no longer a shuffle (``bench_mixing.py --candidates``).

Rule versions (``rule``): :data:`UNIFORM_PICKS` (1) picks uniformly to the end, the rule of
checkpoints written before the tail was shuffled, kept so that they resume into the very order
they began; :data:`SHUFFLED_TAIL` (2) shuffles the tail, the rule of every new plan
(:data:`DRAW_RULE`).

An episode's frames are shuffled in groups (``group``, 2 for the reader: LeRobot's GOP 2) of
consecutive positions ``group * k ...``, drawn one after the other from that episode: decoding
a frame decodes its GOP, and its GOP mate is then drawn at the episode's next pick (about
``buffer_size`` draws later) instead of at a random time in the episode's stay, so the decoded
frames worth keeping are about one per resident episode and camera, not a quarter of the pool.

How the fast planner reproduces the walk. Between two evictions no episode is admitted, so the
number of residents ``n`` and the random stream are fixed: the next ``k`` picks are one call
``rng.integers([n] * k)`` (numpy returns the same values and leaves the generator in the same
state as ``k`` scalar calls). The planner does not know in advance which draw will empty an
episode, so it draws a batch of picks speculatively, stops at the first draw that empties an
episode, rewinds the generator and draws just the picks it used again. The tail is one shuffle:
its draws are worked out whole, in numpy, when it begins.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from lerobot_shards.reader.plan.partition import Piece, Pieces

_NEVER = np.iinfo(np.int64).max
_MIN_BATCH = 16
_MAX_BATCH = 512
READER_GROUP = 2
"""The reader's ``group``: LeRobot encodes with GOP 2 (a keyframe every second frame)."""
UNIFORM_PICKS = 1
"""Draw rule 1: every draw picks a resident uniformly, to the end of the part."""
SHUFFLED_TAIL = 2
"""Draw rule 2: uniform picks while episodes wait for admission; then the part's tail (every
resident's remaining frames) drawn as one shuffle."""
DRAW_RULE = SHUFFLED_TAIL
"""The rule new plans (and the states that record them) use."""
RULES = (UNIFORM_PICKS, SHUFFLED_TAIL)


class Admit(NamedTuple):
    """Fetch piece ``piece`` (an index into the part's pieces) now: it has joined the pool."""

    piece: int


class Draw(NamedTuple):
    """Yield frame ``frame`` (a position within the episode) of piece ``piece``.

    :func:`plan_part` emits draws in runs (:class:`Draws`); :func:`one_by_one` splits them.
    """

    piece: int
    frame: int


class Draws(NamedTuple):
    """Consecutive draws, in draw order: frame ``frames[i]`` of piece ``pieces[i]``.

    Runs of draws as two int64 arrays cost the planner and its consumers one object per run
    instead of one per draw (a run ends at the latest where a piece is admitted or evicted).
    """

    pieces: np.ndarray
    frames: np.ndarray


class Evict(NamedTuple):
    """Piece ``piece`` has been fully drawn: release it."""

    piece: int


Event = Admit | Draws | Evict


def one_by_one(events: Iterable[Event]) -> Iterator[Admit | Draw | Evict]:
    """The events with every :class:`Draws` run split into single :class:`Draw` events."""
    for event in events:
        if type(event) is Draws:
            for piece, frame in zip(event.pieces.tolist(), event.frames.tolist(), strict=True):
                yield Draw(piece, frame)
        else:
            yield event


def first_draws(events: Iterable[Event], n: int) -> Draws:
    """The first ``n`` draws of a plan's events (fewer if it has fewer), as one run."""
    pieces, frames, have = [], [], 0
    for event in events if n > 0 else ():
        if type(event) is Draws:
            pieces.append(event.pieces[: n - have])
            frames.append(event.frames[: n - have])
            have += len(pieces[-1])
            if have == n:
                break
    if not pieces:
        return Draws(np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    return Draws(np.concatenate(pieces), np.concatenate(frames))


def check_budget(
    piece_bytes: Mapping[int, int] | Sequence[int] | np.ndarray,
    byte_budget: int | None,
    episodes: Sequence[int] | np.ndarray | None = None,
) -> None:
    """Refuse an episode that could never be admitted because it alone exceeds the budget.

    ``piece_bytes`` maps episode index to bytes, or is a sequence of sizes whose episodes are
    ``episodes`` (default: the positions). The smallest offending episode is named.
    """
    if byte_budget is None:
        return
    if isinstance(piece_bytes, Mapping):
        episodes = np.fromiter(piece_bytes.keys(), np.int64, len(piece_bytes))
        sizes = np.fromiter(piece_bytes.values(), np.int64, len(piece_bytes))
    else:
        sizes = np.asarray(piece_bytes, dtype=np.int64)
        episodes = (
            np.arange(len(sizes)) if episodes is None else np.asarray(episodes, dtype=np.int64)
        )
    over = np.flatnonzero(sizes > byte_budget)
    if len(over):
        worst = over[np.argmin(episodes[over])]
        raise ValueError(
            f"Episode {int(episodes[worst])} requires {int(sizes[worst])} bytes, "
            f"exceeding the byte budget {byte_budget}"
        )


def grouped_order(start: int, count: int, group: int, rng: np.random.Generator) -> np.ndarray:
    """Positions ``0..count-1`` of a piece that starts at episode position ``start``, shuffled in
    groups: the episode positions ``group * k .. group * k + group - 1`` stay together, in
    ascending order, and ``rng.shuffle`` orders the groups (``group=1``: ``rng.shuffle`` of
    ``arange(count)``). The pool takes positions from the end."""
    if group == 1:
        order = np.arange(count, dtype=np.int64)
        rng.shuffle(order)
        return order
    first = start // group
    groups = np.arange((start + count - 1) // group - first + 1, dtype=np.int64)
    rng.shuffle(groups)
    positions = ((groups + first)[:, None] * group + np.arange(group)).ravel() - start
    return positions[(positions >= 0) & (positions < count)]


def reference_draws(
    counts: Mapping[int, int],
    piece_bytes: Mapping[int, int] | None = None,
    *,
    buffer_size: int,
    byte_budget: int | None = None,
    seed: int,
    epoch: int,
    group: int = 1,
    rule: int = DRAW_RULE,
) -> list[tuple[int, int]]:
    """The ``(episode, frame)`` draws of one epoch by :func:`iter_reference_draws`."""
    return list(
        iter_reference_draws(
            counts,
            piece_bytes,
            buffer_size=buffer_size,
            byte_budget=byte_budget,
            seed=seed,
            epoch=epoch,
            group=group,
            rule=rule,
        )
    )


def iter_reference_draws(
    counts: Mapping[int, int],
    piece_bytes: Mapping[int, int] | None = None,
    *,
    buffer_size: int,
    byte_budget: int | None = None,
    seed: int,
    epoch: int,
    group: int = 1,
    rule: int = DRAW_RULE,
) -> Iterator[tuple[int, int]]:
    """The exact-coverage pool, plainly: the ``(episode, frame)`` draws of one epoch.

    1. ``counts`` maps each selected episode to its frame count (episodes with no frame are
       left out); ``rng = numpy.random.default_rng([seed, epoch])``.
    2. ``order`` = the sorted episode indices as int64, shuffled in place by ``rng.shuffle``;
       ``pending`` = that list.
    3. Admission: while fewer than ``buffer_size`` episodes are resident and ``pending`` is not
       empty, take the first pending episode whose byte size fits in the budget left (with no
       budget, the first); if none fits, stop. The admitted episode gets ``frames =
       grouped_order(0, count, group, rng)`` (with ``group=1``: ``arange(count)`` shuffled by
       ``rng.shuffle``) and joins the end of the resident order.
    4. The tail (rule :data:`SHUFFLED_TAIL`): when admission ends with ``pending`` empty and
       episodes resident, for the first time, ``tail`` = each resident's position in the
       resident order repeated by its remaining count (int64, in resident order), shuffled in
       place by ``rng.shuffle``; every later draw takes the resident at the next position of
       ``tail`` (as the resident order stood when it was made).
    5. Draw: outside the tail, the resident at position ``int(rng.integers(len(resident)))`` of
       the resident order; its remaining count drops by one and the frame is
       ``frames[remaining]``. An episode whose last frame was drawn is evicted (its bytes
       released) and admission runs again. The epoch ends when nothing is pending or resident.
    6. An episode larger than the whole budget is a ``ValueError`` (:func:`check_budget`).

    One Python step per draw, a scan of the pending list per admission under a budget: the
    slow, obviously correct statement kept for tests and the benchmark; :func:`plan_part` is
    the fast equivalent.
    """
    if rule not in RULES:
        raise ValueError(f"unknown draw rule {rule}: this version knows {list(RULES)}")
    sizes = dict(piece_bytes or {})
    if byte_budget is not None:
        check_budget({e: sizes[e] for e in counts if counts[e] > 0}, byte_budget)
    rng = np.random.default_rng([seed, epoch])
    order = np.array(sorted(e for e, c in counts.items() if c > 0), dtype=np.int64)
    rng.shuffle(order)
    pending = order.tolist()
    resident: list[list] = []  # [episode, frames, remaining]
    tail: list[list] | None = None  # the tail's residents, draw by draw
    used = 0

    def admit() -> None:
        nonlocal used, tail
        while len(resident) < buffer_size and pending:
            for episode in pending:
                if byte_budget is None or used + sizes[episode] <= byte_budget:
                    break
            else:
                break
            pending.remove(episode)
            frames = grouped_order(0, counts[episode], group, rng)
            resident.append([episode, frames, counts[episode]])
            used += sizes.get(episode, 0)
        if rule == SHUFFLED_TAIL and tail is None and not pending and resident:
            remaining = [entry[2] for entry in resident]
            positions = np.repeat(np.arange(len(resident), dtype=np.int64), remaining)
            rng.shuffle(positions)
            tail = [resident[p] for p in positions.tolist()]

    admit()
    drawn_in_tail = 0
    while resident:
        if tail is None:
            entry = resident[int(rng.integers(len(resident)))]
        else:
            entry = tail[drawn_in_tail]
            drawn_in_tail += 1
        entry[2] -= 1
        yield entry[0], int(entry[1][entry[2]])
        if entry[2] == 0:
            resident.remove(entry)
            used -= sizes.get(entry[0], 0)
            admit()


class _FirstFit:
    """First pending episode (in pending order) whose size fits the bytes left: O(log n).

    A min-tree over the pending order; taken entries become +inf.
    """

    def __init__(self, sizes_in_order: np.ndarray) -> None:
        n = len(sizes_in_order)
        self.size = 1 << max(n - 1, 0).bit_length()
        tree = np.full(2 * self.size, _NEVER, dtype=np.int64)
        tree[self.size : self.size + n] = sizes_in_order
        level = self.size
        while level > 1:
            pairs = tree[level : 2 * level].reshape(-1, 2)
            tree[level // 2 : level] = pairs.min(axis=1)
            level //= 2
        self.tree = tree.tolist()

    def find(self, left: int) -> int:
        tree = self.tree
        if tree[1] > left:
            return -1
        node = 1
        while node < self.size:
            node *= 2
            if tree[node] > left:
                node += 1
        return node - self.size

    def take(self, index: int) -> None:
        tree = self.tree
        node = index + self.size
        tree[node] = _NEVER
        node //= 2
        while node:
            tree[node] = min(tree[2 * node], tree[2 * node + 1])
            node //= 2


class _Tail:
    """The part's tail (rule :data:`SHUFFLED_TAIL`), worked out whole when it begins: every
    draw's piece and frame, and the draws that empty a piece (in draw order).

    Built from the residents as they stand (pieces, arena offsets, remaining counts, in resident
    order) with the reference's shuffle; the ``k``-th draw of resident ``s`` takes its frame at
    ``arena[off[s] + rem[s] - 1 - k]``, as the walk's ``frames[remaining]`` does.
    """

    def __init__(
        self,
        pieces: list[int],
        offs: list[int],
        rems: list[int],
        arena: np.ndarray,
        starts: np.ndarray,
        rng: np.random.Generator,
    ) -> None:
        rem = np.array(rems, dtype=np.int64)
        slots = np.repeat(np.arange(len(rem), dtype=np.int64), rem)
        rng.shuffle(slots)
        by_slot = np.argsort(slots, kind="stable")  # each slot's draws, in draw order
        ends = np.cumsum(rem)
        taken = np.empty(len(slots), dtype=np.int64)  # draws of the same slot before each draw
        taken[by_slot] = np.arange(len(slots)) - np.repeat(ends - rem, rem)
        self.pieces = np.array(pieces, dtype=np.int64)[slots]
        index = np.array(offs, dtype=np.int64)[slots] + rem[slots] - 1 - taken
        self.frames = arena[index] + starts[self.pieces]
        self.last_draws = np.sort(by_slot[ends - 1])
        self.at = 0  # next draw
        self.emptied = 0  # pieces emptied so far

    def step(self, limit: int, emit: bool) -> tuple[int, Draws | None, int]:
        """Up to ``limit`` draws, ending at the next draw that empties a piece; ``(made, draws,
        the piece emptied or -1)``."""
        last = int(self.last_draws[self.emptied])
        made = min(limit, last + 1 - self.at)
        run = slice(self.at, self.at + made)
        draws = Draws(self.pieces[run].copy(), self.frames[run].copy()) if emit else None
        self.at += made
        if self.at <= last:
            return made, draws, -1
        self.emptied += 1
        return made, draws, int(self.pieces[last])


class _Pool:
    """State of the fast pool: the residents in admission order and the frame arena.

    Resident ``s`` is piece ``piece[s]`` with ``rem[s]`` frames left, whose shuffled frame
    positions are ``arena[off[s] : off[s] + count]``; the walk's ``frames[remaining]`` is
    ``arena[off[s] + remaining]``. An evicted piece leaves the lists at once (its frames stay in
    the arena until the arena is packed, which padding relies on). In the tail (``tail``, rule
    :data:`SHUFFLED_TAIL`) the draws come from :class:`_Tail` and ``rem`` is no longer kept;
    nothing is admitted there, so the arena stays as it is.
    """

    def __init__(
        self,
        pieces: Pieces,
        sizes: np.ndarray | None,
        buffer_size: int,
        byte_budget: int | None,
        rng: np.random.Generator,
        group: int = 1,
        rule: int = DRAW_RULE,
    ) -> None:
        counts = pieces.counts
        self.group = group
        self.rule = rule
        self.tail: _Tail | None = None
        self.counts = counts.tolist()
        self.starts = pieces.starts
        self.rng = rng
        self.buffer_size = buffer_size
        self.budget = byte_budget
        order = np.flatnonzero(counts > 0).astype(np.int64)
        rng.shuffle(order)
        self.order = order.tolist()
        self.head = 0  # first pending position not taken
        self.sizes = None if sizes is None else sizes.tolist()
        self.first_fit = None
        if byte_budget is not None and sizes is not None and len(order):
            self.first_fit = _FirstFit(sizes[order])
            self.taken = bytearray(len(order))
        self.used_bytes = 0
        self.piece: list[int] = []
        self.off: list[int] = []
        self.rem: list[int] = []
        self.total = 0  # remaining frames over the residents
        most = max(1, min(buffer_size, len(order)))
        # Room for the first pool twice over, so filling it does not grow the arena step by step.
        first_pool = int(counts[order[:most]].sum()) if len(order) else 0
        self.arena = np.empty(max(1024, 2 * first_pool), dtype=np.int64)
        self.iota = np.arange(int(counts.max()) if len(counts) else 0, dtype=np.int64)
        self.top = 0
        self.batch = _MIN_BATCH
        self.last: tuple[int, int] | None = None  # (piece, arena offset) of the last eviction

    @property
    def pending(self) -> bool:
        return self.head < len(self.order)

    @property
    def resident(self) -> int:
        return len(self.piece)

    def live_pieces(self) -> list[int]:
        """Resident pieces in resident (admission) order."""
        return list(self.piece)

    def admit(self) -> list[int]:
        """Run admission; returns the admitted pieces in order."""
        admitted = []
        order = self.order
        while len(self.piece) < self.buffer_size and self.head < len(order):
            at = self.head
            if self.first_fit is None:
                self.head += 1
            else:
                if self.used_bytes + self.sizes[order[at]] > self.budget:
                    at = self.first_fit.find(self.budget - self.used_bytes)
                    if at < 0:
                        break
                self.first_fit.take(at)
                self.taken[at] = 1
                while self.head < len(order) and self.taken[self.head]:
                    self.head += 1
            piece = order[at]
            if self.sizes is not None:
                self.used_bytes += self.sizes[piece]
            self._place(piece)
            admitted.append(piece)
        if self.rule == SHUFFLED_TAIL and self.tail is None and not self.pending and self.piece:
            self.tail = _Tail(self.piece, self.off, self.rem, self.arena, self.starts, self.rng)
        return admitted

    def _place(self, piece: int) -> None:
        count = self.counts[piece]
        if self.top + count > len(self.arena):
            self._pack_arena(count)
        frames = self.arena[self.top : self.top + count]
        if self.group == 1:
            frames[:] = self.iota[:count]
            self.rng.shuffle(frames)
        else:
            frames[:] = grouped_order(int(self.starts[piece]), count, self.group, self.rng)
        self.piece.append(piece)
        self.off.append(self.top)
        self.rem.append(count)
        self.top += count
        self.total += count

    def _pack_arena(self, need: int) -> None:
        """Move the residents' frames to the front (whole, as padding replays drawn ones)."""
        sizes = np.array([self.counts[p] for p in self.piece], dtype=np.int64)
        kept = int(sizes.sum())
        arena = np.empty(max(len(self.arena), 2 * (kept + need)), dtype=np.int64)
        new_off = np.cumsum(sizes) - sizes
        if kept:
            old_off = np.array(self.off, dtype=np.int64)
            arena[:kept] = self.arena[np.repeat(old_off - new_off, sizes) + np.arange(kept)]
        self.off = new_off.tolist()
        self.arena = arena
        self.top = kept

    def step(self, limit: int, emit: bool = True) -> tuple[int, Draws | None, int]:
        """Make up to ``limit`` draws, stopping after the first that empties a resident.

        Returns the number of draws made, them as a run (None with ``emit=False``) and the
        piece evicted by the last draw (-1 if none). The eviction's bookkeeping is done;
        admission is not. The picks of the whole batch come from one ``integers`` call; if a
        draw empties a resident before the batch ends, the generator is rewound and only the
        picks used are drawn again.
        """
        if self.tail is not None:
            made, draws, evicted = self.tail.step(min(limit, self.total), emit)
            self.total -= made
            if evicted >= 0:
                self._evict(self.piece.index(evicted))
            return made, draws, evicted
        n = len(self.piece)
        k = min(self.total, limit, self.batch)
        bounds = np.full(k, n, dtype=np.int64)
        bitgen = self.rng.bit_generator
        saved = bitgen.state
        picks = self.rng.integers(bounds).tolist()
        rem = self.rem
        lefts: list[int] = []
        add_left = lefts.append
        s, left = -1, -1
        for s in picks:
            left = rem[s] - 1
            rem[s] = left
            add_left(left)
            if not left:
                break
        made = len(lefts)
        self.total -= made
        draws = None
        if emit:
            slots = np.array(picks[:made], dtype=np.int64)
            pieces = np.array(self.piece, dtype=np.int64)[slots]
            index = np.array(self.off, dtype=np.int64)[slots] + np.array(lefts, dtype=np.int64)
            draws = Draws(pieces, self.arena[index] + self.starts[pieces])
        if left:
            self.batch = min(_MAX_BATCH, 2 * self.batch)
            return made, draws, -1
        evicted = self.piece[s]
        if made < k:
            bitgen.state = saved
            self.rng.integers(bounds[:made])
        self.batch = max(_MIN_BATCH, 2 * made)
        self._evict(s)
        return made, draws, evicted

    def _evict(self, s: int) -> None:
        """Resident ``s`` has been fully drawn: its bytes released, its entries dropped."""
        evicted = self.piece[s]
        if self.sizes is not None:
            self.used_bytes -= self.sizes[evicted]
        self.last = (evicted, self.off[s])
        del self.piece[s], self.off[s], self.rem[s]

    def skip(self, draws: int) -> None:
        """Advance ``draws`` draws, with their evictions and admissions, emitting nothing."""
        while draws > 0 and self.total > 0:
            made, _, evicted = self.step(draws, emit=False)
            draws -= made
            if evicted >= 0:
                self.admit()

    def padding(self, first: int, stop: int) -> Draws:
        """Pad draws ``first..stop-1``: the last piece's frames again, in draw order."""
        piece, off = self.last
        count = self.counts[piece]
        index = np.arange(first, stop) % count
        frames = self.arena[off + count - 1 - index] + self.starts[piece]
        return Draws(np.full(len(frames), piece, dtype=np.int64), frames)


def plan_part(
    pieces: Sequence[Piece],
    piece_bytes: Sequence[int] | np.ndarray | None,
    *,
    buffer_size: int,
    byte_budget: int | None,
    seed: Sequence[int],
    shuffle: bool = True,
    num_samples: int | None = None,
    start: int = 0,
    group: int = 1,
    rule: int = DRAW_RULE,
) -> Iterator[Event]:
    """The exact-coverage pool for one part, as events: Admit, Draws (runs of draws) and Evict.

    ``seed`` is the entropy for ``numpy.random.default_rng``: ``[seed, epoch]`` for a single part
    (then the draws are exactly :func:`reference_draws`), ``[seed, epoch, part]`` with several.
    Pieces are indexed by their position in ``pieces``; pieces with no frame are never
    admitted. ``piece_bytes[i]`` is what piece ``i`` costs while resident (needed only with a
    ``byte_budget``); at most ``buffer_size`` pieces and ``byte_budget`` bytes are resident.

    ``num_samples`` (default: the part's frame count) may exceed the frame count: the extra
    draws repeat the frames of the last drawn piece, in the order they were drawn and cycling,
    before its Evict. ``start=n`` skips the first ``n`` draws without emitting them (no Admit
    or Evict for pieces already gone), then emits Admit for every piece resident at that point,
    in resident order, and goes on; ``start >= num_samples`` yields nothing.

    ``shuffle=False``: pieces in order, frames ascending, still admitting ahead within
    ``buffer_size`` and the budget (in order: the next piece waits until it fits). ``group``:
    a piece's frames are shuffled in groups of that many consecutive episode positions
    (:func:`grouped_order`). ``rule``: the draw rule's version (:data:`RULES`; the module
    docstring says what each does).
    """
    table = Pieces.of(pieces)
    counts = table.counts
    real = int(counts.sum())
    samples = real if num_samples is None else int(num_samples)
    if samples < real:
        raise ValueError(f"num_samples {samples} is less than the part's {real} frames")
    if samples > real == 0:
        raise ValueError(f"a part with no frames cannot yield {samples} padding samples")
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be at least 1, got {buffer_size}")
    if start < 0:
        raise ValueError(f"start must be non-negative, got {start}")
    if group < 1:
        raise ValueError(f"group must be at least 1, got {group}")
    if rule not in RULES:
        raise ValueError(f"unknown draw rule {rule}: this version knows {list(RULES)}")
    sizes = None
    if piece_bytes is not None:
        sizes = np.asarray(piece_bytes, dtype=np.int64)
        if sizes.shape != counts.shape:
            raise ValueError(f"{len(sizes)} piece sizes given for {len(counts)} pieces")
    if byte_budget is not None:
        if sizes is None:
            raise ValueError("a byte_budget needs piece_bytes")
        check_budget(sizes[counts > 0], byte_budget, table.episodes[counts > 0])
    if not shuffle:
        return _plan_in_order(table, sizes, buffer_size, byte_budget, samples, start)
    rng = np.random.default_rng(list(seed))
    pool = _Pool(table, sizes, buffer_size, byte_budget, rng, group, rule)
    return _plan_shuffled(pool, real, samples, start)


def _plan_shuffled(pool: _Pool, real: int, samples: int, start: int) -> Iterator[Event]:
    admitted = pool.admit()
    if start >= samples:
        return
    if start:
        pool.skip(min(start, real))
        if start >= real:  # in the padding: only the last piece is (still) resident
            piece = pool.last[0]
            yield Admit(piece)
            yield pool.padding(start - real, samples - real)
            yield Evict(piece)
            return
        admitted = pool.live_pieces()
    for piece in admitted:
        yield Admit(piece)
    while pool.total:
        _, draws, evicted = pool.step(_MAX_BATCH)
        yield draws
        if evicted < 0:
            continue
        if not pool.resident and not pool.pending and samples > real:
            yield pool.padding(0, samples - real)
        yield Evict(evicted)
        for piece in pool.admit():
            yield Admit(piece)


def _plan_in_order(
    table: Pieces,
    sizes: np.ndarray | None,
    buffer_size: int,
    byte_budget: int | None,
    samples: int,
    start: int,
) -> Iterator[Event]:
    """``shuffle=False``: one piece after another, frames ascending, admitting ahead in order."""
    live = np.flatnonzero(table.counts > 0)
    if start >= samples or not len(live):
        return
    counts = table.counts[live]
    ends = np.cumsum(counts)
    real = int(ends[-1])
    # The piece holding draw `start` (the last one in the padding) and its first frame offset.
    at = min(int(np.searchsorted(ends, start, side="right")), len(live) - 1)
    offset = start - int(ends[at] - counts[at])
    # Admission is greedy in order, so the residents are always a window [at, ahead) whose end
    # only depends on `at`: as far as the pool size and the budget allow.
    ahead = min(at + buffer_size, len(live))
    if byte_budget is not None:
        spent = np.concatenate([[0], np.cumsum(sizes[live])])
        fits = int(np.searchsorted(spent, spent[at] + byte_budget, side="right")) - 1
        ahead = min(ahead, fits)
    used = 0 if sizes is None else int(sizes[live[at:ahead]].sum())
    live_list = live.tolist()
    starts, stops = table.starts.tolist(), table.stops.tolist()
    for i in range(at, ahead):
        yield Admit(live_list[i])
    for i in range(at, len(live_list)):
        piece = live_list[i]
        frames = np.arange(starts[piece] + (offset if i == at else 0), stops[piece])
        if i == len(live_list) - 1 and samples > real:
            count = stops[piece] - starts[piece]
            extra = np.arange(max(start, real) - real, samples - real) % count + starts[piece]
            frames = np.concatenate([frames, extra])
        if len(frames):
            yield Draws(np.full(len(frames), piece, dtype=np.int64), frames.astype(np.int64))
        yield Evict(piece)
        if sizes is not None:
            used -= int(sizes[piece])
        while ahead < len(live_list) and ahead - i - 1 < buffer_size:
            nxt = live_list[ahead]
            if byte_budget is not None and used + int(sizes[nxt]) > byte_budget:
                break
            if sizes is not None:
                used += int(sizes[nxt])
            yield Admit(nxt)
            ahead += 1
