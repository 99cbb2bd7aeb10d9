"""A DataLoader worker's items bound for its rows of mixed batches, and the loader's side of them.

Where each batch holds every worker's samples (``plan/interleave.py``), a worker knows for each
item the batch and the row it lands in, and the loader has given that batch a slot of its ring
(``ring.py``). So, in the worker, :class:`RowArena` hands the decoder each item's row of the
slot, where its camera frames are decoded (a camera once seen uint8 and channel-last, as
``transfer.BatchArena`` learns it), and :meth:`RowArena.pack` replaces each camera tensor by
its place in the slot (copying it there first if it was made elsewhere: a transform, float
frames), and every other tensor by its value, so the item travels as a few hundred bytes. In the
loader's process :func:`unpack` turns places back into views of the slot, and the loop's
``collate_fn`` batches the items as it would any: ``collate.py`` finds a camera's frames in
consecutive rows of one slot and returns them as a view. Frames that found no slot (none free,
the ring unavailable) travel torch's way and are copied by ``collate``: slower, always right.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch

from lerobot_shards.reader.batches.collate import ByValue, CameraFrames, channels_last_view
from lerobot_shards.reader.batches.ring import BatchRing, RingWriter
from lerobot_shards.reader.batches.transfer import shareable


class Place(NamedTuple):
    """Camera frames at byte ``offset`` of slot ``slot``: a ``dtype`` tensor of ``shape`` (in
    memory order: channel-last frames are ``(..., H, W, C)`` when ``channels_last``)."""

    slot: int
    offset: int
    shape: tuple[int, ...]
    dtype: str
    channels_last: bool


class RowArena:
    """Where this worker's items go, in the order it makes them: ``places`` gives each one's
    ``(batch, row)`` (batches numbered from this iteration's start, which is batch ``base`` of
    the ring ``writer``; None: no ring). ``decode_into``: offer decode slots (PyAV frames)."""

    def __init__(
        self,
        writer: RingWriter | None,
        places: Iterator[tuple[int, int]],
        base: int,
        decode_into: bool,
    ) -> None:
        self._writer = writer
        self._places = places
        self._upcoming = next(places, None)
        self._base = base
        self._decode_into = decode_into and writer is not None
        self._handed: deque[tuple[int, int, int | None, dict[str, _Offer]]] = deque()
        self._shapes: dict[str, tuple[int, ...]] = {}  # camera -> channel-last uint8 frames
        self._declined: set[str] = set()
        self._last = -1  # the batch of the item packed last
        # (slot, camera, shape, dtype) -> the region as rows of that shape, a row's bytes, the
        # region's offset in the slot (no rows: None)
        self._rows: dict[tuple, tuple[torch.Tensor | None, int, int]] = {}

    def slots(self) -> dict[str, torch.Tensor] | None:
        """The next item's decode slots (uint8 ``(T, H, W, 3)`` by camera), or None."""
        if self._upcoming is None:
            raise RuntimeError("an item past the last row this worker's interleave places")
        batch, row = self._upcoming
        self._upcoming = next(self._places, None)
        slot = None if self._writer is None else self._writer.slot_of(self._base + batch)
        offered: dict[str, _Offer] = {}
        if slot is not None and self._decode_into:
            for key, shape in self._shapes.items():
                dest, offset = self._row(slot, key, row, shape, torch.uint8)
                if dest is not None:
                    place = Place(slot, offset, shape, "uint8", True)
                    offered[key] = _Offer(dest, place, *_channels_first(shape))
        self._handed.append((batch, row, slot, offered))
        return {key: offer.frames for key, offer in offered.items()} or None

    def pack(self, item: Mapping[str, Any]) -> tuple[int, int, dict[str, Any]]:
        """``(batch, row, item)`` of the item made after the last :meth:`slots`, ready to send:
        camera frames as their :class:`Place`, other tensors by value."""
        batch, row, slot, offered = self._handed.popleft()
        self._last = batch
        packed: dict[str, Any] = {}
        regions = {} if self._writer is None else self._writer.regions
        for key, value in item.items():
            offer = offered.get(key)
            if offer is not None and offer.holds(value):  # decoded in its row: no question left
                packed[key] = offer.place
            elif isinstance(value, CameraFrames) or (
                key in regions and isinstance(value, torch.Tensor)
            ):
                frames = None if offer is None else offer.frames
                packed[key] = self._frames(key, value, slot, row, frames)
            elif isinstance(value, torch.Tensor) and shareable(value.as_subclass(torch.Tensor)):
                packed[key] = value.as_subclass(ByValue)
            else:
                packed[key] = value
        return batch, row, packed

    def batch_ends(self) -> bool:
        """Whether the item packed last was this worker's last of its batch."""
        nxt = self._handed[0] if self._handed else self._upcoming
        return nxt is None or nxt[0] != self._last

    def _frames(
        self,
        key: str,
        value: torch.Tensor,
        slot: int | None,
        row: int,
        offered: torch.Tensor | None,
    ) -> Place | torch.Tensor:
        """Camera ``key``'s frames as their place in the slot (copied there unless decoded
        there; channel-last views stay so, any other tensor is laid out contiguous); as they
        are, for torch's way, where there is no slot or they do not fit."""
        plain = value.as_subclass(torch.Tensor)
        cl = channels_last_view(plain)
        memory = plain.movedim(-3, -1) if cl else plain
        if offered is not None and (
            memory.data_ptr() != offered.data_ptr() or memory.numel() != offered.numel()
        ):
            self._declined.add(key)  # its items do not keep their slots (a transform)
            self._shapes.pop(key, None)
        if slot is None or not shareable(memory):
            return value
        dest, offset = self._row(slot, key, row, tuple(memory.shape), memory.dtype)
        if dest is None:
            return value
        if dest.data_ptr() != memory.data_ptr() or not memory.is_contiguous():
            np.copyto(dest.numpy(), memory.numpy())  # numpy: torch would wake its thread pool
        if cl and memory.dtype == torch.uint8 and key not in self._declined:
            self._shapes[key] = tuple(memory.shape)
        return Place(slot, offset, tuple(memory.shape), _dtype_name(memory.dtype), cl)

    def _row(
        self, slot: int, key: str, row: int, shape: tuple[int, ...], dtype: torch.dtype
    ) -> tuple[torch.Tensor | None, int]:
        """Row ``row`` of camera ``key``'s region of slot ``slot`` as a ``dtype`` tensor of
        ``shape``, and its byte offset in the slot (None where it does not fit)."""
        layout = (slot, key, shape, dtype)
        rows = self._rows.get(layout)
        if rows is None:  # the region as rows of this shape, made once (torch views cost)
            region = self._writer.region(slot, key)
            nbytes = math.prod(shape) * dtype.itemsize
            count = 0 if region is None else len(region) // nbytes
            view = region[: count * nbytes].view(dtype).view(count, *shape) if count else None
            rows = self._rows[layout] = (view, nbytes, self._writer.regions.get(key, (0, 0))[0])
        view, nbytes, base = rows
        if view is None or row >= len(view):
            return None, 0
        return view[row], base + row * nbytes


class _Offer(NamedTuple):
    """A camera's row of a slot offered to the decoder: ``frames`` as the decoder is handed
    them (``(T, H, W, 3)``), the row's :class:`Place`, and the shape and strides of the
    channel-first view an item holds of frames decoded there."""

    row: torch.Tensor
    place: Place
    shape: torch.Size
    stride: tuple[int, ...]

    @property
    def frames(self) -> torch.Tensor:
        return self.row if self.row.dim() == 4 else self.row.unsqueeze(0)

    def holds(self, value: object) -> bool:
        """Whether ``value`` is the item's view of frames decoded in this row, unchanged: then
        its place is this row's, as :meth:`RowArena._frames` would find it (a few
        comparisons, where finding it takes a dozen tensor calls)."""
        return (
            isinstance(value, torch.Tensor)
            and value.data_ptr() == self.row.data_ptr()
            and value.dtype == torch.uint8
            and value.shape == self.shape
            and value.stride() == self.stride
        )


@functools.cache
def _channels_first(shape: tuple[int, ...]) -> tuple[torch.Size, tuple[int, ...]]:
    """Shape and strides of the channel-first view of contiguous channel-last frames."""
    view = torch.empty(shape, dtype=torch.uint8, device="meta").movedim(-1, -3)
    return view.shape, view.stride()


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _InColumn:
    """The value a packed item holds where its own travels in its segment's column."""

    def __reduce__(self) -> str:
        return "IN_COLUMN"


IN_COLUMN = _InColumn()


def by_column(items: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
    """Packed ``items`` with each key whose values are all small tensors of one shape and dtype
    (state, action, indices) sent as one stacked array, and :data:`IN_COLUMN` in its place:
    one array pickles in about the time of one of the tensors it replaces (numpy's reduction
    of each, a few microseconds). :func:`from_columns` gives the items back."""
    if len(items) < 2:
        return items, {}
    columns = {}
    for key, value in items[0].items():
        if type(value) is not ByValue:
            continue
        values = [item.get(key) for item in items]
        if all(
            type(v) is ByValue and v.dtype == value.dtype and v.shape == value.shape for v in values
        ):
            columns[key] = np.stack([v.as_subclass(torch.Tensor).numpy() for v in values])
    if not columns:
        return items, {}
    held = [{k: IN_COLUMN if k in columns else v for k, v in item.items()} for item in items]
    return held, columns


def from_columns(items: list[dict[str, Any]], columns: Mapping[str, np.ndarray]) -> None:
    """Put each item's values back from its segment's ``columns`` (:func:`by_column`), in
    place: each a plain tensor, a row of its column."""
    for key, column in columns.items():
        for item, value in zip(items, torch.from_numpy(column).unbind(0), strict=True):
            item[key] = value


def unpack(items: list[dict[str, Any]], ring: BatchRing | None) -> list[dict[str, Any]]:
    """The loader's side: each item's :class:`Place`\\ s as views of the ring's slots, camera
    frames typed as ``collate.py`` batches them. The frames of a camera that lie in rows of one
    slot are rows of one tensor (``CameraFrames.rows`` says which), which ``collate`` returns
    whole when it is handed every row in order."""
    found: dict[tuple, list[tuple[int, int]]] = {}  # place's kind -> (item, offset)
    for n, item in enumerate(items):
        for key, value in item.items():
            if type(value) is Place:
                kind = (value.slot, key, value.shape, value.dtype, value.channels_last)
                found.setdefault(kind, []).append((n, value.offset))
    if found and ring is None:
        raise RuntimeError("a worker wrote rows into a ring this loader does not have")
    out = [dict(item) for item in items]
    bases: dict[int, torch.Tensor] = {}
    for (slot, key, shape, dtype_name, channels_last), places in found.items():
        if slot not in bases:
            bases[slot] = ring.view(slot)
        dtype = getattr(torch, dtype_name)
        nbytes = math.prod(shape) * dtype.itemsize
        first = min(offset for _, offset in places)
        count = (max(offset for _, offset in places) - first) // nbytes + 1
        if any((offset - first) % nbytes for _, offset in places):  # not rows of one tensor
            rows = None
        else:
            rows = bases[slot][first : first + count * nbytes].view(dtype).view(count, *shape)
            rows = rows.movedim(-1, -3) if channels_last else rows
        for n, offset in places:
            if rows is not None:
                frames = rows[(offset - first) // nbytes].as_subclass(CameraFrames)
                frames.rows = (rows, (offset - first) // nbytes)
            else:
                memory = bases[slot][offset : offset + nbytes].view(dtype).view(shape)
                frames = (memory.movedim(-1, -3) if channels_last else memory).as_subclass(
                    CameraFrames
                )
            frames.camera = key
            out[n][key] = frames
    return out
