"""``lerobot-shards train`` (its real command line, in this process) recording what LeRobot's
trainer consumed: one JSON line per training step, the ``index`` (and ``dataset_index`` of a
mixture) of the batch the trainer took from its DataLoader (``next(dl_iter)`` of LeRobot's
``cycle``) and, per camera, each sample's dtype, shape and the SHA-1 of its bytes (what the
policy is fed, before LeRobot's preprocessor), in ``$RECORD_DIR/rank-<RANK>.jsonl``. The batches
of an eval loader (``--dataset.eval_split``) go to ``eval-rank-<RANK>.jsonl``, one line per
batch with the number of the pass through it; the readers the run built (train and eval: their
options as the reader holds them) to ``datasets-rank-<RANK>.json``. With ``KILL_AT_STEP=n`` the
process kills itself (SIGKILL, nothing cleaned up) as it asks for the batch of its n-th step
since it started: a crash after the checkpoints written before it.

    python tests/support/train_recorder.py --shards DIR --policy.type=act ...
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

from lerobot.scripts import lerobot_train

from lerobot_shards.cli import run
from lerobot_shards.train.run import TrainRun

RANK = os.environ.get("RANK", "0")
RECORD = os.path.join(os.environ["RECORD_DIR"], f"rank-{RANK}.jsonl")
EVAL_RECORD = os.path.join(os.environ["RECORD_DIR"], f"eval-rank-{RANK}.jsonl")
DATASETS = os.path.join(os.environ["RECORD_DIR"], f"datasets-rank-{RANK}.json")
KILL_AT_STEP = int(os.environ.get("KILL_AT_STEP", 0))
CAMERA_PREFIX = "observation.images."
cycle = lerobot_train.cycle
make_train_eval_datasets = TrainRun.make_train_eval_datasets
prepared_loader = TrainRun.prepared_loader


def record_of(batch: dict) -> dict:
    """What a batch held: indices, and per camera each sample's dtype, shape and digest."""
    record = {key: batch[key].tolist() for key in ("index", "dataset_index") if key in batch}
    for key, value in batch.items():
        if key.startswith(CAMERA_PREFIX) and not key.endswith("_is_pad"):
            record[key] = [
                [str(v.dtype), list(v.shape), hashlib.sha1(v.contiguous().numpy()).hexdigest()]
                for v in value.cpu()
            ]
    return record


def recording_cycle(dataloader):
    """LeRobot's ``cycle(dataloader)``, each batch recorded as the trainer takes it."""
    for step, batch in enumerate(cycle(dataloader), start=1):
        with open(RECORD, "a") as out:
            out.write(json.dumps(record_of(batch)) + "\n")
        yield batch
        if step + 1 == KILL_AT_STEP:
            os.kill(os.getpid(), signal.SIGKILL)


def described(ds: Any) -> dict | None:
    """A reader's options, as the reader holds them."""
    if ds is None:
        return None
    return {
        "root": ds.root,
        "episodes": ds.episodes,
        "seed": ds.seed,
        "shuffle": ds.shuffle,
        "pad": ds.pad,
        "buffer_size": ds.buffer_size,
        "byte_budget": ds.byte_budget,
        "storage_options": [m.storage_options for m in ds.datasets],
        "video_backend": ds.video_backend,
        "image_transforms": type(ds.spec.image_transforms).__name__,
        "return_uint8": ds.spec.return_uint8,
    }


def recording_datasets(self: TrainRun, cfg: Any) -> tuple[Any, Any]:
    train, held_out = make_train_eval_datasets(self, cfg)
    with open(DATASETS, "w") as out:
        json.dump({"train": described(train), "eval": described(held_out)}, out)
    return train, held_out


class RecordingEvalFeed:
    """An eval loader whose batches are recorded, numbered by pass, as the trainer takes them."""

    def __init__(self, feed: Any) -> None:
        self.feed = feed
        self.passes = 0

    def __iter__(self) -> Iterator[Any]:
        self.passes += 1
        for batch in self.feed:
            with open(EVAL_RECORD, "a") as out:
                out.write(json.dumps({"pass": self.passes, **record_of(batch)}) + "\n")
            yield batch

    def __len__(self) -> int:
        return len(self.feed)


def recording_loader(self: TrainRun, data_loader: Any, *args: Any) -> Any:
    feed = prepared_loader(self, data_loader, *args)
    return feed if data_loader.dataset is self.train_dataset else RecordingEvalFeed(feed)


if __name__ == "__main__":  # DataLoader workers started by spawn import this module too
    lerobot_train.cycle = recording_cycle
    TrainRun.make_train_eval_datasets = recording_datasets
    TrainRun.prepared_loader = recording_loader
    sys.argv = ["lerobot-shards", "train", *sys.argv[1:]]
    run()
