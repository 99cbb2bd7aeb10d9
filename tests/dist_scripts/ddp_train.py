"""Run under torchrun: one epoch of DDP training (gloo, CPU) on the streamed dataset.

Every rank must take the same number of optimizer steps, or DDP's all-reduce would wait
forever for the rank that stopped early. Rank 0 writes each rank's steps, samples and indices,
and whether the ranks ended with the same weights.

Usage: torchrun --standalone --nproc_per_node=N ddp_train.py DATASET_ROOT OUT_JSON [WORKERS
LOADER]: LOADER ``plain`` (default: a torch DataLoader) or ``sharded`` (a ShardedDataLoader,
whose batches mix every worker's samples).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

BATCH_SIZE = 4


def main(root: str, out: str, workers: str = "2", kind: str = "plain") -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ds = ShardedLeRobotDataset(root, seed=1, buffer_size=2)
    num_workers = int(workers)
    if kind == "sharded":
        loader = ShardedDataLoader(ds, batch_size=BATCH_SIZE, num_workers=num_workers)
    else:
        ds.num_workers = num_workers
        ds.set_epoch(0)
        loader = DataLoader(ds, batch_size=BATCH_SIZE, num_workers=num_workers)
    dim = ds.meta.features["observation.state"]["shape"][0]
    model = DistributedDataParallel(torch.nn.Linear(dim, dim))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    steps = samples = 0
    indices: list[int] = []
    for batch in loader:
        loss = torch.nn.functional.mse_loss(model(batch["observation.state"]), batch["action"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        samples += len(batch["index"])
        indices += batch["index"].tolist()
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone: list[dict] = [{} for _ in range(world)]
    mine = {"rank": rank, "steps": steps, "samples": samples, "indices": indices}
    dist.all_gather_object(everyone, {**mine, "weights": weights.tolist()})
    if rank == 0:
        same = all(r["weights"] == everyone[0]["weights"] for r in everyone)
        result = {
            "num_frames": ds.num_frames,
            "ranks": [{k: r[k] for k in ("rank", "steps", "samples", "indices")} for r in everyone],
            "same_weights": same,
        }
        with open(out, "w") as f:
            json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
