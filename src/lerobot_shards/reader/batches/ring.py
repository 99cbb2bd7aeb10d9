"""Shared batches that several DataLoader workers write: slots the loader's process owns and
hands out batch by batch.

Why. Where a batch mixes every worker's samples (``plan/interleave.py``), no one worker can
make it. Putting the workers' pieces together in the loader's process would copy every frame
of every batch once more, in the one process the training loop runs in. Instead the loader
keeps a ring of shared slots (``memfd``: no name, nothing left behind), each as large as a
batch, and before a batch's rows are made it assigns the batch a free slot in a small shared
table; every worker writes its rows of the batch straight into that slot, at the rows the
interleave gives it (frames decoded there: ``rows.py``), and the batch the loop gets views the
slot. A slot goes to a later batch only once no view of it is alive.

A slot holds one region per camera, of ``batch_size`` rows of that camera's frames as float32
(the largest an item's frames are): pages nobody writes cost no memory, so a uint8 batch uses a
quarter of it. The control block holds the iteration's first batch number and, for each batch
of a window, the slot it was given (or none: then its rows take torch's way and the loader's
``collate`` copies them, always correct). Workers map the control block and the slots through
``/proc/<loader pid>/fd/<fd>``, as the loader maps a worker's batches in ``transfer.py``.

Linux only (``memfd_create`` and ``/proc``), like ``transfer.py``: elsewhere, or with
``LEROBOT_SHARDS_SHARED_BATCHES=0``, there is no ring and rows take torch's way.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from lerobot_shards.reader.batches.transfer import DISABLE

_PAGE = 4096
_TABLE = 256
"""Batches whose slots the control block holds at once (entry ``batch % _TABLE``)."""
_SLOT_BITS = 8
_MAX_SLOTS = (1 << _SLOT_BITS) - 1


def _pages(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


@dataclass(frozen=True)
class RingHandle:
    """What a worker needs to write into a ring: where its memory is and how a slot is laid
    out (camera key to ``(offset, capacity)`` in bytes). Plain data: it pickles anywhere."""

    pid: int
    control_fd: int
    slot_fds: tuple[int, ...]
    slot_bytes: int
    regions: tuple[tuple[str, int, int], ...]


class _Memfd:
    """A memfd mapped read-write; its descriptor closes when the object is collected (the
    mapping lives on in whatever still views it)."""

    def __init__(self, name: str, size: int) -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.map = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        weakref.finalize(self, os.close, self.fd)


def ring_available() -> bool:
    """Whether this process can keep a ring (Linux's memfd and ``/proc``, not switched off)."""
    if not hasattr(os, "memfd_create") or os.environ.get(DISABLE) == "0":
        return False
    try:
        probe = _Memfd("lerobot-shards-probe", _PAGE)
    except OSError:
        return False
    try:
        os.close(os.open(f"/proc/{os.getpid()}/fd/{probe.fd}", os.O_RDWR))
    except OSError:
        return False
    return True


class BatchRing:
    """The loader's side: ``slots`` shared slots with a region per camera of ``capacity`` bytes
    (``capacities``: camera key to bytes of ``batch_size`` rows), the control block, and which
    batch owns which slot. Batch numbers only grow, over every iteration of the loader."""

    def __init__(self, capacities: dict[str, int], slots: int) -> None:
        if not 1 <= slots <= _MAX_SLOTS:
            raise ValueError(f"a ring holds 1 to {_MAX_SLOTS} slots, not {slots}")
        regions, offset = [], 0
        for key, capacity in capacities.items():
            regions.append((key, offset, int(capacity)))
            offset += _pages(int(capacity))
        self.slot_bytes = max(offset, _PAGE)
        self._control = _Memfd("lerobot-shards-ring", 8 * (1 + _TABLE))
        self._words = np.frombuffer(self._control.map, dtype=np.int64)
        self._slots = [_Memfd("lerobot-shards-batch", self.slot_bytes) for _ in range(slots)]
        self.handle = RingHandle(
            os.getpid(),
            self._control.fd,
            tuple(s.fd for s in self._slots),
            self.slot_bytes,
            tuple(regions),
        )
        # Re-entrant: a view's release runs wherever the garbage collector frees it, this very
        # thread inside a locked section included.
        self._lock = threading.RLock()
        self._owner: list[int | None] = [None] * slots  # the pending batch a slot is kept for
        self._alive = [0] * slots  # views of each slot still alive
        self._next = 0  # one past the highest batch number used

    @property
    def slots(self) -> int:
        return len(self._slots)

    def begin(self) -> int:
        """Start an iteration: its first batch number (after every one used so far), published
        for the workers, which read it when their iteration starts."""
        with self._lock:
            self._words[0] = self._next
            return self._next

    def abandon(self, below: int) -> None:
        """Release every pending batch numbered below ``below`` (an earlier iteration's, whose
        writers are done: drained, or shut down)."""
        with self._lock:
            for slot, owner in enumerate(self._owner):
                if owner is not None and owner < below:
                    self._owner[slot] = None

    def assign(self, batch: int) -> None:
        """Give batch ``batch`` the lowest free slot (none if every slot is owned or viewed),
        in the control block, before any worker starts its rows."""
        with self._lock:
            slot = next(
                (
                    s
                    for s in range(len(self._slots))
                    if self._owner[s] is None and not self._alive[s]
                ),
                None,
            )
            if slot is not None:
                self._owner[slot] = batch
            self._words[1 + batch % _TABLE] = batch << _SLOT_BITS | (
                0 if slot is None else slot + 1
            )
            self._next = max(self._next, batch + 1)

    def delivered(self, batch: int) -> None:
        """Batch ``batch`` was put together: its slot is free again once its views are gone."""
        with self._lock:
            for slot, owner in enumerate(self._owner):
                if owner == batch:
                    self._owner[slot] = None

    def view(self, slot: int) -> torch.Tensor:
        """Slot ``slot``'s bytes, a uint8 tensor: the slot stays busy until every tensor viewing
        it is freed (a batch takes one view and makes its tensors from it)."""
        buffer = memoryview(self._slots[slot].map)
        with self._lock:
            self._alive[slot] += 1
        weakref.finalize(buffer, self._released, slot)
        return torch.frombuffer(buffer, dtype=torch.uint8)

    def _released(self, slot: int) -> None:
        with self._lock:
            self._alive[slot] -= 1


class RingWriter:
    """A worker's side: the control block and the slots of the ring ``handle`` describes,
    mapped from the loader's process once, on first use."""

    def __init__(self, handle: RingHandle) -> None:
        self.handle = handle
        self._words = np.frombuffer(self._open(handle.control_fd, 8 * (1 + _TABLE)), np.int64)
        self._slots: dict[int, torch.Tensor] = {}
        self.regions = {key: (offset, capacity) for key, offset, capacity in handle.regions}

    def _open(self, fd: int, size: int) -> mmap.mmap:
        handle = os.open(f"/proc/{self.handle.pid}/fd/{fd}", os.O_RDWR)
        try:
            return mmap.mmap(handle, size)
        finally:
            os.close(handle)

    def base(self) -> int:
        """The current iteration's first batch number."""
        return int(self._words[0])

    def slot_of(self, batch: int) -> int | None:
        """The slot batch ``batch`` was given, or None (none given, or not yet)."""
        entry = int(self._words[1 + batch % _TABLE])
        if entry >> _SLOT_BITS != batch or not entry & _MAX_SLOTS:
            return None
        return (entry & _MAX_SLOTS) - 1

    def region(self, slot: int, key: str) -> torch.Tensor | None:
        """Camera ``key``'s region of slot ``slot`` as uint8 bytes (None: no region for it)."""
        where = self.regions.get(key)
        if where is None:
            return None
        memory = self._slots.get(slot)
        if memory is None:
            buffer = self._open(self.handle.slot_fds[slot], self.handle.slot_bytes)
            memory = self._slots[slot] = torch.frombuffer(buffer, dtype=torch.uint8)
        offset, capacity = where
        return memory[offset : offset + capacity]
