"""Comparing collated batches key by key, tensors with ``torch.equal``."""

from __future__ import annotations

import torch


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
