"""Run under torchrun, one launch per node: each rank reads epochs through a ShardedDataLoader.

Usage: torchrun ... uneven_nodes.py ARGS_JSON. ARGS: ``root``, ``out`` (a folder:
``rank-R.json`` is written), ``caches`` (a cache folder per node), ``group`` (initialise a gloo
process group first), ``drop`` (``{"node": N, "names": [...]}``: environment variables removed
on node N's ranks before the reader sees them, as a launcher that does not set them),
``epochs``, ``stop_after`` (batches of the last epoch; then the loader's state is written to
``state.json`` by rank 0) and ``resume`` (a state file loaded first). The node is the launch's
(torchrun's GROUP_RANK). A ``ValueError`` of the reader is written as the rank's ``error``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path


def main(args: dict) -> None:
    rank, node = int(os.environ["RANK"]), int(os.environ["GROUP_RANK"])
    if args.get("drop") and args["drop"]["node"] == node:
        for name in args["drop"]["names"]:
            os.environ.pop(name, None)
    import torch.distributed as dist

    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

    if args["group"]:
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    out = Path(args["out"])
    ds = ShardedLeRobotDataset(
        args["root"], cache_dir=args["caches"][node], seed=3, buffer_size=2, return_uint8=True
    )
    loader = ShardedDataLoader(ds, batch_size=2, num_workers=0)
    record: dict = {"node": node, "epochs": {}}
    try:
        if args.get("resume"):
            loader.load_state_dict(json.loads(Path(args["resume"]).read_text()))
        for n, epoch in enumerate(args["epochs"]):
            if n or not args.get("resume"):
                ds.set_epoch(epoch)
            taken, last = [], n == len(args["epochs"]) - 1
            for b, batch in enumerate(loader):
                taken.append(batch["index"].tolist())
                if last and args.get("stop_after") and b + 1 == args["stop_after"]:
                    if rank == 0:
                        (out / "state.json").write_text(json.dumps(loader.state_dict()))
                    break
            record["epochs"][str(epoch)] = taken
    except ValueError as exc:
        record["error"] = str(exc)
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
    if args["group"] and "error" not in record:
        dist.barrier()  # the state is written before any rank of a later launch reads it
        dist.destroy_process_group()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
