"""Elastic resume planning (reader/plan/elastic.py): consumed before plus yielded after is every
frame of the epoch exactly once, for any old and new layout, offset and settings.

The consumed frames are found here without elastic.py: each old part's draws come straight
from ``split_parts`` + ``plan_part`` (as the reader streams a fresh epoch; with a single part,
checked here against the plain reference walk ``reference_draws``), and each part's share of the
offset from a batch-by-batch run of the DataLoader's round-robin over a rank's workers
(:func:`taken_per_part`), not from elastic.py's arithmetic (``consumed_per_worker``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lerobot_shards.reader.plan.elastic import (
    Checkpoint,
    Layout,
    Ordering,
    Part,
    Planner,
    node_parts,
)
from lerobot_shards.reader.plan.partition import samples_per_part, split_parts
from lerobot_shards.reader.plan.pool import (
    READER_GROUP,
    RULES,
    Draw,
    one_by_one,
    plan_part,
    reference_draws,
)


def cost(episode: int, start: int, stop: int) -> int:
    return 7 + 3 * (stop - start) + episode % 3


def fresh_draws(episodes, lengths, ordering: Ordering, num_parts: int, epoch: int) -> list[list]:
    """Every part's frame ids, in draw order, padding included: the reader's fresh epoch."""
    begins = dict(zip(episodes, np.cumsum(lengths) - lengths, strict=True))
    samples = samples_per_part(sum(lengths), num_parts, ordering.pad)
    out = []
    for p, pieces in enumerate(
        split_parts(
            np.array(episodes),
            np.array(lengths),
            num_parts,
            seed=ordering.seed,
            epoch=epoch,
            shuffle=ordering.shuffle,
        )
    ):
        sizes = [cost(q.episode, q.start, q.stop) for q in pieces]
        seed = [ordering.seed, epoch] if num_parts == 1 else [ordering.seed, epoch, p]
        events = one_by_one(
            plan_part(
                pieces,
                sizes,
                buffer_size=ordering.buffer_size,
                byte_budget=ordering.byte_budget,
                seed=seed,
                shuffle=ordering.shuffle,
                num_samples=samples[p],
                group=READER_GROUP,
                rule=ordering.draw_rule,
            )
        )
        out.append(
            [int(begins[pieces[e.piece].episode] + e.frame) for e in events if type(e) is Draw]
        )
    return out


def part_draws(planner: Planner, part: Part, ordering: Ordering) -> list[int]:
    """A rest part's frame ids in draw order (the reader maps draws through positions)."""
    out = []
    for e in one_by_one(part.plan(ordering, cost)):
        if type(e) is Draw:
            unit = int(part.units[e.piece])
            position = part.position(e.piece, e.frame)
            out.append(int(planner.ids(part.epoch, [unit], [position])[0]))
    return out


def reference_ids(episodes, lengths, ordering: Ordering, epoch: int) -> list[int]:
    """A single part's frame ids in draw order by the plain reference walk (shuffled epochs)."""
    begins = dict(zip(episodes, np.cumsum(lengths) - lengths, strict=True))
    draws = reference_draws(
        dict(zip(episodes, lengths, strict=True)),
        {e: cost(e, 0, n) for e, n in zip(episodes, lengths, strict=True)},
        buffer_size=ordering.buffer_size,
        byte_budget=ordering.byte_budget,
        seed=ordering.seed,
        epoch=epoch,
        group=READER_GROUP,
        rule=ordering.draw_rule,
    )
    return [int(begins[e] + f) for e, f in draws]


def taken_per_part(layout: Layout, per_part: list[int], offset: int, batch: int, repeat: bool):
    """Samples each part (rank-major, a rank's workers in order) had yielded when every rank's
    consumer had taken ``offset`` samples, by running the DataLoader batch by batch: a rank's
    workers take turns, each yielding the next ``batch`` samples of its own stream (the last
    batch of a finite stream short; with ``repeat`` the stream runs on and every batch is full),
    an exhausted worker is skipped, and the consumer takes the batches in that order."""
    taken = []
    w = layout.workers
    for rank in range(layout.world_size):
        stream_lengths = per_part[rank * w : (rank + 1) * w]
        yielded = [0] * w
        wanted = offset
        while wanted and (repeat or yielded != stream_lengths):
            for worker in range(w):
                left = batch if repeat else min(batch, stream_lengths[worker] - yielded[worker])
                if not left:
                    continue  # exhausted: the DataLoader skips it
                got = min(left, wanted)  # the consumer may stop within a batch
                yielded[worker] += got
                wanted -= got
                if not wanted:
                    break
        taken += yielded
    return taken


layouts = st.builds(Layout, st.integers(1, 3), st.integers(0, 2))
orderings = st.builds(
    Ordering,
    seed=st.integers(0, 2**16),
    shuffle=st.booleans(),
    buffer_size=st.integers(1, 4),
    byte_budget=st.sampled_from([None, 60, 200]),
    pad=st.booleans(),
    repeat=st.just(False),
    draw_rule=st.sampled_from(RULES),
)


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=7),
    old=layouts,
    new=layouts,
    old_ordering=orderings,
    new_ordering=orderings,
    batch=st.integers(1, 4),
    epoch=st.integers(0, 3),
    fraction=st.floats(0, 1),
)
def test_consumed_plus_rest_is_every_frame_once(
    lengths, old, new, old_ordering, new_ordering, batch, epoch, fraction
):
    total = sum(lengths)
    assume(total > 0)
    assume(not old_ordering.pad or total >= old.num_parts)
    assume(old_ordering.byte_budget is None or old_ordering.byte_budget >= cost(6, 0, 12))
    assume(new_ordering.byte_budget is None or new_ordering.byte_budget >= cost(6, 0, 12))
    episodes = list(range(0, 2 * len(lengths), 2))
    planner = Planner(np.array(episodes), np.array(lengths), cost)
    old_draws = fresh_draws(episodes, lengths, old_ordering, old.num_parts, epoch)
    if old.num_parts == 1 and old_ordering.shuffle:
        assert old_draws[0] == reference_ids(episodes, lengths, old_ordering, epoch)
    per_rank = sum(len(d) for d in old_draws[: old.workers])
    offset = round(fraction * per_rank)
    taken = taken_per_part(old, [len(d) for d in old_draws], offset, batch, False)
    consumed = {i for d, k in zip(old_draws, taken, strict=True) for i in d[:k]}

    checkpoint = Checkpoint(epoch, offset, batch, old, old_ordering)
    assert planner.rest_epoch(checkpoint) == epoch
    assert set(np.flatnonzero(planner.consumed(checkpoint, epoch))) == consumed
    (segment,) = planner.segments(checkpoint, new_ordering, new.num_parts)
    after = [part_draws(planner, part, new_ordering) for part in segment]
    assert [p.epoch for p in segment] == [epoch] * new.num_parts
    flat = [i for d in after for i in d]
    assert not consumed & set(flat)
    assert consumed | set(flat) == set(range(total))
    rest = total - len(consumed)
    if new_ordering.pad and rest:
        assert len({len(d) for d in after}) == 1  # equal lengths: DDP does not hang
        padding = len(flat) - rest
        assert padding == new.num_parts * -(-rest // new.num_parts) - rest < new.num_parts
    else:
        assert sorted(flat) == sorted(set(flat))  # no padding: each frame once
    if not new_ordering.shuffle:  # each part ascending, parts consecutive (padding aside)
        assert list(dict.fromkeys(flat)) == sorted(set(flat))


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 10), min_size=1, max_size=6),
    layouts3=st.tuples(layouts, layouts, layouts),
    ordering=orderings,
    batch=st.integers(1, 3),
    fractions=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_nested_elastic_resumes(lengths, layouts3, ordering, batch, fractions):
    """A checkpoint taken while the rest of an epoch runs resumes again, under a third layout,
    and the same layout continues the very same rest stream."""
    total = sum(lengths)
    assume(not ordering.pad or total >= max(lay.num_parts for lay in layouts3))
    assume(ordering.byte_budget is None or ordering.byte_budget >= cost(5, 0, 10))
    first, second, third = layouts3
    planner = Planner(np.arange(len(lengths)), np.array(lengths), cost)
    old_draws = fresh_draws(list(range(len(lengths))), lengths, ordering, first.num_parts, 1)
    offset = round(fractions[0] * sum(len(d) for d in old_draws[: first.workers]))
    c1 = Checkpoint(1, offset, batch, first, ordering)
    taken = taken_per_part(first, [len(d) for d in old_draws], offset, batch, False)
    consumed = Counter(i for d, k in zip(old_draws, taken, strict=True) for i in d[:k])

    (rest1,) = planner.segments(c1, ordering, second.num_parts)
    draws1 = [part_draws(planner, p, ordering) for p in rest1]
    offset2 = round(fractions[1] * sum(len(d) for d in draws1[: second.workers]))
    taken2 = taken_per_part(second, [len(d) for d in draws1], offset2, batch, False)
    consumed.update(i for d, k in zip(draws1, taken2, strict=True) for i in d[:k])
    c2 = Checkpoint(1, offset2, batch, second, ordering, origin=c1)
    assert set(np.flatnonzero(planner.consumed(c2, 1))) == set(consumed)

    (rest2,) = planner.segments(c2, ordering, third.num_parts)
    after = Counter(i for p in rest2 for i in part_draws(planner, p, ordering))
    assert not set(consumed) & set(after)
    assert set(consumed) | set(after) == set(range(total))

    # The same layout as the rest's own: each part goes on where it stood.
    for q, (part, k) in enumerate(planner.positions(c2)):
        assert part is rest1[q] and k == taken2[q]


def test_repeat_checkpoint_across_an_epoch_boundary():
    """With an endless stream the old parts stand in two epochs: the rest is one segment per
    epoch, each exactly what that epoch still lacks, then fresh epochs."""
    lengths = [5, 8, 3, 9]
    ordering = Ordering(3, True, 2, None, True, True)
    old, new = Layout(2, 2), Layout(3, 0)
    planner = Planner(np.arange(4), np.array(lengths), cost)
    per_part = samples_per_part(25, old.num_parts)[0]  # 7, padded
    offset = 14  # per rank, 7 batches of 2 over 2 workers: worker 0 is in epoch 1, worker 1 not
    taken = taken_per_part(old, [per_part] * 4, offset, 2, True)
    assert taken == [8, 6, 8, 6]
    draws = {x: fresh_draws(list(range(4)), lengths, ordering, 4, x) for x in (0, 1)}
    checkpoint = Checkpoint(0, offset, 2, old, ordering)
    assert planner.rest_epoch(checkpoint) == 0
    segments = planner.segments(checkpoint, ordering, new.num_parts)
    assert [s[0].epoch for s in segments] == [0, 1]
    for x, segment in zip((0, 1), segments, strict=True):
        consumed = set()
        for d, t in zip(draws[x], taken, strict=True):
            consumed |= set(d[: min(per_part, t)] if x == 0 else d[: max(0, t - per_part)])
        after = [i for p in segment for i in part_draws(planner, p, ordering)]
        assert not consumed & set(after)
        assert consumed | set(after) == set(range(25))
    stream = planner.stream(checkpoint, 9, ordering, new.num_parts, 1)
    assert [p.epoch for _, p in zip(range(4), stream, strict=False)] == [0, 1, 2, 3]


def test_fewer_remaining_frames_than_parts_pad_with_a_remaining_frame():
    planner = Planner(np.array([0, 1]), np.array([3, 2]))
    ordering = Ordering(0, True, 2, None, True, False)
    remaining = np.array([False, True, False, False, True])
    parts = planner.rest_parts(ordering, 5, 4, remaining)
    draws = [part_draws(planner, p, ordering) for p in parts]
    assert [len(d) for d in draws] == [1] * 5
    assert {i for d in draws for i in d} == {1, 4}
    unpadded = planner.rest_parts(Ordering(0, True, 2, None, False, False), 5, 4, remaining)
    assert sorted(i for p in unpadded for i in part_draws(planner, p, ordering)) == [1, 4]


def test_rest_split_is_a_pure_function_of_its_inputs():
    planner = Planner(np.arange(6), np.array([4, 0, 7, 2, 9, 5]))
    ordering = Ordering(11, True, 3, None, True, False)
    remaining = np.random.default_rng(0).random(27) < 0.6

    def split(epoch, parts):
        return [
            (p.episodes.tolist(), [g.tolist() for g in p.positions], p.entropy, p.num_samples)
            for p in planner.rest_parts(ordering, parts, epoch, remaining)
        ]

    assert split(2, 3) == split(2, 3)
    assert split(2, 3) != split(3, 3)
    for part in planner.rest_parts(ordering, 3, 2, remaining):
        assert part.episodes.tolist() == sorted(part.episodes.tolist())
        for g in part.positions:
            assert g.tolist() == sorted(g.tolist())


def test_fresh_parts_match_the_reference_stream():
    """Routing fresh epochs through Part keeps the single-part reference order draw for draw."""
    lengths = [4, 6, 3]
    ordering = Ordering(5, True, 2, None, True, False)
    planner = Planner(np.arange(3), np.array(lengths), cost)
    (part,) = planner.fresh_parts(ordering, 1, 2)
    assert part_draws(planner, part, ordering) == fresh_draws([0, 1, 2], lengths, ordering, 1, 2)[0]


@pytest.mark.parametrize("pad", [True, False])
def test_nothing_left_gives_empty_parts(pad):
    planner = Planner(np.arange(2), np.array([2, 3]))
    ordering = Ordering(0, True, 2, None, pad, False)
    parts = planner.rest_parts(ordering, 3, 0, np.zeros(5, dtype=bool))
    assert [p.num_samples for p in parts] == [0, 0, 0]


node_layouts = st.builds(
    lambda nodes, local, workers: Layout(nodes * local, workers, nodes),
    st.integers(1, 3),
    st.integers(1, 2),
    st.integers(0, 2),
)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 12), min_size=1, max_size=9),
    old=node_layouts,
    new=node_layouts,
    ordering=orderings,
    affinity=st.booleans(),
    batch=st.integers(1, 4),
    epoch=st.integers(0, 3),
    fraction=st.floats(0, 1),
)
def test_node_affine_checkpoint_resumes_on_other_nodes(
    lengths, old, new, ordering, affinity, batch, epoch, fraction
):
    """A checkpoint of a node-affine epoch resumes on other nodes, ranks and workers (node
    affinity on or off there): consumed plus rest is every frame once, and the next epoch is
    node-affine under the new nodes. The consumed frames are the old parts' pool replays, each
    cut at the share the DataLoader's round-robin gives it (``taken_per_part``)."""
    total = sum(lengths)
    assume(total > 0 and (not ordering.pad or total >= max(old.num_parts, new.num_parts)))
    assume(ordering.byte_budget is None or ordering.byte_budget >= cost(8, 0, 12))
    old_ordering = dataclasses.replace(ordering, node_affinity=True)
    new_ordering = dataclasses.replace(ordering, node_affinity=affinity)
    planner = Planner(np.arange(len(lengths)), np.array(lengths), cost)
    fresh = planner.fresh_parts(old_ordering, old.num_parts, epoch, old.nodes)
    old_draws = [part_draws(planner, part, old_ordering) for part in fresh]
    offset = round(fraction * sum(len(d) for d in old_draws[: old.workers]))
    taken = taken_per_part(old, [len(d) for d in old_draws], offset, batch, False)
    consumed = {i for d, k in zip(old_draws, taken, strict=True) for i in d[:k]}

    checkpoint = Checkpoint(epoch, offset, batch, old, old_ordering)
    assert set(np.flatnonzero(planner.consumed(checkpoint, epoch))) == consumed
    stream = [
        list(planner.stream(checkpoint, epoch, new_ordering, new.num_parts, q, new.nodes))
        for q in range(new.num_parts)
    ]
    rest = [i for parts in stream for i in part_draws(planner, parts[0], new_ordering)]
    assert not consumed & set(rest)
    assert consumed | set(rest) == set(range(total))
    if new_ordering.pad and total > len(consumed):
        assert len({parts[0].num_samples for parts in stream}) == 1
    nxt = planner.fresh_parts(new_ordering, new.num_parts, epoch + 1, new.nodes)
    assert nxt == planner.fresh_parts(new_ordering, new.num_parts, epoch + 1, new.nodes)
    if affinity and new.nodes > 1:  # each new node's share is the one it reads every epoch
        later = planner.fresh_parts(new_ordering, new.num_parts, epoch + 7, new.nodes)
        for rank in range(0, new.world_size, new.local_world_size):
            mine = node_parts(new, rank)
            assert {i for q in mine for i in part_draws(planner, nxt[q], new_ordering)} == {
                i for q in mine for i in part_draws(planner, later[q], new_ordering)
            }
