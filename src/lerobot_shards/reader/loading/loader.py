"""A DataLoader that checkpoints a :class:`ShardedLeRobotDataset` by itself.

Why. With DataLoader workers the dataset copies that iterate live in the workers, so the main
process's dataset cannot see what was delivered, nor (before it is told) how many workers
there are, nor which epoch the workers are in. A state built from a wrong guess of any of
these resumes into repeated and missing frames. :class:`ShardedDataLoader` knows its
``num_workers`` and ``batch_size`` (it sets ``dataset.num_workers``), counts the samples it
delivered, and keeps the dataset's record of the epoch in step with its workers, so
``loader.state_dict()`` is always the exact position (MosaicML's ``StreamingDataLoader`` is the
pattern). torchdata's ``StatefulDataLoader`` stays supported as well.

With two workers or more its batches mix every worker's pool (``mixed.py``): its own
DataLoader carries each worker's rows of every batch, written into a ring of shared slots this
loader owns (``batches/ring.py``), and the batches are put together and collated here.
``mixed_batches=False`` gives torch's batches, each from one worker.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards.reader.batches.collate import collate
from lerobot_shards.reader.batches.ring import BatchRing, ring_available
from lerobot_shards.reader.loading.dataset import ShardedLeRobotDataset
from lerobot_shards.reader.loading.mixed import Mixing, SegmentSource, assemble
from lerobot_shards.reader.meta.schema import item_schema

WARM_DRAWS = 64
"""Draws of the next epoch a ``ShardedDataLoader``'s process warms up as its part ends."""
RING_SPARE = 6
"""Slots of the ring beyond the batches being made: those the loop (and a ``DeviceFeed``)
still holds. Slots nobody writes cost no memory."""
FRAME_BYTES_BOUND = 4
"""Bytes a ring region keeps per frame element: float32 frames, the largest an item has."""


class ShardedDataLoader(DataLoader):
    """``torch.utils.data.DataLoader`` over a :class:`ShardedLeRobotDataset`, with
    ``state_dict()``/``load_state_dict()`` that resume exactly.

    Takes the DataLoader's arguments (``batch_size``, ``num_workers``, ``collate_fn``,
    ``persistent_workers``, ...). Each ``iter(loader)`` runs the dataset's next epoch (or the
    rest of a loaded state's). ``state_dict()`` may be called at any point of the loop; a state
    is refused on load, with what to do, when this loader cannot resume it exactly. With
    persistent workers (or none), each process whose part of an epoch is spent starts fetching
    and decoding its next epoch's first draws while the last batches drain
    (``warm_start.py``).

    Args:
        dataset: The dataset to load; the loader sets its ``num_workers``.
        *args: The DataLoader's positional arguments.
        mixed_batches: With two workers or more, every batch takes the workers' samples one
            at a time in turn, so it mixes every worker's pool; the workers write their rows
            straight into shared batches and ``collate_fn`` runs in this process
            (``mixed.py``). False: each batch is one worker's, as a plain DataLoader makes it.
        **kwargs: The DataLoader's keyword arguments, with its defaults: ``batch_size`` (1; None
            is refused, batches must be counted), ``num_workers`` (0: in this process),
            ``collate_fn`` (``default_collate``; any that ends in it is as fast),
            ``persistent_workers`` (False), ``pin_memory``, ``prefetch_factor``, ...; no
            ``sampler`` or ``shuffle`` (the dataset orders itself).
    """

    def __init__(
        self,
        dataset: ShardedLeRobotDataset,
        *args: Any,
        mixed_batches: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, ShardedLeRobotDataset):
            raise TypeError(
                f"ShardedDataLoader takes a ShardedLeRobotDataset, not {type(dataset).__name__}"
            )
        super().__init__(dataset, *args, **kwargs)
        if self.batch_size is None:
            raise ValueError("ShardedDataLoader needs a batch_size (batches it can count)")
        check_collate(self.collate_fn, dataset)
        dataset.num_workers = self.num_workers
        # The process that ends an epoch runs the next one: it may warm it up (warm_start.py).
        warm = self.num_workers == 0 or self.persistent_workers
        dataset.warm_draws = WARM_DRAWS if warm else 0
        self._delivered = 0
        self.mixed_batches = bool(mixed_batches) and self.num_workers > 1
        """Whether batches mix every worker's samples (asked for, and two workers or more)."""
        self._segments: DataLoader | None = None  # the DataLoader of the workers' rows
        self._ring: BatchRing | None = None
        self._workers: Iterator[Any] | None = None  # its iterator of the current iteration

    def __len__(self) -> int:
        if not self.mixed_batches:
            return super().__len__()
        samples = len(self.dataset)
        return samples // self.batch_size if self.drop_last else -(-samples // self.batch_size)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the workers start and the epoch is recorded here, in the caller's
        # thread, so a state taken before the first batch already counts from this epoch.
        self._delivered = 0
        if self.mixed_batches:
            batches, workers = self._mixed()
        else:
            batches = workers = super().__iter__()  # workers start from the dataset's position
        if self.num_workers > 0:  # the workers iterate: the dataset records where they began
            self.dataset.begin_epoch()
        return self._counted(batches, workers)

    def _mixed(self) -> tuple[Iterator[Any], Iterator[Any]]:
        """Start an iteration of mixed batches: ``(batches, the workers' iterator)``."""
        if self._segments is None:
            self._ring = self._make_ring()
            mixing = Mixing(self.batch_size, None if self._ring is None else self._ring.handle)
            self._segments = DataLoader(
                SegmentSource(self.dataset, mixing),
                batch_size=None,  # each worker's rows of a batch are one of its samples
                num_workers=self.num_workers,
                collate_fn=_as_sent,
                timeout=self.timeout,
                worker_init_fn=self.worker_init_fn,
                multiprocessing_context=self.multiprocessing_context,
                generator=self.generator,
                prefetch_factor=self.prefetch_factor,
                persistent_workers=self.persistent_workers,
                in_order=self.in_order,
            )
        window = self._window()
        ring, base = self._ring, 0
        if ring is not None:  # the first batches' slots, before any worker starts its rows
            base = ring.begin()
            for k in range(window):
                ring.assign(base + k)
        if self._workers is not None and not self.persistent_workers:
            self._workers._shutdown_workers()  # nothing of an earlier iteration writes on
        workers = self._workers = iter(self._segments)  # persistent ones drain what was asked
        if ring is not None:
            ring.abandon(below=base)
        batches = assemble(
            workers,
            ring,
            base,
            self.collate_fn,
            batch_size=self.batch_size,
            drop_last=self.drop_last,
            window=window,
        )
        if self.pin_memory and torch.accelerator.is_available():
            batches = map(_pinned, batches)
        return batches, workers

    def _window(self) -> int:
        """Batches whose rows workers may be making at once: the DataLoader asks each worker
        for ``prefetch_factor`` of its rows ahead (one more for margin)."""
        return (self.prefetch_factor or 2) + 1

    def _make_ring(self) -> BatchRing | None:
        """The ring the workers write batches into: a region per camera, for ``batch_size``
        frames of the items' shape as float32; None where shared slots are not available."""
        if not ring_available():
            return None
        member = self.dataset.datasets[0]
        schema = item_schema(member.meta.features, member.spec)
        capacities = {
            key: self.batch_size * int(np.prod(schema[key][1])) * FRAME_BYTES_BOUND
            for key in member.spec.output_camera_keys
            if key in schema
        }
        if not capacities:
            return None
        return BatchRing(capacities, self._window() + RING_SPARE)

    def _counted(self, batches: Iterator[Any], workers: Iterator[Any]) -> Iterator[Any]:
        try:
            for batch in batches:
                self._delivered += batch_length(batch)
                yield batch
        except Exception:
            # Why: when an epoch fails (a worker killed, say), the exception's traceback holds
            # the DataLoader's iterator, whose other workers would run on, holding their memory,
            # for as long as the caller keeps the exception. Shut them down now, as torch does
            # when the iterator is collected, and let a persistent loader start afresh.
            shutdown = getattr(workers, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            owner = self._segments if self.mixed_batches else self
            if owner is not None and owner._iterator is workers:
                owner._iterator = None
            raise

    def state_dict(self, num_samples: int | None = None) -> dict[str, Any]:
        """The exact position after the batches delivered so far (``reader/plan/state.py``), or,
        with ``num_samples``, after that many of this epoch's samples: what a prefetcher that
        holds delivered batches the loop has not taken yet passes (``device_feed.py``)."""
        taken = self._delivered if num_samples is None else num_samples
        return self.dataset.state_dict(
            num_samples=taken, batch_size=self.batch_size, mixed_batches=self.mixed_batches
        )

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``iter(loader)`` deliver exactly what followed ``state``."""
        segments = self._segments
        if self._iterator is not None or (segments is not None and segments._iterator is not None):
            # persistent workers hold copies made before the state
            raise RuntimeError(
                "load_state_dict on a ShardedDataLoader whose persistent workers already run "
                "would not reach them: load the state into a new ShardedDataLoader"
            )
        self.dataset.load_state_dict(state, mixed_batches=self.mixed_batches)
        self._delivered = 0


def _as_sent(segment: Any) -> Any:
    """The loader's DataLoader's ``collate_fn``: a worker's segment as it made it."""
    return segment


def _pinned(value: Any) -> Any:
    """``value`` with every tensor in page-locked memory (dicts, lists and tuples walked), as
    the DataLoader's ``pin_memory`` gives it."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory()
    if isinstance(value, Mapping):
        return type(value)({k: _pinned(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_pinned(v) for v in value)
    return value


def check_collate(collate_fn: Any, dataset: ShardedLeRobotDataset) -> None:
    """Refuse torch's ``default_collate`` for items that hold LeRobot's language columns: it
    cannot batch their values (None, lists of messages of different lengths), and would fail
    at the first batch. LeRobot's trainer collates such datasets with its own
    ``lerobot_collate_fn`` (it asks ``meta.has_language_columns``)."""
    if collate_fn not in (default_collate, collate):
        return
    language = [k for k, f in dataset.meta.features.items() if f.get("dtype") == "language"]
    if language:
        raise ValueError(
            f"the items hold LeRobot's language columns {language} (lists of messages, None "
            "where a row is empty), which torch's default_collate cannot batch: pass "
            "collate_fn=lerobot.utils.collate.lerobot_collate_fn (what lerobot-train uses: it "
            "leaves them out of the batch), or a collate_fn of your own that keeps them as lists"
        )


def batch_length(batch: Any) -> int:
    """Samples in a collated batch: the length of its first batched tensor."""
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, torch.Tensor) and values.dim() > 0:
        return len(values)
    if isinstance(batch, (Mapping, list, tuple)):
        for value in values:
            if isinstance(value, torch.Tensor) and value.dim() > 0:
                return len(value)
    raise TypeError(
        f"ShardedDataLoader cannot count the samples of a {type(batch).__name__} batch: its "
        "collate_fn must return a dict, list or tuple holding a batched tensor (as "
        "default_collate does), or the checkpoints could not be exact"
    )
