"""A rank's batches drawn from all of its DataLoader workers at once: where each worker's samples
go in the rank's stream.

Pure and numpy only. Each DataLoader worker of a rank streams its own part through its own pool
(``partition.py``, ``pool.py``), so a batch that one worker makes can only mix the episodes
that worker holds. A rank whose batches mix every worker's pool takes its workers' streams
(*lanes*) one sample each in turn, in worker order, skipping a lane that has run out: the
DataLoader's round robin over workers with batches of one sample, so what each lane gave after
any offset is ``consumed_per_worker(offset, lanes, 1, repeat)`` (``elastic.py``), and a
checkpoint of this order resumes, elastically too, as any other. Batch ``k`` holds the rank's
samples ``k * batch_size`` to ``(k + 1) * batch_size - 1``: about ``batch_size / workers`` of
each worker's, so ``W`` pools of ``buffer_size`` episodes mix in every batch (stratified: a
little more than uniform draws from ``W * buffer_size`` episodes would give).

Each worker knows from these counts alone, without asking anyone, the batch and row of each of
its samples: it writes them there (``batches/ring.py``), and the loader only puts the rows of
every worker together (``loading/mixed.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

_CHUNK = 4096
"""Samples of a lane placed at a time."""


class Interleave:
    """The rank's stream of one iteration: lane ``w``'s samples (DataLoader worker ``w``'s) taken
    one at a time in turn with the others'.

    ``remaining[w]`` is how many samples lane ``w`` yields in this iteration; ``None`` for
    streams without end (``repeat``), where every lane always has a next sample.
    """

    def __init__(self, remaining: Sequence[int] | None, lanes: int) -> None:
        if lanes < 1:
            raise ValueError(f"an interleave needs at least one lane, got {lanes}")
        if remaining is not None:
            if len(remaining) != lanes:
                raise ValueError(f"{len(remaining)} lane lengths given for {lanes} lanes")
            if any(n < 0 for n in remaining):
                raise ValueError(f"lane lengths must be non-negative, got {list(remaining)}")
        self.lanes = lanes
        self.remaining = None if remaining is None else np.asarray(remaining, dtype=np.int64)

    @property
    def total(self) -> int | None:
        """Samples of the whole interleave (None: without end)."""
        return None if self.remaining is None else int(self.remaining.sum())

    def positions(self, lane: int, first: int, count: int) -> np.ndarray:
        """Places in the rank's stream of lane ``lane``'s samples ``first..first+count-1``.

        Sample ``i`` of lane ``w`` comes after ``min(n_v, i)`` samples of every lane ``v`` (the
        rounds before its own) and after the lanes before ``w`` that still have an ``i``-th.
        """
        if not 0 <= lane < self.lanes:
            raise ValueError(f"lane {lane} is outside {self.lanes} lanes")
        i = np.arange(first, first + count, dtype=np.int64)
        if self.remaining is None:
            return i * self.lanes + lane
        if first + count > self.remaining[lane]:
            have = int(self.remaining[lane])
            raise ValueError(f"lane {lane} has {have} samples, not {first + count}")
        n = self.remaining
        before = np.minimum(n[None, :], i[:, None]).sum(axis=1)
        return before + (n[None, :lane] > i[:, None]).sum(axis=1)

    def batch_length(self, batch: int, batch_size: int) -> int:
        """Samples of batch ``batch`` (the last one may be short)."""
        total = self.total
        if total is None:
            return batch_size
        return max(0, min(batch_size, total - batch * batch_size))

    def places(self, lane: int, batch_size: int) -> Iterator[tuple[int, int]]:
        """``(batch, row)`` of each of lane ``lane``'s samples, in the lane's order."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        end = None if self.remaining is None else int(self.remaining[lane])
        first = 0
        while end is None or first < end:
            count = _CHUNK if end is None else min(_CHUNK, end - first)
            batches, rows = np.divmod(self.positions(lane, first, count), batch_size)
            yield from zip(batches.tolist(), rows.tolist(), strict=True)
            first += count
