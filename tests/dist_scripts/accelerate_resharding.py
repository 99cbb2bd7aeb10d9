"""Run under torchrun (2 processes): a ShardedLeRobotDataset's DataLoader prepared by accelerate
as ``accelerator.prepare`` prepares it, then iterated. Both ways accelerate re-shards an
IterableDataset must be refused by the reader (each would train on 1/N of every epoch).

Usage: torchrun --standalone --nproc_per_node=2 accelerate_resharding.py ROOT MODE WORKERS START
MODE: dispatch (accelerate's default for an IterableDataset) or shard (dispatch_batches=False);
START: the DataLoader workers' start method (fork, spawn).
"""

from __future__ import annotations

import sys

from accelerate import PartialState
from accelerate.data_loader import prepare_data_loader
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset


def main(root: str, mode: str, workers: int, start: str) -> None:
    state = PartialState(cpu=True)  # gloo over the torchrun environment
    ds = ShardedLeRobotDataset(root, seed=1)
    context = start if workers else None
    loader = DataLoader(ds, batch_size=4, num_workers=workers, multiprocessing_context=context)
    prepared = prepare_data_loader(
        loader, state.device, put_on_device=True, dispatch_batches=mode == "dispatch"
    )
    for _ in prepared:
        pass
    print(f"rank {state.process_index}: iterated a whole epoch", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
