"""Run under torchrun, one launch per node: each rank reads an epoch through its node's cache.

Usage: torchrun ... cache_nodes.py ARGS_JSON. ARGS: ``root``, ``storage_options``, ``epoch``,
``caches`` (one folder per node), ``limit_gb``, ``out`` (a folder: ``rank-R.json`` is written),
``stop_after`` (batches; then the loader's state is written too) and ``resume`` (a state file
to load first). The node is the launch's (torchrun's GROUP_RANK); ranks do not talk to each
other (the reader needs no process group), so a rank of a finished node may exit first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset


def main(args: dict) -> None:
    rank, node = int(os.environ["RANK"]), int(os.environ["GROUP_RANK"])
    ds = ShardedLeRobotDataset(
        args["root"],
        storage_options=args["storage_options"],
        cache_dir=args["caches"][node],
        cache_limit_gb=args["limit_gb"],
        seed=3,
        buffer_size=3,
        return_uint8=True,
    )
    loader = ShardedDataLoader(ds, batch_size=4, num_workers=2)
    if args.get("resume"):
        loader.load_state_dict(json.loads(Path(args["resume"]).read_text()))
    else:
        ds.set_epoch(args["epoch"])
    taken: list[int] = []
    out = Path(args["out"])
    for n, batch in enumerate(loader):
        taken += batch["index"].tolist()
        if args.get("stop_after") and n + 1 == args["stop_after"]:
            (out / f"state-{rank}.json").write_text(json.dumps(loader.state_dict()))
            break
    (out / f"rank-{rank}.json").write_text(json.dumps({"node": node, "indices": taken}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
