"""The rank's stream of mixed batches (``plan/interleave.py``): each worker's samples taken one at
a time in turn. Checked against what it must agree with: every batch's rows held exactly once,
the DataLoader's round robin (``consumed_per_worker``, sample by sample) at every offset, and a
resumed iteration going on exactly where the interrupted one was."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_shards.reader.plan.elastic import consumed_per_worker
from lerobot_shards.reader.plan.interleave import Interleave

lane_counts = st.lists(st.integers(0, 40), min_size=1, max_size=5)


def rank_stream(counts: list[int]) -> list[tuple[int, int]]:
    """``(lane, sample)`` in rank order, written plainly: round after round, every lane that
    still has a sample gives its next one."""
    out = []
    for i in range(max(counts, default=0)):
        out += [(lane, i) for lane, n in enumerate(counts) if i < n]
    return out


@settings(max_examples=60)
@given(counts=lane_counts, batch_size=st.integers(1, 12))
def test_every_batch_row_is_one_sample_of_one_lane(counts, batch_size):
    interleave = Interleave(counts, len(counts))
    total = sum(counts)
    batches = -(-total // batch_size)
    seen = {}
    for lane, n in enumerate(counts):
        places = list(interleave.places(lane, batch_size))
        assert len(places) == n
        for i, place in enumerate(places):
            assert place not in seen
            seen[place] = (lane, i)
    want = {(k, r) for k in range(batches) for r in range(interleave.batch_length(k, batch_size))}
    assert set(seen) == want
    # and in rank order, the plain round robin
    order = [seen[divmod(p, batch_size)] for p in range(total)]
    assert order == rank_stream(counts)


@settings(max_examples=60)
@given(counts=lane_counts)
def test_what_each_lane_gave_is_the_round_robin_of_single_samples(counts):
    interleave = Interleave(counts, len(counts))
    places = [interleave.positions(lane, 0, n) for lane, n in enumerate(counts)]
    for offset in range(sum(counts) + 1):
        consumed, nxt = consumed_per_worker(offset, counts, 1, repeat=False)
        assert consumed == [int((p < offset).sum()) for p in places]
        if offset < sum(counts):
            assert offset in places[nxt].tolist()


@settings(max_examples=60)
@given(counts=lane_counts, data=st.data())
def test_an_iteration_resumed_anywhere_goes_on_as_the_interrupted_one(counts, data):
    """After ``offset`` samples, lane ``w`` of the new iteration plays lane ``nxt + w`` with
    what that lane has left (``state.Position.start``): the same rank stream follows."""
    total = sum(counts)
    offset = data.draw(st.integers(0, total))
    consumed, nxt = consumed_per_worker(offset, counts, 1, repeat=False)
    lanes = len(counts)
    roles = [(nxt + w) % lanes for w in range(lanes)]
    resumed = Interleave([counts[r] - consumed[r] for r in roles], lanes)
    after = {}
    for w, role in enumerate(roles):
        left = counts[role] - consumed[role]
        for i, p in enumerate(resumed.positions(w, 0, left).tolist()):
            after[p] = (role, consumed[role] + i)
    assert [after[p] for p in range(total - offset)] == rank_stream(counts)[offset:]


@given(lanes=st.integers(1, 5), batch_size=st.integers(1, 12), offset=st.integers(0, 500))
def test_endless_lanes_take_turns_forever(lanes, batch_size, offset):
    interleave = Interleave(None, lanes)
    assert interleave.total is None and interleave.batch_length(10**9, batch_size) == batch_size
    consumed, _ = consumed_per_worker(offset, [1] * lanes, 1, repeat=True)
    for lane in range(lanes):
        positions = interleave.positions(lane, 0, 200)
        assert np.array_equal(positions, np.arange(200) * lanes + lane)
        assert int((positions < offset).sum()) == consumed[lane] or offset >= 200 * lanes
    first = next(interleave.places(lanes - 1, batch_size))
    assert first == divmod(lanes - 1, batch_size)
