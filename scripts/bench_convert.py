"""Conversion throughput beside a plain copy of the same source bytes on the same disk.

Generates (once, cached) a LeRobot v3.0 dataset of at least ``--size-mb`` with the test factory:
two 480x640 cameras of realistic content at 30 fps. The factory encodes like LeRobot (AV1, GOP 2)
at crf 30, where such a scene is ~5 KB a frame and 200 MB would take ~20 minutes to encode on a
small machine; the bench encodes at a higher quality (``--crf``, default 4, ~40 KB a frame)
instead of using noise, so the frames are still camera-like video, just less compressed.

Then it times, alternately and with the source warm in the page cache: ``shutil.copyfile`` of
every source file, and ``lerobot_shards.convert`` of the dataset (end to end, worker start-up
included); prints MB/s of source bytes for each, to the page cache and including a final sync,
the ratios, and the machine. Usage: ``python scripts/bench_convert.py [--cache DIR] [--workers N]``.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import shutil
import statistics
import time
from pathlib import Path

import av
import fsspec
from _bench_common import cpu_model  # scripts/ is on sys.path when run as a script

import lerobot_shards.testing.video as factory_video
from lerobot_shards import convert
from lerobot_shards.format import read_index
from lerobot_shards.testing.factory import make_dataset

CAMERAS = {"observation.images.cam_high": (480, 640), "observation.images.cam_wrist": (480, 640)}
FPS = 30
MB = 1e6


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def generate(cache: Path, size_mb: float, crf: int, episode_length: int) -> Path:
    """The cached source dataset; generated on first use (a probe sizes the episode count)."""
    root = cache / f"source-v30-2x480x640-crf{crf}-{int(size_mb)}mb"
    done = root / ".complete"
    if done.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    factory_video.CRF = crf  # the factory's encoder quality (module constant)
    probe = cache / ".probe"

    def make(path: Path, episodes: int) -> None:
        make_dataset(
            path,
            episode_lengths=[episode_length] * episodes,
            cameras=CAMERAS,
            fps=FPS,
            content="realistic",
            data_files_size_in_mb=100,
            video_files_size_in_mb=200,
        )

    if probe.exists():
        shutil.rmtree(probe)
    make(probe, 1)
    per_episode = tree_bytes(probe)
    shutil.rmtree(probe)
    episodes = math.ceil(size_mb * MB * 1.05 / per_episode)
    print(
        f"generating {episodes} episodes of {episode_length} frames (~{per_episode / MB:.1f} MB "
        f"each) at crf {crf} into {root} ...",
        flush=True,
    )
    started = time.perf_counter()
    make(root, episodes)
    total = tree_bytes(root)
    if total < size_mb * MB:
        raise SystemExit(f"{root}: generated {total / MB:.0f} MB < {size_mb} MB; raise --size-mb")
    done.write_text(f"{total}\n")
    print(f"generated {total / MB:.0f} MB in {time.perf_counter() - started:.0f} s", flush=True)
    return root


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def warm(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def cpu_seconds() -> float:
    """User + system CPU of this process and its finished children (the worker processes)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(action) -> tuple[float, float, float]:
    """Wall seconds of ``action()`` into the page cache, wall seconds until its writes reached
    the disk, and the CPU seconds it used.

    Dirty pages of the previous run are flushed first, so one run's writeback never slows the
    next; the second figure adds a final ``sync``.
    """
    os.sync()
    cpu = cpu_seconds()
    started = time.perf_counter()
    action()
    cached = time.perf_counter() - started
    cpu = cpu_seconds() - cpu
    os.sync()
    return cached, time.perf_counter() - started, cpu


def copy_all(root: Path, files: list[Path], dest: Path) -> None:
    for path in files:
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("/tmp/lerobot-shards-bench"),
        help="where the source dataset is generated once and the outputs go",
    )
    parser.add_argument("--size-mb", type=float, default=200)
    parser.add_argument("--crf", type=int, default=4)
    parser.add_argument("--episode-length", type=int, default=300, help="frames (10 s at 30 fps)")
    parser.add_argument("--workers", type=int, default=None, help="default: CPU count")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    args.cache.mkdir(parents=True, exist_ok=True)
    root = generate(args.cache, args.size_mb, args.crf, args.episode_length)
    files = source_files(root)
    nbytes = sum(p.stat().st_size for p in files)
    workers = args.workers if args.workers is not None else os.cpu_count()
    warm(files)

    copies, converts = [], []
    for _ in range(args.repeat):
        for dest in (args.cache / "copy", args.cache / "shards"):
            if dest.exists():
                shutil.rmtree(dest)
        copies.append(timed(lambda: copy_all(root, files, args.cache / "copy")))
        converts.append(
            timed(
                lambda: convert(
                    str(root), str(args.cache / "shards"), workers=workers, progress=False
                )
            )
        )
    shutil.rmtree(args.cache / "copy")
    shards = tree_bytes(args.cache / "shards" / "shards")
    index = read_index(fsspec.filesystem("file"), str(args.cache / "shards"))

    print(
        f"machine:  {cpu_model()}, {os.cpu_count()} cores; {platform.platform()}; "
        f"python {platform.python_version()}, av {av.__version__}; load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    print(
        f"source:   {root} ({len(files)} files, {nbytes / MB:.1f} MB, {index.total_episodes} "
        f"episodes, {index.total_frames} frames, 2 cameras 480x640); shards {shards / MB:.1f} MB"
    )
    for i, label in enumerate(("page cache", "incl. sync")):
        copy_s = statistics.median(t[i] for t in copies)
        convert_s = statistics.median(t[i] for t in converts)
        runs = ", ".join(f"{t[i]:.2f}" for t in converts)
        print(f"[{label}] median of {args.repeat} runs")
        print(
            f"  copy:     {nbytes / MB / copy_s:7.1f} MB/s  "
            f"({', '.join(f'{t[i]:.2f}' for t in copies)} s)"
        )
        print(
            f"  convert:  {nbytes / MB / convert_s:7.1f} MB/s  ({runs} s; workers={workers}, "
            f"{index.total_frames / convert_s:.0f} frames/s, process start-up included)"
        )
        print(f"  ratio:    {copy_s / convert_s:.2f}  (convert / copy throughput; target >= 0.5)")
    copy_cpu = statistics.median(t[2] for t in copies)
    convert_cpu = statistics.median(t[2] for t in converts)
    print(
        f"[CPU] copy {copy_cpu:.2f} s ({nbytes / MB / copy_cpu:.0f} MB per CPU-second), "
        f"convert {convert_cpu:.2f} s ({nbytes / MB / convert_cpu:.0f} MB per CPU-second)"
    )


if __name__ == "__main__":
    main()
