"""Run under torchrun: each rank streams one epoch with 2 DataLoader workers; the ranks gather
their indices and check them (disjoint, complete, equal lengths). Rank 0 writes what it saw.

Usage: torchrun --standalone --nproc_per_node=N stream_epoch.py DATASET_ROOT OUT_JSON
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset

NUM_WORKERS = 2


def main(root: str, out: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = ShardedLeRobotDataset(root, seed=7, buffer_size=3)
    ds.num_workers = NUM_WORKERS
    ds.set_epoch(0)
    loader = DataLoader(ds, batch_size=None, num_workers=NUM_WORKERS)
    indices = [int(item["index"]) for item in loader]
    mine = {"rank": rank, "indices": indices, "len": len(ds), "padding": ds.padding}
    everyone: list[dict] = [{} for _ in range(world)]
    dist.all_gather_object(everyone, mine)

    lengths = [len(r["indices"]) for r in everyone]
    assert len(set(lengths)) == 1, f"ranks yielded different numbers of samples: {lengths}"
    assert all(r["len"] == len(r["indices"]) for r in everyone), "len(ds) is not what was yielded"
    sets = [set(r["indices"]) for r in everyone]
    for a in range(world):
        for b in range(a + 1, world):
            assert not sets[a] & sets[b], f"ranks {a} and {b} share {sorted(sets[a] & sets[b])}"
    covered = set().union(*sets)
    total = ds.num_frames
    assert covered == set(range(total)), f"missing {sorted(set(range(total)) - covered)}"
    padding = sum(r["padding"] for r in everyone)
    assert sum(lengths) == total + padding, (sum(lengths), total, padding)
    assert padding < world * NUM_WORKERS, f"{padding} padded samples"
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": world, "num_frames": total, "ranks": everyone}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
