"""The exact-coverage pool (reader/plan/pool.py): equal to the reference, exact, resumable,
bounded."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_shards.reader.plan.partition import Pieces, part_index, samples_per_part, split_parts
from lerobot_shards.reader.plan.pool import (
    DRAW_RULE,
    RULES,
    SHUFFLED_TAIL,
    UNIFORM_PICKS,
    Admit,
    Draw,
    Draws,
    Evict,
    check_budget,
    first_draws,
    grouped_order,
    one_by_one,
    plan_part,
    reference_draws,
)

COUNTS = {0: 3, 2: 1, 5: 4, 7: 2, 9: 0}
SIZES = {0: 30, 2: 10, 5: 40, 7: 20, 9: 5}


def one_part(counts: dict[int, int]) -> Pieces:
    episodes = np.array(list(counts), dtype=np.int64)
    return split_parts(episodes, np.array(list(counts.values())), 1, seed=0, epoch=0)[0]


def planned(*args, **kwargs) -> list:
    """``plan_part``'s events with its runs split into single draws, each run checked first."""
    events = list(plan_part(*args, **kwargs))
    for event in events:
        if type(event) is Draws:
            assert event.pieces.dtype == event.frames.dtype == np.int64
            assert len(event.pieces) == len(event.frames) > 0
    return list(one_by_one(events))


def draws_of(events, pieces: Pieces) -> list[tuple[int, int]]:
    return [(int(pieces.episodes[e.piece]), e.frame) for e in events if isinstance(e, Draw)]


def check_events(events, pieces: Pieces, sizes, buffer_size: int, budget: int | None) -> None:
    """Admit before draw, evict after the last draw, and the pool never over its limits."""
    resident: set[int] = set()
    done: set[int] = set()
    used = 0
    for event in events:
        if isinstance(event, Admit):
            assert event.piece not in resident and event.piece not in done
            resident.add(event.piece)
            used += sizes[event.piece] if sizes is not None else 0
            assert len(resident) <= buffer_size
            assert budget is None or used <= budget
        elif isinstance(event, Draw):
            assert event.piece in resident
            piece = pieces[event.piece]
            assert piece.start <= event.frame < piece.stop
        else:
            assert isinstance(event, Evict)
            resident.remove(event.piece)
            done.add(event.piece)
            used -= sizes[event.piece] if sizes is not None else 0
    assert not resident


def test_integers_with_an_array_of_bounds_equals_scalar_calls():
    """The fact the fast planner rests on: same values, same generator state afterwards."""
    bounds = np.array([5_000_000_000, 2**32 + 1, 2**32, 2**32 - 1, 1000, 17, 3, 2, 1] * 20)
    batched, single = np.random.default_rng([4, 2]), np.random.default_rng([4, 2])
    values = batched.integers(bounds)
    assert values.tolist() == [int(single.integers(int(b))) for b in bounds]
    assert batched.bit_generator.state == single.bit_generator.state
    frames_a, frames_b = np.arange(50), np.arange(50)
    batched.shuffle(frames_a)
    single.shuffle(frames_b)
    assert frames_a.tolist() == frames_b.tolist()


def test_first_draws_cuts_the_runs_at_n():
    pieces = one_part({e: 7 + e % 5 for e in range(40)})
    every = [(e.piece, e.frame) for e in planned(pieces, None, buffer_size=3, byte_budget=None,
                                                 seed=[3, 1]) if type(e) is Draw]  # fmt: skip
    for n in (0, 1, 5, 100, len(every), len(every) + 10):
        got = first_draws(plan_part(pieces, None, buffer_size=3, byte_budget=None, seed=[3, 1]), n)
        assert list(zip(got.pieces.tolist(), got.frames.tolist(), strict=True)) == every[:n]


def test_whole_order_of_a_small_case():
    """Pinned: the order of each draw rule for this case, so a change of order (which would
    resume old checkpoints into another order) cannot go unseen. Under a budget that admits the
    last episode at the end, the rules agree; with every episode resident from the start, rule
    1's uniform picks leave episode 5, the longest, to the end, and rule 2 shuffles it in."""
    budgeted = [(5, 0), (5, 1), (2, 0), (7, 0), (7, 1), (5, 2), (5, 3), (0, 1), (0, 2), (0, 0)]
    pieces = one_part(COUNTS)
    sizes = [SIZES[e] for e in pieces.episodes.tolist()]
    for rule in RULES:
        reference = reference_draws(
            COUNTS, SIZES, buffer_size=2, byte_budget=60, seed=0, epoch=0, rule=rule
        )
        assert reference == budgeted
        events = planned(pieces, sizes, buffer_size=2, byte_budget=60, seed=[0, 0], rule=rule)
        assert draws_of(events, pieces) == budgeted
        assert [e for e in events if not isinstance(e, Draw)][:3] == [Admit(2), Admit(1), Evict(1)]
        check_events(events, pieces, sizes, 2, 60)
    whole = {
        UNIFORM_PICKS: [(2, 0), (7, 0), (0, 2), (0, 1), (7, 1), (0, 0), (5, 0), (5, 1), (5, 2),
                        (5, 3)],
        SHUFFLED_TAIL: [(5, 0), (7, 0), (5, 1), (0, 2), (5, 2), (0, 1), (2, 0), (0, 0), (5, 3),
                        (7, 1)],
    }  # fmt: skip
    for rule, expected in whole.items():
        assert reference_draws(COUNTS, buffer_size=4, seed=0, epoch=0, rule=rule) == expected
        events = planned(pieces, None, buffer_size=4, byte_budget=None, seed=[0, 0], rule=rule)
        assert draws_of(events, pieces) == expected
    assert reference_draws(COUNTS, buffer_size=4, seed=0, epoch=0) == whole[DRAW_RULE]
    with pytest.raises(ValueError, match=r"^unknown draw rule 3: this version knows \[1, 2\]$"):
        plan_part(pieces, None, buffer_size=4, byte_budget=None, seed=[0, 0], rule=3)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=30),
    buffer_size=st.integers(1, 12),
    budget_slack=st.one_of(st.none(), st.integers(0, 300)),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 1000),
    group=st.sampled_from([1, 2, 3]),
    rule=st.sampled_from(RULES),
    data=st.data(),
)
def test_fast_planner_equals_the_reference_and_resumes_at_any_offset(
    lengths, buffer_size, budget_slack, seed, epoch, group, rule, data
):
    rng = np.random.default_rng(len(lengths))
    counts = {3 * i: n for i, n in enumerate(lengths)}
    sizes_by_episode = {e: int(rng.integers(1, 100)) for e in counts}
    budget = None if budget_slack is None else max(sizes_by_episode.values()) + budget_slack
    reference = reference_draws(
        counts,
        sizes_by_episode,
        buffer_size=buffer_size,
        byte_budget=budget,
        seed=seed,
        epoch=epoch,
        group=group,
        rule=rule,
    )
    pieces = one_part(counts)
    sizes = [sizes_by_episode[e] for e in pieces.episodes.tolist()]

    def plan(start=0):
        return planned(
            pieces, sizes, buffer_size=buffer_size, byte_budget=budget, seed=[seed, epoch],
            start=start, group=group, rule=rule,
        )  # fmt: skip

    events = plan()
    assert draws_of(events, pieces) == reference
    assert sorted(reference) == [(e, f) for e, n in sorted(counts.items()) for f in range(n)]
    check_events(events, pieces, sizes, buffer_size, budget)
    start = data.draw(st.integers(0, len(reference) + 2))
    resumed = plan(start)
    assert draws_of(resumed, pieces) == reference[start:]
    check_events(resumed, pieces, sizes, buffer_size, budget)


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=30),
    buffer_size=st.integers(1, 12),
    budget_slack=st.one_of(st.none(), st.integers(0, 300)),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_rules_draw_alike_until_nothing_is_left_to_admit(
    lengths, buffer_size, budget_slack, seed
):
    """Rule 2 changes only the tail: every draw before the last admission is rule 1's, random
    number for random number, so a pool smaller than its part mixes as before until then."""
    rng = np.random.default_rng(seed)
    counts = {i: n for i, n in enumerate(lengths)}
    sizes = {e: int(rng.integers(1, 100)) for e in counts}
    budget = None if budget_slack is None else max(sizes.values()) + budget_slack
    kwargs = dict(buffer_size=buffer_size, byte_budget=budget, seed=seed, epoch=0, group=2)
    uniform = reference_draws(counts, sizes, rule=UNIFORM_PICKS, **kwargs)
    shuffled = reference_draws(counts, sizes, rule=SHUFFLED_TAIL, **kwargs)
    pieces = one_part(counts)
    events = planned(pieces, [sizes[e] for e in pieces.episodes.tolist()], buffer_size=buffer_size,
                     byte_budget=budget, seed=[seed, 0], group=2, rule=UNIFORM_PICKS)  # fmt: skip
    admits = [i for i, e in enumerate(events) if isinstance(e, Admit)]
    before = sum(isinstance(e, Draw) for e in events[: admits[-1]]) if admits else 0
    assert shuffled[:before] == uniform[:before]
    assert sorted(shuffled) == sorted(uniform)


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 20), min_size=1, max_size=20),
    world_size=st.integers(1, 3),
    num_workers=st.integers(0, 3),
    buffer_size=st.integers(1, 6),
    budget_slack=st.one_of(st.none(), st.integers(0, 150)),
    pad=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
    epoch=st.integers(0, 5),
    rule=st.sampled_from(RULES),
    data=st.data(),
)
def test_every_frame_once_over_all_parts_with_equal_lengths(
    lengths,
    world_size,
    num_workers,
    buffer_size,
    budget_slack,
    pad,
    shuffle,
    seed,
    epoch,
    rule,
    data,
):
    episodes = np.arange(len(lengths)) * 2
    total = sum(lengths)
    num_parts = world_size * max(num_workers, 1)
    if pad and 0 < total < num_parts:
        return  # refused by samples_per_part (tested there)
    parts = split_parts(
        episodes, np.array(lengths), num_parts, seed=seed, epoch=epoch, shuffle=shuffle
    )
    samples = samples_per_part(total, num_parts, pad=pad)
    sizes_by_episode = {int(e): 10 + 7 * int(e) for e in episodes}
    budget = None if budget_slack is None else max(sizes_by_episode.values()) + budget_slack
    real, padding = [], []
    for rank in range(world_size):
        for worker in range(max(num_workers, 1)):
            part, count = part_index(rank, world_size, worker, num_workers)
            assert count == num_parts
            pieces = parts[part]
            sizes = [sizes_by_episode[e] for e in pieces.episodes.tolist()]
            kwargs = dict(
                buffer_size=buffer_size, byte_budget=budget, seed=[seed, epoch, part],
                shuffle=shuffle, num_samples=samples[part], rule=rule,
            )  # fmt: skip
            events = planned(pieces, sizes, **kwargs)
            check_events(events, pieces, sizes, buffer_size, budget)
            drawn = draws_of(events, pieces)
            assert len(drawn) == samples[part]
            own = sum(p.count for p in pieces)
            assert len(set(drawn[:own])) == own  # the part's own frames first, each once
            assert set(drawn[own:]) <= set(drawn[:own])  # padding repeats the part's frames
            real += drawn[:own]
            padding += drawn[own:]
            if not shuffle:
                assert drawn[:own] == sorted(drawn[:own])
            start = data.draw(st.integers(0, samples[part] + 1))
            suffix = planned(pieces, sizes, start=start, **kwargs)
            assert draws_of(suffix, pieces) == drawn[start:]
            check_events(suffix, pieces, sizes, buffer_size, budget)
    assert sorted(real) == [
        (int(e), f) for e, n in zip(episodes, lengths, strict=True) for f in range(n)
    ]
    assert len(padding) == (num_parts * samples[0] - total if pad else 0)
    assert len(padding) < num_parts


def test_padding_repeats_the_last_piece_in_draw_order():
    pieces = Pieces(np.array([1, 2]), np.array([0, 4]), np.array([3, 6]))
    for shuffle in (True, False):
        events = planned(pieces, None, buffer_size=2, byte_budget=None, seed=[1, 0],
                         shuffle=shuffle, num_samples=10)  # fmt: skip
        draws = [(e.piece, e.frame) for e in events if isinstance(e, Draw)]
        assert events[-1] == Evict(draws[4][0])  # the last piece is evicted after its padding
        last = [d for d in draws[:5] if d[0] == draws[4][0]]
        assert draws[5:] == (last * 5)[: 10 - 5]
        for start in range(12):
            resumed = planned(pieces, None, buffer_size=2, byte_budget=None, seed=[1, 0],
                              shuffle=shuffle, num_samples=10, start=start)  # fmt: skip
            assert [(e.piece, e.frame) for e in resumed if isinstance(e, Draw)] == draws[start:]
            if start < 10:
                assert isinstance(resumed[0], Admit) and resumed[-1] == events[-1]
            else:
                assert resumed == []


def test_order_is_a_pure_function_of_its_inputs():
    pieces = one_part({e: 20 for e in range(30)})

    def order(seed):
        return planned(pieces, None, buffer_size=4, byte_budget=None, seed=seed)

    assert order([7, 1]) == order([7, 1])
    assert order([7, 1]) != order([7, 2])  # another epoch
    assert order([7, 1]) != order([8, 1])  # another seed
    assert order([7, 1, 0]) != order([7, 1, 1])  # another part


def test_unshuffled_order_is_ascending_and_admits_ahead():
    pieces = Pieces(np.arange(4), np.zeros(4), np.array([3, 0, 2, 4]))  # piece 1 has no frame
    events = planned(pieces, [5, 1, 5, 5], buffer_size=2, byte_budget=10, seed=[0, 0],
                     shuffle=False)  # fmt: skip
    assert events == [
        Admit(0), Admit(2), Draw(0, 0), Draw(0, 1), Draw(0, 2), Evict(0), Admit(3),
        Draw(2, 0), Draw(2, 1), Evict(2), Draw(3, 0), Draw(3, 1), Draw(3, 2), Draw(3, 3), Evict(3),
    ]  # fmt: skip


def test_budget_errors():
    with pytest.raises(
        ValueError, match=r"^Episode 5 requires 40 bytes, exceeding the byte budget 39$"
    ):
        reference_draws(COUNTS, SIZES, buffer_size=2, byte_budget=39, seed=0, epoch=0)
    pieces = one_part(COUNTS)
    sizes = [SIZES[e] for e in pieces.episodes.tolist()]
    with pytest.raises(
        ValueError, match=r"^Episode 5 requires 40 bytes, exceeding the byte budget 39$"
    ):
        plan_part(pieces, sizes, buffer_size=2, byte_budget=39, seed=[0, 0])
    with pytest.raises(
        ValueError, match=r"^Episode 7 requires 20 bytes, exceeding the byte budget 10$"
    ):
        check_budget({9: 5, 7: 20, 8: 30}, 10)
    check_budget({9: 5, 7: 20}, None)
    with pytest.raises(ValueError, match="less than the part's 10 frames"):
        plan_part(pieces, None, buffer_size=2, byte_budget=None, seed=[0, 0], num_samples=9)


@pytest.mark.parametrize(
    ("buffer_size", "budget", "group", "rule"),
    [
        (40, None, 1, UNIFORM_PICKS),
        (200, None, 2, UNIFORM_PICKS),
        (25, 3000, 2, UNIFORM_PICKS),
        (200, None, 2, SHUFFLED_TAIL),
        (25, 3000, 2, SHUFFLED_TAIL),
        (400, None, 2, SHUFFLED_TAIL),
    ],
)
def test_larger_epoch_equals_the_reference_with_resume(buffer_size, budget, group, rule):
    """Long enough to pack the slots and the frame arena and to run batches at full size (and,
    with a pool of 400, to draw the whole epoch as rule 2's tail)."""
    rng = np.random.default_rng(buffer_size)
    counts = {int(e): int(n) for e, n in enumerate(rng.integers(1, 80, 300))}
    sizes_by_episode = {e: int(rng.integers(1, 500)) for e in counts}
    reference = reference_draws(
        counts, sizes_by_episode, buffer_size=buffer_size, byte_budget=budget, seed=11, epoch=4,
        group=group, rule=rule,
    )  # fmt: skip
    pieces = one_part(counts)
    sizes = [sizes_by_episode[e] for e in pieces.episodes.tolist()]
    for start in (0, 1, 777, len(reference) // 2, len(reference) - 1):
        events = planned(pieces, sizes, buffer_size=buffer_size, byte_budget=budget,
                         seed=[11, 4], start=start, group=group, rule=rule)  # fmt: skip
        assert draws_of(events, pieces) == reference[start:]
        check_events(events, pieces, sizes, buffer_size, budget)


@settings(max_examples=200, deadline=None)
@given(start=st.integers(0, 50), count=st.integers(1, 60), group=st.integers(1, 5))
def test_grouped_order_keeps_each_group_together(start, count, group):
    order = grouped_order(start, count, group, np.random.default_rng(start * 61 + count))
    assert sorted(order.tolist()) == list(range(count))
    groups = [(start + p) // group for p in order.tolist()]
    runs = [g for i, g in enumerate(groups) if i == 0 or groups[i - 1] != g]
    assert len(runs) == len(set(runs))  # each group's positions come in one run...
    for g in set(groups):
        run = [p for p in order.tolist() if (start + p) // group == g]
        assert run == sorted(run)  # ...ascending


def test_the_pool_draws_a_group_at_an_episodes_consecutive_picks():
    """A group's frames are its episode's consecutive draws, highest first (taken from the
    end of the grouped order), so a GOP mate decoded at one pick is drawn at the next."""
    counts = {0: 9, 1: 6, 2: 7}
    draws = reference_draws(counts, buffer_size=3, seed=5, epoch=0, group=2)
    for episode, count in counts.items():
        frames = [f for e, f in draws if e == episode]
        assert sorted(frames) == list(range(count))
        runs: list[list[int]] = []
        for f in frames:
            if runs and runs[-1][0] // 2 == f // 2:
                runs[-1].append(f)
            else:
                runs.append([f])
        assert len(runs) == (count + 1) // 2  # one run per pair: never split
        assert all(run == sorted(run, reverse=True) for run in runs)
