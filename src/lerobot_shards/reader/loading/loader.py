"""A DataLoader that checkpoints a :class:`ShardedLeRobotDataset` by itself.

Why. With DataLoader workers the dataset copies that iterate live in the workers, so the main
process's dataset cannot see what was delivered, nor (before it is told) how many workers
there are, nor which epoch the workers are in. A state built from a wrong guess of any of
these resumes into repeated and missing frames. :class:`ShardedDataLoader` knows its
``num_workers`` and ``batch_size`` (it sets ``dataset.num_workers``), counts the samples it
delivered, and keeps the dataset's record of the epoch in step with its workers, so
``loader.state_dict()`` is always the exact position (MosaicML's ``StreamingDataLoader`` is the
pattern). torchdata's ``StatefulDataLoader`` stays supported as well.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader

from lerobot_shards.reader.loading.dataset import ShardedLeRobotDataset

WARM_DRAWS = 64
"""Draws of the next epoch a ``ShardedDataLoader``'s process warms up as its part ends."""


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
    """

    def __init__(self, dataset: ShardedLeRobotDataset, *args: Any, **kwargs: Any) -> None:
        if not isinstance(dataset, ShardedLeRobotDataset):
            raise TypeError(
                f"ShardedDataLoader takes a ShardedLeRobotDataset, not {type(dataset).__name__}"
            )
        super().__init__(dataset, *args, **kwargs)
        if self.batch_size is None:
            raise ValueError("ShardedDataLoader needs a batch_size (batches it can count)")
        dataset.num_workers = self.num_workers
        # The process that ends an epoch runs the next one: it may warm it up (warm_start.py).
        warm = self.num_workers == 0 or self.persistent_workers
        dataset.warm_draws = WARM_DRAWS if warm else 0
        self._delivered = 0

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the workers start and the epoch is recorded here, in the caller's
        # thread, so a state taken before the first batch already counts from this epoch.
        self._delivered = 0
        self.dataset._world()  # the ranks agree on the world before any worker copies it
        batches = super().__iter__()  # workers start here, from the dataset's next position
        if self.num_workers > 0:  # the workers iterate: the dataset records where they began
            self.dataset.begin_epoch()
        return self._counted(batches)

    def _counted(self, batches: Iterator[Any]) -> Iterator[Any]:
        try:
            for batch in batches:
                self._delivered += batch_length(batch)
                yield batch
        except Exception:
            # Why: when an epoch fails (a worker killed, say), the exception's traceback holds
            # the DataLoader's iterator, whose other workers would run on, holding their memory,
            # for as long as the caller keeps the exception. Shut them down now, as torch does
            # when the iterator is collected, and let a persistent loader start afresh.
            shutdown = getattr(batches, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()
            if self._iterator is batches:
                self._iterator = None
            raise

    def state_dict(self, num_samples: int | None = None) -> dict[str, Any]:
        """The exact position after the batches delivered so far (``reader/plan/state.py``), or,
        with ``num_samples``, after that many of this epoch's samples: what a prefetcher that
        holds delivered batches the loop has not taken yet passes (``device_feed.py``)."""
        taken = self._delivered if num_samples is None else num_samples
        return self.dataset.state_dict(num_samples=taken, batch_size=self.batch_size)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``iter(loader)`` deliver exactly what followed ``state``."""
        if self._iterator is not None:  # persistent workers hold copies made before the state
            raise RuntimeError(
                "load_state_dict on a ShardedDataLoader whose persistent workers already run "
                "would not reach them: load the state into a new ShardedDataLoader"
            )
        self.dataset.load_state_dict(state)
        self._delivered = 0


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
