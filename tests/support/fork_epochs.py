"""A training script's reads, run as its own process: ``python fork_epochs.py URL OPTIONS OUT``.

It opens a ``ShardedLeRobotDataset`` on S3 in the main process and reads epoch 0 there (so the
main process holds an s3fs client with its event loop thread and pooled connections), then runs
epochs 0 and 1 through a DataLoader whose 2 workers are *forked* from it (the Linux default),
then reads epoch 0 in the main process again. Each worker runs a full garbage collection on its
s3fs I/O thread at its first item, as a long-running worker does sooner or later (that thread
allocates most: it parses every response), so what the worker dropped of its parent's (an
inherited filesystem, say) is finalized there while the worker runs. It saves every item (plain
tensors), how long each phase took and the main process's lost sockets to ``OUT``
(``torch.save``). A test runs it in a subprocess with a timeout, so a fork that hangs fails the
test, and the test process's own threads (S3 server, proxy) are not forked.
"""

from __future__ import annotations

import gc
import json
import sys
import time

import fsspec.asyn
import torch
from torch.utils.data import DataLoader, default_convert

from lerobot_shards import ShardedLeRobotDataset


def plain(item: dict) -> dict:
    return {
        k: v.as_subclass(torch.Tensor).clone() if isinstance(v, torch.Tensor) else v
        for k, v in item.items()
    }


_collected = False


async def _collect() -> None:
    gc.collect()


def convert_after_full_gc(item: dict) -> dict:
    """The DataLoader's default conversion (``batch_size=None``), after one full collection
    on this process's fsspec I/O thread."""
    global _collected
    if not _collected:
        _collected = True
        fsspec.asyn.sync(fsspec.asyn.get_loop(), _collect)
    return default_convert(item)


def unregistered_sockets(ds: ShardedLeRobotDataset) -> list[int]:
    """File descriptors the main process's s3fs event loop watches that its epoll instance has
    lost: the loop's selector lists them, the kernel (``/proc/self/fdinfo``) does not. A forked
    child shares that epoll instance; closing the parent's connections there unregisters them."""
    selector = ds.fs.loop._selector
    watched = set(selector.get_map())
    with open(f"/proc/self/fdinfo/{selector.fileno()}") as f:
        kernel = {int(line.split()[1]) for line in f if line.startswith("tfd:")}
    return sorted(watched - kernel)


def main(url: str, options: str, out: str) -> None:
    ds = ShardedLeRobotDataset(url, storage_options=json.loads(options), seed=3, cache=False)
    seconds = {}
    began = time.monotonic()
    single = [plain(i) for i in ds]
    seconds["single"] = time.monotonic() - began
    forked = []
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        loader = DataLoader(
            ds,
            batch_size=None,
            num_workers=2,
            multiprocessing_context="fork",
            collate_fn=convert_after_full_gc,
        )
        began = time.monotonic()
        forked.append([plain(i) for i in loader])
        seconds[f"fork{epoch}"] = time.monotonic() - began
    lost = unregistered_sockets(ds)
    ds.set_epoch(0)
    began = time.monotonic()
    after = [plain(i) for i in ds]
    seconds["after"] = time.monotonic() - began
    torch.save(
        {"single": single, "fork": forked, "after": after, "seconds": seconds, "lost": lost}, out
    )


if __name__ == "__main__":
    main(*sys.argv[1:])
