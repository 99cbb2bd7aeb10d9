"""Batches from DataLoader workers to the main process through reused shared-memory segments.

Why. torch moves a worker's batch to the main process by copying every tensor into fresh shared
memory and passing a file descriptor per tensor, each over a connection of its own to the
worker. For a batch of 8 samples of two 480x640 cameras that is 5 ms of the kernel zeroing and
mapping new pages in the worker, plus the connections and the mapping in the main process: as
much CPU as decoding the frames. Here a worker keeps a few shared segments (``memfd``: no name,
so nothing can be left behind) and reuses them. A batched camera (or any large column) is
written into a free segment and becomes a :class:`SharedTensor`; the main process maps the
segment through ``/proc/<worker pid>/fd/<fd>`` and receives a plain tensor viewing it. When the
main process frees the last view, it marks the segment free for the worker again. Camera frames
are even decoded straight into their rows of the next batch's segments (:class:`BatchArena`),
so batching them copies nothing.

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

import numpy as np
import torch

_HEADER = 64  # [main holds, worker holds], then padding; payload offsets are 64-byte aligned
_ALIGN = 64
DISABLE = "LEROBOT_SHARDS_SHARED_BATCHES"
"""Set to ``0`` to send batches torch's way (say, where ``/proc/<pid>/fd`` of a worker cannot be
opened by the main process)."""
MAX_SEGMENTS = 32
"""Segments one worker keeps, one per camera (or large column) of a batch: a batch waiting in
each of the DataLoader's prefetch slots, the one the main process is using and the one before
it, with a margin, for up to about five cameras."""

VIEW_BYTES = 1 << 16
"""Batched columns at least this large reach the main process through a segment; smaller ones
travel by value in the batch's own message (``collate.py``)."""

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


def shareable(value: object) -> bool:
    """A plain CPU tensor of a dtype numpy has, without grad: it can be shared as bytes."""
    return (
        type(value) is torch.Tensor
        and value.device.type == "cpu"
        and value.dtype in _NUMPY_DTYPES
        and not value.requires_grad
    )


def stackable(values: object) -> bool:
    """A non-empty list of plain CPU tensors of one shape and numpy-compatible dtype."""
    return _first(values) is not None


def _first(values: object) -> torch.Tensor | None:
    if type(values) is not list or not values:
        return None
    first = values[0]
    if not shareable(first):
        return None
    for v in values:
        if not shareable(v) or v.dtype != first.dtype or v.shape != first.shape:
            return None
    return first


class _Lease:
    """A segment acquired for one batched tensor of ``shape`` and ``dtype``, at ``tensor``.

    The worker's hold (and the main process's, if the tensor is never sent) ends when the last
    view of the segment is freed.
    """

    def __init__(self, segment: _Segment, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.segment = segment
        self.sent = [False]
        buffer = memoryview(segment.map)
        nbytes = int(np.prod(shape)) * dtype.itemsize
        base = torch.frombuffer(buffer, dtype=torch.uint8)
        self.tensor = base[_HEADER : _HEADER + nbytes].view(dtype).view(shape)
        weakref.finalize(buffer, _worker_release, segment.map, self.sent)

    @classmethod
    def acquire(
        cls, pool: SegmentPool, shape: tuple[int, ...], dtype: torch.dtype
    ) -> _Lease | None:
        size = _aligned(_HEADER + int(np.prod(shape)) * dtype.itemsize)
        segment = pool.acquire(size)
        return None if segment is None else cls(segment, shape, dtype)


class TaggedTensor(torch.Tensor):
    """A tensor whose type only tags it for batching or sending: operations on it (and
    ``copy.deepcopy``) return plain tensors."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __deepcopy__(self, memo: dict) -> torch.Tensor:
        copied = memo[id(self)] = self.as_subclass(torch.Tensor).clone()
        return copied


class SharedTensor(TaggedTensor):
    """A batched tensor in a DataLoader worker's shared segment.

    Pickled (by the DataLoader, to send the batch to the main process) it carries only the
    segment's address and the tensor's layout; unpickled, it is a plain tensor viewing the
    segment. Any operation on it returns a plain tensor.
    """

    _lease: _Lease
    _frames: bool

    def __reduce_ex__(self, protocol):
        lease = self._lease
        if lease.sent[0]:  # pickled before (a copy, say): only one receiver may free the segment
            return torch.Tensor.__reduce_ex__(self.as_subclass(torch.Tensor).clone(), protocol)
        lease.sent[0] = True
        rows = self.shape[0]
        shape = (rows, *lease.tensor.shape[1:])
        dtype = str(self.dtype).removeprefix("torch.")
        address = (os.getpid(), lease.segment.fd, lease.segment.size)
        return _attach, (address, shape, dtype, self._frames)


def _shared(lease: _Lease, rows: int, frames: bool) -> SharedTensor:
    """The first ``rows`` rows of ``lease``'s tensor as a :class:`SharedTensor` (channel-first
    view of channel-last frames if ``frames``)."""
    tensor = lease.tensor[:rows]
    shared = (tensor.movedim(-1, -3) if frames else tensor).as_subclass(SharedTensor)
    shared._lease = lease
    shared._frames = frames
    return shared


def share_stacked(values: list[torch.Tensor], frames: bool) -> SharedTensor | None:
    """``values`` (a :func:`stackable` list; channel-last frames if ``frames``) stacked into a
    free segment of this process's pool, as a :class:`SharedTensor`; None where segments
    cannot be shared or none is free (the caller then batches torch's way)."""
    pool = worker_pool()
    first = _first(values)
    if pool is None or first is None:
        return None
    lease = _Lease.acquire(pool, (len(values), *first.shape), first.dtype)
    if lease is None:
        return None
    # numpy copies on this thread; torch would wake its intra-op pool
    np.stack([v.numpy() for v in values], out=lease.tensor.numpy())
    return _shared(lease, len(values), frames)


class BatchArena:
    """Batch slots for the camera frames a DataLoader worker's dataset is about to yield.

    Why. Copying each decoded frame into the batch costs as much as a tenth of decoding it. The
    DataLoader's fetcher takes a worker's items in order, ``batch_size`` at a time, and then
    collates them; so the ``p``-th item yielded since the last collate lands at row ``p`` of the
    next batch. Once a camera has been batched once (its frames' shape and the batch's length
    are then known), the dataset asks :meth:`slots` for each item's frame destinations, row
    ``p`` of a segment acquired per camera for the coming batch, and the decoder writes the
    frames there; collating the camera (:meth:`take`) then finds them in place.

    Nothing here is trusted: :meth:`take` uses the slots only if every frame of the batch is
    exactly its row's slot, and otherwise the frames are copied (a segment whose views are held
    is never reused). A camera whose items did not keep their slots (a transform) is not
    offered slots again.
    """

    def __init__(self, pool: SegmentPool) -> None:
        self._pool = pool
        self._shapes: dict[str, tuple[int, ...]] = {}  # camera -> channel-last batch shape
        self._declined: set[str] = set()
        self._handed = 0  # items given slots since the last batch was collated
        self._filling: dict[str, _Lease] = {}  # the coming batch's segments, by camera
        self._filled: dict[str, _Lease] = {}  # the batch being collated's segments

    def slots(self) -> dict[str, torch.Tensor] | None:
        """The next item's frame slots (uint8 ``(T, H, W, 3)`` by camera), or None: before a
        camera was batched, past the batch's length, or while no segment is free."""
        row = self._handed
        self._handed += 1
        if row == 0:
            self._filling = {}
            for key, shape in self._shapes.items():
                lease = _Lease.acquire(self._pool, shape, torch.uint8)
                if lease is not None:
                    self._filling[key] = lease
        slots = {}
        for key, lease in self._filling.items():
            if row < len(lease.tensor):
                slot = lease.tensor[row]
                slots[key] = slot if slot.dim() == 4 else slot.unsqueeze(0)  # one frame: CHW
        return slots or None

    def take(self, key: str, frames: list[torch.Tensor]) -> SharedTensor | None:
        """Camera ``key``'s batch, ``frames`` (channel-last), as a view of the slots they were
        decoded into; None if they are not there (the caller copies them). Learns the batch's
        layout for the slots of the batches to come."""
        if self._handed:  # the first camera collated since items were handed: a batch ended
            self._filled, self._filling, self._handed = self._filling, {}, 0
        lease = self._filled.pop(key, None)
        if lease is not None and len(frames) <= len(lease.tensor):
            rows = lease.tensor[: len(frames)]
            if all(
                f.data_ptr() == r.data_ptr() and f.shape == r.shape and f.is_contiguous()
                for f, r in zip(frames, rows, strict=True)
            ):
                return _shared(lease, len(frames), frames=True)
            self._declined.add(key)  # its items do not keep their slots
            self._shapes.pop(key, None)
            return None
        first = _first(frames)
        if key not in self._declined and first is not None and first.dtype == torch.uint8:
            self._shapes[key] = (len(frames), *first.shape)
        return None


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
    address: tuple[int, int, int], shape: tuple[int, ...], dtype: str, frames: bool
) -> torch.Tensor:
    """Main process: map a worker's segment and return the tensor it holds, viewing it."""
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
    torch_dtype = getattr(torch, dtype)
    nbytes = int(np.prod(shape)) * torch_dtype.itemsize
    tensor = torch.frombuffer(buffer, dtype=torch.uint8)[_HEADER : _HEADER + nbytes]
    del buffer  # from here on, only the view returned holds the segment
    tensor = tensor.view(torch_dtype).view(shape)
    return tensor.movedim(-1, -3) if frames else tensor
