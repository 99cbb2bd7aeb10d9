"""``lerobot-shards train`` (its real command line, in this process) recording what LeRobot's
trainer consumed: one JSON line per training step, the ``index`` (and ``dataset_index`` of a
mixture) of the batch the trainer took from its DataLoader (``next(dl_iter)`` of LeRobot's
``cycle``), in ``$RECORD_DIR/rank-<RANK>.jsonl``. With ``KILL_AT_STEP=n`` the process kills
itself (SIGKILL, nothing cleaned up) as it asks for the batch of its n-th step since it started:
a crash after the checkpoints written before it.

    python tests/support/train_recorder.py --shards DIR --policy.type=act ...
"""

from __future__ import annotations

import json
import os
import signal
import sys

from lerobot.scripts import lerobot_train

from lerobot_shards.cli import run

RECORD = os.path.join(os.environ["RECORD_DIR"], f"rank-{os.environ.get('RANK', '0')}.jsonl")
KILL_AT_STEP = int(os.environ.get("KILL_AT_STEP", 0))
cycle = lerobot_train.cycle


def recording_cycle(dataloader):
    """LeRobot's ``cycle(dataloader)``, each batch recorded as the trainer takes it."""
    for step, batch in enumerate(cycle(dataloader), start=1):
        record = {key: batch[key].tolist() for key in ("index", "dataset_index") if key in batch}
        with open(RECORD, "a") as out:
            out.write(json.dumps(record) + "\n")
        yield batch
        if step + 1 == KILL_AT_STEP:
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":  # DataLoader workers started by spawn import this module too
    lerobot_train.cycle = recording_cycle
    sys.argv = ["lerobot-shards", "train", *sys.argv[1:]]
    run()
