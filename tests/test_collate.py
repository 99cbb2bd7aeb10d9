"""lerobot_shards.collate: batches equal to default_collate's, frames channel-last in memory."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset, collate


@pytest.fixture(scope="module")
def av1(golden_dir, tmp_path_factory):
    dest = tmp_path_factory.mktemp("collate") / "av1_multifile"
    lerobot_shards.convert(str(golden_dir / "av1_multifile"), str(dest), workers=0, progress=False)
    return dest


def assert_same_batch(ours: dict, theirs: dict) -> None:
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key


@pytest.mark.parametrize("return_uint8", [True, False])
def test_collate_equals_default_collate_with_channels_last_frames(
    av1, return_uint8, golden_delta_timestamps
):
    ds = ShardedLeRobotDataset(
        av1, return_uint8=return_uint8, delta_timestamps=golden_delta_timestamps, seed=3
    )
    items = list(ds)
    for start in range(0, len(items), 8):
        chunk = items[start : start + 8]
        ours = collate(chunk)
        assert_same_batch(ours, default_collate(chunk))
        for key in ds.meta.camera_keys:
            frames = ours[key]
            assert frames.movedim(-3, -1).is_contiguous(), key  # no transposing copy was made


def test_collate_through_dataloader_workers(av1):
    ds = ShardedLeRobotDataset(av1, return_uint8=True, seed=1)
    ds.num_workers = 2
    ds.set_epoch(0)
    ours = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate))
    ds.set_epoch(0)
    theirs = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert_same_batch(a, b)
