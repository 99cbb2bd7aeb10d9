"""reader.collate: any default_collate batches the reader's items as torch would batch plain
tensors (same values), frames channel-last in memory, and batches hold only plain tensors."""

from __future__ import annotations

import pytest
import torch
from support.batches import assert_same_batch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards import ShardedLeRobotDataset, collate
from lerobot_shards.reader.batches.collate import CameraFrames, ItemTensor


def plain(item: dict) -> dict:
    return {
        k: v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v
        for k, v in item.items()
    }


@pytest.mark.parametrize("return_uint8", [True, False])
def test_default_collate_of_items_equals_torchs_with_channels_last_frames(
    av1, return_uint8, golden_delta_timestamps
):
    ds = ShardedLeRobotDataset(
        av1, return_uint8=return_uint8, delta_timestamps=golden_delta_timestamps, seed=3
    )
    items = list(ds)
    first = items[0]
    for key, value in first.items():
        if key in ds.meta.camera_keys:
            assert type(value) is CameraFrames, key
        elif isinstance(value, torch.Tensor):
            assert type(value) is ItemTensor, key
    for start in range(0, len(items), 8):
        chunk = items[start : start + 8]
        theirs = default_collate([plain(item) for item in chunk])
        for ours in (default_collate(chunk), collate(chunk)):
            assert_same_batch(ours, theirs)  # plain tensors only (assert_same_batch checks)
            for key in ds.meta.camera_keys:
                assert ours[key].movedim(-3, -1).is_contiguous(), key  # no transposing copy


def test_operations_on_item_tensors_give_plain_tensors(av1):
    item = next(iter(ShardedLeRobotDataset(av1, return_uint8=True)))
    for value in item.values():
        if isinstance(value, torch.Tensor):
            assert type(value + 0) is torch.Tensor
            assert type(value.clone()) is torch.Tensor


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


def test_items_copy_deeply_as_plain_tensors(av1):
    import copy

    item = next(iter(ShardedLeRobotDataset(av1, return_uint8=True)))
    copied = copy.deepcopy(item)
    for key, value in item.items():
        if isinstance(value, torch.Tensor):
            assert type(copied[key]) is torch.Tensor and torch.equal(copied[key], value), key
