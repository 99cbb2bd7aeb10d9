"""One rank of a job reading through the node-local cache, as a process of its own.

``python cache_job.py ARGS_JSON``: ARGS holds ``root``, ``storage_options``, ``epochs`` (a list),
``workers``, ``out`` (a JSON file written at the end), and the dataset's keyword arguments
``dataset``. RANK, WORLD_SIZE and LOCAL_WORLD_SIZE come from the environment, as under torchrun.
For each epoch it writes every item's ``index`` and a digest of all its tensors, in the order
the loader delivered them.

``stop_at`` (``[stage, n]``): the process (the job's or one of its DataLoader workers) that
reaches the cache's stage ``stage`` the ``n``-th time for the job writes its pid to the file
``stopped`` and waits there to be killed. Stages: ``download`` (part of a download written),
``rename`` (a download synced, not yet in place), ``commit`` (in place, its row not yet ready),
``eviction`` (a victim moved out, its row not yet deleted), ``unlink`` (an evicted file
removed, its book not yet closed).
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


def stop_at(stage: str, times: int, stopped: str) -> None:
    """Make the ``times``-th process step at ``stage`` stop there (the file system calls of
    the cache store, wrapped; DataLoader workers inherit them)."""
    import os
    import time

    write, rename, unlink = os.write, os.rename, os.unlink

    def at(name: str) -> None:
        if name != stage:
            return
        fd = os.open(f"{stopped}.count", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:  # one byte per time the job's processes got here, appended atomically
            write(fd, b"x")
            seen = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if seen == times:
            with open(stopped, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(600)

    def writing(fd, data):
        n = write(fd, data)
        if "/cache/tmp/" in os.readlink(f"/proc/self/fd/{fd}"):
            at("download")
        return n

    def renaming(src, dst):
        if "/entries/" in str(dst):
            at("rename")
        rename(src, dst)
        if "/entries/" in str(dst):
            at("commit")
        if "/entries/" in str(src) and "/cache/tmp/" in str(dst):
            at("eviction")

    def unlinking(path, *args, **kwargs):
        unlink(path, *args, **kwargs)
        if "/cache/tmp/" in str(path) and "." in os.path.basename(path):
            at("unlink")

    os.write, os.rename, os.unlink = writing, renaming, unlinking


def main() -> None:
    args = json.loads(sys.argv[1])
    if args.get("stop_at"):
        stop_at(*args["stop_at"], args["stopped"])
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
