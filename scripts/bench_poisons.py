"""What searching the rows for training poisons costs a conversion (``poisons.py``).

Four datasets from the test factory, generated once under ``--cache``: ``tiny``, 2,000
episodes of 3 frames and no camera (each episode's fixed costs dominate), ``rows``, 200
episodes of 500 frames and no camera (conversion is all rows), ``video``, 100 episodes of 300
frames with one 96x128 AV1 camera, all three with LeRobot's file sizes (many episodes per data
file, searched at once), and ``rows-v2.1``, ``rows`` as LeRobot v2.1 stores it (a file per
episode, each searched alone: the search's worst share). Each is converted in this process
(``workers=0``, so every episode's time is measured where it is spent), alternately and
``--repeat`` times: as shipped, with the time spent finding the poisons summed over episodes
(``job.episode_poisons``), and with that step replaced by one that finds nothing. Prints, in CPU
time of this process (what other work on the machine disturbs least) and in wall time, the
median conversion times of both, their ratio (with over without), and the search's share of
the shipped conversion.

Usage: ``python scripts/bench_poisons.py [--cache DIR] [--repeat 5] [--datasets tiny ...]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from _bench_common import DONE, machine_line

from lerobot_shards import convert
from lerobot_shards.converter import job

DATASETS = {
    "tiny": {"episode_lengths": [3] * 2000, "cameras": {}},
    "rows": {"episode_lengths": [500] * 200, "cameras": {}},
    "rows-v2.1": {"episode_lengths": [500] * 200, "cameras": {}, "version": "v2.1"},
    "video": {
        "episode_lengths": [300] * 100,
        "cameras": {"observation.images.top": (96, 128)},
        "video_variants": 2,
    },
}


def source(cache: Path, name: str) -> Path:
    from lerobot_shards.testing.factory import make_dataset

    root = cache / f"poisons-{name}"
    if not (root / DONE).exists():
        if root.exists():
            shutil.rmtree(root)
        print(f"generating {root} (once; cached) ...", flush=True)
        # LeRobot's file sizes: many episodes per data file, as LeRobot records them
        make_dataset(
            root, fps=30, data_files_size_in_mb=100, video_files_size_in_mb=200, **DATASETS[name]
        )
        (root / DONE).write_text("ok\n")
    return root


def timed_convert(root: Path, scratch: Path, search: bool) -> dict[str, float]:
    """One conversion: its CPU and wall seconds, and those spent finding poisons (0 without
    the search)."""
    spent = {"search_cpu": 0.0, "search_wall": 0.0}
    shipped = job.episode_poisons

    def measured(*args, **kwargs):
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return shipped(*args, **kwargs)
        finally:
            spent["search_cpu"] += time.process_time() - cpu
            spent["search_wall"] += time.perf_counter() - wall

    job.episode_poisons = measured if search else (lambda *args, **kwargs: [])
    dest = scratch / "dest"
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        convert(str(root), str(dest), workers=0, progress=False)
        return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, **spent}
    finally:
        job.episode_poisons = shipped
        shutil.rmtree(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench-cache")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--datasets", nargs="+", choices=list(DATASETS), default=list(DATASETS))
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    print(machine_line())
    for name in args.datasets:
        root = source(args.cache, name)
        on, off = [], []
        with tempfile.TemporaryDirectory(dir=args.cache) as scratch:
            timed_convert(root, Path(scratch), True)  # warm: page cache, imports
            for _ in range(args.repeat):
                on.append(timed_convert(root, Path(scratch), True))
                off.append(timed_convert(root, Path(scratch), False))
        lengths = DATASETS[name]["episode_lengths"]
        line = [f"{name}: {len(lengths)} episodes, {sum(lengths)} frames;"]
        for clock in ("cpu", "wall"):
            with_search = statistics.median(r[clock] for r in on)
            without = statistics.median(r[clock] for r in off)
            shares = [r[f"search_{clock}"] / r[clock] for r in on]
            line.append(
                f"{clock}: {with_search:.2f} s with the search, {without:.2f} s without, ratio "
                f"{with_search / without:.3f}, the search {statistics.median(shares):.2%} of it "
                f"({min(shares):.2%}-{max(shares):.2%});"
            )
        print(" ".join(line) + f" medians of {args.repeat}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
