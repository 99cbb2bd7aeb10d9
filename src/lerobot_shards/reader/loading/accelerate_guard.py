"""Refuses accelerate's re-sharding of a reader that already gives each rank its own part.

``accelerator.prepare(dataloader)`` with several processes handles an ``IterableDataset`` in
one of two ways, and both lose data here: by default it *dispatches* (``DataLoaderDispatcher``:
rank 0 alone iterates and hands slices of its batches to the others), and with
``dispatch_batches=False`` it wraps the dataset in ``IterableDatasetShard`` (each rank keeps
1/N of its own stream's batches). The reader already yields each rank's part of the epoch, so
either way the job trains on 1/N of every epoch and nothing says so (measured with accelerate
1.16, 2 processes: 42 of 84 frames per epoch). An iteration of the reader inside either is
refused, saying what to do.

Found by the frames of the call stack: the dataset cannot see who iterates it otherwise. The
check runs where each wrapper's frames are on the stack: in ``__iter__`` (the process that
iterates, a DataLoader worker included: ``IterableDatasetShard`` runs inside the worker, and a
forked worker inherits the dispatcher's frames) and where the dataset is pickled for spawned
workers (inside the dispatcher's ``__iter__``, in the training process).
"""

from __future__ import annotations

import sys

WRAPPERS = ("DataLoaderDispatcher", "IterableDatasetShard")


def accelerate_wrapper_on_stack() -> str | None:
    """The name of accelerate's re-sharding wrapper whose method is running, if any."""
    if "accelerate" not in sys.modules:
        return None
    frame = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        kind = type(owner)
        if kind.__name__ in WRAPPERS and kind.__module__.startswith("accelerate."):
            return kind.__name__
        frame = frame.f_back
    return None


def refuse_accelerate_resharding(world_size: int) -> None:
    """``RuntimeError`` when accelerate re-shards the reader over ``world_size`` > 1 ranks."""
    if world_size <= 1:
        return
    wrapper = accelerate_wrapper_on_stack()
    if wrapper is None:
        return
    raise RuntimeError(
        f"ShardedLeRobotDataset iterated by accelerate's {wrapper} with {world_size} processes: "
        "the reader already gives every rank its own part of each epoch, and accelerate would "
        f"keep 1/{world_size} of it (the job would train on 1/{world_size} of every epoch). "
        "Do not pass its DataLoader to accelerator.prepare (prepare the model and optimizer; "
        "move batches with accelerate.utils.send_to_device(batch, accelerator.device)), or "
        "train with `lerobot-shards train`, which does this for LeRobot's trainer"
    )
