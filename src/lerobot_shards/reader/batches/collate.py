"""How the reader's items are batched, whatever ``collate_fn`` the DataLoader was given.

Training loops pass their own ``collate_fn`` (LeRobot's ``lerobot_collate_fn``) or none, and
both end in torch's ``default_collate``. So the reader types the tensors of its items: camera
frames are :class:`CameraFrames`, every other tensor an :class:`ItemTensor`, and this module
registers a batching function for each in torch's ``default_collate_fn_map`` (torch's
documented way to teach ``default_collate`` a type). Any operation on them returns a plain
tensor, and batches hold only plain tensors, so nothing else sees the types.

What the functions do differently from torch's:

- Frames are channel-first ``permute`` views of the decoder's channel-last (HWC) frames.
  ``default_collate`` would stack them into a contiguous NCHW batch, a transposing copy that
  costs about half as much as decoding the frame. Here they are stacked channel-last (a plain
  copy, or none at all: ``transfer.BatchArena``) and the batch is an NCHW view of it, a
  ``torch.channels_last`` tensor: the same shape and values (``torch.equal``), which
  convolutions take as they are.
- In a DataLoader worker, torch sends every batched tensor to the main process through a new
  shared-memory file and a connection of its own. Here the cameras (and any other large
  column) go through the worker's reused shared segments (``transfer.py``) and the small
  columns by value, in the batch's own message.
- In the loader's process, where batches mixing every worker's rows are collated
  (``rows.py``), a camera's frames that lie in consecutive rows of one shared slot are
  returned as a view of those rows: the workers wrote them there, nobody copies them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info
from torch.utils.data._utils.collate import default_collate_fn_map

from lerobot_shards.reader.batches import transfer


class CameraFrames(transfer.TaggedTensor):
    """Camera frames of a reader's item: a channel-first view of channel-last memory, batched
    by ``default_collate`` with :func:`collate_frames`. In all else a plain tensor."""

    camera: str
    """The item's key for these frames."""
    rows: tuple[torch.Tensor, int] | None = None
    """In the loader's process, frames of a mixed batch: the tensor of the batch's rows of this
    camera and which row these frames are (``rows.unpack``)."""


class ItemTensor(transfer.TaggedTensor):
    """Any other tensor of a reader's item (state, action, index, ...), batched by
    ``default_collate`` with :func:`collate_item_tensors`. In all else a plain tensor."""


class ByValue(transfer.TaggedTensor):
    """A small tensor that a DataLoader worker sends by value, in its message, rather than
    through a shared-memory file and a connection of its own."""

    def __reduce_ex__(self, protocol):
        return torch.from_numpy, (self.as_subclass(torch.Tensor).numpy(),)


def typed_item(item: Mapping[str, Any], camera_keys: Sequence[str]) -> dict[str, Any]:
    """``item`` with its frames as :class:`CameraFrames` (where they are channel-first views of
    channel-last memory) and its other tensors as :class:`ItemTensor`."""
    typed = {}
    for key, value in item.items():
        if type(value) is torch.Tensor:
            if key in camera_keys and channels_last_view(value):
                value = value.as_subclass(CameraFrames)
                value.camera = key
            else:
                value = value.as_subclass(ItemTensor)
        typed[key] = value
    return typed


def channels_last_view(value: object) -> bool:
    """A (..., C, H, W) tensor whose memory is laid out (..., H, W, C), as the reader's frames."""
    return (
        isinstance(value, torch.Tensor)
        and value.dim() >= 3
        and not value.is_contiguous()
        and value.movedim(-3, -1).is_contiguous()
    )


def collate_frames(batch: Sequence[torch.Tensor], *, collate_fn_map=None) -> torch.Tensor:
    """``default_collate``'s function for :class:`CameraFrames`: the frames stacked channel-last
    (no transposing copy), as a channel-first tensor."""
    whole = getattr(batch[0], "rows", None)
    whole = None if whole is None else whole[0]
    if (
        whole is not None
        and len(whole) == len(batch)
        and all(
            getattr(f, "rows", None) is not None and f.rows[0] is whole and f.rows[1] == n
            for n, f in enumerate(batch)
        )
    ):
        return whole  # every row of a shared batch, in order: it is the batch
    plain = [f.as_subclass(torch.Tensor) for f in batch]
    in_place = rows_in_place(plain) if get_worker_info() is None else None
    if in_place is not None:
        return in_place
    if not all(channels_last_view(f) and f.shape == plain[0].shape for f in plain):
        return default_collate_fn_map[torch.Tensor](plain, collate_fn_map=collate_fn_map)
    frames = [f.movedim(-3, -1) for f in plain]
    pool = transfer.worker_pool() if get_worker_info() is not None else None
    if pool is not None:
        camera = getattr(batch[0], "camera", None)  # None: typed elsewhere than typed_item
        shared = pool.arena.take(camera, frames) if camera is not None else None
        if shared is None:
            shared = transfer.share_stacked(frames, frames=True)
        if shared is not None:
            return shared
    out = torch.empty((len(frames), *frames[0].shape), dtype=frames[0].dtype)
    if get_worker_info() is not None:  # bound for the main process: torch's shared memory
        out.share_memory_()
    # numpy copies on this thread; torch.stack would wake the intra-op thread pool, whose
    # spinning threads take the cores the decode threads need.
    np.stack([f.numpy() for f in frames], out=out.numpy())
    return out.movedim(-1, -3)


def rows_in_place(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The tensors stacked, as a view, if they already lie one after the other in one memory
    (rows of a shared batch slot, ``rows.py``); else None. Channel-last frames stay so."""
    first = tensors[0]
    memory = [t.movedim(-3, -1) for t in tensors] if channels_last_view(first) else tensors
    head = memory[0]
    if not head.is_contiguous() or not head.numel():
        return None
    storage, step = head.untyped_storage().data_ptr(), head.nbytes
    for n, t in enumerate(memory):
        if not (
            t.shape == head.shape
            and t.dtype == head.dtype
            and t.is_contiguous()
            and t.untyped_storage().data_ptr() == storage
            and t.data_ptr() == head.data_ptr() + n * step
        ):
            return None
    stacked = head.as_strided((len(memory), *head.shape), (head.numel(), *head.stride()))
    return stacked.movedim(-1, -3) if memory is not tensors else stacked


def collate_item_tensors(batch: Sequence[torch.Tensor], *, collate_fn_map=None) -> torch.Tensor:
    """``default_collate``'s function for :class:`ItemTensor`: stacked as torch stacks them; in
    a DataLoader worker, small batches are sent by value and large ones through the worker's
    reused shared segments, not through a new shared-memory file each."""
    plain = [v.as_subclass(torch.Tensor) for v in batch]
    if get_worker_info() is None or not transfer.stackable(plain):
        return default_collate_fn_map[torch.Tensor](plain, collate_fn_map=collate_fn_map)
    first = plain[0]
    if first.numel() * first.element_size() * len(plain) >= transfer.VIEW_BYTES:
        shared = transfer.share_stacked(plain, frames=False)
        if shared is not None:
            return shared
        return default_collate_fn_map[torch.Tensor](plain, collate_fn_map=collate_fn_map)
    out = torch.empty((len(plain), *first.shape), dtype=first.dtype)
    np.stack([v.numpy() for v in plain], out=out.numpy())
    return out.as_subclass(ByValue)


def collate(batch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Batch reader items: torch's ``default_collate``, which batches them as this module says.

    Any ``collate_fn`` that ends in ``default_collate`` (torch's default, LeRobot's
    ``lerobot_collate_fn``) is as fast; this name is kept for loops written against it.

    Args:
        batch: The items of one batch, as the DataLoader hands them to its ``collate_fn``.

    Returns:
        One tensor per key (camera frames channel-last in memory, never transposed), strings
        as lists.
    """
    return default_collate(batch)


default_collate_fn_map[CameraFrames] = collate_frames
default_collate_fn_map[ItemTensor] = collate_item_tensors
