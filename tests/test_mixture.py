"""The weighted mixture's epochs, pure (no I/O): samples per dataset, the units of every epoch,
and the planner over them, checked as whole multisets of (episode, frame) and whole sets of
sample ids over epochs, world sizes, workers and elastic resumes. What a checkpoint consumed is
taken from the uninterrupted streams (made without elastic.py), never from the planner."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lerobot_shards.reader.plan.elastic import Checkpoint, Layout, Ordering, Part, Planner
from lerobot_shards.reader.plan.mixture import MixturePlan, Units, samples_per_dataset
from lerobot_shards.reader.plan.partition import Pieces, samples_per_part, split_parts
from lerobot_shards.reader.plan.pool import READER_GROUP, Draw, Draws, one_by_one, plan_part


def make_mixture(lengths_per_dataset, samples, seed=3, shuffle=True):
    """Global episode ids (dataset d's episodes offset by 100 * d) and the plan."""
    episodes = [
        np.arange(len(lens), dtype=np.int64) + 100 * d for d, lens in enumerate(lengths_per_dataset)
    ]
    lengths = [np.asarray(lens, dtype=np.int64) for lens in lengths_per_dataset]
    return episodes, lengths, MixturePlan(episodes, lengths, samples, seed=seed, shuffle=shuffle)


def frame_counts(units: Units) -> Counter:
    """How many times each (episode, frame) is in the units."""
    out: Counter = Counter()
    for e, a, b in zip(
        units.episodes.tolist(), units.starts.tolist(), units.stops.tolist(), strict=True
    ):
        out.update((e, f) for f in range(a, b))
    return out


def epoch_draws(planner: Planner, ordering: Ordering, num_parts: int, epoch: int):
    """Every part's draws of a fresh epoch as (episode, frame) pairs and as sample ids."""
    pairs, ids = [], []
    for part in planner.fresh_parts(ordering, num_parts, epoch):
        for event in part.plan(ordering, None):
            if type(event) is Draws:
                pairs += zip(
                    part.episodes[event.pieces].tolist(), event.frames.tolist(), strict=True
                )
                ids += planner.ids(epoch, part.units[event.pieces], event.frames).tolist()
    return pairs, ids


lengths_strategy = st.lists(
    st.lists(st.integers(1, 9), min_size=1, max_size=5), min_size=1, max_size=4
)


def test_samples_per_dataset_rounds_by_largest_remainder():
    assert samples_per_dataset([10, 10, 10], [2, 1, 1], None).tolist() == [15, 8, 7]
    assert samples_per_dataset([10, 20], None, None).tolist() == [10, 20]
    assert samples_per_dataset([10, 20], None, 6).tolist() == [2, 4]
    assert samples_per_dataset([5, 5], [0, 1], 7).tolist() == [0, 7]
    with pytest.raises(ValueError, match="2 weights given for 3 datasets"):
        samples_per_dataset([1, 2, 3], [1, 1], None)
    with pytest.raises(ValueError, match="non-negative"):
        samples_per_dataset([1, 2], [1, -1], None)
    with pytest.raises(ValueError, match="dataset 1 has weight 1 but no frames"):
        samples_per_dataset([4, 0], [1, 1], None)


@given(
    frames=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    data=st.data(),
    epoch_size=st.one_of(st.none(), st.integers(0, 400)),
)
def test_samples_per_dataset_are_the_shares_rounded(frames, data, epoch_size):
    weights = data.draw(st.lists(st.integers(0, 9), min_size=len(frames), max_size=len(frames)))
    if sum(weights) == 0:
        weights[0] = 1
    counts = samples_per_dataset(frames, weights, epoch_size)
    total = sum(frames) if epoch_size is None else epoch_size
    assert counts.sum() == total
    for n, w in zip(counts.tolist(), weights, strict=True):
        assert abs(n - Fraction(total * w, sum(weights))) < 1


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_strategy, data=st.data(), shuffle=st.booleans())
def test_every_frame_appears_floor_or_ceil_times_and_rotates_over_epochs(lengths, data, shuffle):
    samples = data.draw(st.lists(st.integers(0, 60), min_size=len(lengths), max_size=len(lengths)))
    episodes, lens, plan = make_mixture(lengths, samples, shuffle=shuffle)
    total: Counter = Counter()
    for epoch in range(7):
        units = plan.units(epoch)
        assert units.total == sum(samples)
        counts = frame_counts(units)
        total.update(counts)
        for d in range(len(lengths)):
            frames = [
                (int(e), f) for e, n in zip(episodes[d], lens[d], strict=True) for f in range(n)
            ]
            size = len(frames)
            per_epoch = [counts[f] for f in frames]
            assert sum(per_epoch) == samples[d]
            assert set(per_epoch) <= {samples[d] // size, -(-samples[d] // size)}
            so_far = [total[f] for f in frames]
            assert sum(so_far) == samples[d] * (epoch + 1)
            assert max(so_far) - min(so_far) <= 1, (d, epoch, so_far)


def test_a_down_weighted_dataset_rotates_through_all_its_frames():
    _, _, plan = make_mixture([[4, 4, 4], [6]], [3, 6])
    seen: Counter = Counter()
    for epoch in range(4):  # 4 epochs x 3 samples = every frame of dataset 0 once
        seen.update(k for k in frame_counts(plan.units(epoch)) if k[0] < 100)
    assert sorted(seen) == [(e, f) for e in range(3) for f in range(4)]
    assert set(seen.values()) == {1}


@settings(max_examples=40, deadline=None)
@given(
    lengths=lengths_strategy,
    data=st.data(),
    world_size=st.integers(1, 3),
    workers=st.integers(0, 3),
    epoch=st.integers(0, 5),
)
def test_an_epoch_is_the_same_samples_whatever_the_layout(
    lengths, data, world_size, workers, epoch
):
    samples = data.draw(st.lists(st.integers(0, 40), min_size=len(lengths), max_size=len(lengths)))
    if not sum(samples):
        samples[0] = 1
    episodes, lens, plan = make_mixture(lengths, samples)
    planner = Planner(np.concatenate(episodes), np.concatenate(lens), None, plan.units)
    ordering = Ordering(
        seed=3, shuffle=True, buffer_size=2, byte_budget=None, pad=False, repeat=False
    )
    num_parts = world_size * max(1, workers)
    pairs, ids = epoch_draws(planner, ordering, num_parts, epoch)
    assert sorted(ids) == list(range(sum(samples)))  # every sample exactly once
    assert Counter(pairs) == frame_counts(plan.units(epoch))
    one_part, _ = epoch_draws(planner, ordering, 1, epoch)
    assert Counter(one_part) == Counter(pairs)


def sample_ids(units: Units) -> np.ndarray:
    """Each unit's first sample id: the units' frames numbered end to end (``Units``)."""
    return np.cumsum(units.counts) - units.counts


def uninterrupted_streams(units: Units, ordering: Ordering, num_parts: int, epoch: int):
    """Every part's sample ids in draw order, padding included, for a fresh epoch of ``units``,
    made without elastic.py: the units split as ``split_parts`` splits episodes, each part's
    pool over its pieces' episode rows run by ``plan_part`` (the reader's fresh epoch)."""
    begins = sample_ids(units)
    samples = samples_per_part(units.total, num_parts, ordering.pad)
    out = []
    split = split_parts(
        np.arange(len(units.counts)),
        units.counts,
        num_parts,
        seed=ordering.seed,
        epoch=epoch,
        shuffle=ordering.shuffle,
    )
    for p, pieces in enumerate(split):
        # A piece of unit u is rows of u's episode: the pool decodes GOPs of those rows.
        u = pieces.episodes
        rows = Pieces(
            units.episodes[u], units.starts[u] + pieces.starts, units.starts[u] + pieces.stops
        )
        seed = [ordering.seed, epoch] if num_parts == 1 else [ordering.seed, epoch, p]
        events = plan_part(
            rows,
            None,
            buffer_size=ordering.buffer_size,
            byte_budget=None,
            seed=seed,
            shuffle=ordering.shuffle,
            num_samples=samples[p],
            group=READER_GROUP,
        )
        out.append(
            [
                int(begins[u[e.piece]] + e.frame - units.starts[u[e.piece]])
                for e in one_by_one(events)
                if type(e) is Draw
            ]
        )
    return out


def part_stream(part: Part, ordering: Ordering, units: Units, start: int = 0) -> list[int]:
    """A planned part's sample ids in draw order from draw ``start`` on, as the reader streams
    it (``part.plan(..., start)``, each draw's frame mapped through ``part.position``)."""
    begins = sample_ids(units)
    out = []
    for e in one_by_one(part.plan(ordering, None, start)):
        if type(e) is Draw:
            unit = int(part.units[e.piece])
            out.append(int(begins[unit] + part.position(e.piece, e.frame) - units.starts[unit]))
    return out


def loader_order(streams: list[list[int]], batch: int) -> list[tuple[int, int]]:
    """One rank's DataLoader over its workers' streams: ``(worker, sample id)`` in the order the
    consumer takes them. Workers take turns, each yielding the next ``batch`` samples of its
    own stream (the last batch short); an exhausted worker is skipped."""
    out, at = [], [0] * len(streams)
    while any(a < len(s) for a, s in zip(at, streams, strict=True)):
        for w, s in enumerate(streams):
            out += [(w, i) for i in s[at[w] : at[w] + batch]]
            at[w] = min(len(s), at[w] + batch)
    return out


@settings(max_examples=100, deadline=None)
@given(
    lengths=lengths_strategy,
    data=st.data(),
    old=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    new=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    batch=st.integers(1, 3),
    pad=st.booleans(),
    shuffle=st.booleans(),
)
def test_resume_of_a_mixture_completes_the_epoch_exactly(
    lengths, data, old, new, batch, pad, shuffle
):
    """The samples consumed before the checkpoint are the first ``offset`` of each rank's
    uninterrupted stream (its workers' streams, made without elastic.py, in the DataLoader's
    round-robin). Resumed in the same layout, each part yields exactly the rest of its own
    stream; under another layout, the rest of the epoch is exactly what those streams had
    still to yield, each sample once (padding aside)."""
    samples = data.draw(st.lists(st.integers(1, 30), min_size=len(lengths), max_size=len(lengths)))
    layout, new_layout = Layout(*old), Layout(*new)
    assume(not pad or sum(samples) >= layout.num_parts)  # padded parts need a frame each
    episodes, lens, plan = make_mixture(lengths, samples)
    planner = Planner(np.concatenate(episodes), np.concatenate(lens), None, plan.units)
    ordering = Ordering(3, shuffle, 2, None, pad=pad, repeat=False)
    epoch = data.draw(st.integers(0, 3))
    units = plan.units(epoch)
    streams = uninterrupted_streams(units, ordering, layout.num_parts, epoch)
    fresh = planner.fresh_parts(ordering, layout.num_parts, epoch)
    assert [part_stream(p, ordering, units) for p in fresh] == streams  # the reader's own

    w = layout.workers
    orders = [loader_order(streams[r * w : (r + 1) * w], batch) for r in range(layout.world_size)]
    offset = data.draw(st.integers(0, len(orders[0])))  # the same on every rank (DDP)
    taken, consumed, tail = [], set(), []
    for order in orders:
        before = order[:offset]
        taken += [sum(1 for worker, _ in before if worker == q) for q in range(w)]
        consumed |= {i for _, i in before}
        tail += [i for _, i in order[offset:]]
    checkpoint = Checkpoint(epoch, offset, batch, layout, ordering)

    # The same layout: every part goes on where its uninterrupted stream stood.
    for q, (part, k) in enumerate(planner.positions(checkpoint)):
        assert (part.epoch, k) == (epoch, taken[q])
        assert part_stream(part, ordering, units, k) == streams[q][taken[q] :]

    # Another layout: the epoch's rest, split anew.
    (segment,) = planner.segments(checkpoint, ordering, new_layout.num_parts)
    after = [part_stream(p, ordering, units) for p in segment]
    flat = [i for d in after for i in d]
    assert not consumed & set(flat)
    assert set(flat) == set(tail) - consumed  # what the uninterrupted epoch had still to yield
    assert sorted(consumed | set(flat)) == list(range(sum(samples)))
    if pad and flat:
        assert len({len(d) for d in after}) == 1  # equal lengths: DDP does not hang
        assert len(flat) - len(set(flat)) < new_layout.num_parts
    else:
        assert len(flat) == len(set(flat))
