"""The byte budget is per rank: each of the rank's DataLoader workers gets an equal share for its
own pool, an episode too large for a share is refused by name, and a checkpoint taken under the
split resumes (elastically) under another worker count with every frame exactly once."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest
from torch.utils.data import DataLoader

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.format import MANIFEST_FILE, read_manifest

AV1 = "av1_multifile"
FRAMES = 74
EPISODE_LENGTHS = (12, 1, 30, 9, 17, 5)


@pytest.fixture(scope="module")
def av1(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("shards") / AV1
    lerobot_shards.convert(str(golden_dir / AV1), str(dest), workers=0, progress=False)
    return dest


@pytest.fixture(scope="module")
def cost(av1: Path) -> dict[int, int]:
    """Each whole episode's cost: fetched bytes plus its decoded frames (40x56 and 24x32 RGB)."""
    sizes = read_manifest(fsspec.filesystem("file"), str(av1 / MANIFEST_FILE)).column("size")
    return {
        e: size + n * 3 * (40 * 56 + 24 * 32)
        for e, (size, n) in enumerate(zip(sizes.to_pylist(), EPISODE_LENGTHS, strict=True))
    }


def test_one_worker_keeps_the_whole_budget(av1, cost):
    budget = 2 * max(cost.values())
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4)
    assert sorted(int(item["index"]) for item in ds) == list(range(FRAMES))
    assert ds.state_dict()["byte_budget"] == budget
    assert max(cost.values()) < ds.memory_stats()["peak_budget_bytes"] <= budget


def test_each_worker_gets_its_share(av1, cost):
    budget = 2 * max(cost.values())
    # Worker 0 of 2 (the layout ds.num_workers says), streamed in process to read its stats.
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4)
    ds.num_workers = 2
    mine = [int(item["index"]) for item in ds]
    assert ds.memory_stats()["peak_budget_bytes"] <= budget // 2
    assert ds.state_dict()["byte_budget"] == budget // 2
    # Through a DataLoader with 2 workers: both shares, every frame exactly once.
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4)
    ds.num_workers = 2
    seen = [i for batch in DataLoader(ds, batch_size=4, num_workers=2) for i in batch["index"]]
    assert sorted(map(int, seen)) == list(range(FRAMES))
    assert set(mine) < set(map(int, seen))


def test_an_episode_larger_than_a_share_is_refused_by_name(av1, cost):
    budget = max(cost.values())  # fits the rank's budget, not half of it
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9)
    ds.num_workers = 2
    share = budget // 2
    first = min(e for e, c in cost.items() if c > share)
    with pytest.raises(
        ValueError,
        match=rf"^Episode {first} requires {cost[first]} bytes, exceeding the byte budget "
        rf"{share} of each of the rank's 2 DataLoader workers",
    ):
        iter(ds)
    ds.num_workers = 0  # in process, one part: the whole budget
    assert len([item["index"] for item in ds]) == FRAMES


def test_checkpoint_under_the_split_resumes_under_one_worker(av1, cost):
    budget = 2 * max(cost.values())
    ds = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4, seed=3)
    ds.num_workers = 2
    taken: list[int] = []
    for batch in DataLoader(ds, batch_size=4, num_workers=2):
        taken += batch["index"].tolist()
        if len(taken) == 12:
            break
    state = ds.state_dict(num_samples=len(taken), batch_size=4)
    assert (state["num_workers"], state["byte_budget"]) == (2, budget // 2)
    resumed = ShardedLeRobotDataset(av1, byte_budget_gb=budget / 1e9, buffer_size=4, seed=3)
    resumed.load_state_dict(state)
    rest = [int(item["index"]) for item in resumed]
    assert sorted(taken + rest) == list(range(FRAMES))
