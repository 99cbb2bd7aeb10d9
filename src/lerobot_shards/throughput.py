"""What a DataLoader over a converted dataset delivers: samples/s, camera frames/s, bytes/s and
coverage, measured the way a training loop consumes the stream.

Used by ``lerobot-shards stream``, the demo and ``scripts/bench_read.py``. The counting happens
in the consuming process, from the batches alone:

- samples and camera frames are counted from the batch tensors;
- coverage is the distinct global ``index`` values (of a mixture, ``(dataset_index, index)``)
  seen in the current epoch over the frames this rank yields per epoch (padding repeats count
  once), so a finished epoch reads 100%; a mixture also counts each dataset's samples and
  distinct frames;
- shard bytes are counted when an episode's first sample of the epoch arrives, once for every
  piece of it the epoch's plan holds (each piece, a frame range of one episode in one part, is
  fetched by one ranged read of its whole episode). Bytes prefetched for episodes whose samples
  have not arrived yet are not counted.

Rates are measured after ``warmup_batches`` batches, so worker start-up and the first fetches
do not dilute them; ``first_batch_s`` reports that start-up separately.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch

from lerobot_shards.reader.loading.dataset import ShardedLeRobotDataset
from lerobot_shards.reader.loading.loader import ShardedDataLoader

if TYPE_CHECKING:
    from lerobot_shards.report import RunLog


@dataclass
class StreamStats:
    """Counts of one streaming run; the rates cover the measured window (after warm-up)."""

    samples: int = 0
    batches: int = 0
    camera_frames: int = 0
    bytes_fetched: int = 0
    elapsed_s: float = 0.0
    """Seconds since the dataset's construction began."""
    first_batch_s: float = math.nan
    """Seconds from the dataset's construction to the first batch."""
    window_s: float = 0.0
    window_samples: int = 0
    window_camera_frames: int = 0
    window_bytes: int = 0
    epoch: int = 0
    """The epoch being streamed (or the last one, once finished)."""
    seen: int = 0
    """Distinct global indices seen in ``epoch``."""
    epoch_frames: int = 0
    """Frames this rank yields per epoch (its samples minus padding)."""
    epoch_coverage: list[float] = field(default_factory=list)
    """Coverage of every finished epoch."""
    dataset_samples: list[int] = field(default_factory=list)
    """Per dataset of a mixture: samples delivered in ``epoch``."""
    dataset_seen: list[int] = field(default_factory=list)
    """Per dataset of a mixture: its distinct frames delivered in ``epoch``."""
    dataset_frames: list[int] = field(default_factory=list)
    """Per dataset of a mixture: its selected frames."""
    dataset_share: list[int] = field(default_factory=list)
    """Per dataset of a mixture: samples it contributes per epoch over all ranks."""

    @property
    def samples_per_s(self) -> float:
        return self.window_samples / self.window_s if self.window_s > 0 else math.nan

    @property
    def camera_frames_per_s(self) -> float:
        return self.window_camera_frames / self.window_s if self.window_s > 0 else math.nan

    @property
    def bytes_per_s(self) -> float:
        return self.window_bytes / self.window_s if self.window_s > 0 else math.nan

    @property
    def overall_samples_per_s(self) -> float:
        """Every sample over every second since construction: start-up and warm-up included."""
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else math.nan

    @property
    def coverage(self) -> float:
        """Distinct samples seen in the current epoch / frames in this rank's epoch (of a
        mixture: distinct ``(dataset_index, index)`` over this rank's samples per epoch, which
        reads 100% at the epoch's end only when no frame is drawn twice)."""
        return self.seen / self.epoch_frames if self.epoch_frames else math.nan

    def line(self) -> str:
        """One human-readable progress line (and one per dataset of a mixture)."""
        line = (
            f"{self.elapsed_s:7.1f} s  {self.samples_per_s:8.1f} samples/s  "
            f"{self.camera_frames_per_s:8.1f} camera frames/s  "
            f"{self.bytes_per_s / 1e6:7.2f} MB/s  epoch {self.epoch} coverage "
            f"{self.seen}/{self.epoch_frames} ({100 * self.coverage:.1f}%)  "
            f"[{self.samples} samples, first batch after {self.first_batch_s:.2f} s]"
        )
        return "\n".join([line, *self.dataset_lines()])

    def dataset_lines(self) -> list[str]:
        """Per dataset of a mixture: its samples this epoch against its share, and the
        distinct frames they showed."""
        if len(self.dataset_frames) < 2:
            return []
        return [
            f"    dataset {d}: {n} samples of its {share} per epoch, {seen}/{frames} distinct "
            f"frames ({100 * seen / frames if frames else 0:.1f}%)"
            for d, (n, share, seen, frames) in enumerate(
                zip(
                    self.dataset_samples,
                    self.dataset_share,
                    self.dataset_seen,
                    self.dataset_frames,
                    strict=True,
                )
            )
        ]


class _FetchCounter:
    """Shard bytes behind the samples seen: when an episode's first sample of the epoch arrives,
    its bytes once for every piece of it the epoch's plan fetches (its parts over all ranks and
    workers; an up-weighted dataset's episode may be drawn in several pieces)."""

    def __init__(self, ds: ShardedLeRobotDataset, num_parts: int) -> None:
        self._ds = ds
        self._num_parts = num_parts
        members = ds.datasets
        self._from = [m.selection.starts for m in members]
        rows = [len(f) for f in self._from]
        self._first_row = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(np.int64)
        self._sizes = ds.catalog.sizes

    def start_epoch(self, epoch: int) -> None:
        ds = self._ds
        ctx = ds._context()
        parts = ds._planner.fresh_parts(ctx.ordering, self._num_parts, epoch, ctx.nodes)
        rows = np.searchsorted(ds.catalog.episodes, np.concatenate([p.episodes for p in parts]))
        pieces = np.bincount(rows.astype(np.int64), minlength=len(self._sizes))
        self._bytes = self._sizes * pieces
        self._fetched = np.zeros(len(self._sizes), dtype=bool)

    def see(self, datasets: np.ndarray, indices: np.ndarray) -> int:
        """Bytes of the episodes whose first sample of the epoch is among these samples."""
        rows = np.empty(len(indices), dtype=np.int64)
        for d in np.unique(datasets).tolist():
            mine = datasets == d
            row = np.searchsorted(self._from[d], indices[mine], side="right") - 1
            rows[mine] = self._first_row[d] + row
        new = np.unique(rows)
        new = new[~self._fetched[new]]
        self._fetched[new] = True
        return int(self._bytes[new].sum())


def _one_intra_op_thread(worker_id: int) -> None:
    """DataLoader workers collate on one thread: with several workers on few cores, torch's
    intra-op threads only fight the decoder threads and each other."""
    torch.set_num_threads(1)


def stream(
    root: str | Sequence[str],
    *,
    weights: Sequence[float] | None = None,
    workers: int = 2,
    batch_size: int = 8,
    seconds: float | None = None,
    epochs: int | None = None,
    buffer_size: int = 64,
    byte_budget_gb: float | None = None,
    return_uint8: bool = False,
    shuffle: bool = True,
    seed: int = 0,
    warmup_batches: int = 1,
    warmup_epochs: int = 0,
    storage_options: dict | None = None,
    dataset_options: Mapping | None = None,
    report: Callable[[StreamStats], None] | None = None,
    interval_s: float = 5.0,
    collate_fn: Callable | None = None,
    log: RunLog | None = None,
    mixed_batches: bool = True,
) -> StreamStats:
    """Stream ``root`` (or a mixture: a list of roots, with ``weights``) through a
    ``ShardedDataLoader`` and return what it delivered.

    Runs ``epochs`` epochs (default 1), or until ``seconds`` have passed (with ``seconds`` and
    no ``epochs``: as many epochs as fit), whichever comes first. DataLoader workers are
    persistent, so each epoch sees a new order, and collate on one intra-op thread each.
    ``report(stats)`` is called every ``interval_s`` seconds and at the end of every epoch.
    ``dataset_options`` go to ``ShardedLeRobotDataset`` as further keyword arguments.
    ``collate_fn`` batches for the DataLoader (``None``: torch's ``default_collate``).
    ``log`` records each batch for a report (``lerobot_shards.report``). ``mixed_batches``:
    the loader's (False: each batch from one worker).

    The rates cover what follows ``warmup_batches`` batches, or, with ``warmup_epochs``, whole
    epochs from the start of epoch ``warmup_epochs`` (with persistent workers already running):
    admitting a pool as large as the dataset fetches and demuxes all of an epoch's episodes
    before its first batch, and only whole epochs weigh that fairly.
    """
    if epochs is None:
        epochs = 1 if seconds is None else None
    started = time.perf_counter()
    deadline = math.inf if seconds is None else started + seconds
    mixture = {} if isinstance(root, str) else {"weights": weights}
    ds = ShardedLeRobotDataset(
        root,
        **mixture,
        shuffle=shuffle,
        seed=seed,
        buffer_size=buffer_size,
        byte_budget_gb=byte_budget_gb,
        return_uint8=return_uint8,
        storage_options=storage_options,
        **dict(dataset_options or {}),
    )
    ds.num_workers = workers
    counter = _FetchCounter(ds, ds._context().world_size * max(1, workers))
    shape = {key: int(np.prod(ds.meta.features[key]["shape"])) for key in ds.meta.camera_keys}
    loader = ShardedDataLoader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        persistent_workers=workers > 0,
        worker_init_fn=_one_intra_op_thread if workers > 0 else None,
        collate_fn=collate_fn,
        mixed_batches=mixed_batches,
    )
    members = ds.datasets
    stats = StreamStats(
        epoch_frames=len(ds) - ds.padding,
        dataset_frames=[int(m.selection.lengths.sum()) for m in members],
        dataset_share=ds.samples_per_dataset.tolist(),
    )
    seen = [np.zeros(m.meta.total_frames, dtype=bool) for m in members]
    window_start = started if warmup_batches <= 0 and warmup_epochs <= 0 else None
    last_report = started
    epoch = 0
    try:
        while epochs is None or epoch < epochs:
            stats.epoch, stats.seen = epoch, 0
            stats.dataset_samples = [0] * len(members)
            stats.dataset_seen = [0] * len(members)
            for mask in seen:
                mask[:] = False
            counter.start_epoch(epoch)
            if warmup_epochs > 0 and epoch == warmup_epochs:
                window_start = time.perf_counter()
            for batch in loader:
                now = time.perf_counter()
                indices = batch["index"].numpy().reshape(-1)
                n = len(indices)
                datasets = (
                    batch["dataset_index"].numpy().reshape(-1)
                    if ds.is_mixture
                    else np.zeros(n, dtype=np.int64)
                )
                frames = sum(batch[key].numel() // shape[key] for key in shape)
                if log is not None:
                    episodes = batch["episode_index"].numpy().reshape(-1).tolist()
                    log.batch(n, len(set(zip(datasets.tolist(), episodes, strict=True))))
                fetched = counter.see(datasets, indices)
                for d in np.unique(datasets).tolist():
                    mine = indices[datasets == d]
                    seen[d][mine] = True
                    stats.dataset_samples[d] += len(mine)
                    stats.dataset_seen[d] = int(seen[d].sum())
                stats.samples += n
                stats.batches += 1
                stats.camera_frames += frames
                stats.bytes_fetched += fetched
                stats.seen = sum(stats.dataset_seen)
                stats.elapsed_s = now - started
                if stats.batches == 1:
                    stats.first_batch_s = stats.elapsed_s
                if window_start is not None:
                    stats.window_samples += n
                    stats.window_camera_frames += frames
                    stats.window_bytes += fetched
                    stats.window_s = now - window_start
                elif warmup_epochs <= 0 and stats.batches >= warmup_batches:
                    window_start = now
                if report is not None and now - last_report >= interval_s:
                    report(replace(stats, epoch_coverage=list(stats.epoch_coverage)))
                    last_report = now
                if now >= deadline:
                    break
            else:
                stats.epoch_coverage.append(stats.coverage)
                if report is not None:
                    report(replace(stats, epoch_coverage=list(stats.epoch_coverage)))
                    last_report = time.perf_counter()
                epoch += 1
                continue
            break
    finally:
        del loader  # shuts the persistent workers down
    return stats
