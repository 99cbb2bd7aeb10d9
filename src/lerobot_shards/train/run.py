"""``lerobot-shards train``: LeRobot's own trainer (``lerobot.scripts.lerobot_train``, its
``main``) run in-process, joined at three points; nothing of its loop is copied.

1. Its dataset factory (``make_train_eval_datasets``) builds readers over the shards
   (``datasets.py``).
2. Its ``Accelerator`` leaves a reader's DataLoader to the reader. accelerate would dispatch an
   ``IterableDataset`` from rank 0 (each rank would train on slices of rank 0's share: 1/N of
   the epoch, or a crash on the ``task`` strings) or cut its batches again
   (``IterableDatasetShard``). The reader already gives each rank its own part of every epoch,
   all parts of one length, so the prepared loader is a ``ShardedDataLoader`` with the settings
   of the DataLoader LeRobot built (workers, batch size, collate, pin_memory, prefetch), its
   batches moved to the device by a ``DeviceFeed`` (the next one copied while a step runs).
3. Its ``save_checkpoint`` also writes the data position beside the training state
   (``training_state/lerobot_shards.json``, with the shards it read), and ``--resume=true``
   loads it into the new loader: the data continues exactly where it stopped, under the same or
   another number of processes or workers (``reader/plan/elastic.py``).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any
from unittest import mock

import accelerate
import torch
from lerobot.utils.constants import TRAINING_STATE_DIR

from lerobot_shards.reader.loading.dataset import ShardedLeRobotDataset
from lerobot_shards.reader.loading.device_feed import DeviceFeed
from lerobot_shards.reader.loading.loader import ShardedDataLoader
from lerobot_shards.train.arguments import RefusedArgument, lerobot_arguments
from lerobot_shards.train.datasets import Shards, make_datasets

DATA_STATE_FILE = "lerobot_shards.json"
"""The data position in a checkpoint's ``training_state`` folder."""


class TrainRun:
    """One run's link between LeRobot's trainer and the reader: the shards, the train loader
    whose position checkpoints record, and the position a resumed run starts from."""

    def __init__(self, shards: Shards | None) -> None:
        self.shards = shards
        self.train_dataset: ShardedLeRobotDataset | None = None
        self.train_feed: DeviceFeed | None = None
        self.resume_state: dict | None = None

    def make_train_eval_datasets(self, cfg: Any) -> tuple[Any, Any]:
        """LeRobot's dataset factory, over the shards (those of the checkpoint on a resume
        without ``--shards``)."""
        saved = read_data_state(Path(cfg.checkpoint_path)) if cfg.resume else None
        if self.shards is None and saved is not None:
            self.shards = Shards(**saved["shards"])
        if self.shards is None:
            raise RefusedArgument("lerobot-shards train needs --shards (the converted datasets)")
        self.train_dataset, held_out = make_datasets(cfg, self.shards)
        self.resume_state = None if saved is None else saved["data"]
        return self.train_dataset, held_out

    def prepared_loader(
        self,
        data_loader: torch.utils.data.DataLoader,
        device: torch.device | None,
        non_blocking: bool,
    ) -> DeviceFeed:
        """What ``accelerator.prepare`` returns for a reader's DataLoader: the same settings in
        a ``ShardedDataLoader`` (the train one resumed where the checkpoint stopped), its
        batches on ``device`` (None: the CPU), each copied while the step before runs."""
        loader = ShardedDataLoader(data_loader.dataset, **loader_settings(data_loader))
        feed = DeviceFeed(loader, device or "cpu", non_blocking=non_blocking)
        if data_loader.dataset is self.train_dataset:
            if self.resume_state is not None:
                feed.load_state_dict(self.resume_state)
            self.train_feed = feed
        return feed

    def save_checkpoint(self, save: Callable[..., None], **kwargs: Any) -> None:
        """LeRobot's ``save_checkpoint``, then the data position beside its training state
        (before LeRobot points ``last`` at the checkpoint, so ``last`` always has both)."""
        save(**kwargs)
        if self.train_feed is None or self.shards is None:
            raise RuntimeError("a checkpoint before the train loader was prepared")
        state = {
            "step": kwargs["step"],
            "shards": asdict(self.shards),
            "data": self.train_feed.state_dict(),  # batches in flight left out
        }
        folder = Path(kwargs["checkpoint_dir"]) / TRAINING_STATE_DIR
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f"{DATA_STATE_FILE}.partial"
        partial.write_text(json.dumps(state, indent=1))
        os.replace(partial, folder / DATA_STATE_FILE)


def read_data_state(checkpoint: Path) -> dict:
    """The data position saved in a checkpoint; refused, naming the file, when absent."""
    path = checkpoint / TRAINING_STATE_DIR / DATA_STATE_FILE
    if not path.exists():
        raise RefusedArgument(
            f"{path} not found: the checkpoint {checkpoint} was not written by lerobot-shards "
            "train, so where its data stopped is unknown"
        )
    return json.loads(path.read_text())


def loader_settings(data_loader: torch.utils.data.DataLoader) -> dict[str, Any]:
    """The arguments that built ``data_loader`` (LeRobot's): all but its dataset and sampler."""
    settings = {
        "batch_size": data_loader.batch_size,
        "num_workers": data_loader.num_workers,
        "collate_fn": data_loader.collate_fn,
        "pin_memory": data_loader.pin_memory,
        "drop_last": data_loader.drop_last,
        "timeout": data_loader.timeout,
        "worker_init_fn": data_loader.worker_init_fn,
        "generator": data_loader.generator,
    }
    if data_loader.num_workers > 0:
        settings["prefetch_factor"] = data_loader.prefetch_factor
        settings["persistent_workers"] = data_loader.persistent_workers
        settings["multiprocessing_context"] = data_loader.multiprocessing_context
    return settings


def accelerator_for(run: TrainRun) -> type[accelerate.Accelerator]:
    """LeRobot's ``Accelerator``, but a reader's DataLoader is prepared by ``run``."""

    class ShardAwareAccelerator(accelerate.Accelerator):
        def prepare_data_loader(
            self,
            data_loader: torch.utils.data.DataLoader,
            device_placement: bool | None = None,
            slice_fn_for_dispatch: Callable | None = None,
        ) -> Any:
            if not isinstance(data_loader.dataset, ShardedLeRobotDataset):
                return super().prepare_data_loader(
                    data_loader, device_placement, slice_fn_for_dispatch
                )
            place = self.device_placement if device_placement is None else device_placement
            return run.prepared_loader(
                data_loader, self.device if place else None, self.non_blocking
            )

    return ShardAwareAccelerator


@contextmanager
def joined(run: TrainRun) -> Iterator[Any]:
    """LeRobot's training module with the three joins above in place (and only while inside)."""
    from lerobot.scripts import lerobot_train

    save = lerobot_train.save_checkpoint
    with (
        mock.patch.object(lerobot_train, "make_train_eval_datasets", run.make_train_eval_datasets),
        mock.patch.object(
            lerobot_train, "save_checkpoint", lambda **kw: run.save_checkpoint(save, **kw)
        ),
        mock.patch.object(accelerate, "Accelerator", accelerator_for(run)),
    ):
        yield lerobot_train


def train(shards: Shards | None, arguments: Sequence[str]) -> None:
    """Run ``lerobot-train arguments`` on ``shards`` (None: a resume takes the checkpoint's)."""
    first_root = shards.roots[0] if shards else None
    argv = ["lerobot-train", *lerobot_arguments(arguments, first_root)]
    run = TrainRun(shards)
    with mock.patch.object(sys, "argv", argv), joined(run) as lerobot_train:
        lerobot_train.main()
    # The loaders' persistent workers stop with their iterators, which only collection ends;
    # the command exits without tearing the interpreter down (cli.run says why).
    run.train_loader = None
    gc.collect()
