"""The edges of an epoch: time to the first batch, and the gap between batches where one epoch
ends and the next begins, at the default ``buffer_size=64``.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`)): first batch 1.29 s (1.29, 1.27, 1.29); at epoch boundaries with persistent workers and
the warm start, the longest gap 153, 147 and 125 ms (2.9x, 2.8x, 2.4x the median gap of 52 ms);
with ``repeat=True`` 161-168 ms (3.1-3.2x).

Data: ``bench_pool``'s ALOHA-like dataset (128 episodes of 300-500 frames, three 480x640 AV1
cameras, GOP 2), generated and converted once under ``--cache``.

1. First batch: a fresh process builds the reader (all 128 episodes) and a DataLoader
   (``--workers`` workers, batch ``--batch-size``, ``lerobot_shards.collate``, uint8), and
   times ``iter(loader)`` to the first batch (workers started, pool admitted, first items
   decoded), ``--rounds`` times (each in a fresh process: nothing in the page cache is warm
   beyond what the previous round left, as on a training machine's second run).
2. Epoch boundary: ``--episodes`` of them (an epoch short enough to run several times here),
   ``--epochs`` epochs, once as one ``iter(loader)`` per epoch with persistent workers (the
   DataLoader restarts its workers' iteration at each boundary) and once with ``repeat=True``
   (one endless iteration that runs on into the next epoch); every gap between consecutive
   batches is recorded in the consuming process. Reported: the median gap, and the longest gap
   among the ``--edge`` batches on either side of each epoch boundary.

Usage: ``python scripts/bench_epoch_edges.py [--cache DIR] [--workers 2] [--batch-size 32]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _bench_common import machine_line
from bench_pool import dataset


def one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)


def make_loader(
    shards: str, workers: int, batch_size: int, episodes: list[int] | None, repeat: bool = False
):
    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset, collate

    ds = ShardedLeRobotDataset(
        shards, episodes=episodes, return_uint8=True, buffer_size=64, repeat=repeat
    )
    return ShardedDataLoader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=collate,
        persistent_workers=True,
        worker_init_fn=one_thread,
    )


def first_batch(shards: str, workers: int, batch_size: int) -> dict:
    started = time.perf_counter()
    loader = make_loader(shards, workers, batch_size, None)
    built = time.perf_counter()
    batches = iter(loader)
    next(batches)
    done = time.perf_counter()
    return {"construct_s": built - started, "first_batch_s": done - built}


def boundary_gaps(
    shards: str, workers: int, batch_size: int, episodes: int, epochs: int, repeat: bool
) -> dict:
    """The arrival time of every batch, by epoch. With ``repeat`` one endless iteration, cut
    into epochs by sample count (the last batch of an epoch may hold the next one's first)."""
    loader = make_loader(shards, workers, batch_size, list(range(episodes)), repeat)
    stamps: list[list[float]] = []
    if not repeat:
        for _ in range(epochs):
            stamps.append([time.perf_counter() for _batch in loader])
        return {"stamps": stamps}
    per_epoch = len(loader.dataset)
    samples, times = 0, []
    for batch in loader:
        times.append(time.perf_counter())
        samples += len(batch["index"])
        if samples >= per_epoch * (len(stamps) + 1):
            stamps.append(times)
            times = []
            if len(stamps) == epochs:
                break
    return {"stamps": stamps}


def run_child(kind: str, *args: object) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps([kind, *args])],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes", type=int, default=8, help="for the epoch boundary")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--edge", type=int, default=3, help="batches each side of a boundary")
    parser.add_argument("--child", help="internal")
    args = parser.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        run = first_batch if kind == "first" else boundary_gaps
        print(json.dumps(run(*rest)), flush=True)
        return
    _, shards, _ = dataset(args.cache, "aloha")
    print(machine_line())
    print(
        f"config: ALOHA-like, 128 episodes, 3 cameras 480x640 AV1; buffer_size=64, "
        f"{args.workers} workers, batch {args.batch_size}, uint8, lerobot_shards.collate",
        flush=True,
    )
    firsts = [
        run_child("first", str(shards), args.workers, args.batch_size) for _ in range(args.rounds)
    ]
    print(
        "time to first batch (iter(loader) to batch 0), s: "
        + ", ".join(f"{r['first_batch_s']:.2f}" for r in firsts)
        + f"  (median {np.median([r['first_batch_s'] for r in firsts]):.2f}; reader built in "
        f"{np.median([r['construct_s'] for r in firsts]):.2f} s before)",
        flush=True,
    )
    for repeat in (False, True):
        result = run_child(
            "edges", str(shards), args.workers, args.batch_size, args.episodes, args.epochs, repeat
        )
        report_gaps(result["stamps"], args, repeat)


def report_gaps(stamps: list[list[float]], args: argparse.Namespace, repeat: bool) -> None:
    flat = np.concatenate([np.asarray(s) for s in stamps])
    gaps = np.diff(flat)
    median = float(np.median(gaps))
    how = (
        "repeat=True (one endless iteration)"
        if repeat
        else "one iter(loader) per epoch, persistent workers"
    )
    print(
        f"epoch boundary, {how} ({args.episodes} episodes, {len(stamps[0])} batches per "
        f"epoch): median gap between batches {1000 * median:.0f} ms",
        flush=True,
    )
    at = 0
    for e in range(len(stamps) - 1):
        at += len(stamps[e])  # gaps[at - 1] is from the epoch's last batch to the next's first
        near = gaps[max(0, at - 1 - args.edge) : at - 1 + args.edge + 1]
        print(
            f"  epoch {e} -> {e + 1}: last-to-first gap {1000 * gaps[at - 1]:.0f} ms, longest "
            f"within {args.edge} batches of it {1000 * near.max():.0f} ms "
            f"({near.max() / median:.1f}x the median)",
            flush=True,
        )


if __name__ == "__main__":
    main()
