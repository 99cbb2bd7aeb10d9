"""The pool at real scale: throughput, memory and mixing over whole epochs of datasets
with several times more episodes than the pool holds, beside LeRobot's way of loading them.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`), quiet): ALOHA-like defaults 331.7 samples/s (7.17x LeRobot's map-style loader), peak PSS
2.41 GB, 25 distinct episodes per batch of 32 (ideal 25.3); aggregated defaults 495.0 samples/s
(8.72x), 1.47 GB. Its reader run on the ALOHA-like defaults since local shards are mapped: 520-545
samples/s at 1.37 GB.

Datasets (generated once and cached by the test factory, as LeRobot v3.0 records them: AV1 GOP 2
crf 30, realistic content, episodes sharing large video files):

- ``aloha``: 128 episodes of 300, 400 or 500 frames, three cameras at 480x640, 50 fps;
- ``aggregated``: 288 episodes of 74 to 240 frames, two cameras at 480x640, 30 fps;
- ``aloha16``: 16 episodes of 400 frames, three cameras at 480x640, 50 fps (fits in the pool).

Encoding hundreds of long episodes takes hours on a small machine, so equal-length episodes
share one of four encodings per camera (``make_dataset(video_variants=4)``): compressed sizes,
file layout and decoding work are those of distinct recordings, only the pixels repeat.

Each setting runs in a fresh process: one whole epoch through a DataLoader (``--workers``
workers, batch ``--batch-size``, ``lerobot_shards.collate``, ``return_uint8=True``, shuffled).
It reports samples/s from the first batch to the end of the epoch, the peak PSS of the process
tree (the loop and its workers, sampled every 0.1 s from outside), and the distinct episodes in
each batch beside the ideal for uniform draws from the pool, ``B * (1 - (1 - 1/B) ** batch)``
with ``B`` the episodes each worker's pool holds. Settings, per dataset: the defaults
(``buffer_size=64`` per worker, no byte budget, ``frame_cache_gb=0.5``); ``byte_budget_gb``
values, one too small for a full pool (it warns); for ``aloha`` a pool of 16 per worker, several
times fewer than the dataset's episodes; and ``frame_cache_gb=100``, a cache that holds every
decoded frame until its draw (what the reader did before the cache had a cap), to show what the
cap costs.

Baseline, same data, same workers and batch size: ``LeRobotSource`` (LeRobot's map-style
``LeRobotDataset``: every item decoded from the source videos, decoders kept open) under a
shuffling DataLoader with torch's default collate, timed for ``--seconds`` after a warm-up.

Usage: ``python scripts/bench_pool.py [--cache DIR] [--datasets aggregated,aloha,aloha16]
[--seconds 60]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import numpy as np
import torch
from _bench_common import cached_conversion, cached_dataset, machine_line
from torch.utils.data import DataLoader

from lerobot_shards.format import MANIFEST_FILE
from lerobot_shards.memory import PeakMemory
from lerobot_shards.validate import read_manifest

GB = 1e9
CAM = (480, 640)
ALOHA_CAMERAS = {f"observation.images.cam_{c}": CAM for c in ("high", "left_wrist", "right")}
CACHE_ALL = ("frame_cache_gb=100 (holds all)", {"frame_cache_gb": 100})
DATASETS = {
    "aggregated": {
        "episodes": 288,
        "lengths": [74, 120, 160, 200, 240],
        "cameras": {f"observation.images.cam_{c}": CAM for c in ("high", "wrist")},
        "fps": 30,
        "settings": [
            ("defaults", {}),
            ("byte_budget_gb=1", {"byte_budget_gb": 1}),
            ("byte_budget_gb=4", {"byte_budget_gb": 4}),
            ("byte_budget_gb=0.3", {"byte_budget_gb": 0.3}),
            CACHE_ALL,
        ],
    },
    "aloha": {
        "episodes": 128,
        "lengths": [300, 400, 500],
        "cameras": ALOHA_CAMERAS,
        "fps": 50,
        "settings": [
            ("defaults", {}),
            ("byte_budget_gb=1", {"byte_budget_gb": 1}),
            ("byte_budget_gb=0.3", {"byte_budget_gb": 0.3}),
            ("buffer_size=16", {"buffer_size": 16}),
            CACHE_ALL,
        ],
    },
    "aloha16": {
        "episodes": 16,
        "lengths": [400],
        "cameras": ALOHA_CAMERAS,
        "fps": 50,
        "settings": [("defaults", {}), ("byte_budget_gb=4", {"byte_budget_gb": 4})],
    },
}


def dataset(cache: Path, name: str) -> tuple[Path, Path, list[int]]:
    """(source, shards, episode lengths) of dataset ``name``, generated and converted once."""
    spec = DATASETS[name]
    rng = np.random.default_rng(0)
    lengths = rng.choice(spec["lengths"], spec["episodes"]).tolist()
    key = f"pool-{name}-{spec['episodes']}ep-{len(spec['cameras'])}x480x640"
    source = cached_dataset(
        cache,
        key,
        episode_lengths=lengths,
        cameras=spec["cameras"],
        fps=spec["fps"],
        video_variants=4,
    )
    return source, cached_conversion(source, cache / f"{key}-shards"), lengths


def one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)


# ----------------------------------------------------------------------------- child processes


def reader_epoch(shards: str, workers: int, batch_size: int, options: dict) -> dict:
    """One whole epoch of the reader: rate, distinct episodes per batch, what each pool held."""
    from lerobot_shards import ShardedLeRobotDataset, collate

    ds = ShardedLeRobotDataset(shards, return_uint8=True, seed=0, **options)
    ds.num_workers = workers
    pool = ds._budget(workers)  # what each worker's pool and frame cache get
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        worker_init_fn=one_thread,
        collate_fn=collate,
    )
    distinct, seen = [], set()
    started = time.perf_counter()
    first = None
    samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter()
            samples = -len(batch["index"])  # the rate counts from the first batch on
        samples += len(batch["index"])
        distinct.append(len(set(batch["episode_index"].tolist())))
        seen.update(batch["index"].tolist())
    end = time.perf_counter()
    return {
        "samples_per_s": samples / (end - first),
        "first_batch_s": first - started,
        "distinct": distinct,
        "seen": len(seen),
        "pool_bytes": pool.pool,
        "cache_bytes": pool.cache,
    }


def baseline_run(source: str, workers: int, batch_size: int, seconds: float) -> dict:
    """LeRobotSource under a shuffling DataLoader, timed for ``seconds`` after 4 batches."""
    from lerobot_shards.source import LeRobotSource

    ds = LeRobotSource(source, return_uint8=True)
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        worker_init_fn=one_thread,
        generator=torch.Generator().manual_seed(0),
    )
    it = iter(loader)
    for _ in range(4):
        next(it)
    samples, distinct = 0, []
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        batch = next(it)
        samples += len(batch["index"])
        distinct.append(len(set(batch["episode_index"].tolist())))
    return {
        "samples_per_s": samples / (time.perf_counter() - started),
        "distinct": distinct,
    }


def run_child(kind: str, *args: object) -> dict:
    """Run ``kind`` in a fresh process, sampling its process tree's PSS from here."""
    command = [sys.executable, __file__, "--child", json.dumps([kind, *args])]
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    with PeakMemory(child.pid, interval_s=0.1) as memory:
        out, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"{kind} {args} failed with exit code {child.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_pss"] = memory.peak_pss
    return result


# ----------------------------------------------------------------------------- report


def ideal(pool: int, batch: int) -> float:
    """Expected distinct episodes in ``batch`` uniform draws from ``pool`` episodes."""
    return pool * (1 - (1 - 1 / pool) ** batch)


def mixing(distinct: list[int]) -> str:
    d = np.array(distinct)
    return f"{np.median(d):4.1f} (p10 {np.percentile(d, 10):4.1f}, min {d.min():2d})"


def bench(name: str, args: argparse.Namespace) -> None:
    source, shards, lengths = dataset(args.cache, name)
    spec = DATASETS[name]
    manifest = read_manifest(fsspec.filesystem("file"), str(shards / MANIFEST_FILE))
    sizes = sorted(manifest.column("size").to_pylist())  # each episode's compressed bytes
    per_worker = -(-len(lengths) // args.workers)
    print(
        f"\n{name}: {len(lengths)} episodes of {min(lengths)}-{max(lengths)} frames "
        f"({sum(lengths)} frames), {len(spec['cameras'])} cameras 480x640 at {spec['fps']} fps; "
        f"{sum(sizes) / 1e6:.0f} MB of shards, episodes of {sizes[0] / 1e6:.1f}-"
        f"{sizes[-1] / 1e6:.1f} MB; {args.workers} workers, {per_worker} episodes each",
        flush=True,
    )
    header = (
        f"  {'setting':<34} {'samples/s':>9} {'x base':>6} {'peak PSS':>9}  "
        f"{'distinct episodes / batch of ' + str(args.batch_size):<34} ideal"
    )
    base = run_child("baseline", str(source), args.workers, args.batch_size, args.seconds)
    print(header)
    print(
        f"  {'LeRobotSource (LeRobot map-style)':<34} {base['samples_per_s']:9.1f} {1:6.2f} "
        f"{base['peak_pss'] / GB:7.2f} GB  {mixing(base['distinct']):<34} "
        f"(uniform over frames; {args.seconds:.0f} s)",
        flush=True,
    )
    for label, options in spec["settings"]:
        held = min(options.get("buffer_size", 64), per_worker)
        r = run_child("reader", str(shards), args.workers, args.batch_size, options)
        if r["seen"] != sum(lengths):
            raise SystemExit(f"{label}: saw {r['seen']} of {sum(lengths)} frames in an epoch")
        pool = r["pool_bytes"]
        # The pool holds ``held`` episodes if any ``held`` fit its bytes, else about as many
        # median-sized ones as fit.
        full = pool is None or pool >= sum(sizes[-held:])
        fits = held if full else min(held, pool // int(np.median(sizes)))
        budget = "" if pool is None else f"; per worker {pool / 1e6:.0f} MB pool"
        print(
            f"  {label:<34} {r['samples_per_s']:9.1f} "
            f"{r['samples_per_s'] / base['samples_per_s']:6.2f} {r['peak_pss'] / GB:7.2f} GB  "
            f"{mixing(r['distinct']):<34} {ideal(fits, args.batch_size):4.1f} "
            f"(pool of {fits}{budget}, {r['cache_bytes'] / 1e6:.0f} MB frame cache; "
            f"first batch {r['first_batch_s']:.1f} s)",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--datasets", default="aggregated,aloha,aloha16")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60.0, help="baseline timing window")
    parser.add_argument("--child", help="internal")
    args = parser.parse_args()
    if args.child:
        kind, *rest = json.loads(args.child)
        run = reader_epoch if kind == "reader" else baseline_run
        print(json.dumps(run(*rest)), flush=True)
        return
    print(machine_line())
    print(
        f"config: {args.workers} DataLoader workers (1 intra-op thread each), batch "
        f"{args.batch_size}, return_uint8=True, shuffle; one whole epoch per reader setting, "
        "each in a fresh process",
        flush=True,
    )
    for name in args.datasets.split(","):
        bench(name, args)


if __name__ == "__main__":
    main()
