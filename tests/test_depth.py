"""Depth cameras: what the reader refuses, and the rule of which keyframe a frame decodes from.

That depth items equal LeRobot's is tested against items LeRobot itself returned
(``test_golden.py``: a depth video with open GOPs and depth images, plain and with
``delta_timestamps``) and against LeRobot in its environment (``test_lerobot_depth.py``: both
output units, ``return_uint8``, transforms, statistics, recordings from metres, closed GOPs).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from support.batches import assert_same_batch
from support.mutate import put_together, take_apart
from torch.utils.data import default_collate

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset, convert
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import INFO_FILE, FormatError, decode_starts
from lerobot_shards.source import SourceError

DEPTH = "observation.images.depth"

LIES = {
    "three channels": ({"shape": [40, 56, 3]}, r"one channel, its shape \[40, 56, 3\] has 3"),
    "a unit LeRobot does not convert": ({"info.depth_unit": "cm"}, r"depth_unit 'cm'"),
    "a depth_min that is no number": ({"info.video.depth_min": "0.01"}, "must be a number"),
    "use_log that is no boolean": ({"info.video.use_log": 1}, "must be true or false"),
    "log codes without an inverse": (
        {"info.video.depth_min": -4.0},
        r"depth_min \+ video.shift = -0.5 is not positive",
    ),
    "a depth map that is no camera": (
        {"dtype": "float32", "shape": [1], "names": None},
        "is no camera",
    ),
}


def tell(features: dict, changes: dict) -> None:
    """Change the depth feature of ``features`` as ``changes`` says (``info.`` keys: its info)."""
    feature = features[DEPTH]
    for path, value in changes.items():
        *outer, name = path.split(".", 1) if path.startswith("info.") else [path]
        (feature["info"] if outer else feature)[name] = value


@pytest.mark.parametrize("lie", LIES.values(), ids=LIES.keys())
def test_a_depth_feature_lerobot_cannot_read_as_it_says_is_refused(
    shards, golden_copy, tmp_path: Path, lie
):
    """A depth feature whose info the reader cannot honour as LeRobot does is refused by
    ``convert`` (before any episode) and when shards that say it are opened, naming the feature
    and what is wrong, never read into other values."""
    changes, message = lie
    parts = take_apart(shards("depth_video"))
    for features in (parts.index["features"], parts.info["features"]):
        tell(features, changes)
    put_together(parts, tmp_path / "lie")
    with pytest.raises(FormatError, match=rf"feature '{DEPTH}'.*{message}"):
        ShardedLeRobotDataset(tmp_path / "lie")
    source = golden_copy("depth_video")
    info = json.loads((source / INFO_FILE).read_text())
    tell(info["features"], changes)
    (source / INFO_FILE).write_text(json.dumps(info))
    with pytest.raises(SourceError, match=rf"meta/info.json: feature '{DEPTH}'.*{message}"):
        convert(str(source), str(tmp_path / "converted"), workers=0, progress=False)
    assert not (tmp_path / "converted" / "shards").exists()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["depth_video", "depth_image"])
def test_batches_from_workers_are_lerobots_items_batched(shards, golden_path, name: str):
    """Two DataLoader workers (decode threads, shared batches) with delta_timestamps: every
    batch is LeRobot's recorded items, ``default_collate``-d."""
    recorded = np.load(golden_path(name).parent / f"{name}.delta.items.npz")
    keys, tasks = json.loads(str(recorded["__keys__"])), list(recorded["__tasks__"])
    ds = ShardedLeRobotDataset(
        shards(name), buffer_size=2, delta_timestamps=json.loads(str(recorded["__delta__"]))
    )
    loader = ShardedDataLoader(ds, batch_size=4, num_workers=2)
    seen = []
    for batch in loader:
        indices = batch["index"].tolist()
        items = [
            {k: tasks[i] if k == "task" else torch.from_numpy(recorded[f"{i}|{k}"]) for k in keys}
            for i in indices
        ]
        assert_same_batch(batch, default_collate(items))
        seen += indices
    assert sorted(seen) == list(range(len(tasks)))


@pytest.mark.parametrize("name", ["depth_video", "depth_image"])
def test_deep_verify_decodes_every_depth_frame(shards, name: str):
    assert verify_dataset(str(shards(name)), deep=True) == []


def starts_by_definition(pts: list[int], keys: list[bool]) -> list[int]:
    """For each packet: the keyframe it decodes from, straight from the definition (the last
    keyframe at or before it in decode order whose presentation time is not after its own)."""
    return [
        max((k for k in range(i + 1) if keys[k] and pts[k] <= pts[i]), default=-1)
        for i in range(len(pts))
    ]


@given(st.permutations(range(12)), st.lists(st.booleans(), min_size=12, max_size=12))
def test_each_frame_decodes_from_the_last_keyframe_shown_no_later(order, keys):
    assert decode_starts(list(order), keys) == starts_by_definition(list(order), keys)


def test_leading_frames_decode_from_the_keyframe_before():
    """x265's GOP 2 (the golden depth video): the B-frame decoded after keyframe 2 but shown
    before it decodes from keyframe 0, and so does its own GOP's first frame."""
    pts = [0, 2, 1, 4, 3, 5]
    keys = [True, True, False, True, False, False]
    assert decode_starts(pts, keys) == [0, 1, 0, 3, 1, 3]
