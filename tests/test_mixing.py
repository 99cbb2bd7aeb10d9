"""Mixing: batches drawn from a full pool hold about as many distinct episodes as uniform draws
from the pool would give, a rank whose workers hold every episode mixes its batches as a global
shuffle does to the end of the epoch (the pool's tail, ``plan/pool.py``), and a byte budget that
fits a full pool of compressed episodes costs none of it (the reader's order is then exactly the
order without a budget)."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.format import MANIFEST_FILE
from lerobot_shards.reader.plan.elastic import Ordering, Planner
from lerobot_shards.reader.plan.partition import split_parts
from lerobot_shards.reader.plan.pool import DRAW_RULE, UNIFORM_PICKS, Draws, plan_part
from lerobot_shards.validate import read_manifest

BATCH = 32


def ideal(pool: int, batch: int = BATCH) -> float:
    """Expected distinct episodes in ``batch`` uniform draws (with replacement) from ``pool``."""
    return pool * (1 - (1 - 1 / pool) ** batch)


def distinct_per_batch(pieces: np.ndarray, batch: int = BATCH) -> np.ndarray:
    whole = len(pieces) // batch * batch
    return np.array([len(set(b)) for b in pieces[:whole].reshape(-1, batch).tolist()])


@settings(max_examples=40, deadline=None)
@given(
    buffer_size=st.integers(2, 64),
    ratio=st.integers(4, 8),
    max_length=st.integers(1, 400),
    budgeted=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_median_batch_mixes_as_uniform_draws_from_the_pool(
    buffer_size, ratio, max_length, budgeted, seed
):
    """A dataset of 4-8 times more episodes than the pool, of 1..max_length frames and random
    compressed sizes, under no budget or one that fits the ``buffer_size`` largest episodes."""
    rng = np.random.default_rng(seed)
    n = ratio * buffer_size
    lengths = rng.integers(1, max_length + 1, n)
    pieces = split_parts(np.arange(n), lengths, 1, seed=0, epoch=0)[0]
    sizes = pieces.counts * rng.integers(1_000, 50_000, n)
    budget = int(np.sort(sizes)[-buffer_size:].sum()) if budgeted else None
    drawn = [
        event.pieces
        for event in plan_part(
            pieces, sizes, buffer_size=buffer_size, byte_budget=budget, seed=[seed, 0]
        )
        if type(event) is Draws
    ]
    distinct = distinct_per_batch(np.concatenate(drawn))
    assume(len(distinct) >= 10)  # a median of at least ten batches
    assert np.median(distinct) >= 0.9 * ideal(buffer_size), (np.median(distinct), distinct)


def test_the_rule_beats_weighting_by_frames_left_on_long_episodes():
    """The figure the rule was chosen by: 64 residents, episodes of 74-240 frames."""
    rng = np.random.default_rng(7)
    lengths = rng.integers(74, 241, 256)
    pieces = split_parts(np.arange(256), lengths, 1, seed=0, epoch=0)[0]
    events = plan_part(pieces, None, buffer_size=64, byte_budget=None, seed=[7, 0])
    drawn = np.concatenate([e.pieces for e in events if type(e) is Draws])
    assert np.median(distinct_per_batch(drawn)) >= 0.95 * ideal(64)  # 25.3


def global_shuffle(lengths: list[int], batch: int = BATCH) -> float:
    """Expected distinct episodes in ``batch`` frames drawn uniformly without replacement from
    all frames (episode ``e`` holds ``lengths[e]``)."""
    total = sum(lengths)
    return sum(1 - float(np.prod((total - n - np.arange(batch)) / (total - np.arange(batch))))
               for n in lengths)  # fmt: skip


def mixed_batches(planner: Planner, ordering: Ordering, workers: int, epoch: int) -> np.ndarray:
    """Distinct episodes in each full batch of one rank whose batches take its workers'
    samples one at a time in turn (``plan/interleave.py``), a spent worker skipped."""
    lanes = []
    for part in planner.fresh_parts(ordering, workers, epoch):
        drawn = [e.pieces for e in part.plan(ordering, None) if type(e) is Draws]
        lanes.append(part.episodes[np.concatenate(drawn)].tolist())
    stream = [lane[i] for i in range(max(map(len, lanes))) for lane in lanes if i < len(lane)]
    return distinct_per_batch(np.array(stream))


@pytest.mark.parametrize("workers", [2, 3])
def test_workers_holding_every_episode_mix_as_a_global_shuffle_to_the_end(workers):
    """24 episodes of 300-500 frames (the peer benchmark's), held whole by the workers' pools
    from the start: over 5 epochs, batches of 32 hold at least 0.95 of the global shuffle's
    distinct episodes (17.7), and so do the last tenth of each epoch's batches within 0.9,
    where uniform picks (rule 1) had left a few long episodes to the end (16.5 and 9 there)."""
    lengths = [(300, 500, 350, 450, 400)[e % 5] for e in range(24)]
    planner = Planner(np.arange(24), np.array(lengths))
    ideal = global_shuffle(lengths)
    for rule, holds in ((DRAW_RULE, True), (UNIFORM_PICKS, False)):
        ordering = Ordering(3, True, 64, None, False, False, draw_rule=rule)
        epochs = [mixed_batches(planner, ordering, workers, epoch) for epoch in range(5)]
        mean = np.concatenate(epochs).mean()
        tail = np.concatenate([d[-len(d) // 10 :] for d in epochs]).mean()
        assert (mean >= 0.95 * ideal and tail >= 0.9 * ideal) == holds, (rule, mean, tail, ideal)


def test_a_budget_that_fits_a_full_pool_keeps_the_order_of_no_budget(av1):
    manifest = read_manifest(fsspec.filesystem("file"), str(av1 / MANIFEST_FILE))
    sizes = sorted(manifest.column("size").to_pylist())
    workers, buffer_size = 2, 2
    # Each worker's share holds its two largest episodes, and nothing is left for frames.
    budget = workers * sum(sizes[-buffer_size:])

    def order(**options) -> list[int]:
        ds = ShardedLeRobotDataset(av1, buffer_size=buffer_size, seed=5, **options)
        ds.num_workers = workers
        loader = DataLoader(ds, batch_size=4, num_workers=workers)
        return [int(i) for batch in loader for i in batch["index"]]

    unbudgeted = order()
    assert sorted(unbudgeted) == list(range(sum(manifest.column("length").to_pylist())))
    assert order(byte_budget_gb=budget / 1e9) == unbudgeted
    # One byte less and a pool of two largest episodes no longer fits: the order changes.
    assert order(byte_budget_gb=(budget - 2) / 1e9) != unbudgeted
