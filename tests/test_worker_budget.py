"""The byte budget: per rank, shared out over its DataLoader workers; each worker's share pays
first for a full pool of fetched episodes and the frame cache gets what is left. An episode
too large for a share is refused by name, a budget that starves the pool is warned about, and a
checkpoint taken under the split resumes (elastically) under another worker count."""

from __future__ import annotations

import warnings

import fsspec
import pytest
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset, SmallPoolWarning
from lerobot_shards.format import MANIFEST_FILE
from lerobot_shards.validate import read_manifest

FRAMES = 74
MB = 10**6


@pytest.fixture(scope="module")
def sizes(av1) -> dict[int, int]:
    """Each episode's fetched (compressed) bytes: what it costs the pool."""
    manifest = read_manifest(fsspec.filesystem("file"), str(av1 / MANIFEST_FILE))
    return dict(
        zip(
            manifest.column("episode_index").to_pylist(),
            manifest.column("size").to_pylist(),
            strict=True,
        )
    )


def split(budget: int, cache: int, workers: int, full_pool: int) -> tuple[int, int]:
    """(pool budget, frame cache) of one worker's part, as the README states the rule, where
    ``full_pool`` is what the ``buffer_size`` largest episodes take."""
    share = budget // workers
    part_cache = max(0, min(cache // workers, share - full_pool))
    return share - part_cache, part_cache


def largest(sizes: dict[int, int], n: int) -> int:
    return sum(sorted(sizes.values())[-n:])


def test_budget_holds_compressed_episodes_and_the_cache(av1, sizes):
    budget, cache = 8 * max(sizes.values()), 10 * MB
    ds = ShardedLeRobotDataset(
        av1, byte_budget_gb=budget / 1e9, frame_cache_gb=cache / 1e9, buffer_size=4
    )
    assert sorted(int(item["index"]) for item in ds) == list(range(FRAMES))
    pool, part_cache = split(budget, cache, 1, largest(sizes, 4))
    assert pool == largest(sizes, 4)  # a full pool first, the rest is frame cache
    assert ds.state_dict()["byte_budget"] == pool
    stats = ds.memory_stats()
    assert max(sizes.values()) <= stats["peak_budget_bytes"] <= pool
    assert 0 < stats["peak_frame_cache_bytes"] <= part_cache
    assert stats["peak_resident_memory"] <= budget


def test_each_worker_gets_its_share(av1, sizes):
    budget = 12 * max(sizes.values())
    pool, part_cache = split(budget, int(0.5e9), 2, largest(sizes, 3))
    # Worker 0 of 2 (the layout ds.num_workers says), streamed in process to read its stats.
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4)
    ds.num_workers = 2
    mine = [int(item["index"]) for item in ds]
    stats = ds.memory_stats()
    assert stats["peak_budget_bytes"] <= pool and stats["peak_frame_cache_bytes"] <= part_cache
    assert stats["peak_resident_memory"] <= budget // 2
    assert ds.state_dict()["byte_budget"] == pool
    # Through a DataLoader with 2 workers: both shares, every frame exactly once.
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4)
    ds.num_workers = 2
    seen = [i for batch in DataLoader(ds, batch_size=4, num_workers=2) for i in batch["index"]]
    assert sorted(map(int, seen)) == list(range(FRAMES))
    assert set(mine) < set(map(int, seen))


def test_an_episode_larger_than_a_share_is_refused_by_name(av1, sizes):
    biggest = max(sizes, key=sizes.get)
    with pytest.raises(
        ValueError,
        match=rf"^Episode {biggest} is {sizes[biggest]} bytes, more than the byte budget of "
        rf"{sizes[biggest] - 1} bytes per worker \(byte_budget_gb=",
    ):
        ShardedLeRobotDataset(av1, byte_budget_gb=(sizes[biggest] - 1) / 1e9)
    budget = sizes[biggest]  # fits the rank's budget, not half of it
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9)
    ds.num_workers = 2
    first = min(e for e, size in sizes.items() if size > budget // 2)
    with pytest.raises(
        ValueError,
        match=rf"^Episode {first} is {sizes[first]} bytes, more than the byte budget of "
        rf"{budget // 2} bytes per worker \(byte_budget_gb=.* split over the rank's 2 DataLoader",
    ):
        iter(ds)
    # In process, one part: the whole budget holds the largest episode and nothing else, so the
    # frame cache gets no room and every frame is still yielded, decoded when drawn.
    ds.num_workers = 0
    with pytest.warns(SmallPoolWarning, match=r"fewer than the 6 the pool would hold"):
        assert sorted(int(item["index"]) for item in ds) == list(range(FRAMES))
    # Past the (empty) cap, only the frames of the draw being built: one per camera.
    assert ds.memory_stats()["peak_frame_cache_bytes"] <= 3 * (40 * 56 + 24 * 32)


def test_a_budget_that_starves_the_pool_warns_with_numbers(av1, sizes):
    median = sorted(sizes.values())[len(sizes) // 2]
    tight = ShardedLeRobotDataset(av1, byte_budget_gb=4 * median / 1e9, buffer_size=6)
    with pytest.warns(SmallPoolWarning) as caught:
        iter(tight)
    message = str(caught[0].message)
    assert "for fetched episodes: about 4 of the median" in message
    assert "fewer than the 6 the pool would hold (buffer_size=6)" in message
    # The budget the warning advises keeps the pool full: no warning.
    advised = float(message.rsplit("byte_budget_gb=", 1)[1].split()[0])
    roomy = ShardedLeRobotDataset(av1, byte_budget_gb=advised, buffer_size=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallPoolWarning)
        iter(roomy)


def test_checkpoint_under_the_split_resumes_under_one_worker(av1, sizes):
    budget = 12 * max(sizes.values())
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4, seed=3)
    ds.num_workers = 2
    taken: list[int] = []
    for batch in DataLoader(ds, batch_size=4, num_workers=2):
        taken += batch["index"].tolist()
        if len(taken) == 12:
            break
    state = ds.state_dict(num_samples=len(taken), batch_size=4)
    pool, _ = split(budget, int(0.5e9), 2, largest(sizes, 3))
    assert (state["num_workers"], state["byte_budget"]) == (2, pool)
    resumed = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4, seed=3)
    resumed.load_state_dict(state)
    rest = [int(item["index"]) for item in resumed]
    assert sorted(taken + rest) == list(range(FRAMES))
