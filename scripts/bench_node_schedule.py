"""The node cache's schedule at 1k, 100k and 1M episodes: seconds per DataLoader worker per epoch.

Why. Every process that reads through the node-local cache computes when its node reads each
episode next (``reader/loading/node_cache.py``): the admissions of every part of every rank
and worker of the node, this epoch and the next. Issue 49 measured 254 s per worker per epoch at
1M episodes (8 ranks x 4 workers on one node) when this replayed every draw of every part; the
goal is 1 s.

What runs, no I/O: a planner over N episodes of 150 frames (the issue's datasets), pools of 64,
8 ranks x 4 DataLoader workers on one node, and a stand-in catalog with distinct checksums.
For each N: a fresh schedule's first call (epochs 0 and 1, the key numbers included: what the
first cached read waits for), then each later epoch's (one new epoch planned); beside it the
schedule of git commit ``--baseline`` (its node_cache.py and next_use.py loaded beside these)
at the sizes up to ``--baseline-max``. Prints wall time and this process's CPU time.

Usage: ``PYTHONPATH=src python scripts/bench_node_schedule.py [--sizes 1000,100000,1000000]
[--baseline 4a0988e]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import machine_line

from lerobot_shards.reader.loading import node_cache
from lerobot_shards.reader.plan.elastic import Ordering, Planner
from lerobot_shards.reader.plan.nodes import Nodes

FRAMES = 150
RANKS, WORKERS = 8, 4


@dataclass
class Selection:
    digests: np.ndarray
    """Each episode's checksum digest, random as sha256's (``(n, 32)`` bytes)."""
    fingerprint: str

    @property
    def checksums(self) -> list[str]:
        """The digests' texts (what a baseline's schedule numbers its keys from)."""
        return [f"sha256:{row.tobytes().hex()}" for row in self.digests]


@dataclass
class Member:
    root: str
    selection: Selection


class Catalog:
    """What the schedule reads of a catalog: the episodes, their checksums and costs."""

    def __init__(self, episodes: int) -> None:
        self.episodes = np.arange(episodes, dtype=np.int64)
        self.episodes_of = [self.episodes]
        digests = np.random.default_rng(episodes).integers(0, 256, (episodes, 32), np.uint8)
        self.members = [Member("s3://bench/ds", Selection(digests, f"bench-{episodes}"))]

    def cost(self, episode: int, start: int, stop: int) -> int:
        return (stop - start) * 40_000


def load_baseline(ref: str):
    """``node_cache`` of git commit ``ref``, importing that commit's ``next_use``."""
    root = Path(__file__).resolve().parents[1]

    def source(path: str) -> str:
        return subprocess.run(
            ["git", "show", f"{ref}:src/lerobot_shards/{path}"],
            capture_output=True,
            text=True,
            check=True,
            cwd=root,
        ).stdout

    folder = Path(tempfile.mkdtemp())
    (folder / "baseline_next_use.py").write_text(source("reader/plan/next_use.py"))
    (folder / "baseline_node_cache.py").write_text(
        source("reader/loading/node_cache.py").replace(
            "from lerobot_shards.reader.plan.next_use import", "from baseline_next_use import"
        )
    )
    sys.path.insert(0, str(folder))
    for name in ("baseline_next_use", "baseline_node_cache"):
        spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules["baseline_node_cache"]


def timed(work) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - wall, time.process_time() - cpu


def bench(module, episodes: int, epochs: int) -> list[tuple[float, float]]:
    """Wall and CPU seconds of a fresh schedule's first epoch, then of each later one."""
    catalog = Catalog(episodes)
    planner = Planner(catalog.episodes, np.full(episodes, FRAMES, dtype=np.int64), catalog.cost)
    ordering = Ordering(0, True, 64, None, True, False, False)
    parts = RANKS * WORKERS
    schedule = module.NodeSchedule(
        None, planner, ordering, parts, Nodes.one(RANKS), list(range(parts)), catalog
    )
    planner.fresh_parts(ordering, parts, 0)  # the split is the stream's, not the schedule's
    planner.fresh_parts(ordering, parts, 1)
    times = [timed(lambda: (schedule.schedule(0), schedule.keys()))]
    for epoch in range(1, epochs):
        planner.fresh_parts(ordering, parts, epoch + 1)
        times.append(timed(lambda e=epoch: schedule.schedule(e)))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,100000,1000000")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--baseline", help="a git commit whose schedule runs beside this one")
    parser.add_argument("--baseline-max", type=int, default=100_000)
    args = parser.parse_args()
    runs = [("this schedule", node_cache)]
    if args.baseline:
        runs.append((f"schedule of {args.baseline}", load_baseline(args.baseline)))
    print(
        f"episodes of {FRAMES} frames, pools of 64, {RANKS} ranks x {WORKERS} workers on one "
        "node; seconds wall (CPU) per worker\n"
    )
    print("| episodes | schedule | first (epochs 0, 1) | each later epoch |")
    print("|---|---|---|---|")
    for episodes in (int(n) for n in args.sizes.split(",")):
        for label, module in runs:
            if module is not node_cache and episodes > args.baseline_max:
                continue
            times = bench(module, episodes, args.epochs)
            later = ", ".join(f"{w:.2f} ({c:.2f})" for w, c in times[1:])
            print(
                f"| {episodes} | {label} | {times[0][0]:.2f} ({times[0][1]:.2f}) | {later} |",
                flush=True,
            )
    print(f"\ngoal: at most 1 s per worker per epoch at 1M episodes; {machine_line()}")


if __name__ == "__main__":
    main()
