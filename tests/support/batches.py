"""Comparing collated batches and whole epochs of items key by key, tensors with
``torch.equal``."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader


def assert_same_batch(ours: dict, theirs: dict) -> None:
    """Same keys in the same order; tensors of the same type, dtype, shape and values."""
    assert list(ours) == list(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert type(ours[key]) is torch.Tensor, key
            assert ours[key].dtype == value.dtype and ours[key].shape == value.shape, key
            assert torch.equal(ours[key], value), key
        else:
            assert ours[key] == value, key


def epochs(ds, num_workers: int, count: int = 2) -> list[list[dict]]:
    """The items of the first ``count`` epochs, directly or through a DataLoader."""
    out = []
    for epoch in range(count):
        ds.set_epoch(epoch)
        if num_workers == 0:
            out.append(list(ds))
        else:
            out.append(list(DataLoader(ds, batch_size=None, num_workers=num_workers)))
    return out


def assert_same_items(got: list[dict], want: list[dict]) -> None:
    """The same items in the same order, key for key."""
    assert [int(i["index"]) for i in got] == [int(i["index"]) for i in want]
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b)
        for key, value in b.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(a[key], value), (int(b["index"]), key)
            else:
                assert a[key] == value, (int(b["index"]), key)
