"""Does the GPU wait? The reader alone, LeRobot's loader alone, a training step alone, and the
step fed by each loader, in one run on one machine.

Last printed (docs/performance.md, AMD EPYC, 2 cores, LeRobot 0.6.1's environment: Python 3.12,
torch 2.11, PyAV 15 (`.venv-lerobot`); no GPU measured yet; ``--episodes 8 --seconds 10``): reader
alone 488 / 587 samples/s at 1 / 2 workers, LeRobot's ``LeRobotDataset`` 51 / 60; a CPU step alone
80 samples/s, fed by the reader 62 (0.78, waited 1.0%), by LeRobot's loader 30 (0.37, waited 5.8%).

Data (made by the project's factory, once, under ``--cache``; the datasets are generated in
parallel processes): ``--datasets`` ALOHA-like datasets of ``--episodes`` episodes in all, of
300-400 frames, three 480x640 AV1 cameras (GOP 2), streamed as one mixture. Batch
``--batch-size`` (32), uint8 frames, ``buffer_size`` ``--buffer-size`` (8).

1. The reader alone: ``ShardedDataLoader`` over the mixture (``lerobot_shards.collate``) by
   DataLoader workers, samples/s over ``--seconds`` after a warm-up, with how busy the machine
   was and how much of a core the consuming process used; and the scaling at W workers against
   W times the 1-worker rate.
2. LeRobot's loader alone: LeRobot 0.6.1's ``LeRobotDataset`` (PyAV, ``return_uint8=True``,
   one per dataset, concatenated) under a shuffling DataLoader, torch's collate (only where
   LeRobot is installed: run this script with ``.venv-lerobot/bin/python``).
3. A training step alone: per camera an image encoder, the features concatenated into a linear
   head regressing the action; uint8 frames made float on the device, channels_last, AdamW,
   ``loss.item()`` each step (as LeRobot's trainer logs it); one batch kept on the device. On
   CUDA: ResNet18 per camera at 480x640 under bf16 autocast (torchvision). On the CPU: a small
   CNN on frames pooled 4x (the step must not take the whole machine from the loader).
4. The step fed by the reader (``lerobot_shards.to_device``: the next batch copied while a step
   runs) and by LeRobot's loader (``pin_memory`` on CUDA, the batch moved before the step):
   samples/s, the ratio to the step alone, and the time the step waited for its batch.

Each measurement runs in a fresh process. ``--report FILE`` also writes the picture of the run
fed by the reader (``lerobot-shards stream --report``'s, with the steps' waits).

Usage: ``python scripts/bench_gpu_feed.py [--cache DIR] [--episodes 64] [--datasets 4]
[--workers 1,2,4,8,15] [--seconds 20] [--device auto]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from _bench_common import cached_conversion, cached_dataset, machine_line

CAMERAS = {f"observation.images.cam_{c}": (480, 640) for c in ("high", "left_wrist", "right")}


# ----------------------------------------------------------------------------- data


def make_one(cache: str, name: str, lengths: list[int]) -> str:
    source = cached_dataset(
        Path(cache), name, episode_lengths=lengths, cameras=CAMERAS, fps=50, video_variants=4
    )
    return str(cached_conversion(source, Path(cache) / f"{name}-shards", workers=1))


def make_data(
    cache: Path, datasets: int, episodes: int, lengths: list[int]
) -> list[tuple[str, str]]:
    """(source, shards) of each dataset, generated and converted in parallel processes."""
    rng = np.random.default_rng(0)
    per = [episodes // datasets + (d < episodes % datasets) for d in range(datasets)]
    jobs = []
    spawn = multiprocessing.get_context("spawn")  # a fork (of torch's threads) can hang
    with ProcessPoolExecutor(min(datasets, os.cpu_count() or 1), mp_context=spawn) as pool:
        for d, count in enumerate(per):
            chosen = rng.choice(lengths, count).tolist()
            name = f"feed-{d}-{count}ep-{'-'.join(map(str, lengths))}-3x480x640"
            jobs.append((str(cache / name), pool.submit(make_one, str(cache), name, chosen)))
        return [(source, job.result()) for source, job in jobs]


# ----------------------------------------------------------------------------- the step


def make_model(device: torch.device, full: bool) -> torch.nn.Module:
    """Per camera an encoder to 512 features (ResNet18 when ``full``, else a small CNN on
    frames pooled 4x), their concatenation into a linear head of 14 actions."""

    def encoder() -> torch.nn.Module:
        if full:
            import torchvision

            return torchvision.models.resnet18(num_classes=512)
        return torch.nn.Sequential(
            torch.nn.AvgPool2d(4),
            torch.nn.Conv2d(3, 32, 5, stride=2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(32, 64, 3, stride=2),
            torch.nn.ReLU(),
            torch.nn.Conv2d(64, 128, 3, stride=2),
            torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(),
            torch.nn.Linear(128, 512),
        )

    class Policy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoders = torch.nn.ModuleList(encoder() for _ in CAMERAS)
            self.head = torch.nn.Linear(512 * len(CAMERAS), 14)

        def forward(self, images: list[torch.Tensor]) -> torch.Tensor:
            features = [e(x) for e, x in zip(self.encoders, images, strict=True)]
            return self.head(torch.cat(features, dim=1))

    return Policy().to(device).to(memory_format=torch.channels_last)


class Step:
    """One optimisation step on a batch already on the device."""

    def __init__(self, device: torch.device, full: bool) -> None:
        self.device = device
        self.model = make_model(device, full)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.autocast = device.type == "cuda"

    def __call__(self, batch: dict) -> float:
        images = [batch[k].to(memory_format=torch.channels_last).float().div_(255) for k in CAMERAS]
        target = batch["action"].float() if "action" in batch else None
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            out = self.model(images)
        if target is None or target.shape != out.shape:
            target = torch.zeros_like(out)
        loss = torch.nn.functional.mse_loss(out.float(), target)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()  # LeRobot's trainer logs the loss each step: the GPU is waited for


# ----------------------------------------------------------------------------- loaders


def one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)


def reader_loader(shards: list[str], workers: int, args: dict, trace_dir: str | None = None):
    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset, collate

    ds = ShardedLeRobotDataset(
        shards,
        return_uint8=True,
        buffer_size=args["buffer_size"],
        repeat=True,
        trace_dir=trace_dir,
    )
    return ShardedDataLoader(
        ds,
        batch_size=args["batch_size"],
        num_workers=workers,
        collate_fn=collate,
        worker_init_fn=one_thread if workers else None,
        persistent_workers=workers > 0,
        pin_memory=args["device"] == "cuda",
    )


def lerobot_loader(sources: list[str], workers: int, args: dict):
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from torch.utils.data import ConcatDataset, DataLoader

    parts = [
        LeRobotDataset(f"bench/{Path(s).name}", root=s, return_uint8=True, video_backend="pyav")
        for s in sources
    ]
    return DataLoader(
        ConcatDataset(parts),
        batch_size=args["batch_size"],
        shuffle=True,
        num_workers=workers,
        worker_init_fn=one_thread if workers else None,
        persistent_workers=workers > 0,
        pin_memory=args["device"] == "cuda",
        generator=torch.Generator().manual_seed(0),
    )


def distinct_episodes(batch: dict) -> int:
    """Distinct (dataset, episode) pairs in a batch (without ``dataset_index``: episodes)."""
    episodes = batch["episode_index"].tolist()
    datasets = batch["dataset_index"].tolist() if "dataset_index" in batch else [0] * len(episodes)
    return len(set(zip(datasets, episodes, strict=True)))


def endless(loader):
    while True:
        yield from loader


def busy_cpus() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def time_loader(batches, seconds: float, warmup: int = 4) -> dict:
    """Samples/s over ``seconds`` after ``warmup`` batches, with the machine's busy share and
    the consuming process's CPU use."""
    for _ in range(warmup):
        next(batches)
    busy0, total0 = busy_cpus()
    cpu0, started, samples = time.process_time(), time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        samples += len(next(batches)["index"])
    wall = time.perf_counter() - started
    busy1, total1 = busy_cpus()
    return {
        "samples_per_s": samples / wall,
        "machine_busy": (busy1 - busy0) / max(1, total1 - total0),
        "main_cores": (time.process_time() - cpu0) / wall,
    }


# ----------------------------------------------------------------------------- children


def child(kind: str, args: dict) -> dict:
    device = torch.device(args["device"])
    full = args["model"] == "resnet18"
    if kind == "reader":
        return time_loader(
            endless(reader_loader(args["shards"], args["workers"], args)), args["seconds"]
        )
    if kind == "lerobot":
        return time_loader(
            endless(lerobot_loader(args["sources"], args["workers"], args)), args["seconds"]
        )
    step = Step(device, full)
    if kind == "step":
        batch = next(iter(reader_loader(args["shards"], 0, args)))
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for _ in range(3):
            step(batch)
        started, steps = time.perf_counter(), 0
        while time.perf_counter() - started < args["seconds"]:
            step(batch)
            steps += 1
        return {"samples_per_s": steps * args["batch_size"] / (time.perf_counter() - started)}
    from lerobot_shards import to_device
    from lerobot_shards.report import MemorySampler, RunLog, write_report

    trace_dir = tempfile.mkdtemp() if args.get("report") else None
    if kind == "fed-reader":
        feed = endless(
            to_device(reader_loader(args["shards"], args["workers"], args, trace_dir), device)
        )
    else:
        loader = lerobot_loader(args["sources"], args["workers"], args)
        feed = (
            {
                k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v
                for k, v in b.items()
            }
            for b in endless(loader)
        )
    for _ in range(3):
        step(next(feed))
    log = RunLog()
    with MemorySampler(log):
        started, steps = time.perf_counter(), 0
        while time.perf_counter() - started < args["seconds"]:
            asked = time.perf_counter()
            batch = next(feed)
            got = time.perf_counter()
            step(batch)
            log.batch(args["batch_size"], distinct_episodes(batch))
            log.step(got - asked, time.perf_counter() - got)
            steps += 1
        wall = time.perf_counter() - started
    if trace_dir:
        from lerobot_shards.trace import read_traces

        write_report(
            log,
            read_traces(trace_dir),
            args["report"],
            title=f"step fed by the reader ({args['workers']} workers, {device})",
        )
    return {
        "samples_per_s": steps * args["batch_size"] / wall,
        "waited_s": sum(log.step_wait_s),
        "wall_s": wall,
    }


def run_child(kind: str, args: dict) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps([kind, args])],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- main


def default_workers() -> str:
    from lerobot_shards.reader.loading.cpu import physical_cores, usable_cpus

    cores, cpus = physical_cores(), len(usable_cpus())
    counts = {w for w in (1, 2, 4, 8, 16, 32, 64) if w <= cores} | {max(1, cpus - 1)}
    return ",".join(str(w) for w in sorted(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--datasets", type=int, default=4)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--workers", default=None, help="reader workers, e.g. 1,2,4,8,15")
    parser.add_argument("--lerobot-workers", default=None, help="default: the last three")
    parser.add_argument("--lengths", default="300,350,400", help="episode lengths to draw")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--buffer-size", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--model", default="auto", help="resnet18 (CUDA default) or small")
    parser.add_argument("--report", help="write the fed-by-the-reader run's report here")
    parser.add_argument("--child", help="internal")
    cli = parser.parse_args()
    if cli.child:
        kind, args = json.loads(cli.child)
        print(json.dumps(child(kind, args)), flush=True)
        return
    device = (
        cli.device if cli.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    model = cli.model if cli.model != "auto" else ("resnet18" if device == "cuda" else "small")
    workers = [int(w) for w in (cli.workers or default_workers()).split(",")]
    lerobot_workers = [
        int(w) for w in (cli.lerobot_workers or ",".join(map(str, workers[-3:]))).split(",")
    ]
    print(machine_line(), flush=True)
    started = time.perf_counter()
    lengths = [int(n) for n in cli.lengths.split(",")]
    data = make_data(cli.cache, cli.datasets, cli.episodes, lengths)
    print(f"data ready in {time.perf_counter() - started:.0f} s", flush=True)
    args = {
        "sources": [s for s, _ in data],
        "shards": [d for _, d in data],
        "device": device,
        "model": model,
        "batch_size": cli.batch_size,
        "buffer_size": cli.buffer_size,
        "seconds": cli.seconds,
    }
    print(
        f"config: {cli.datasets} ALOHA-like datasets as one mixture, {cli.episodes} episodes of "
        f"{min(lengths)}-{max(lengths)} frames, 3 cameras 480x640 AV1 GOP 2; batch "
        f"{cli.batch_size}, uint8, "
        f"buffer_size {cli.buffer_size}; device {device}, step model {model}; "
        f"{cli.seconds:.0f} s per figure",
        flush=True,
    )
    rows = []
    alone = {w: run_child("reader", {**args, "workers": w}) for w in workers}
    rates = " / ".join(f"{alone[w]['samples_per_s']:,.0f}" for w in workers)
    top = max(workers, key=lambda w: alone[w]["samples_per_s"])
    rows.append(
        (
            f"reader alone (default decode threads), samples/s by workers "
            f"{' / '.join(map(str, workers))}",
            f"{rates} (at {top}: machine {100 * alone[top]['machine_busy']:.0f}% busy, consuming "
            f"process {100 * alone[top]['main_cores']:.0f}% of a core)",
        )
    )
    one = alone[workers[0]]["samples_per_s"] / workers[0]
    rows.append(
        (
            "scaling: rate / (W x the 1-worker rate)",
            " / ".join(f"{alone[w]['samples_per_s'] / (w * one):.2f}" for w in workers),
        )
    )
    try:
        import lerobot  # noqa: F401

        theirs = {w: run_child("lerobot", {**args, "workers": w}) for w in lerobot_workers}
        rows.append(
            (
                f"LeRobot LeRobotDataset (pyav, return_uint8), samples/s by workers "
                f"{' / '.join(map(str, lerobot_workers))}",
                " / ".join(f"{theirs[w]['samples_per_s']:,.0f}" for w in lerobot_workers),
            )
        )
    except ImportError:
        theirs = None
        rows.append(("LeRobot LeRobotDataset", "not measured: LeRobot is not installed here"))
    step = run_child("step", {**args, "workers": 0})["samples_per_s"]
    rows.append(
        (
            f"a training step alone ({model} on {device}, one batch kept there)",
            f"{step:,.0f} samples/s",
        )
    )
    fed = run_child("fed-reader", {**args, "workers": top, "report": cli.report})
    rows.append(
        (
            f"the step fed by the reader ({top} workers, to_device)",
            f"{fed['samples_per_s']:,.0f} samples/s ({fed['samples_per_s'] / step:.2f} of the step "
            f"alone; waited for batches {100 * fed['waited_s'] / fed['wall_s']:.1f}% of the time)",
        )
    )
    if theirs is not None:
        best = max(lerobot_workers, key=lambda w: theirs[w]["samples_per_s"])
        fed_theirs = run_child("fed-lerobot", {**args, "workers": best})
        rows.append(
            (
                f"the step fed by LeRobot's loader ({best} workers)",
                f"{fed_theirs['samples_per_s']:,.0f} samples/s "
                f"({fed_theirs['samples_per_s'] / step:.2f}; waited "
                f"{100 * fed_theirs['waited_s'] / fed_theirs['wall_s']:.1f}%)",
            )
        )
    width = max(len(k) for k, _ in rows)
    print("\n| what | figure |\n|---|---|")
    for what, figure in rows:
        print(f"| {what:<{width}} | {figure} |")


if __name__ == "__main__":
    main()
