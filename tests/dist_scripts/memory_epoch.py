"""One epoch through a DataLoader (uint8 items), measuring the PSS of this process tree: prints
JSON with the tree's PSS (all of it, and ``data``: anonymous plus shared memory, see
``lerobot_shards.memory``) once the workers are up but before they fetch anything (the
baseline), after the first batch, and its peak while the epoch's batches are delivered (and,
apart, with the workers' shutdown after the last one); a batch's bytes and the frames seen. Run by
tests/test_memory.py and scripts/bench_memory.py in a fresh process.

Usage: python memory_epoch.py SHARDS '{"frame_cache_gb": ..., "byte_budget_gb": ...}'
       [--workers 2] [--batch-size 8] [--prefetch-factor 2] [--collate lerobot_shards|default]
       [--no-gc-freeze]

The loop calls ``gc.freeze()`` before the DataLoader forks its workers (unless told not to):
otherwise the garbage collector, walking objects the workers inherited, copies their pages into
each process over the epoch, up to the training process's heap per worker, which is no part of
the reader (docs/performance.md measures it).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import multiprocessing
import time

import torch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards import ShardedLeRobotDataset, collate
from lerobot_shards.memory import PeakMemory


def hold(ready, go, worker_id: int) -> None:
    """worker_init_fn: say this worker is up (torch and the reader imported, the dataset
    copied), then wait until the baseline has been sampled."""
    torch.set_num_threads(1)
    ready.release()
    go.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards")
    parser.add_argument("options")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    parser.add_argument(
        "--collate", choices=("lerobot_shards", "default"), default="lerobot_shards"
    )
    parser.add_argument("--no-gc-freeze", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ds = ShardedLeRobotDataset(args.shards, return_uint8=True, seed=1, **json.loads(args.options))
    ds.num_workers = args.workers
    if not args.no_gc_freeze:
        # Objects made so far are never collected, so no collection touches (and copies) the
        # forked workers' shared pages of them: what the reader holds, not copy-on-write.
        gc.freeze()
    ready, go = multiprocessing.Semaphore(0), multiprocessing.Event()
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        num_workers=args.workers,
        prefetch_factor=args.prefetch_factor,
        collate_fn=collate if args.collate == "lerobot_shards" else default_collate,
        worker_init_fn=functools.partial(hold, ready, go),
    )
    seen: list[int] = []
    batch_bytes = 0
    started = time.perf_counter()
    with PeakMemory() as memory:
        batches = iter(loader)  # the workers start: they wait in hold() for the baseline
        for _ in range(args.workers):
            if not ready.acquire(timeout=120):
                raise SystemExit("DataLoader workers did not start")
        baseline = memory.usage()
        memory.peak_pss, memory.peak_data = baseline["pss"], baseline["data"]
        go.set()
        for batch in batches:
            if not seen:
                first = memory.usage()
                batch_bytes = sum(v.nbytes for v in batch.values() if torch.is_tensor(v))
            seen += batch["index"].tolist()
            del batch
            memory.usage()  # the peak so far: while batches are delivered
            peak_pss, peak_data = memory.peak_pss, memory.peak_data
        # The last next() above also shut the workers down: what exiting costs is apart.
    print(
        json.dumps(
            {
                "baseline_pss": baseline["pss"],
                "first_pss": first["pss"],
                "peak_pss": peak_pss,
                "baseline_data": baseline["data"],
                "first_data": first["data"],
                "peak_data": peak_data,
                "peak_pss_with_shutdown": memory.peak_pss,
                "peak_data_with_shutdown": memory.peak_data,
                "batch_bytes": batch_bytes,
                "seconds": time.perf_counter() - started,
                "frames": sorted(seen),
            }
        )
    )


if __name__ == "__main__":
    main()
