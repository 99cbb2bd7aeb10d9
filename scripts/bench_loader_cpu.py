"""What mixed batches cost the loader's own process: its CPU per batch, mixed beside unmixed, in
one run.

With mixed batches (``ShardedDataLoader``'s default) the training process unpickles every
item's small fields and collates each batch from rows the workers wrote into the shared ring;
with ``mixed_batches=False`` it receives each worker's collated batch. Decoding is the workers'
either way. On ``bench_peers``' dataset (``--episodes`` of 300-500 frames, three 480x640 AV1
cameras, cached under ``--cache`` as ``bench_peers.py`` leaves it), ``--workers`` persistent
workers, batch ``--batch-size``, uint8; each run a fresh process streaming ``--batches``
batches, the two kinds alternated over ``--rounds`` rounds (the order rotating). Per run, over
the batches after the first (start-up excluded):

- the loader process's CPU per batch: user plus system time of that process alone, its
  threads included, its workers not (``time.process_time``);
- the process tree's CPU per batch (workers included, from ``/proc``) and the loader's share;
- wall-clock per batch.

Medians over rounds and the ratio mixed / unmixed, with the load average at each run.

Usage: ``python scripts/bench_loader_cpu.py [--batches 40] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_peers import (
    CAMERAS_3X480X640,
    FPS,
    NAMES,
    REPO,
    make_loader,
    median,
    peer_lengths,
    tree_cpu_seconds,
)

KINDS = ("shards", "shards-unmixed")


def child(kind: str, root: str, workers: int, batch_size: int, batches: int) -> None:
    """``batches`` batches of ``kind``; prints a JSON line of the CPU and wall clock spent on
    those after the first."""
    loader = make_loader(kind, root, workers, batch_size)
    if len(loader) < batches:
        raise SystemExit(f"the epoch has {len(loader)} batches, fewer than --batches {batches}")
    pid, record = os.getpid(), {}
    for n, _ in enumerate(loader, 1):
        if n == 1:
            wall, own, tree = time.perf_counter(), time.process_time(), tree_cpu_seconds(pid)
        if n == batches:  # the workers are still alive: count their CPU
            record = {
                "wall_s": time.perf_counter() - wall,
                "loader_cpu_s": time.process_time() - own,
                "tree_cpu_s": tree_cpu_seconds(pid) - tree,
                "batches": n - 1,
            }
            break
    print(json.dumps(record), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help="internal")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.workers, args.batch_size, args.batches)
        return

    from _bench_common import cached_conversion, cached_dataset, machine_line

    name = f"peers-v30-{args.episodes}ep-3x480x640-{FPS}fps"
    source = cached_dataset(
        args.cache,
        name,
        episode_lengths=peer_lengths(args.episodes),
        cameras=CAMERAS_3X480X640,
        fps=FPS,
        video_variants=2,
    )
    root = cached_conversion(source, args.cache / f"{name}-shards")
    print(machine_line())
    print(
        f"{args.episodes} episodes, three 480x640 AV1 cameras; batch {args.batch_size}, "
        f"{args.workers} workers, uint8; {args.batches} batches per run, the first left out",
        flush=True,
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    results: dict[str, list[dict]] = {k: [] for k in KINDS}
    for r in range(args.rounds):
        for kind in KINDS[r % 2 :] + KINDS[: r % 2]:
            load = os.getloadavg()[0]
            command = [sys.executable, __file__, "--child", kind, str(root)]
            command += ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
            command += ["--batches", str(args.batches)]
            out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
            s = json.loads(out.stdout.strip().splitlines()[-1])
            per = {k: 1000 * s[k] / s["batches"] for k in ("wall_s", "loader_cpu_s", "tree_cpu_s")}
            per["share"] = s["loader_cpu_s"] / s["tree_cpu_s"]
            results[kind].append(per)
            print(
                f"round {r + 1} {NAMES[kind]}: loader process {per['loader_cpu_s']:.1f} CPU-ms "
                f"per batch ({per['share']:.1%} of the tree's {per['tree_cpu_s']:.0f}), wall "
                f"{per['wall_s']:.0f} ms per batch (load {load:.1f})",
                flush=True,
            )
    m = {k: {key: median([p[key] for p in results[k]]) for key in results[k][0]} for k in KINDS}
    mixed, unmixed = m["shards"], m["shards-unmixed"]
    for kind in KINDS:
        print(
            f"median {NAMES[kind]}: loader {m[kind]['loader_cpu_s']:.1f} CPU-ms per batch, "
            f"tree {m[kind]['tree_cpu_s']:.0f}, wall {m[kind]['wall_s']:.0f} ms"
        )
    print(
        f"mixed / unmixed: loader CPU {mixed['loader_cpu_s'] / unmixed['loader_cpu_s']:.2f}x "
        f"(+{mixed['loader_cpu_s'] - unmixed['loader_cpu_s']:.1f} ms per batch), tree CPU "
        f"{mixed['tree_cpu_s'] / unmixed['tree_cpu_s']:.2f}x, wall "
        f"{mixed['wall_s'] / unmixed['wall_s']:.2f}x; load {os.getloadavg()[0]:.1f} at the end"
    )


if __name__ == "__main__":
    main()
