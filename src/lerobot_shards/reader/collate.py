"""A DataLoader ``collate_fn`` that batches camera frames without transposing them.

The reader hands out camera frames as channel-first ``permute`` views of the decoder's
channel-last (HWC) frames. ``default_collate`` stacks those into a contiguous NCHW batch: a
transposing copy that costs about half as much as decoding the frame. :func:`collate` stacks
them channel-last instead (a plain copy) and returns the batch as an NCHW view of it, that is
a ``torch.channels_last`` tensor: the same shape and values (``torch.equal``), which convolutions
take as they are. Everything else is batched by ``default_collate``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from lerobot_shards.reader import transfer


def _channels_last_view(value: object) -> bool:
    """A (..., C, H, W) tensor whose memory is laid out (..., H, W, C), as the reader's frames."""
    return (
        isinstance(value, torch.Tensor)
        and value.dim() >= 3
        and not value.is_contiguous()
        and value.movedim(-3, -1).is_contiguous()
    )


def _stack_channels_last(frames: Sequence[torch.Tensor]) -> torch.Tensor:
    """Stack channel-last (``..., H, W, C``) frames; return the batch as a channel-first view."""
    first = frames[0]
    shape = (len(frames), *first.shape)
    if get_worker_info() is not None:  # as default_collate: the batch crosses to the main process
        storage = torch.UntypedStorage._new_shared(
            first.numel() * first.element_size() * len(frames)
        )
        out = torch.empty(0, dtype=first.dtype).set_(storage).view(shape)
    else:
        out = torch.empty(shape, dtype=first.dtype)
    # numpy copies on this thread; torch.stack would wake the intra-op thread pool, whose
    # spinning threads take the cores the decode threads need.
    np.stack([f.numpy() for f in frames], out=out.numpy())
    return out.movedim(-1, -3)


def collate(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Batch reader items: camera frames channel-last in memory, the rest as default_collate.

    In a DataLoader worker the batch is written into a reused shared segment (``transfer.py``
    says why) instead of fresh shared memory per tensor; camera frames the reader already
    decoded into their rows of it (``transfer.BatchArena``) are not copied again. The main
    process receives a plain dict.
    """
    first = batch[0]
    frame_keys = [key for key, value in first.items() if _channels_last_view(value)]
    pool = transfer.worker_pool() if get_worker_info() is not None else None
    columns: dict[str, Any] = {}
    to_stack = set()  # columns kept as lists of tensors, for the segment
    for key in first:
        values = [item[key] for item in batch]
        if key in frame_keys:
            columns[key] = [v.movedim(-3, -1) for v in values]
        elif pool is not None and transfer.stackable(values):
            columns[key] = values
            to_stack.add(key)
        else:
            columns[key] = default_collate(values)
    if pool is not None:
        shared = transfer.pack(columns, frame_keys, pool)
        if shared is not None:
            return shared
    for key in frame_keys:
        columns[key] = _stack_channels_last(columns[key])
    for key in to_stack:  # no segment was free: torch's way
        columns[key] = default_collate(columns[key])
    return columns
