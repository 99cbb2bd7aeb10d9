"""Real memory under a byte budget: the process tree's PSS over whole epochs, beside the budget
and the bound docs/streaming.md states.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`)): ``small``, growth above the idle tree 121-202 MB (budget 0.04 GB: 160 MB; 258 MB
without ``gc.freeze()``), within the bound; ``aloha``, 457-460 MB for plain items under budgets of
0.3 GB, 1 GB and none, 920 MB with a full frame cache (bound 972 MB).

Each setting runs one whole epoch in a fresh process (``tests/dist_scripts/memory_epoch.py``):
a DataLoader with ``--workers`` workers, batch ``--batch-size``, ``prefetch_factor``
``--prefetch-factor``, ``lerobot_shards.collate``, uint8, shuffled, ``buffer_size=8``. The
baseline is the tree (the loop and its workers) once the workers are up, torch and the reader
imported and the dataset copied, before any episode is fetched; the figure is the peak above it
while the epoch's batches are delivered, sampled every 0.05 s. The loop calls ``gc.freeze()``
before the workers fork (one row without it: the garbage collector then copies the pages the
workers inherited, which is no part of the reader). Both are reported as ``data``, the PSS of
anonymous and shared memory (heaps, stacks, batch segments): the PSS of mapped library files is
shared with every other process using the same installation and moves with them
(``memory.py``).

The datasets (generated once by the test factory, as LeRobot records them), each with many more
episodes than the pools hold:

- ``small`` (default): 48 episodes of 60 frames, two 192x256 AV1 cameras, 30 fps. Items show
  camera a's last half second (``delta_timestamps``), so decoded frames are drawn again and the
  frame cache has something to hold; the budgets cut it down.
- ``aloha``: users' scale, 48 episodes of 300, 400 or 500 frames (18,800 frames), three
  480x640 AV1 cameras, 50 fps; plain items under budgets of 0.3 and 1 GB and none, and items
  that show cam_high's last 0.1 s (6 frames) under 0.3 GB.

The bound (docs/streaming.md, docs/performance.md): growth <= 1.2 x the budget (a held decoded
frame costs its decoder's buffers, up to 1.2 times the planes the cache counts) + workers x
(prefetch_factor + 2) x batch bytes + workers x working memory (40 MB at two 192x256 cameras, 70 MB
at three 480x640 ones) (with gc.freeze(); without it, add the copy-on-write).

Usage: ``python scripts/bench_memory.py [--dataset small|aloha] [--cache DIR] [--workers 2]
[--batch-size 8]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
from _bench_common import cached_conversion, cached_dataset, machine_line

MB = 1e6
SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "dist_scripts" / "memory_epoch.py"
BACK = [-0.5, -0.4, -0.3, -0.2, -0.1, 0.0]
ALOHA = {f"observation.images.cam_{c}": (480, 640) for c in ("high", "left_wrist", "right")}
DATASETS = {
    "small": {
        "lengths": [60] * 48,
        "cameras": {"observation.images.a": (192, 256), "observation.images.b": (192, 256)},
        "fps": 30,
        "what": "2 cameras 192x256, camera a shown 6 frames back",
        "working_memory": 40 * MB,
        "items": {"delta_timestamps": {"observation.images.a": BACK}},
        "settings": [
            ("frame_cache_gb=0, no budget", {"frame_cache_gb": 0}),
            ("byte_budget_gb=0.01", {"byte_budget_gb": 0.01}),
            ("byte_budget_gb=0.02", {"byte_budget_gb": 0.02}),
            ("byte_budget_gb=0.04", {"byte_budget_gb": 0.04}),
            ("byte_budget_gb=0.08", {"byte_budget_gb": 0.08}),
            ("byte_budget_gb=0.16", {"byte_budget_gb": 0.16}),
            ("no budget", {}),
            ("byte_budget_gb=0.04, no gc.freeze", {"byte_budget_gb": 0.04, "gc_freeze": False}),
        ],
    },
    "aloha": {
        "lengths": np.random.default_rng(0).choice([300, 400, 500], 48).tolist(),
        "cameras": ALOHA,
        "fps": 50,
        "what": "3 cameras 480x640, 300-500 frames each",
        "working_memory": 70 * MB,
        "items": {},
        "settings": [
            ("frame_cache_gb=0, no budget", {"frame_cache_gb": 0}),
            ("byte_budget_gb=0.3", {"byte_budget_gb": 0.3}),
            ("byte_budget_gb=1", {"byte_budget_gb": 1}),
            ("no budget", {}),
            (
                "byte_budget_gb=0.3, 6 frames back",
                {
                    "byte_budget_gb": 0.3,
                    "delta_timestamps": {
                        "observation.images.cam_high": [-0.1, -0.08, -0.06, -0.04, -0.02, 0.0]
                    },
                },
            ),
        ],
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="small")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--prefetch-factor", type=int, default=2)
    args = parser.parse_args()
    print(machine_line(), flush=True)
    spec = DATASETS[args.dataset]
    lengths, cameras = spec["lengths"], spec["cameras"]
    height, width = next(iter(cameras.values()))
    name = f"memory-{len(lengths)}ep-{len(cameras)}x{height}x{width}"
    source = cached_dataset(
        args.cache,
        name,
        episode_lengths=lengths,
        cameras=cameras,
        fps=spec["fps"],
        video_variants=4,
        data_files_size_in_mb=50,
        video_files_size_in_mb=50,
    )
    shards = cached_conversion(source, args.cache / f"{name}-shards")

    from lerobot_shards import ShardedLeRobotDataset

    w = args.workers
    print(
        f"dataset: {shards} ({len(lengths)} episodes, {sum(lengths)} frames, {spec['what']}); "
        f"{w} DataLoader workers, batch {args.batch_size}, prefetch_factor "
        f"{args.prefetch_factor}, buffer_size=8; MB = 10**6 bytes; data = PSS of anonymous + "
        "shared memory of the tree",
        flush=True,
    )
    print(
        f"  {'setting':<34} {'pool+cache (counted)':>20} {'baseline':>9} {'peak':>7} "
        f"{'growth':>7} {'in flight':>9} {'bound':>7}  {'PSS peak':>8}  frames"
    )
    for label, options in spec["settings"]:
        options = {"buffer_size": 8, **spec["items"], **options}
        freeze = options.pop("gc_freeze", True)
        command = [
            sys.executable,
            str(SCRIPT),
            str(shards),
            json.dumps(options),
            "--workers",
            str(w),
            "--batch-size",
            str(args.batch_size),
            "--prefetch-factor",
            str(args.prefetch_factor),
            *([] if freeze else ["--no-gc-freeze"]),
        ]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ds = ShardedLeRobotDataset(
            shards, **{k: v for k, v in options.items() if k != "delta_timestamps"}
        )
        part = ds._budget(w)
        pool = "all" if part.pool is None else f"{w * part.pool / MB:.0f}"
        counted = f"{pool} + {w * part.cache / MB:.0f}"
        in_flight = w * (args.prefetch_factor + 2) * r["batch_bytes"]
        growth = r["peak_data"] - r["baseline_data"]
        if part.pool is None:
            bound = "-"
        else:
            b = 1.2 * w * (part.pool + part.cache) + in_flight + w * spec["working_memory"]
            bound = f"{b / MB:.0f}"
        ok = r["frames"] == list(range(sum(lengths)))
        print(
            f"  {label:<34} {counted:>20} {r['baseline_data'] / MB:9.0f} "
            f"{r['peak_data'] / MB:7.0f} {growth / MB:7.0f} {in_flight / MB:9.0f} {bound:>7}  "
            f"{r['peak_pss'] / MB:8.0f}  {'each once' if ok else 'WRONG'}",
            flush=True,
        )


if __name__ == "__main__":
    main()
