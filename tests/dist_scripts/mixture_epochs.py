"""Run under torchrun: each rank streams two epochs of a weighted mixture with 2 DataLoader
workers (``ShardedDataLoader``); rank 0 writes every rank's ``(dataset_index, index)`` pairs per
epoch, for the test to check the exact counts.

Usage: torchrun --standalone --nproc_per_node=N mixture_epochs.py OUT_JSON ROOT WEIGHT ROOT WEIGHT
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch.distributed as dist

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset


def main(out: str, *args: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    roots, weights = list(args[0::2]), [float(w) for w in args[1::2]]
    ds = ShardedLeRobotDataset(roots, weights=weights, seed=11, buffer_size=2, pad=False)
    loader = ShardedDataLoader(ds, batch_size=3, num_workers=2)
    epochs = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        pairs = []
        for batch in loader:
            pairs += zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)
        epochs.append(pairs)
    everyone: list[list] = [[] for _ in range(world)]
    dist.all_gather_object(everyone, epochs)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {"world_size": world, "ranks": everyone, "share": ds.samples_per_dataset.tolist()},
                f,
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
