"""One rank of a job reading through the node-local cache, as a process of its own.

``python cache_job.py ARGS_JSON``: ARGS holds ``root``, ``storage_options``, ``epochs`` (a list),
``workers``, ``out`` (a JSON file written at the end), and the dataset's keyword arguments
``dataset``. RANK, WORLD_SIZE and LOCAL_WORLD_SIZE come from the environment, as under torchrun.
For each epoch it writes every item's ``index`` and a digest of all its tensors, in the order
the loader delivered them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Iterator

import torch

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset


def digest(item: dict) -> str:
    """The item's every key and value (tensors by dtype, shape and bytes)."""
    h = hashlib.sha256()
    for key in sorted(item):
        value = item[key]
        h.update(key.encode())
        if isinstance(value, torch.Tensor):
            h.update(f"{value.dtype}{tuple(value.shape)}".encode())
            h.update(value.contiguous().numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def unbatched(loader: ShardedDataLoader) -> Iterator[dict]:
    """The loader's items, one by one, in the order it delivered them."""
    for batch in loader:
        for i in range(len(batch["index"])):
            yield {key: value[i] for key, value in batch.items()}


def main() -> None:
    args = json.loads(sys.argv[1])
    ds = ShardedLeRobotDataset(
        args["root"], storage_options=args["storage_options"], **args["dataset"]
    )
    out = {}
    for epoch in args["epochs"]:
        ds.set_epoch(epoch)
        loader = ShardedDataLoader(ds, batch_size=4, num_workers=args["workers"])
        out[str(epoch)] = [(int(item["index"]), digest(item)) for item in unbatched(loader)]
    with open(args["out"], "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
