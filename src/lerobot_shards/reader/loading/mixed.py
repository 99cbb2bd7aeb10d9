"""Batches that mix every DataLoader worker's pool: each worker's rows of every batch, and the
loader putting each batch together.

Why. Each worker streams its own part through its own pool, so a batch made by one worker
holds only the episodes that worker holds: with 2 workers on 24 episodes, 10.3 distinct
episodes in a batch of 32 where a global shuffle gives 17.6. Here the rank's stream takes its
workers' samples one at a time in turn (``plan/interleave.py``), so every batch holds about
``batch_size / workers`` samples of each worker's pool.

The workers' side (:func:`segments`): for each batch it has samples in, a worker yields one
:class:`Segment`, the batch's number and length, and its rows with their items, whose frames it
wrote straight into the slot the loader gave the batch (``batches/ring.py``,
``batches/rows.py``). The loader's DataLoader runs without batching of its own
(``batch_size=None``), the segments being its samples. The loader's side (:func:`assemble`):
collect each batch's segments, in batch order (one that comes early waits), unpack the items
into row order and collate them with the loop's ``collate_fn``, in the loader's process: any
``collate_fn`` sees exactly the batch's items, and ``default_collate`` finds each camera's
frames already in place, a view of the slot.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from torch.utils.data import IterableDataset

from lerobot_shards.reader.batches.ring import BatchRing, RingHandle, RingWriter
from lerobot_shards.reader.batches.rows import RowArena, by_column, from_columns, unpack
from lerobot_shards.reader.plan.interleave import Interleave

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Mixing:
    """What a worker needs to make its rows of mixed batches: the loader's batch size and its
    ring (None: no ring, rows take torch's way)."""

    batch_size: int
    ring: RingHandle | None


class Segment(NamedTuple):
    """A worker's rows of one batch: ``items[i]`` goes to row ``rows[i]`` of batch ``batch``
    (numbered from the iteration's start), which holds ``length`` samples in all; their small
    tensors of one kind stacked in ``columns`` (``rows.by_column``)."""

    batch: int
    length: int
    rows: list[int]
    items: list[dict]
    columns: dict[str, np.ndarray]


class SegmentSource(IterableDataset):
    """The dataset as the loader's own DataLoader iterates it: each worker's segments."""

    def __init__(self, dataset: Any, mixing: Mixing) -> None:
        self.dataset = dataset
        self.mixing = mixing

    def __iter__(self) -> Iterator[Segment]:
        return self.dataset.segments(self.mixing)


_writers: dict[tuple[int, RingHandle], RingWriter | None] = {}


def ring_writer(handle: RingHandle | None) -> RingWriter | None:
    """This process's mapping of the ring ``handle`` names (made once); None, with a warning
    once, where the loader's memory cannot be opened here (rows then take torch's way)."""
    if handle is None:
        return None
    key = (os.getpid(), handle)
    if key not in _writers:
        try:
            _writers[key] = RingWriter(handle)
        except OSError as exc:
            logger.warning(
                "DataLoader worker (pid %d) cannot map the loader's batch ring (%s): its rows "
                "take torch's shared memory, and the loader copies them",
                os.getpid(),
                exc,
            )
            _writers[key] = None
    return _writers[key]


def segments(
    items: Iterator[dict],
    arena: RowArena,
    interleave: Interleave,
    batch_size: int,
) -> Iterator[Segment]:
    """A worker's items (each made after ``arena.slots()`` said where) as its segments."""
    rows: list[int] = []
    packed: list[dict] = []
    batch = -1
    for item in items:
        batch, row, ready = arena.pack(item)
        rows.append(row)
        packed.append(ready)
        if arena.batch_ends():
            length = interleave.batch_length(batch, batch_size)
            yield Segment(batch, length, rows, *by_column(packed))
            rows, packed = [], []
    if packed:
        raise RuntimeError(f"batch {batch}: the worker's stream ended inside the batch")


def assemble(
    received: Iterator[Segment],
    ring: BatchRing | None,
    base: int,
    collate_fn: Callable[[list], Any],
    *,
    batch_size: int,
    drop_last: bool,
    window: int,
) -> Iterator[Any]:
    """The batches, in order, from the workers' segments: each one's items unpacked in row
    order and collated by ``collate_fn``. Batch ``k`` of the iteration is the ring's batch
    ``base + k``; each batch put together gives batch ``k + window`` a slot."""
    pending: dict[int, list[Segment]] = {}
    filled: dict[int, int] = {}
    nxt = 0
    for segment in received:
        if segment.batch < nxt:
            raise RuntimeError(f"rows of batch {segment.batch} came after it was delivered")
        pending.setdefault(segment.batch, []).append(segment)
        filled[segment.batch] = filled.get(segment.batch, 0) + len(segment.rows)
        while nxt in pending and filled[nxt] >= pending[nxt][0].length:
            parts, length = pending.pop(nxt), filled.pop(nxt)
            rows = [row for part in parts for row in part.rows]
            if sorted(rows) != list(range(length)):
                raise RuntimeError(f"batch {nxt}: the workers' rows {sorted(rows)} do not tile it")
            for part in parts:
                from_columns(part.items, part.columns)
            items: list[Any] = [None] * length
            unpacked = unpack([item for part in parts for item in part.items], ring)
            for row, item in zip(rows, unpacked, strict=True):
                items[row] = item
            del unpacked, parts
            if ring is not None:  # its views hold the slot from here on
                ring.delivered(base + nxt)
                ring.assign(base + nxt + window)
            nxt += 1
            if drop_last and length < batch_size:
                continue
            yield collate_fn(items)
    if pending:
        raise RuntimeError(f"batch {min(pending)} ended with rows missing")
