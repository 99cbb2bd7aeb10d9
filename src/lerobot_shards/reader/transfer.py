"""Batches from DataLoader workers to the main process through reused shared-memory segments.

Why. torch moves a worker's batch to the main process by copying every tensor into fresh shared
memory and passing a file descriptor per tensor over a socket. For a batch of 8 samples of two
480x640 cameras that is 5 ms of the kernel zeroing and mapping new pages in the worker, plus the
socket round trips and the mapping in the main process: as much CPU as decoding the frames. Here
a worker keeps a few shared segments (``memfd``: no name, so nothing can be left behind) and
reuses them. A batch is written into a free segment; the main process maps it through
``/proc/<worker pid>/fd/<fd>`` and hands out the camera frames (and any tensor of 64 KiB or
more) as views of it, and every smaller tensor as a copy, so that keeping a batch's indices does
not keep its frames' segment. When the main process frees the last view, it marks the segment
free for the worker again.

A segment is reused only when both sides are done with it: byte 0 of its header is set while
the main process may still use it (cleared there when the views are freed, or by the worker if
the batch was never sent), byte 1 while the worker holds views of it. Each byte has one writer at
a time, so no atomic read-modify-write is needed.

Linux only (``memfd_create`` and ``/proc``). Elsewhere, with ``LEROBOT_SHARDS_SHARED_BATCHES=0``
in the environment, or while every segment is in use (a training loop that keeps many batches),
a batch goes torch's way, which is always correct.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

_HEADER = 64  # [main holds, worker holds], then padding; payload offsets are 64-byte aligned
_ALIGN = 64
DISABLE = "LEROBOT_SHARDS_SHARED_BATCHES"
"""Set to ``0`` to send batches torch's way (say, where ``/proc/<pid>/fd`` of a worker cannot be
opened by the main process)."""
MAX_SEGMENTS = 8
"""Segments one worker keeps: a batch waiting in each of the DataLoader's prefetch slots, the one
the main process is using and the one before it, with a margin."""

VIEW_BYTES = 1 << 16
"""Tensors of a batch at least this large reach the main process as views of the segment,
smaller ones as copies."""

_NUMPY_DTYPES = {
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.float32,
    torch.float64,
    torch.bool,
}


class _Segment:
    """One memfd mapped read-write in the worker."""

    def __init__(self, size: int) -> None:
        self.fd = os.memfd_create("lerobot-shards-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size = size

    @property
    def free(self) -> bool:
        return self.map[0] == 0 and self.map[1] == 0

    def close(self) -> None:
        """Unmap and close (only when free: the worker's views are gone)."""
        self.map.close()
        os.close(self.fd)


class SegmentPool:
    """A worker's shared segments, at most ``max_segments``, reused once free."""

    def __init__(self, max_segments: int = MAX_SEGMENTS) -> None:
        self.max_segments = max_segments
        self.segments: list[_Segment] = []
        self.arena = BatchArena(self)

    def acquire(self, size: int) -> _Segment | None:
        """A free segment of at least ``size`` bytes, marked held by both sides; None if every
        segment is in use (the caller then sends the batch torch's way)."""
        spare = None
        for segment in self.segments:
            if segment.free:
                if segment.size >= size:
                    segment.map[0:2] = b"\x01\x01"
                    return segment
                spare = segment
        if len(self.segments) >= self.max_segments:
            if spare is None:
                return None
            self.segments.remove(spare)  # free but too small (the batch shape changed)
            spare.close()
        segment = _Segment(size)
        segment.map[0:2] = b"\x01\x01"
        self.segments.append(segment)
        return segment


_pool: tuple[int, SegmentPool | None] | None = None  # (pid, pool) of this process


def worker_pool() -> SegmentPool | None:
    """This process's pool, or None where segments cannot be shared (not Linux, no memfd, no
    ``/proc/<pid>/fd``). Keyed by pid so that a forked child never reuses its parent's."""
    global _pool
    pid = os.getpid()
    if _pool is None or _pool[0] != pid:
        _pool = (pid, _make_pool())
    return _pool[1]


def _make_pool() -> SegmentPool | None:
    if not hasattr(os, "memfd_create") or os.environ.get(DISABLE) == "0":
        return None
    try:
        probe = _Segment(_HEADER)
    except OSError:
        return None
    try:
        os.close(os.open(f"/proc/{os.getpid()}/fd/{probe.fd}", os.O_RDWR))
    except OSError:
        return None
    finally:
        probe.close()
    return SegmentPool()


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _shareable(value: object) -> bool:
    return (
        type(value) is torch.Tensor
        and value.device.type == "cpu"
        and value.dtype in _NUMPY_DTYPES
        and not value.requires_grad
    )


class SharedBatch(dict):
    """A collated batch whose tensors live in a shared segment (in a DataLoader worker).

    In the worker it is a plain dict of tensors viewing the segment. Pickled (by the DataLoader,
    to send it to the main process) it carries only the segment's address and layout; unpickled,
    it is a plain ``dict``: views of the segment for the camera frames and other large tensors,
    copies of the small ones.
    """

    def __init__(self, lease: _Lease, values: dict[str, Any]) -> None:
        super().__init__(values)
        self._address = (os.getpid(), lease.segment.fd, lease.segment.size)
        self._layout = lease.layout
        self._sent = lease.sent

    def __reduce__(self):
        if self._sent[0]:  # pickled before (a copy, say): only one receiver may free the segment
            return dict, ({k: _copy(v) for k, v in self.items()},)
        self._sent[0] = True
        shared = {entry[0] for entry in self._layout}
        rest = {k: v for k, v in self.items() if k not in shared}
        return _attach, (self._address, self._layout, rest, list(self))


def _copy(value: Any) -> Any:
    return value.clone() if isinstance(value, torch.Tensor) else value


class _Lease:
    """A segment acquired for one batch, with views of it laid out as ``layout`` says.

    The worker's hold (and the main process's, if the batch is never sent) ends when the last
    view of the segment is freed.
    """

    def __init__(self, segment: _Segment, layout: list[tuple]) -> None:
        self.segment = segment
        self.layout = layout
        self.sent = [False]
        buffer = memoryview(segment.map)
        self.tensors = _views(torch.frombuffer(buffer, dtype=torch.uint8), layout)
        weakref.finalize(buffer, _worker_release, segment.map, self.sent)

    @classmethod
    def acquire(cls, pool: SegmentPool, layout: list[tuple], size: int) -> _Lease | None:
        segment = pool.acquire(size)
        return None if segment is None else cls(segment, layout)


class BatchArena:
    """Batch slots for the camera frames a DataLoader worker's dataset is about to yield.

    Why. Copying each decoded frame into the batch segment costs as much as a tenth of decoding
    it. The DataLoader's fetcher takes a worker's items in order, ``batch_size`` at a time, and
    then calls ``collate``; so the ``p``-th item yielded since the last collate lands at row
    ``p`` of the next batch. Once :func:`pack` has seen one batch (its layout and length), the
    dataset asks :meth:`slots` for each item's frame destinations, row ``p`` of a segment
    acquired for the coming batch, and the decoder writes the frames there; :func:`pack` then
    finds them in place and copies only the other columns.

    Nothing here is trusted: :func:`pack` uses the slots only if every frame of the batch is
    exactly its row's slot, and otherwise copies into another segment (a segment whose views are
    held is never reused). A camera whose items did not keep their slots (a transform, float
    frames) is not offered slots again.
    """

    def __init__(self, pool: SegmentPool) -> None:
        self._pool = pool
        self._layout: list[tuple] | None = None
        self._size = 0
        self._keys: tuple[str, ...] = ()
        self._declined: set[str] = set()
        self._handed = 0  # items given slots since the last collate
        self._lease: _Lease | None = None

    def slots(self) -> dict[str, torch.Tensor] | None:
        """The next item's frame slots (uint8 ``(T, H, W, 3)`` by camera), or None: before the
        first batch, past the batch's length, or while no segment is free."""
        row = self._handed
        self._handed += 1
        if self._layout is None or not self._keys or row >= self._layout[0][2][0]:
            return None
        if row == 0:
            self._lease = _Lease.acquire(self._pool, self._layout, self._size)
        if self._lease is None:
            return None
        slots = {}
        for key in self._keys:
            slot = self._lease.tensors[key][row]
            slots[key] = slot if slot.dim() == 4 else slot.unsqueeze(0)  # one frame: CHW items
        return slots

    def end_batch(self) -> tuple[_Lease | None, tuple[str, ...]]:
        """Called by collate: the segment the batch's slots are in (None if none were given),
        and the cameras given slots; the next item starts a new batch."""
        lease, self._lease, self._handed = self._lease, None, 0
        return lease, self._keys

    def learn(self, layout: list[tuple], size: int, declined: Sequence[str] = ()) -> None:
        """Lay out the coming batches as this one (``layout`` and ``size`` as :func:`pack`
        computed them; its rows are the batch's items); offer slots for its uint8 frame
        columns, except those ``declined`` now or before."""
        self._declined.update(declined)
        self._layout, self._size = layout, size
        self._keys = tuple(
            key
            for key, _, _, dtype, frames in layout
            if frames and dtype == "uint8" and key not in self._declined
        )


def pack(
    columns: Mapping[str, Any], frame_keys: Sequence[str], pool: SegmentPool
) -> SharedBatch | None:
    """Stack each column that is a list of equal tensors into one shared segment.

    ``columns`` maps each key to its values across the batch (a :func:`stackable` list) or to an
    already batched value, kept as it is. ``frame_keys`` name columns of channel-last camera
    frames: stacked as they are, returned as channel-first views (``movedim``), and handed to the
    main process as views of the segment. Frames already in their rows of the segment the
    pool's :class:`BatchArena` gave out are not copied. None if no segment is free, or if a frame
    column is not :func:`stackable` (then the caller's own stacking reports why).
    """
    lease, offered = pool.arena.end_batch()
    layout, offset = [], _HEADER
    for key, value in columns.items():
        first = _first(value)
        if first is None and key in frame_keys:
            return None
        if first is not None:
            shape = (len(value), *first.shape)
            dtype = str(first.dtype).removeprefix("torch.")
            layout.append((key, offset, shape, dtype, key in frame_keys))
            offset = _aligned(offset + int(np.prod(shape)) * first.element_size())
    if not layout:
        return None
    in_place: set[str] = set()
    declined: list[str] = []
    if lease is not None and lease.layout == layout:  # a batch of the slots' shape
        in_place = {key for key in offered if _in_slots(columns[key], lease.tensors[key])}
        declined = [key for key in offered if key not in in_place]
    pool.arena.learn(layout, offset, declined)
    if declined or not in_place:
        lease = _Lease.acquire(pool, layout, offset)  # frames out of place: copy them all
        in_place = set()
        if lease is None:
            return None
    values = dict(columns)
    for key, _, _, _, frames in layout:
        tensor = lease.tensors[key]
        if key not in in_place:
            np.stack([v.numpy() for v in columns[key]], out=tensor.numpy())
        values[key] = tensor.movedim(-1, -3) if frames else tensor
    return SharedBatch(lease, values)


def _in_slots(values: Sequence[torch.Tensor], slots: torch.Tensor) -> bool:
    """Whether each of ``values`` is exactly its row of ``slots`` (same memory and shape)."""
    return len(values) == len(slots) and all(
        v.data_ptr() == s.data_ptr() and v.shape == s.shape and v.is_contiguous()
        for v, s in zip(values, slots, strict=True)
    )


def _views(base: torch.Tensor, layout: list[tuple]) -> dict[str, torch.Tensor]:
    views = {}
    for key, start, shape, dtype_name, _ in layout:
        dtype = getattr(torch, dtype_name)
        size = int(np.prod(shape)) * torch.empty(0, dtype=dtype).element_size()
        views[key] = base[start : start + size].view(dtype).view(shape)
    return views


def stackable(values: object) -> bool:
    """A non-empty list of plain CPU tensors of one shape and numpy-compatible dtype."""
    return _first(values) is not None


def _first(values: object) -> torch.Tensor | None:
    if type(values) is not list or not values:
        return None
    first = values[0]
    if not _shareable(first):
        return None
    for v in values:
        if not _shareable(v) or v.dtype != first.dtype or v.shape != first.shape:
            return None
    return first


def _worker_release(segment_map: mmap.mmap, sent: list[bool]) -> None:
    if segment_map.closed:
        return
    if not sent[0]:
        segment_map[0] = 0
    segment_map[1] = 0


def _main_release(segment_map: mmap.mmap) -> None:
    if not segment_map.closed:
        segment_map[0] = 0


def _attach(
    address: tuple[int, int, int], layout: list[tuple], rest: dict[str, Any], order: list[str]
) -> dict[str, Any]:
    """Main process: map a worker's segment and rebuild the batch as a plain dict."""
    pid, fd, size = address
    try:
        handle = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
    except OSError as exc:
        raise RuntimeError(
            f"cannot map the batch that DataLoader worker (pid {pid}) shared ({exc}): the "
            f"worker has exited, or this process may not open /proc/{pid}/fd (then set "
            f"{DISABLE}=0 to send batches through torch's shared memory instead)"
        ) from exc
    try:
        segment_map = mmap.mmap(handle, size)
    finally:
        os.close(handle)
    buffer = memoryview(segment_map)
    weakref.finalize(buffer, _main_release, segment_map)
    tensors = _views(torch.frombuffer(buffer, dtype=torch.uint8), layout)
    del buffer  # from here on, only the views returned hold the segment
    values = dict(rest)
    for key, _, _, _, frames in layout:
        tensor = tensors[key]
        if frames:
            values[key] = tensor.movedim(-1, -3)
        else:  # small ones are copied so that keeping them does not keep the segment
            values[key] = tensor if tensor.nbytes >= VIEW_BYTES else tensor.clone()
    return {key: values[key] for key in order}
