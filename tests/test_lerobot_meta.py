"""ds.meta as LeRobot's LeRobotDatasetMetadata gives it: checked against the golden dataset's
own files here, and against LeRobot itself where LeRobot is installed (the LeRobot environment
of scripts/setup_lerobot_env.sh, which CI runs)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.required import importorskip

from lerobot_shards import ShardedLeRobotDataset

AV1 = "av1_multifile"
LENGTHS = [12, 1, 30, 9, 17, 5]


def test_meta_reads_as_lerobots(av1, golden_dir):
    meta = ShardedLeRobotDataset(av1, episodes=[1, 2]).meta  # describes the whole dataset
    info = json.loads((golden_dir / AV1 / "meta" / "info.json").read_text())
    assert meta.fps == info["fps"] == 10 and isinstance(meta.fps, int)
    assert meta.robot_type == info["robot_type"]
    assert meta.names == {key: ft["names"] for key, ft in info["features"].items()}
    assert meta.shapes == {key: tuple(ft["shape"]) for key, ft in info["features"].items()}
    assert meta.total_tasks == info["total_tasks"] == 4
    assert meta.chunks_size == info["chunks_size"]
    assert meta.depth_keys == [] and meta.has_language_columns is False
    tasks = meta.tasks
    assert list(tasks.index) == ["stack the blocks", "push the T", "fold the towel", "open the lid"]
    assert tasks.loc["fold the towel"].task_index == 2 == meta.get_task_index("fold the towel")
    assert meta.get_task_index("fly") is None
    starts = np.cumsum([0, *LENGTHS[:-1]]).tolist()
    assert meta.episodes["episode_index"] == list(range(6))
    assert meta.episodes["length"] == LENGTHS
    assert meta.episodes["dataset_from_index"] == starts
    assert meta.episodes["dataset_to_index"] == [
        s + n for s, n in zip(starts, LENGTHS, strict=True)
    ]
    assert meta.episodes[2] == {
        "episode_index": 2,
        "length": 30,
        "dataset_from_index": 13,
        "dataset_to_index": 43,
    }
    with pytest.raises(KeyError, match="episodes have the columns"):
        meta.episodes["nope"]


def test_meta_equals_lerobots_own(av1, golden_dir):
    metadata = importorskip(
        "lerobot.datasets.dataset_metadata",
        reason="LeRobot is optional here; CI's LeRobot environment runs this",
    )
    theirs = metadata.LeRobotDatasetMetadata("golden/av1_multifile", root=golden_dir / AV1)
    ours = ShardedLeRobotDataset(av1).meta
    for name in (
        "fps",
        "features",
        "camera_keys",
        "video_keys",
        "image_keys",
        "depth_keys",
        "names",
        "shapes",
        "total_episodes",
        "total_frames",
        "total_tasks",
        "robot_type",
        "chunks_size",
        "data_files_size_in_mb",
        "video_files_size_in_mb",
        "data_path",
        "video_path",
        "has_language_columns",
    ):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.tasks.equals(theirs.tasks)
    for task in [*theirs.tasks.index, "unknown"]:
        assert ours.get_task_index(task) == theirs.get_task_index(task)
    assert set(ours.stats) == set(theirs.stats)
    for key, values in theirs.stats.items():
        assert set(ours.stats[key]) == set(values), key
        for name, value in values.items():
            mine = ours.stats[key][name]
            assert mine.dtype == value.dtype and np.array_equal(mine, value), (key, name)
    for column in ours.episodes.column_names:
        assert ours.episodes[column] == list(theirs.episodes[column]), column
    for i in range(ours.total_episodes):
        row = theirs.episodes[i]
        assert ours.episodes[i] == {k: row[k] for k in ours.episodes.column_names}
