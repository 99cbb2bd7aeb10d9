"""The ranks' world without a process group (reader/loading/world.py): the nodes as the
environment describes them, refused on every rank where it cannot describe them consistently,
and never needed by a reader without a cache or node affinity (issue 42, item 1).

Each rank's environment is what torchrun sets on it (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE), written out here by hand for every rank of a
launch; the real launches are in tests/test_uneven_nodes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.reader.loading.world import environment_world
from lerobot_shards.reader.plan.nodes import Nodes
from lerobot_shards.testing.factory import make_dataset


def torchrun_env(sizes: list[int], drop: tuple[str, ...] = (), on_node: int = -1) -> list[dict]:
    """Every rank's environment under torchrun with ``sizes[n]`` ranks on node ``n`` (one
    launch per node); ``drop`` names variables missing on node ``on_node``'s ranks."""
    envs, world = [], sum(sizes)
    for node, size in enumerate(sizes):
        for local in range(size):
            env = {
                "RANK": str(sum(sizes[:node]) + local),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(local),
                "LOCAL_WORLD_SIZE": str(size),
                "GROUP_RANK": str(node),
                "GROUP_WORLD_SIZE": str(len(sizes)),
            }
            if node == on_node:
                env = {k: v for k, v in env.items() if k not in drop}
            envs.append(env)
    return envs


def test_equal_nodes_are_read_from_the_environment():
    for env in torchrun_env([3, 3]):
        world = environment_world(env)
        assert world.nodes == Nodes.even(6, 2)
        assert world.node_parts(2) == list(range(6)) if world.rank < 3 else list(range(6, 12))
    plain = environment_world({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
    assert plain.nodes == Nodes.even(4, 2)
    assert environment_world({}).nodes == Nodes.one(1)


@pytest.mark.parametrize(
    ("sizes", "drop", "on_node", "refused"),
    [
        ([2, 4, 2], (), -1, "all"),  # torchrun's --nproc-per-node differs per node
        ([4, 2, 2], (), -1, "all"),
        ([2, 2], ("LOCAL_WORLD_SIZE",), 1, "node 1"),  # a launcher that does not set it
        ([2, 2], ("LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE", "GROUP_RANK"), 1, "node 1"),
    ],
)
def test_environments_that_cannot_describe_the_nodes_leave_them_unknown(
    sizes, drop, on_node, refused
):
    """Unequal nodes: every rank sees that its environment cannot describe them. A node whose
    ranks lack LOCAL_WORLD_SIZE: those ranks cannot know the nodes (another rank's environment
    may say otherwise); the other node's environment is consistent, and only a process group
    could tell it about the first (tests/test_uneven_nodes.py)."""
    for env in torchrun_env(sizes, drop, on_node):
        world = environment_world(env)
        node = int(env.get("GROUP_RANK", on_node))
        if refused == "all" or node == on_node:
            assert world.nodes is None
            with pytest.raises(ValueError, match=r"which ranks share a node.*torch\.distributed"):
                world.require_nodes("node affinity")
            assert world.node_parts(2) == [2 * world.rank, 2 * world.rank + 1]  # its own
        else:
            assert world.nodes == Nodes.even(sum(sizes), len(sizes))


LENGTHS = [5, 9, 3, 7, 4, 8, 6, 2]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("world")
    src = make_dataset(
        tmp / "src", episode_lengths=LENGTHS, cameras={"observation.images.cam": (24, 32)}
    )
    lerobot_shards.convert(str(src), str(tmp / "shards"), workers=0, progress=False)
    return tmp / "shards"


def set_env(monkeypatch: pytest.MonkeyPatch, env: dict) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GROUP_WORLD_SIZE", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_a_reader_without_cache_or_affinity_never_needs_the_nodes(shards, monkeypatch):
    """WORLD_SIZE 4 with LOCAL_WORLD_SIZE 3 (an environment no equal nodes fit): a reader
    without a cache or node affinity iterates, counts and checkpoints every rank's part, every
    frame once over the ranks."""
    seen = []
    for rank in range(4):
        set_env(monkeypatch, {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "3"})
        ds = ShardedLeRobotDataset(shards, cache=False, node_affinity=False, buffer_size=2)
        items = [int(item["index"]) for item in ds]
        assert len(items) == len(ds)
        assert ds.state_dict()["epoch"] == 1
        seen += items
    assert set(seen) == set(range(sum(LENGTHS)))


def test_what_needs_unknown_nodes_is_refused_on_every_rank(shards, monkeypatch, tmp_path):
    """Nodes of 2, 4 and 2 ranks without a process group: node affinity, or a cache whose
    default affinity depends on the nodes, is refused on every rank before anything is read;
    with node affinity off a cache does without the nodes."""
    for env in torchrun_env([2, 4, 2]):
        set_env(monkeypatch, env)
        ds = ShardedLeRobotDataset(shards, node_affinity=True, buffer_size=2)
        with pytest.raises(ValueError, match="node_affinity=True needs to know"):
            next(iter(ds))
        ds = ShardedLeRobotDataset(shards, cache_dir=tmp_path / env["GROUP_RANK"], buffer_size=2)
        with pytest.raises(ValueError, match="node_affinity=None"):
            ds.state_dict()
        ds = ShardedLeRobotDataset(
            shards, cache_dir=tmp_path / env["GROUP_RANK"], node_affinity=False, buffer_size=2
        )
        assert ds.state_dict()["node_affinity"] is False
