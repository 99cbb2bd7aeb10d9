"""One epoch through a 2-worker DataLoader (lerobot_shards.collate, uint8), measuring the PSS of
this process tree: prints JSON with the tree's PSS after the first batch, its peak over the epoch,
the batch's bytes and the frames seen. Run by tests/test_memory.py in a fresh process.

Usage: python memory_epoch.py SHARDS '{"frame_cache_gb": ..., "byte_budget_gb": ...}'
"""

from __future__ import annotations

import json
import sys

import torch
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset, collate
from lerobot_shards.testing.memory import PeakMemory

BATCH = 8
WORKERS = 2


def main() -> None:
    torch.set_num_threads(1)
    ds = ShardedLeRobotDataset(sys.argv[1], return_uint8=True, seed=1, **json.loads(sys.argv[2]))
    ds.num_workers = WORKERS
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS, collate_fn=collate)
    seen: list[int] = []
    batch_bytes = 0
    with PeakMemory() as memory:
        for batch in loader:
            if not seen:
                first, _ = memory.sample()
                memory.peak_pss = first  # the peak from here on: the epoch, not the start-up
                batch_bytes = sum(v.nbytes for v in batch.values() if torch.is_tensor(v))
            seen += batch["index"].tolist()
            del batch
    print(
        json.dumps(
            {
                "first_pss": first,
                "peak_pss": memory.peak_pss,
                "batch_bytes": batch_bytes,
                "frames": sorted(seen),
            }
        )
    )


if __name__ == "__main__":
    main()
