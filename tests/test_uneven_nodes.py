"""Real torchrun launches on loopback, one per node, with nodes of unequal sizes (issue 42, item
1): with a process group the ranks exchange their nodes, so nodes of 2, 4 and 2 ranks (one of
them without LOCAL_WORLD_SIZE) read every frame exactly once per epoch with equal steps per
rank, each node its own share every epoch, and checkpoints resume elastically from unequal to
equal nodes and back; without a process group, launches of 1, 2 and 1 ranks are refused on
every rank.

Each node has a cache folder of its own over a local root, so node affinity is on by default
(tests/dist_scripts/uneven_nodes.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.torchrun import launch_nodes

import lerobot_shards
from lerobot_shards.testing.factory import make_dataset

pytestmark = pytest.mark.slow

LENGTHS = [5, 9, 3, 7, 4, 8, 6, 2, 5, 7, 3, 6, 4, 5]
FRAMES = sum(LENGTHS)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("uneven")
    src = make_dataset(
        tmp / "src", episode_lengths=LENGTHS, cameras={"observation.images.cam": (24, 32)}
    )
    lerobot_shards.convert(str(src), str(tmp / "shards"), workers=0, progress=False)
    return tmp / "shards"


def run(shards: Path, out: Path, sizes: list[int], **args: object) -> list[dict]:
    """Every rank's record (rank order) of one job launched with ``sizes`` ranks per node."""
    out.mkdir(parents=True)
    caches = [str(out.parent / f"cache-{n}") for n in range(len(sizes))]
    spec = {"root": str(shards), "out": str(out), "caches": caches, "group": True, **args}
    for launch in launch_nodes("uneven_nodes.py", json.dumps(spec), sizes=sizes):
        assert launch.returncode == 0, launch.stderr[-4000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(sum(sizes))]


def episode_of(index: int) -> int:
    return int(np.searchsorted(np.cumsum(LENGTHS), index, side="right"))


def assert_exactly_once(indices: list[int], parts: int) -> None:
    """Every frame, repeated only as padding (fewer repeats than parts)."""
    counts = Counter(indices)
    assert set(counts) == set(range(FRAMES))
    assert sum(counts.values()) - FRAMES < parts


def steps(ranks: list[dict], epoch: int) -> set[int]:
    return {len(r["epochs"][str(epoch)]) for r in ranks}


def flat(ranks: list[dict], epoch: int) -> list[int]:
    return [i for r in ranks for batch in r["epochs"][str(epoch)] for i in batch]


def test_unequal_nodes_read_every_frame_once_and_resume_elastically(shards, tmp_path):
    # nodes of 2, 4 and 2 ranks; node 1's launcher sets no LOCAL_WORLD_SIZE
    drop = {"node": 1, "names": ["LOCAL_WORLD_SIZE"]}
    first = run(shards, tmp_path / "a", [2, 4, 2], epochs=[0, 1, 2], stop_after=3, drop=drop)
    assert [r["node"] for r in first] == [0, 0, 1, 1, 1, 1, 2, 2]
    for epoch in (0, 1):
        assert_exactly_once(flat(first, epoch), 8)
        assert len(steps(first, epoch)) == 1, "every rank takes the same number of steps"
    shares = [
        [{episode_of(i) for r in first if r["node"] == n for b in r["epochs"][str(e)] for i in b}
         for n in range(3)]
        for e in (0, 1)
    ]  # fmt: skip
    assert shares[0] == shares[1], "each node reads its own share every epoch"
    assert sum(len(s) for s in shares[0]) <= len(LENGTHS) + 2  # cut episodes only at 2 seams

    # the checkpoint of epoch 2 resumes on 2 equal nodes, which stop in epoch 3 ...
    state = str(tmp_path / "a" / "state.json")
    second = run(shards, tmp_path / "b", [2, 2], epochs=[2, 3], resume=state, stop_after=2)
    assert_exactly_once(flat(first, 2) + flat(second, 2), 8)
    assert len(steps(second, 2)) == 1
    # ... and that checkpoint resumes on nodes of 1 and 3 ranks
    state = str(tmp_path / "b" / "state.json")
    third = run(shards, tmp_path / "c", [1, 3], epochs=[3], resume=state)
    assert_exactly_once(flat(second, 3) + flat(third, 3), 4)
    assert len(steps(third, 3)) == 1


def test_without_a_process_group_unequal_nodes_are_refused_on_every_rank(shards, tmp_path):
    """Three launches of 1, 2 and 1 ranks and no process group: no rank can know the others'
    nodes, so every rank refuses, saying how to give them, before reading anything."""
    ranks = run(shards, tmp_path / "a", [1, 2, 1], epochs=[0], group=False)
    for rank in ranks:
        assert "which ranks share a node" in rank.get("error", ""), rank
        assert "torch.distributed" in rank["error"]
        assert rank["epochs"] == {}
