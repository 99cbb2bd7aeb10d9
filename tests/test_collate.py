"""lerobot_shards.collate: batches equal to default_collate's, frames channel-last in memory."""

from __future__ import annotations

import pytest
from support.batches import assert_same_batch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards import ShardedLeRobotDataset, collate


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
