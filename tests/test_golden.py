"""The items LeRobot itself returned, recorded: LeRobotSource and the converted shards read by
ShardedLeRobotDataset both equal them, key for key, value for value (torch.equal), task for task.

Golden data: v3.0 written and read by LeRobot 0.6.1 (tests/data/lerobot-0.6.1: among them a
depth camera as video, LeRobot's default 12-bit HEVC with open GOPs, and as 16-bit images) and
v2.1 written and read by LeRobot 0.3.3 (tests/data/lerobot-0.3.3-v2.1); each folder's README
says how.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from support.required import importorskip

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.source import LeRobotSource

DATASETS = ["av1_multifile", "image", "depth_video", "depth_image", "v21_video", "v21_image"]


def expected_items(path, delta: bool) -> tuple[list[str], list[str], np.lib.npyio.NpzFile]:
    """What LeRobot returned for the golden dataset at ``path``: keys, tasks, tensors."""
    recorded = np.load(path.parent / f"{path.name}{'.delta' if delta else ''}.items.npz")
    return json.loads(str(recorded["__keys__"])), list(recorded["__tasks__"]), recorded


def recorded_delta(golden_path, golden_delta_timestamps, name: str) -> dict[str, list[float]]:
    """The delta_timestamps of a golden dataset's ``.delta.items.npz``: its own ``__delta__``
    where it records one, else those every other was recorded with."""
    recorded = np.load(golden_path(name).parent / f"{name}.delta.items.npz")
    if "__delta__" in recorded.files:
        return json.loads(str(recorded["__delta__"]))
    return golden_delta_timestamps


def assert_item_is_golden(item: dict, index: int, keys, tasks, recorded) -> None:
    assert list(item) == keys, f"index {index}: keys"
    assert item["task"] == tasks[index], f"index {index}: task"
    for key in keys:
        if key == "task":
            continue
        expected = torch.from_numpy(recorded[f"{index}|{key}"])
        got = item[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, (index, key)
        assert torch.equal(got, expected), f"index {index}, {key}: values differ"


@pytest.mark.parametrize("delta", [False, True], ids=["plain", "delta"])
@pytest.mark.parametrize("name", DATASETS)
def test_every_index_equals_lerobot(golden_path, golden_delta_timestamps, name, delta):
    keys, tasks, recorded = expected_items(golden_path(name), delta)
    deltas = recorded_delta(golden_path, golden_delta_timestamps, name)
    source = LeRobotSource(str(golden_path(name)), delta_timestamps=deltas if delta else None)
    assert len(source) == len(tasks)
    for index in range(len(source)):
        assert_item_is_golden(source[index], index, keys, tasks, recorded)


@pytest.mark.parametrize("delta", [False, True], ids=["plain", "delta"])
@pytest.mark.parametrize("name", DATASETS)
def test_shards_equal_lerobot(golden_path, shards, golden_delta_timestamps, name, delta):
    """A whole shuffled epoch of the converted dataset: every index once, each LeRobot's item."""
    keys, tasks, recorded = expected_items(golden_path(name), delta)
    deltas = recorded_delta(golden_path, golden_delta_timestamps, name)
    ds = ShardedLeRobotDataset(
        shards(name), buffer_size=3, delta_timestamps=deltas if delta else None
    )
    order = []
    for item in ds:
        index = int(item["index"])
        assert_item_is_golden(item, index, keys, tasks, recorded)
        order.append(index)
    assert sorted(order) == list(range(len(tasks))) and order != sorted(order)


@pytest.mark.parametrize("name", DATASETS)
def test_random_access_order_equals_lerobot(golden_path, golden_delta_timestamps, name):
    """Open decoders seek back and jump across files and episodes without changing a frame."""
    keys, tasks, recorded = expected_items(golden_path(name), True)
    deltas = recorded_delta(golden_path, golden_delta_timestamps, name)
    source = LeRobotSource(str(golden_path(name)), delta_timestamps=deltas)
    order = list(range(len(source))) * 2
    random.Random(0).shuffle(order)
    for index in order:
        assert_item_is_golden(source[index], index, keys, tasks, recorded)


@pytest.mark.timeout(60)
def test_dataloader_workers_equal_lerobot(golden_dir, golden_delta_timestamps):
    """Forked workers open their own decoders (none shared across the fork)."""
    keys, tasks, recorded = expected_items(golden_dir / "av1_multifile", True)
    source = LeRobotSource(
        str(golden_dir / "av1_multifile"), delta_timestamps=golden_delta_timestamps
    )
    source[30]  # open decoders in the parent first
    loader = torch.utils.data.DataLoader(
        source, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    for index, item in enumerate(loader):
        assert_item_is_golden(item, index, keys, tasks, recorded)


@pytest.mark.parametrize("name", ["av1_multifile", "image", "depth_video", "depth_image"])
def test_return_uint8_equals_lerobots_own(golden_path, shards, name):
    """lerobot-train's own setting, ``return_uint8=True``: video frames uint8, image features
    and depth maps float32, every value as LeRobot's LeRobotDataset returns it, from the source
    and from a whole epoch of the shards. LeRobot's environment runs this."""
    lerobot_dataset = importorskip(
        "lerobot.datasets.lerobot_dataset", reason="LeRobot is optional; CI's LeRobot env runs this"
    )
    theirs = lerobot_dataset.LeRobotDataset(
        f"golden/{name}", root=golden_path(name), video_backend="pyav", return_uint8=True
    )
    source = LeRobotSource(str(golden_path(name)), return_uint8=True)
    frames = len(source)
    items = list(ShardedLeRobotDataset(shards(name), buffer_size=3, return_uint8=True))
    assert sorted(int(item["index"]) for item in items) == list(range(frames))
    for item in [*items, *(source[i] for i in range(frames))]:
        index = int(item["index"])
        expected = theirs[index]
        assert list(item) == list(expected), index
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert item[key].dtype == value.dtype, (index, key, item[key].dtype)
                assert torch.equal(item[key], value), (index, key)
            else:
                assert item[key] == value, (index, key)
