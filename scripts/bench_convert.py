"""Conversion beside a plain copy of the same source, and the converter at 100,000 episodes.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`), load average 0.6): ``--workers 2 --repeat 5`` convert 187.8 MB/s against cp -r's 1364.6
MB/s, ratio 0.14 (target 0.5: missed); 6.9 ms per episode in one process; 100,000 episodes in 88.9
s (1,124 episodes/s), killed at 34,279 and resumed in 80.1 s with every finished shard untouched.

1. An aggregated dataset, laid out as LeRobot's ``aggregate_datasets`` lays one out (the test
   factory's ``make_aggregated_dataset``): four recordings of 72 episodes (4 to 5.5 s at 30 fps,
   two 480x640 cameras of camera-like content, AV1 as LeRobot encodes it: GOP 2, crf 30) merged
   file by file, so each camera's episodes share a few large mp4 files and all rows one parquet.
   Generated once under ``--cache``. Then, alternately and ``--repeat`` times, each a fresh
   process with the source warm in the page cache and dirty pages flushed before it starts:
   ``cp -r SRC DEST && sync`` and ``lerobot-shards convert SRC DEST --workers N --no-progress
   && sync`` (N: the machine's cores). Prints both, their ratio (convert over copy throughput;
   target >= 0.5), and what one episode costs: every episode converted in one process
   (``--workers 0``), in ms per episode, which is the CPU time per episode of a worker.
2. ``--scale-episodes`` (default 100,000) tiny episodes (2 to 4 frames, one 32x32 camera; a few
   thousand episodes per data and video file, as in DROID), made by the factory and cached: the
   command line converts them; a second conversion is killed (SIGKILL, whole process group) once
   a third of the episodes are done and then resumed; the manifest is read back, written again
   and ``lerobot-shards inspect`` run on it. All timed.

Usage: ``python scripts/bench_convert.py [--cache DIR] [--workers N] [--repeat 3]
[--scale-episodes 100000]`` (``--scale-episodes 0`` skips part 2).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import fsspec
from _bench_common import CAMERAS_2X480X640, DONE, cached_dataset, machine_line

from lerobot_shards import convert
from lerobot_shards.converter.job import read_records
from lerobot_shards.format import MANIFEST_FILE, write_manifest
from lerobot_shards.format import manifest_rows as to_rows
from lerobot_shards.testing.aggregate import make_aggregated_dataset
from lerobot_shards.validate import read_index, read_manifest

MB = 1e6
CLI = [str(Path(sys.executable).with_name("lerobot-shards"))]
PARTS = 4
EPISODES_PER_PART = 72
LENGTHS = (120, 135, 150, 165)  # 4 to 5.5 s at 30 fps


def aggregated(cache: Path) -> Path:
    """The aggregated source, generated on first use."""
    root = cache / f"aggregated-{PARTS}x{EPISODES_PER_PART}-2x480x640"
    if (root / DONE).exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    print(f"generating {root} (once; cached) ...", flush=True)
    started = time.perf_counter()
    part = {
        "episode_lengths": [LENGTHS[i % len(LENGTHS)] for i in range(EPISODES_PER_PART)],
        "cameras": CAMERAS_2X480X640,
        "fps": 30,
        "content": "realistic",
        "video_variants": 2,  # equal-length episodes share two encodings per part and camera
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
    }
    make_aggregated_dataset(root, [part] * PARTS)
    (root / DONE).write_text("ok\n")
    print(f"generated in {time.perf_counter() - started:.0f} s", flush=True)
    return root


def tiny(cache: Path, episodes: int) -> Path:
    return cached_dataset(
        cache,
        f"tiny-{episodes}ep-1x32x32",
        episode_lengths=[(2, 3, 4)[i % 3] for i in range(episodes)],
        cameras={"observation.images.cam": (32, 32)},
        fps=10,
        content="blocks",
        data_files_size_in_mb=1,
        video_files_size_in_mb=2,
        video_variants=4,
    )


def source_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def warm(files: list[Path]) -> None:
    for path in files:
        with open(path, "rb") as f:
            while f.read(1 << 24):
                pass


def timed(argv: list[str]) -> float:
    """Wall seconds of ``argv`` plus a ``sync``, dirty pages flushed first."""
    os.sync()
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    os.sync()
    return time.perf_counter() - started


def startup() -> str:
    """What importing the converter costs in a fresh interpreter, and whether torch came too."""
    code = (
        "import sys, time; t = time.perf_counter(); import lerobot_shards.converter.run; "
        "print(f'{time.perf_counter() - t:.2f}', 'torch' in sys.modules)"
    )
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout
            for _ in range(3)]  # fmt: skip
    seconds = statistics.median(float(r.split()[0]) for r in runs)
    torch = runs[0].split()[1] == "True"
    return f"import of the converter {seconds:.2f} s, torch imported: {'yes' if torch else 'no'}"


def part1(cache: Path, workers: int, repeat: int) -> None:
    root = aggregated(cache)
    files = source_files(root)
    nbytes = sum(p.stat().st_size for p in files)
    videos = [p for p in files if p.suffix == ".mp4"]
    warm(files)
    copies, converts = [], []
    command = [*CLI, "convert", str(root), str(cache / "shards"), "--workers", str(workers)]
    for _ in range(repeat):
        for dest in (cache / "copy", cache / "shards"):
            if dest.exists():
                shutil.rmtree(dest)
        copies.append(timed(["cp", "-r", str(root), str(cache / "copy")]))
        converts.append(timed([*command, "--no-progress"]))
    shutil.rmtree(cache / "copy")
    index = read_index(fsspec.filesystem("file"), str(cache / "shards"))
    shards = index.total_bytes
    shutil.rmtree(cache / "shards")
    os.sync()
    started = time.perf_counter()
    convert(str(root), str(cache / "shards"), workers=0, progress=False)
    one = time.perf_counter() - started
    shutil.rmtree(cache / "shards")

    print(
        f"source:   {root.name}: {len(files)} files ({len(videos)} mp4), {nbytes / MB:.1f} MB, "
        f"{index.total_episodes} episodes, {index.total_frames} frames; shards "
        f"{shards / MB:.1f} MB"
    )
    print(f"start-up: {startup()}")
    copy_s, convert_s = statistics.median(copies), statistics.median(converts)
    print(f"[cp -r + sync, then lerobot-shards convert --workers {workers} + sync] x{repeat}")
    print(
        f"  copy:     {nbytes / MB / copy_s:7.1f} MB/s ({', '.join(f'{t:.2f}' for t in copies)} s)"
    )
    runs = ", ".join(f"{t:.2f}" for t in converts)
    print(
        f"  convert:  {nbytes / MB / convert_s:7.1f} MB/s ({runs} s; "
        f"{index.total_episodes / convert_s:.0f} episodes/s, whole command)"
    )
    print(f"  ratio:    {copy_s / convert_s:.2f}  (convert / copy throughput; target >= 0.5)")
    print(
        f"per episode: {1e3 * one / index.total_episodes:.1f} ms (one process, {one:.2f} s for "
        f"{index.total_episodes} episodes)"
    )


def part2(cache: Path, workers: int, episodes: int) -> None:
    root = tiny(cache, episodes)
    warm(source_files(root))
    dest = cache / "scale-shards"
    fs = fsspec.filesystem("file")
    if dest.exists():
        shutil.rmtree(dest)
    argv = [*CLI, "convert", str(root), str(dest), "--workers", str(workers), "--no-progress"]
    convert_s = timed(argv)
    manifest = dest / MANIFEST_FILE

    started = time.perf_counter()
    table = read_manifest(fs, str(manifest))
    read_s = time.perf_counter() - started
    started = time.perf_counter()
    rows = to_rows(table)
    rows_s = time.perf_counter() - started
    started = time.perf_counter()
    write_manifest(fs, str(cache / "manifest-again.parquet"), rows)
    write_s = time.perf_counter() - started
    os.remove(cache / "manifest-again.parquet")
    started = time.perf_counter()
    subprocess.run([*CLI, "inspect", str(dest)], check=True, stdout=subprocess.DEVNULL)
    inspect_s = time.perf_counter() - started

    shutil.rmtree(dest)
    os.sync()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, start_new_session=True)
    started = time.perf_counter()
    while len(read_records(fs, str(dest))) < episodes // 3:
        if proc.poll() is not None:
            raise SystemExit("the conversion finished before a third of it was done")
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_after = time.perf_counter() - started
    started = time.perf_counter()
    recorded = read_records(fs, str(dest))  # what a rerun reads first
    records_s = time.perf_counter() - started
    before = {i: (dest / r.shard).stat().st_mtime_ns for i, r in recorded.items()}
    os.sync()
    started = time.perf_counter()
    result = subprocess.run(argv, check=True, capture_output=True, text=True)
    resume_s = time.perf_counter() - started
    done = re.search(r"\((\d+) converted, (\d+) already done\)", result.stdout)
    untouched = sum(
        (dest / r.shard).stat().st_mtime_ns == before[i]
        for i, r in read_records(fs, str(dest)).items()
        if i in before
    )
    print(
        f"scale:    {root.name}: {episodes} episodes, {sum(1 for _ in source_files(root))} files; "
        f"manifest {manifest.stat().st_size / MB:.1f} MB"
    )
    print(
        f"  convert:  {convert_s:.1f} s ({episodes / convert_s:.0f} episodes/s, --workers "
        f"{workers}, whole command + sync)"
    )
    print(
        f"  kill:     SIGKILL after {killed_after:.1f} s with {len(before)} episodes recorded "
        f"(read back in {records_s:.2f} s); resume: {resume_s:.1f} s, {done.group(1)} "
        f"converted, {done.group(2)} already done, {untouched} of {len(before)} finished "
        "shards untouched"
    )
    print(
        f"  manifest: read {read_s:.2f} s, as row objects {rows_s:.2f} s, written {write_s:.2f} s;"
        f" lerobot-shards inspect {inspect_s:.2f} s (whole command)"
    )
    shutil.rmtree(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("/tmp/lerobot-shards-bench"),
        help="where the source datasets are generated once and the outputs go",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="default: cores")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale-episodes", type=int, default=100_000)
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    print(machine_line(), flush=True)
    part1(args.cache, args.workers, args.repeat)
    if args.scale_episodes:
        part2(args.cache, args.workers, args.scale_episodes)


if __name__ == "__main__":
    main()
