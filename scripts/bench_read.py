"""Reader throughput against its baselines and targets, side by side in one run on the same data.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`)): reader with 2 workers 7.67x [7.24-7.97] the baseline and 0.78 [0.77-0.80] of the decode
ceiling, in process 5.68x and 0.57; first batch 0.16 s; peak PSS 0.77 GB with ``byte_budget_gb=1``.
On AMD EPYC, 2 cores, LeRobot 0.6.1's environment: Python 3.12, torch 2.11, PyAV 15
(`.venv-lerobot`): 5.74x and 0.73, every ``collate_fn`` within 0.93-1.00 of the fastest; LeRobot's
own ``LeRobotDataset`` 136.1 samples/s.

Generates (once, cached) a LeRobot v3.0 dataset with the test factory, as LeRobot records it:
24 episodes of 60-100 frames, two cameras at 480x640, AV1 GOP 2 (crf 30), realistic content,
30 fps, episodes sharing large video files; converts it once. Then measures, with the same
DataLoader workers (each collating on one intra-op thread), batch size and ``return_uint8``:

- reader: ``ShardedLeRobotDataset`` (shuffle, default decode threads) through a DataLoader,
  twice: with ``--workers`` persistent workers (as the baseline) and in process
  (``num_workers=0``: its decode threads use the cores and no batch crosses processes); timed
  over whole epochs after a warm-up epoch;
- baseline: ``LeRobotSource`` (decoders kept open between items) under a shuffling DataLoader,
  timed for ``--seconds`` after a few warm-up batches;
- ceiling: every frame of the same source videos decoded in file order with PyAV and converted
  to rgb24, one process per video file on a pool of ``--workers`` processes; the best of three
  ways to call PyAV (its defaults, a reused swscale context, one codec and one swscale thread);
- time to first batch: constructing the dataset to its first batch through the DataLoader;
- rounds: the ceiling and both readers are measured ``--rounds`` times, interleaved, so that
  load from other work on a shared machine falls on both sides alike; each round's closeness
  pairs the reader with that round's ceiling, and the targets use the median round (the
  spread is printed beside it);
- memory: peak memory (sum of PSS, and of RSS, over the process tree, sampled every 0.1 s) of a
  training-style loop (one optimizer step per batch) with ``byte_budget_gb=1``, in a fresh
  process.

Usage: ``python scripts/bench_read.py [--cache DIR] [--workers 2] [--batch-size 8] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import av
import numpy as np
import torch
from _bench_common import CAMERAS_2X480X640, cached_conversion, cached_dataset, machine_line
from av.video.reformatter import VideoReformatter
from torch.utils.data import DataLoader

from lerobot_shards.reader.frames.rgb24 import one_thread_options
from lerobot_shards.source import LeRobotSource
from lerobot_shards.throughput import stream

EPISODES = 24
FPS = 30
GB = 1e9


def one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


# ----------------------------------------------------------------------------- measurements


def measure_reader(
    shards: Path, args: argparse.Namespace, workers: int, collate_fn=None
) -> tuple[float, float, int, float]:
    """(samples/s, camera frames/s, samples, seconds) over whole epochs after a warm-up epoch,
    through a DataLoader with ``workers`` workers (0: in process, decoding on threads) and
    ``collate_fn`` (None: torch's default, what a training loop passes)."""
    stats = stream(
        str(shards),
        workers=workers,
        batch_size=args.batch_size,
        epochs=1 + args.reader_epochs,
        warmup_epochs=1,
        buffer_size=args.buffer_size,
        return_uint8=True,
        collate_fn=collate_fn,
    )
    if stats.epoch_coverage != [1.0] * (1 + args.reader_epochs):
        raise SystemExit(f"reader: incomplete epochs, coverage {stats.epoch_coverage}")
    return (
        stats.samples_per_s,
        stats.camera_frames_per_s,
        stats.window_samples,
        stats.window_s,
    )


def measure_baseline(source: Path, args: argparse.Namespace) -> tuple[float, int, float]:
    """(samples/s, samples, seconds) of LeRobotSource under a shuffling DataLoader."""
    return measure_map_style(LeRobotSource(str(source), return_uint8=True), args)


def measure_map_style(ds, args: argparse.Namespace) -> tuple[float, int, float]:
    """(samples/s, samples, seconds) of a map-style dataset under a shuffling DataLoader, timed
    for ``args.seconds`` after ``args.warmup_batches`` batches."""
    loader = DataLoader(
        ds,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        worker_init_fn=one_thread if args.workers > 0 else None,
        generator=torch.Generator().manual_seed(0),
    )

    def batches():
        while True:
            yield from loader

    it = batches()
    for _ in range(args.warmup_batches):
        next(it)
    samples = 0
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        samples += len(next(it)["index"])
    elapsed = time.perf_counter() - started
    return samples / elapsed, samples, elapsed


def decode_file(job: tuple[str, str]) -> int:
    """Every frame of one video file, in order, to rgb24 (as a loader must deliver it).

    ``pyav-defaults``: ``container.decode`` and ``frame.to_ndarray(format="rgb24")``;
    ``reused-scaler``: one swscale context for the file, codec threads as PyAV sets them;
    ``one-thread``: one codec thread and one swscale thread (what the reader's threads use).
    """
    path, how = job
    count = 0
    reformatter = VideoReformatter()
    with av.open(path) as container:
        stream = container.streams.video[0]
        if how == "one-thread":
            stream.codec_context.thread_count = 1
        for frame in container.decode(stream):
            if how == "pyav-defaults":
                frame.to_ndarray(format="rgb24")
            else:
                options = one_thread_options() if how == "one-thread" else {}
                reformatter.reformat(frame, format="rgb24", **options).to_ndarray()
            count += 1
    return count


CEILING_METHODS = ("pyav-defaults", "reused-scaler", "one-thread")


def measure_ceiling(source: Path, workers: int) -> tuple[float, int, dict[str, float]]:
    """(best camera frames/s, frames, frames/s of each method) of in-order decoding of
    every file on a pool of ``workers`` processes, each method run once."""
    files = sorted(str(p) for p in (source / "videos").rglob("*.mp4"))
    rates: dict[str, float] = dict.fromkeys(CEILING_METHODS, 0.0)
    with multiprocessing.get_context("fork").Pool(max(1, workers)) as pool:
        for how in CEILING_METHODS:
            started = time.perf_counter()
            jobs = [(f, how) for f in files]
            frames = sum(pool.imap_unordered(decode_file, jobs, chunksize=1))
            rates[how] = frames / (time.perf_counter() - started)
    return max(rates.values()), frames, rates


def other_collates() -> dict:
    """The collate_fns a training loop may pass besides torch's default: this package's, and
    LeRobot's ``lerobot_collate_fn`` where LeRobot is installed."""
    from lerobot_shards import collate

    collates = {"lerobot_shards.collate": collate}
    try:
        from lerobot.utils.collate import lerobot_collate_fn
    except ImportError:
        return collates
    collates["lerobot_collate_fn"] = lerobot_collate_fn
    return collates


def lerobot_version() -> str:
    from importlib.metadata import version

    return version("lerobot")


def measure_lerobot(source: Path, args: argparse.Namespace) -> tuple[float, int, float, str] | None:
    """(samples/s, samples, seconds, video backend) of LeRobot's own ``LeRobotDataset`` as its
    training script loads it; None where LeRobot is not installed."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError:
        return None
    ds = LeRobotDataset(f"bench/{source.name}", root=source, return_uint8=True)
    backend = getattr(ds, "video_backend", None) or getattr(ds, "_video_backend", "default")
    return (*measure_map_style(ds, args), str(backend))


def measure_first_batch(shards: Path, args: argparse.Namespace, buffer_size: int) -> float:
    """Seconds from constructing the dataset to its first batch through the DataLoader."""
    stats = stream(
        str(shards),
        workers=args.workers,
        batch_size=args.batch_size,
        seconds=1e-9,
        epochs=1,
        buffer_size=buffer_size,
        return_uint8=True,
    )
    return stats.first_batch_s


# ----------------------------------------------------------------------------- memory


def tree_memory(pid: int) -> tuple[int, int]:
    """(sum of PSS, sum of RSS) in bytes over ``pid`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    pss = rss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return pss, rss


def memory_child(shards: str, budget_gb: float, workers: int, batch_size: int) -> None:
    """A training-style loop: one epoch, one optimizer step of a small model per batch."""
    from lerobot_shards import ShardedLeRobotDataset, collate

    torch.manual_seed(0)
    ds = ShardedLeRobotDataset(shards, byte_budget_gb=budget_gb, return_uint8=True)
    ds.num_workers = workers
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        num_workers=workers,
        worker_init_fn=one_thread,
        collate_fn=collate,
    )
    cameras = ds.meta.camera_keys
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3 * len(cameras), 8, 3, stride=2),
        torch.nn.Flatten(),
        torch.nn.LazyLinear(int(np.prod(ds.meta.features["action"]["shape"]))),
    )
    model(torch.zeros(1, 3 * len(cameras), 60, 80))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    samples = 0
    for batch in loader:
        images = torch.cat([batch[key] for key in cameras], dim=1).float().div_(255)
        images = torch.nn.functional.avg_pool2d(images, 8)
        loss = torch.nn.functional.mse_loss(model(images), batch["action"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        samples += len(batch["index"])
    print(f"{samples}", flush=True)


def measure_memory(
    shards: Path, budget_gb: float, args: argparse.Namespace
) -> tuple[int, int, int, float]:
    """(peak tree PSS, peak tree RSS, samples, seconds) of the loop in a fresh process."""
    command = [
        sys.executable,
        __file__,
        "--memory-child",
        str(shards),
        str(budget_gb),
        "--workers",
        str(args.workers),
        "--batch-size",
        str(args.batch_size),
    ]
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    peak = [0, 0]

    def sample() -> None:
        while child.poll() is None:
            pss, rss = tree_memory(child.pid)
            peak[0], peak[1] = max(peak[0], pss), max(peak[1], rss)
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = child.communicate()
    sampler.join()
    if child.returncode != 0:
        raise SystemExit(f"memory loop failed with exit code {child.returncode}")
    return peak[0], peak[1], int(out.split()[-1]), time.perf_counter() - started


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (all loaders)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--buffer-size", type=int, default=64, help="reader pool (episodes)")
    parser.add_argument("--reader-epochs", type=int, default=2, help="timed epochs after warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved ceiling/reader rounds")
    parser.add_argument("--seconds", type=float, default=20.0, help="baseline timing window")
    parser.add_argument("--warmup-batches", type=int, default=8, help="baseline warm-up")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--memory-child", nargs=2, metavar=("SHARDS", "BUDGET_GB"), help="internal")
    args = parser.parse_args()
    if args.memory_child:
        memory_child(
            args.memory_child[0], float(args.memory_child[1]), args.workers, args.batch_size
        )
        return

    lengths = np.random.default_rng(0).integers(60, 101, EPISODES).tolist()
    name = f"read-v30-{EPISODES}ep-2x480x640"
    source = cached_dataset(
        args.cache, name, episode_lengths=lengths, cameras=CAMERAS_2X480X640, fps=FPS
    )
    shards = cached_conversion(source, args.cache / f"{name}-shards")
    for path in [*source.rglob("*"), *shards.rglob("*")]:  # page cache warm for everyone
        if path.is_file():
            path.read_bytes()
    frames = sum(lengths)
    cameras = len(CAMERAS_2X480X640)

    print(machine_line())
    print(
        f"dataset: {source} ({EPISODES} episodes, {frames} frames, {cameras} cameras 480x640 "
        f"AV1 GOP 2, realistic content); shards at {shards}"
    )
    print(
        f"config: {args.workers} DataLoader workers (1 intra-op thread each), batch "
        f"{args.batch_size}, return_uint8=True, shuffle; reader buffer_size={args.buffer_size}",
        flush=True,
    )

    # Rounds interleave the ceiling and the reader, so load from other work on the machine falls
    # on both alike; each round's closeness pairs the reader with that round's ceiling.
    rounds: list[dict] = []
    for r in range(args.rounds):
        ceiling, ceiling_frames, methods = measure_ceiling(source, args.workers)
        print(
            f"round {r + 1}: ceiling {ceiling:7.1f} camera frames/s  in-order PyAV decode to rgb24 "
            f"of every frame ({ceiling_frames} frames, {args.workers} processes), the best of: "
            + ", ".join(f"{how} {rate:.0f}" for how, rate in methods.items()),
            flush=True,
        )
        readers = {}
        for workers in (args.workers, 0):
            readers[workers] = measure_reader(shards, args, workers)
            rate, rate_frames, n, secs = readers[workers]
            where = f"{workers} DataLoader workers" if workers else "DataLoader in process"
            print(
                f"round {r + 1}: reader  {rate:7.1f} samples/s = {rate_frames:.1f} camera frames/s "
                f"(ShardedLeRobotDataset, {where}, default decode threads; {n} samples in "
                f"{secs:.1f} s over {args.reader_epochs} whole epochs after a warm-up epoch)",
                flush=True,
            )
        collates = {"default_collate": readers[args.workers][0]}
        for name, collate_fn in other_collates().items():
            collates[name] = measure_reader(shards, args, args.workers, collate_fn)[0]
        print(
            f"round {r + 1}: reader by collate_fn, {args.workers} workers: "
            + ", ".join(f"{name} {rate:.1f}" for name, rate in collates.items())
            + " samples/s",
            flush=True,
        )
        rounds.append({"ceiling": ceiling, "readers": readers, "collates": collates})
    baseline, n, secs = measure_baseline(source, args)
    print(
        f"baseline: {baseline:7.1f} samples/s = {baseline * cameras:.1f} camera frames/s  "
        f"(LeRobotSource, shuffling DataLoader, {args.workers} workers, {n} samples in "
        f"{secs:.1f} s)",
        flush=True,
    )
    lerobots = measure_lerobot(source, args)
    if lerobots is not None:
        rate, n, secs, backend = lerobots
        print(
            f"LeRobot:  {rate:7.1f} samples/s  (LeRobot {lerobot_version()}'s own LeRobotDataset, "
            f"return_uint8=True, video_backend={backend}, shuffling DataLoader, {args.workers} "
            f"workers, default collate: its training configuration; {n} samples in {secs:.1f} s)",
            flush=True,
        )
    first = measure_first_batch(shards, args, args.buffer_size)
    small = 4
    first_small = measure_first_batch(shards, args, small)
    print(
        f"first batch: {first:.2f} s with buffer_size={args.buffer_size}, {first_small:.2f} s "
        f"with buffer_size={small}  (construct to first batch, local shards)",
        flush=True,
    )
    print(f"targets (median of {args.rounds} rounds; the rounds' spread in brackets):")
    for workers in (args.workers, 0):
        where = f"{workers} workers" if workers else "in process"
        rates = [r["readers"][workers][0] / baseline for r in rounds]
        closeness = [r["readers"][workers][1] / r["ceiling"] for r in rounds]
        ratio, close = float(np.median(rates)), float(np.median(closeness))
        print(
            f"  reader ({where}) / baseline samples/s:  {ratio:6.2f}x  target >= 3x   "
            f"{verdict(ratio >= 3)}  [{min(rates):.2f}-{max(rates):.2f}]"
        )
        print(
            f"  reader ({where}) frames/s / ceiling:    {close:6.2f}   target >= 0.7  "
            f"{verdict(close >= 0.7)}  [{min(closeness):.2f}-{max(closeness):.2f}]"
        )
    for name in rounds[0]["collates"]:  # each collate_fn beside the fastest of its round
        shares = [r["collates"][name] / max(r["collates"].values()) for r in rounds]
        share = float(np.median(shares))
        print(
            f"  {name + ' / fastest collate:':34} {share:6.2f}   target >= 0.9  "
            f"{verdict(share >= 0.9)}  [{min(shares):.2f}-{max(shares):.2f}]"
        )
    print(
        f"  time to first batch:               {first:6.2f} s  target < 1 s   "
        f"{verdict(first < 1)}  (buffer_size={args.buffer_size})"
    )
    if not args.skip_memory:
        pss, rss, n, secs = measure_memory(shards, 1.0, args)
        limit = 1.5 * GB
        print(
            f"  peak memory, byte_budget_gb=1:     {pss / GB:6.2f} GB PSS ({rss / GB:.2f} GB RSS) "
            f"/ 1.5 GB = {pss / limit:.2f}  target <= 1   {verdict(pss <= limit)}  (process tree "
            f"of a training loop, {args.workers} workers sharing the 1 GB budget; {n} "
            f"samples in {secs:.1f} s)"
        )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end (1, 5, 15 min): {load}  (2 cores shared with other work)")


if __name__ == "__main__":
    main()
