"""The node cache's schedule (reader/loading/node_cache.py, reader/plan/next_use.py; issue 42,
item 4, and issue 49, item 3): which entries a node reads, in which order, at a cost in
proportion to its pieces.

The order each part admits its pieces in is the pool's own (checked against the planner's
events); when they are admitted is estimated, so only what a cache needs is checked: each
part's reads keep their order, epochs follow each other, the rest of an epoch after an
elastic resume is what is left of it (what the interrupted job took is not scheduled again),
and episodes with the same bytes (a mixture over one dataset twice) are one entry, read
whenever either is.
"""

from __future__ import annotations

import copy
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.reader.plan.next_use import NEVER, admission_times, residents_at
from lerobot_shards.reader.plan.partition import Pieces
from lerobot_shards.reader.plan.pool import Admit, Draws, admission_order, plan_part
from lerobot_shards.testing.factory import make_dataset

LENGTHS = [5, 9, 3, 7, 4, 8, 6, 2, 5, 7, 3, 6]


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(0, 12), min_size=1, max_size=25),
    buffer_size=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    shuffle=st.booleans(),
)
def test_admissions_are_the_pools_in_its_order_and_their_times_keep_it(
    counts, buffer_size, seed, shuffle
):
    """``admission_order`` is the order of the plan's Admit events; the estimated times never
    go back, start at 0 for the first pool, and lie within the part's draws."""
    counts = np.array(counts)
    pieces = Pieces(np.arange(len(counts)), np.zeros(len(counts)), counts)
    events = list(plan_part(pieces, None, buffer_size=buffer_size, byte_budget=None,
                            seed=[seed, 1, 2], shuffle=shuffle))  # fmt: skip
    admitted = [e.piece for e in events if type(e) is Admit]
    order = admission_order(counts, [seed, 1, 2], shuffle)
    assert order.tolist() == admitted
    times = admission_times(counts[order], buffer_size)
    assert np.all(np.diff(times) >= 0)
    assert np.all(times[: min(buffer_size, len(times))] == 0)
    drawn = sum(len(e.pieces) for e in events if type(e) is Draws)
    assert np.all((times >= 0) & (times <= drawn))
    for start in range(0, drawn + 1, 5):  # who is resident where a resumed part starts
        resident = residents_at(times, buffer_size, start)
        assert resident.sum() <= buffer_size
        assert np.all(times[resident] <= start)


def test_a_budget_admits_later_where_fewer_bytes_fit():
    counts, sizes = np.full(6, 10), np.array([5, 5, 5, 5, 5, 5])
    plain = admission_times(counts, 4)
    tight = admission_times(counts, 4, sizes, byte_budget=10)  # two pieces fit, not four
    assert plain.tolist()[:4] == [0, 0, 0, 0] and tight.tolist()[:2] == [0, 0]
    assert np.all(tight >= plain) and tight[2] > 0


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("schedule")
    src = make_dataset(
        tmp / "src", episode_lengths=LENGTHS, cameras={"observation.images.cam": (24, 32)}
    )
    lerobot_shards.convert(str(src), str(tmp / "shards"), workers=0, progress=False)
    return tmp / "shards"


def schedule_of(ds: ShardedLeRobotDataset):
    """The node schedule the next iteration of ``ds`` reads through, and where it starts."""
    ctx = ds._context()
    first = ds._world().rank * ctx.workers
    part, _, cursor = copy.deepcopy(ds._position).start(ctx, ds._planner, first, ctx.workers)
    node = ds._node_schedule(ctx, cursor.origin, (part.epoch, cursor.offset))
    return node, part.epoch


def reads_of(node, key: int, epoch: int) -> list[int]:
    """Every time the node reads entry ``key`` in ``epoch`` (its schedule's)."""
    times, after = [], node.time(epoch, 0) - 1
    while (at := node.schedule(epoch).next_use(key, after)) < node.time(epoch + 1, 0):
        times.append(at)
        after = at
    assert at == NEVER or at >= node.time(epoch + 1, 0)
    return times


def test_a_mixture_of_one_dataset_twice_reads_each_entry_for_both(shards, tmp_path):
    """Both members' episode ``e`` are one entry, scheduled at every admission of either (a
    plan's Admit events, counted apart from the schedule)."""
    ds = ShardedLeRobotDataset([shards, shards], cache_dir=tmp_path, buffer_size=2, seed=1)
    node, epoch = schedule_of(ds)
    keys = node.key(ds.catalog.episodes)
    half = len(LENGTHS)
    assert keys[:half].tolist() == keys[half:].tolist() == list(range(half))
    ordering = ds._context().ordering
    part = ds._planner.fresh_parts(ordering, 1, epoch)[0]
    admitted = Counter(
        int(keys[np.searchsorted(ds.catalog.episodes, part.episodes[e.piece])])
        for e in part.plan(ordering, ds.catalog.cost)
        if type(e) is Admit
    )
    assert set(admitted.values()) == {2}  # each dataset's episode once
    for key in range(half):
        assert len(reads_of(node, key, epoch)) == admitted[key]


def test_the_rest_of_an_epoch_after_an_elastic_resume_is_scheduled_not_the_epoch(
    shards, tmp_path, monkeypatch
):
    """One rank takes 60% of epoch 3; its state resumes on 2 ranks of one node: the node's
    schedule of epoch 3 reads exactly the episodes with frames left, each part in its order."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    first = ShardedLeRobotDataset(shards, cache_dir=tmp_path, buffer_size=2, seed=1)
    first.set_epoch(3)
    total = sum(LENGTHS)
    taken = [int(item["index"]) for _, item in zip(range(total * 6 // 10), first, strict=False)]
    state = first.state_dict()
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    left = {e for e in range(len(LENGTHS)) if set(range(starts[e], starts[e + 1])) - set(taken)}
    assert len(left) < len(LENGTHS), "some episodes were taken whole"
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(name, value)
    resumed = ShardedLeRobotDataset(cache_dir=tmp_path, root=shards, buffer_size=2, seed=1)
    resumed.load_state_dict(state)
    node, epoch = schedule_of(resumed)
    assert epoch == 3
    read = node.schedule(3).first_reads(node.time(3, 0), node.time(4, 0))
    assert set(read.tolist()) == set(node.key(resumed.catalog.episodes[sorted(left)]).tolist())


# ------------------------------------------------------------------ cache keys as numbers

DIGEST_TAILS = st.sampled_from([bytes(24), bytes([1]) * 24, bytes(range(24))])
DIGEST_HEADS = st.sampled_from([bytes(8), bytes([7]) * 8, bytes(range(8, 16))])


@settings(max_examples=200, deadline=None)
@given(digests=st.lists(st.tuples(DIGEST_HEADS, DIGEST_TAILS), min_size=0, max_size=30))
def test_key_numbers_are_a_dict_of_the_checksums_texts(digests):
    """Equal checksums one number, numbered in the order they first come, as a dict of their
    texts numbers them; a checksum's text finds its number, another text none: digests that
    share their first eight bytes and differ after (the sort's slow path) included."""
    from lerobot_shards.reader.loading.node_cache import KeyNumbers

    raw = [head + tail for head, tail in digests]
    texts = [f"sha256:{d.hex()}" for d in raw]
    numbers: dict[str, int] = {}
    expected = [numbers.setdefault(t, len(numbers)) for t in texts]
    matrix = np.frombuffer(b"".join(raw), np.uint8).reshape(-1, 32)
    keys = KeyNumbers(matrix)
    assert keys.episodes.tolist() == expected
    assert keys.count == len(numbers)
    for text, number in numbers.items():
        assert keys.number(text) == number
    absent = "sha256:" + (bytes([7]) * 8 + bytes([9]) * 24).hex()
    for other in (absent, "md5:" + "0" * 64, "sha256:zz" + "0" * 62, "sha256:00"):
        assert keys.number(other) is None


def test_the_schedule_numbers_keys_without_a_checksum_text_per_episode(
    shards, tmp_path, monkeypatch
):
    """The node cache numbers a million episodes' keys from their digests: a worker that made
    a text per checksum (5 s each at a million episodes) fails here."""
    from lerobot_shards.reader.meta.selection import Selection

    ds = ShardedLeRobotDataset(str(shards), cache=True, cache_dir=str(tmp_path / "cache"))

    def refused(self):
        raise AssertionError("a checksum text per episode")

    monkeypatch.setattr(Selection, "checksums", property(refused))
    seen = [int(item["index"]) for item in ds]
    assert sorted(seen) == list(range(sum(LENGTHS)))
