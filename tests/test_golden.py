"""LeRobotSource against items recorded by LeRobot 0.6.1 itself: exact keys, values and tasks."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from lerobot_shards.source import LeRobotSource

DATASETS = ["av1_multifile", "image"]


def expected_items(
    golden_dir, name: str, delta: bool
) -> tuple[list[str], list[str], np.lib.npyio.NpzFile]:
    recorded = np.load(golden_dir / f"{name}{'.delta' if delta else ''}.items.npz")
    return json.loads(str(recorded["__keys__"])), list(recorded["__tasks__"]), recorded


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
def test_every_index_equals_lerobot(golden_dir, golden_delta_timestamps, name, delta):
    keys, tasks, recorded = expected_items(golden_dir, name, delta)
    source = LeRobotSource(
        str(golden_dir / name), delta_timestamps=golden_delta_timestamps if delta else None
    )
    assert len(source) == len(tasks) == 74
    for index in range(len(source)):
        assert_item_is_golden(source[index], index, keys, tasks, recorded)


@pytest.mark.parametrize("name", DATASETS)
def test_random_access_order_equals_lerobot(golden_dir, golden_delta_timestamps, name):
    """Open decoders seek back and jump across files and episodes without changing a frame."""
    keys, tasks, recorded = expected_items(golden_dir, name, True)
    source = LeRobotSource(str(golden_dir / name), delta_timestamps=golden_delta_timestamps)
    order = list(range(len(source))) * 2
    random.Random(0).shuffle(order)
    for index in order:
        assert_item_is_golden(source[index], index, keys, tasks, recorded)


@pytest.mark.timeout(60)
def test_dataloader_workers_equal_lerobot(golden_dir, golden_delta_timestamps):
    """Forked workers open their own decoders (none shared across the fork)."""
    keys, tasks, recorded = expected_items(golden_dir, "av1_multifile", True)
    source = LeRobotSource(
        str(golden_dir / "av1_multifile"), delta_timestamps=golden_delta_timestamps
    )
    source[30]  # open decoders in the parent first
    loader = torch.utils.data.DataLoader(
        source, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    for index, item in enumerate(loader):
        assert_item_is_golden(item, index, keys, tasks, recorded)
