"""fetch_order: the plan's admissions reordered so the episodes drawn first are fetched first,
with nothing else moved: the same draws in the same order, the same admissions in each run of
them, every draw still after its piece's admission and the pool within its limits."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_plan import check_events, one_part

from lerobot_shards.reader.loading.stream import fetch_order
from lerobot_shards.reader.plan.pool import Admit, Draws, Evict, one_by_one, plan_part


def bursts(events) -> list[list[int]]:
    """The pieces of each run of consecutive admissions, in order."""
    runs: list[list[int]] = []
    previous = None
    for event in events:
        if type(event) is Admit:
            if type(previous) is not Admit:
                runs.append([])
            runs[-1].append(event.piece)
        previous = event
    return runs


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=30),
    buffer_size=st.integers(1, 12),
    seed=st.integers(0, 2**32 - 1),
    start=st.integers(0, 40),
    horizon=st.sampled_from([1, 5, 1024]),
)
def test_admissions_reordered_by_first_draw_and_nothing_else(
    lengths, buffer_size, seed, start, horizon
):
    pieces = one_part({3 * i: n for i, n in enumerate(lengths)})
    start = min(start, int(pieces.counts.sum()))
    plan = list(plan_part(pieces, None, buffer_size=buffer_size, byte_budget=None,
                          seed=[seed, 0], start=start, group=2))  # fmt: skip
    ordered = list(fetch_order(iter(plan), horizon))

    def without_admits(events):
        return [
            (e.pieces.tolist(), e.frames.tolist()) if type(e) is Draws else e
            for e in events
            if type(e) is not Admit
        ]

    assert without_admits(ordered) == without_admits(plan)
    assert [sorted(b) for b in bursts(ordered)] == [sorted(b) for b in bursts(plan)]
    check_events(list(one_by_one(ordered)), pieces, None, buffer_size, None)
    # Within each burst: the pieces drawn in the following draws (before the next eviction)
    # come first, in the order of their first draw.
    for n, event in enumerate(ordered):
        if type(event) is Admit and (n == 0 or type(ordered[n - 1]) is not Admit):
            burst = []
            m = n
            while m < len(ordered) and type(ordered[m]) is Admit:
                burst.append(ordered[m].piece)
                m += 1
            first: list[int] = []
            drawn = 0
            while m < len(ordered) and type(ordered[m]) is Draws and drawn < horizon:
                for piece in ordered[m].pieces.tolist():
                    if piece in burst and piece not in first:
                        first.append(piece)
                drawn += len(ordered[m].pieces)
                m += 1
            assert burst[: len(first)] == first


def test_a_pool_filling_fetches_the_first_drawn_episodes_first():
    pieces = one_part({e: 40 for e in range(16)})
    plan = list(plan_part(pieces, None, buffer_size=16, byte_budget=None, seed=[1, 0], group=2))
    ordered = list(fetch_order(iter(plan)))
    first_run = next(e for e in ordered if type(e) is Draws)
    admitted = [e.piece for e in ordered if type(e) is Admit]
    firsts = list(dict.fromkeys(first_run.pieces.tolist()))
    assert admitted[: len(firsts)] == firsts
    assert admitted != [e.piece for e in plan if type(e) is Admit]  # the plan's order differs
    assert not any(type(e) is Evict for e in ordered[: len(admitted)])
    assert np.array_equal(
        np.concatenate([e.pieces for e in ordered if type(e) is Draws]),
        np.concatenate([e.pieces for e in plan if type(e) is Draws]),
    )
