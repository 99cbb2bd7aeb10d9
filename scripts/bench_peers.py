"""This reader beside the loaders a LeRobot user weighs it against, on the same dataset, one epoch
each, alternated in one run: speed, memory, exactness and mixing side by side.

The loaders, each in its own environment, each used as its documentation says:

- ``lerobot-shards``: ``ShardedLeRobotDataset`` through ``ShardedDataLoader`` (persistent
  workers), its batches mixing every worker's pool (the default), and, as the baseline of the
  same run, ``mixed_batches=False`` (each batch from one worker, as before): this ``.venv``;
- ``LeRobot``: LeRobot 0.6.1's own ``LeRobotDataset`` in its training configuration (torchcodec,
  ``EpisodeAwareSampler`` shuffling, ``prefetch_factor=4``, persistent spawn workers):
  ``.venv-lerobot`` (``scripts/setup_lerobot_env.sh``);
- ``lerobot-lancedb``: lerobot-lancedb 0.3.1's ``LanceDBDataset`` on its own conversion,
  under a DataLoader with its recommended ``lance_mp_context()`` (forkserver) workers and
  ``EpisodeAwareSampler``, as its README pairs them: ``.venv-lancedb``
  (``scripts/setup_lancedb_env.sh``).

All with ``--workers`` DataLoader workers, batch ``--batch-size``, ``return_uint8=True``. The
dataset comes from the test factory as LeRobot records it (v3.0, AV1 GOP 2, realistic content,
cached): ``--episodes`` episodes of 300-500 frames, three 480x640 cameras, 50 fps. Each
converter (this one's, lerobot-lancedb's) converts it once, timed, with the peak PSS of its
process tree. Then ``--rounds`` rounds, each loader in turn (the order rotating every round, so
load from others on a shared machine falls on all alike), each run in a fresh process:

- samples/s over the epoch (from constructing the dataset to the last batch) and samples per
  CPU-second (user + system time of the process tree, workers included, read from ``/proc``);
- first batch: seconds from constructing the dataset to its first batch;
- peak PSS of the process tree (``lerobot_shards.memory``), sampled every 50 ms;
- exactly once: every frame of the dataset delivered, none twice (padding repeats reported);
- distinct episodes per batch (mean over full batches), beside the global-shuffle ideal: the
  expectation for ``batch_size`` frames drawn uniformly without replacement from all frames.

``--mixing-episodes N`` also streams a dataset of N episodes (small frames: only the order is
measured) through this reader, mixed and not, beside the global-shuffle ideal.

Usage: ``python scripts/bench_peers.py [--cache DIR] [--workers 2] [--batch-size 32] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FPS = 50
CAMERAS_3X480X640 = {
    "observation.images.cam_high": (480, 640),
    "observation.images.cam_left_wrist": (480, 640),
    "observation.images.cam_right_wrist": (480, 640),
}
LOADERS = ("shards", "shards-unmixed", "lerobot", "lance")
NAMES = {
    "shards": "lerobot-shards",
    "shards-unmixed": "lerobot-shards, mixed_batches=False",
    "lerobot": "LeRobot 0.6.1 LeRobotDataset",
    "lance": "lerobot-lancedb 0.3.1",
}
ENVS = {
    "shards": REPO / ".venv",
    "shards-unmixed": REPO / ".venv",
    "lerobot": REPO / ".venv-lerobot",
    "lance": REPO / ".venv-lancedb",
}


# ----------------------------------------------------------------------------- child: one epoch


def tree_cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` and its live descendants."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry)] = fields
            children.setdefault(int(fields[1]), []).append(int(entry))
    ticks, todo = 0, [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        if p in stats:
            ticks += int(stats[p][11]) + int(stats[p][12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def make_loader(kind: str, root: str, workers: int, batch_size: int):
    """The loader ``kind`` over ``root`` as its documentation says to use it."""
    import torch

    if kind.startswith("shards"):
        from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

        ds = ShardedLeRobotDataset(root, return_uint8=True)
        return ShardedDataLoader(
            ds,
            batch_size=batch_size,
            num_workers=workers,
            persistent_workers=True,
            mixed_batches=kind == "shards",
        )
    from lerobot.datasets import EpisodeAwareSampler

    if kind == "lerobot":
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        ds = LeRobotDataset("bench/peers", root=root, return_uint8=True, video_backend="torchcodec")
        context, prefetch = "spawn", 4  # lerobot_train's defaults
    else:
        from lerobot_lancedb import LanceDBDataset, lance_mp_context

        ds = LanceDBDataset(root=root, return_uint8=True)
        context, prefetch = lance_mp_context(), 2
    sampler = EpisodeAwareSampler(
        ds.meta.episodes["dataset_from_index"],
        ds.meta.episodes["dataset_to_index"],
        episode_indices_to_use=ds.episodes,
        shuffle=True,
        seed=1000,
        absolute_to_relative_idx=getattr(ds, "absolute_to_relative_idx", None),
    )
    return torch.utils.data.DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=workers,
        prefetch_factor=prefetch,
        persistent_workers=kind == "lerobot",
        multiprocessing_context=context,
        drop_last=False,
    )


def child(kind: str, root: str, workers: int, batch_size: int) -> None:
    """One epoch of loader ``kind``; prints a JSON line of its timings and every batch's
    indices and episodes."""
    started = time.time()
    loader = make_loader(kind, root, workers, batch_size)
    batches = len(loader)
    first = end = cpu = None
    indices, episodes = [], []
    for n, batch in enumerate(loader, 1):
        now = time.time()
        first = first or now
        indices.append(batch["index"].reshape(-1).tolist())
        episodes.append(batch["episode_index"].reshape(-1).tolist())
        if n == batches:  # the workers are still alive: count their CPU
            end, cpu = now, tree_cpu_seconds(os.getpid())
    padding = getattr(loader.dataset, "padding", 0)
    record = {"started": started, "first": first, "end": end, "cpu_s": cpu, "padding": padding}
    print(json.dumps({**record, "indices": indices, "episodes": episodes}), flush=True)


# ----------------------------------------------------------------------------- orchestration


def python_of(kind: str) -> Path:
    python = ENVS[kind] / "bin" / "python"
    if not python.exists():
        setup = "setup_lancedb_env.sh" if kind == "lance" else "setup_lerobot_env.sh"
        raise SystemExit(f"{python} not found: run scripts/{setup} first")
    return python


def run_measured(command: list[str], env: dict | None = None) -> tuple[str, float, int]:
    """Run ``command``; returns its stdout, wall seconds and the peak PSS of its tree."""
    from _bench_common import PSS_INTERVAL_S

    from lerobot_shards.memory import PeakMemory

    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    with PeakMemory(proc.pid, interval_s=PSS_INTERVAL_S) as peak:
        out, _ = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(command)} failed with exit code {proc.returncode}")
    return out, time.perf_counter() - started, peak.peak_pss


def run_epoch(kind: str, root: Path, args: argparse.Namespace) -> dict:
    """One epoch of ``kind`` in a fresh process of its environment."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")} if kind.startswith("shards") else None
    command = [str(python_of(kind)), __file__, "--child", kind, str(root)]
    command += ["--workers", str(args.workers), "--batch-size", str(args.batch_size)]
    out, wall, pss = run_measured(command, env)
    record = json.loads(out.strip().splitlines()[-1])
    record.update(wall_s=wall, peak_pss=pss)
    return record


def global_shuffle_ideal(lengths: list[int], batch_size: int) -> float:
    """Expected distinct episodes among ``batch_size`` frames drawn uniformly without
    replacement from all frames (episode ``e`` holds ``lengths[e]``)."""
    total = sum(lengths)
    expected = 0.0
    for n in lengths:
        absent = 1.0
        for j in range(batch_size):
            absent *= max(0, total - n - j) / (total - j)
        expected += 1 - absent
    return expected


def summary(record: dict, frames: int, batch_size: int) -> dict:
    indices = [i for b in record["indices"] for i in b]
    full = [b for b in record["episodes"] if len(b) == batch_size]
    samples = len(indices)
    seconds = record["end"] - record["started"]
    return {
        "samples_s": samples / seconds,
        "per_cpu_s": samples / record["cpu_s"],
        "first_s": record["first"] - record["started"],
        "peak_pss_gb": record["peak_pss"] / 1e9,
        "exactly_once": set(indices) == set(range(frames))
        and samples - len(set(indices)) == record["padding"],
        "padding": record["padding"],
        "distinct": sum(len(set(b)) for b in full) / max(1, len(full)),
        "samples": samples,
    }


def convert_all(source: Path, args: argparse.Namespace, formats: set[str]) -> dict[str, dict]:
    """Each converter of ``formats`` once, timed, with its peak PSS:
    ``{kind: {"dest", "s", "pss"}}``."""
    out = {}
    shards = args.cache / f"{source.name}-shards"
    lance = args.cache / f"{source.name}-lance"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for kind, dest, command in (
        ("shards", shards, [str(ENVS["shards"] / "bin" / "lerobot-shards"), "convert"]),
        ("lance", lance, [str(ENVS["lance"] / "bin" / "lerobot-lance-convert")]),
    ):
        if kind not in formats:
            continue
        if dest.exists():
            subprocess.run(["rm", "-rf", str(dest)], check=True)
        if kind == "shards":
            command = [*command, str(source), str(dest), "--no-progress"]
        else:
            command = [*command, "--root", str(source), "--out", str(dest)]
        _, seconds, pss = run_measured(command, env if kind == "shards" else None)
        out[kind] = {"dest": dest, "s": seconds, "pss_gb": pss / 1e9}
        print(f"convert {NAMES[kind]}: {seconds:.1f} s, peak PSS {pss / 1e9:.2f} GB", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loaders", default=",".join(LOADERS))
    parser.add_argument("--mixing-episodes", type=int, default=0)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "ROOT"), help="internal")
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.workers, args.batch_size)
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from _bench_common import cached_dataset, machine_line

    lengths = peer_lengths(args.episodes)
    name = f"peers-v30-{args.episodes}ep-3x480x640-{FPS}fps"
    source = cached_dataset(
        args.cache,
        name,
        episode_lengths=lengths,
        cameras=CAMERAS_3X480X640,
        fps=FPS,
        video_variants=2,
    )
    frames = sum(lengths)
    print(machine_line())
    print(
        f"dataset: {args.episodes} episodes of {min(lengths)}-{max(lengths)} frames ({frames} "
        f"frames), three 480x640 AV1 cameras (GOP 2), {FPS} fps; batch {args.batch_size}, "
        f"{args.workers} DataLoader workers, uint8; one epoch per run",
        flush=True,
    )
    kinds = args.loaders.split(",")
    formats = {"lance" if kind == "lance" else "shards" for kind in kinds if kind != "lerobot"}
    converted = convert_all(source, args, formats)
    roots = {
        kind: source if kind == "lerobot" else converted[kind.split("-")[0]]["dest"]
        for kind in kinds
    }
    for path in [p for root in {source, *roots.values()} for p in root.rglob("*")]:
        if path.is_file():  # the page cache warm for everyone
            path.read_bytes()
    ideal = global_shuffle_ideal(lengths, args.batch_size)
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = kinds[r % len(kinds) :] + kinds[: r % len(kinds)]
        for kind in order:
            load = os.getloadavg()[0]
            s = summary(run_epoch(kind, roots[kind], args), frames, args.batch_size)
            s["load"] = load
            results[kind].append(s)
            print(
                f"round {r + 1} {NAMES[kind]}: {s['samples_s']:.1f} samples/s, "
                f"{s['per_cpu_s']:.1f} per CPU-s, first batch {s['first_s']:.2f} s, "
                f"peak PSS {s['peak_pss_gb']:.2f} GB, exactly once {s['exactly_once']}, "
                f"{s['distinct']:.2f} distinct episodes per batch (load {load:.1f})",
                flush=True,
            )
    print(f"global-shuffle ideal: {ideal:.2f} distinct episodes per batch of {args.batch_size}")
    print_table(results, converted, ideal, args)
    if args.mixing_episodes:
        mixing(args)


def peer_lengths(episodes: int) -> list[int]:
    """300-500 frames, 400 on average: five lengths in turn (equal lengths share encodings)."""
    return [(300, 500, 350, 450, 400)[e % 5] for e in range(episodes)]


def once(runs: list[dict]) -> bool:
    return all(s["exactly_once"] for s in runs)


def median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def print_table(results: dict, converted: dict, ideal: float, args: argparse.Namespace) -> None:
    """The markdown table of the medians over rounds (docs/performance.md)."""
    kinds = list(results)
    print()
    print("| | " + " | ".join(NAMES[k] for k in kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")

    def cell(kind: str, key: str, fmt: str) -> str:
        return fmt.format(median([s[key] for s in results[kind]]))

    def convert_cell(kind: str) -> str:
        done = converted.get("shards" if kind.startswith("shards") else kind)
        return "-" if done is None else f"{done['s']:.1f} s, {done['pss_gb']:.2f} GB"

    rows = [
        ("convert (time, peak PSS)", convert_cell),
        ("samples/s (epoch)", lambda k: cell(k, "samples_s", "{:.0f}")),
        ("samples per CPU-second", lambda k: cell(k, "per_cpu_s", "{:.0f}")),
        ("first batch", lambda k: cell(k, "first_s", "{:.2f} s")),
        ("peak PSS of the process tree", lambda k: cell(k, "peak_pss_gb", "{:.2f} GB")),
        ("every frame exactly once", lambda k: "yes" if once(results[k]) else "NO"),
        (
            f"distinct episodes per batch (global shuffle {ideal:.1f})",
            lambda k: cell(k, "distinct", "{:.1f}"),
        ),
    ]
    for title, fn in rows:
        print(f"| {title} | " + " | ".join(fn(k) for k in kinds) + " |")
    loads = [s["load"] for k in kinds for s in results[k]]
    print(f"\nload average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f}")


def mixing(args: argparse.Namespace) -> None:
    """Distinct episodes per batch of this reader on a dataset larger than the pools."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _bench_common import cached_conversion, cached_dataset

    lengths = peer_lengths(args.mixing_episodes)
    name = f"peers-mixing-{args.mixing_episodes}ep-1x32x32"
    source = cached_dataset(
        args.cache,
        name,
        episode_lengths=lengths,
        cameras={"observation.images.cam": (32, 32)},
        fps=FPS,
        content="blocks",
        video_variants=2,
    )
    shards = cached_conversion(source, args.cache / f"{name}-shards")
    ideal = global_shuffle_ideal(lengths, args.batch_size)
    for kind in ("shards", "shards-unmixed"):
        s = summary(run_epoch(kind, shards, args), sum(lengths), args.batch_size)
        print(
            f"{args.mixing_episodes} episodes, {NAMES[kind]}: {s['distinct']:.2f} distinct "
            f"episodes per batch of {args.batch_size} (global shuffle {ideal:.2f}), exactly "
            f"once {s['exactly_once']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
