"""Epochs through a plain DataLoader's fresh workers, run as its own process:
``python plain_loader_epochs.py ROOT START EPOCHS BATCH WORKERS DATASET_OPTIONS``.

It opens a ``ShardedLeRobotDataset`` (``DATASET_OPTIONS``: JSON keyword arguments) and runs
``EPOCHS`` iterations of one ``torch.utils.data.DataLoader`` whose ``WORKERS`` non-persistent
workers start by ``START`` (``fork``, the Linux default, copies the dataset without pickling
it), then prints each iteration's ``index`` order as one JSON line. A test runs it in a
subprocess with a timeout: forking the test process itself, whose earlier tests leave server,
proxy and pool threads running, can deadlock the child in CPython's after-fork code; this
process has no such threads when it forks.
"""

from __future__ import annotations

import json
import sys

from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset


def main(root: str, start: str, epochs: str, batch: str, workers: str, options: str) -> None:
    ds = ShardedLeRobotDataset(root, **json.loads(options))
    loader = DataLoader(
        ds, batch_size=int(batch), num_workers=int(workers), multiprocessing_context=start
    )
    orders = []
    for _ in range(int(epochs)):
        order: list[int] = []
        for batch_items in loader:
            order += batch_items["index"].tolist()
        orders.append(order)
    print(json.dumps(orders))


if __name__ == "__main__":
    main(*sys.argv[1:])
