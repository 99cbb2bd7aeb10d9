"""A million episodes: what opening, planning, reading, pickling, verifying and writing a
manifest cost at 1k, 10k, 100k and 1M episodes, each beside the 1k figure (issue 49).

    python scripts/bench_scale.py [--sizes 1000,10000,100000,1000000] [--cache DIR]
        [--cache-first-batch-up-to 100000] [--code SRC]

Datasets are made cheaply (``lerobot_shards.testing.scale``): every episode is one of four real
converted episodes (150 frames, three 480x640 AV1 cameras at 30 fps) renumbered, its row
written by the converter's own writer (``format.ManifestColumns``) with a checksum of its own
and video sizes that differ by up to 5%, and a shard only where the first batch reads (the
first 128 admissions of each of the two workers' parts). Each figure is measured in a fresh
process, so what one keeps is not another's:

- construction: ``ShardedLeRobotDataset(root)``, median of 3, and the RSS it adds (memory kept
  per process, after a garbage collection);
- epoch start: what a DataLoader worker does in ``iter(ds)`` before its first fetch, as worker 0
  of 1 rank x 2 workers and of rank 0 of 8 x 4 workers: median of 3, and the peak memory
  Python and numpy allocate in it (tracemalloc);
- first batch: ``ShardedDataLoader(ds, batch_size=32, num_workers=2)`` (forked workers), from
  ``iter`` to the first batch, without and with the node-local cache (``cache_dir`` on local
  disk; ``--cache-first-batch-up-to`` leaves it out above that size), and the CPU time of the
  process and its workers in it; the workers' peak RSS (largest ``VmHWM``) and the process
  tree's PSS after it;
- pickle: ``pickle.dumps(ds)`` (what a spawn or forkserver worker receives), beside the
  manifest file;
- verify: ``lerobot-shards verify --sample 0`` (the manifest side: index, metadata, manifest
  and its checksum) and ``lerobot-shards inspect``, whole commands, wall time and peak RSS;
- write: rows collected one at a time as a conversion collects them, the bytes they hold
  (``ManifestColumns.nbytes``) and the RSS they add, and the time to write the manifest and
  ``index.json`` from them.

``--code SRC`` runs the measurements with another checkout's ``src`` (the datasets are the
same files): the figures of the code before a change on the same machine. Where that code has
no ``verify --sample``, its verify is a plain ``verify`` (every shard, mostly absent).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

HERE = Path(__file__).resolve().parent
CAMERAS = {
    "observation.images.cam_high": (480, 640),
    "observation.images.cam_left_wrist": (480, 640),
    "observation.images.cam_right_wrist": (480, 640),
}
LENGTH = 150
FPS = 30
BATCH = 32
WORKERS = 2
BUFFER = 64
"""The reader's default ``buffer_size``: each part's pool."""
READ_ADMISSIONS = 2 * BUFFER
"""Admissions of each first-batch part given a shard (the pool and as many again)."""
MB = 1e6
TEMPLATE = "scale-template-shards"


# ------------------------------------------------------------------ datasets


def template(cache: Path) -> Path:
    from _bench_common import cached_conversion, cached_dataset

    source = cached_dataset(
        cache, "scale-template-4x150-3x480x640", episode_lengths=[LENGTH] * 4,
        cameras=CAMERAS, fps=FPS,
    )  # fmt: skip
    return cached_conversion(source, cache / TEMPLATE, workers=0)


def first_reads(episodes: int) -> set[int]:
    """The episodes the first batch of 1 rank x 2 workers may fetch."""
    import numpy as np

    from lerobot_shards.reader.plan.elastic import Ordering, Planner
    from lerobot_shards.reader.plan.pool import Admit

    planner = Planner(np.arange(episodes), np.full(episodes, LENGTH))
    ordering = Ordering(seed=0, shuffle=True, buffer_size=BUFFER, byte_budget=None, pad=True,
                        repeat=False)  # fmt: skip
    read = set()
    for part in planner.fresh_parts(ordering, WORKERS, 0):
        admitted = 0
        for event in part.plan(ordering, None):
            if type(event) is Admit:
                read.add(int(part.episodes[event.piece]))
                admitted += 1
                if admitted == READ_ADMISSIONS:
                    break
    return read


def make(source: Path, dest: Path, episodes: int) -> None:
    """The scaled dataset at ``dest``, with the shards the first batch reads."""
    from lerobot_shards.testing.scale import make_scaled_dataset

    read = first_reads(episodes) | {0}  # inspect reads episode 0's header
    make_scaled_dataset(source, dest, episodes, read)


# ------------------------------------------------------------------ measurements (in a child)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measure_write(root: str) -> dict:
    """The converter's side: rows collected as a conversion collects them (one at a time), the
    bytes they hold, and the manifest and index.json written from them."""
    import pyarrow as pa

    from lerobot_shards.format import ManifestColumns
    from lerobot_shards.testing.scale import Template, scaled_rows, write_scaled

    episodes = int(Path(root).name.rsplit("-", 1)[1])
    tpl = Template.open(Path(root).parent / TEMPLATE)
    with tempfile.TemporaryDirectory(prefix="bench-scale-write-") as dest:
        rows = ManifestColumns()
        gc.collect()
        before = rss(), pa.total_allocated_bytes()
        for row in scaled_rows(tpl, episodes, Path(dest)):
            rows.add(row)
        held = rows.nbytes
        gc.collect()
        grown = rss() - before[0]
        started, cpu = time.perf_counter(), time.process_time()
        write_scaled(tpl, Path(dest), rows)
        write_s, write_cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"rows_held": held, "rows_rss": grown, "write_s": write_s, "write_cpu": write_cpu}


def measure_construct(root: str) -> dict:
    import torch  # noqa: F401 (imported before the baseline RSS, as a training script has it)

    from lerobot_shards import ShardedLeRobotDataset

    ShardedLeRobotDataset(str(Path(root).parent / TEMPLATE))  # what it imports on first use
    gc.collect()
    before = rss()
    started, cpu = time.perf_counter(), time.process_time()
    ds = ShardedLeRobotDataset(root)
    first, first_cpu = time.perf_counter() - started, time.process_time() - cpu
    gc.collect()
    kept = rss() - before
    times, cpus = [first], [first_cpu]
    for _ in range(2):
        started, cpu = time.perf_counter(), time.process_time()
        ShardedLeRobotDataset(root)
        times.append(time.perf_counter() - started)
        cpus.append(time.process_time() - cpu)
    started = time.perf_counter()
    pickled = pickle.dumps(ds)
    pickle_s = time.perf_counter() - started
    started = time.perf_counter()
    pickle.loads(pickled)
    unpickle_s = time.perf_counter() - started
    manifest = (Path(root) / "manifest.parquet").stat().st_size
    return {
        "construct_s": statistics.median(times),
        "construct_cpu": statistics.median(cpus),
        "kept": kept,
        "pickle": len(pickled),
        "manifest": manifest,
        "pickle_s": pickle_s,
        "unpickle_s": unpickle_s,
    }


def measure_epoch_start(root: str, world: int, workers: int) -> dict:
    os.environ.update(RANK="0", WORLD_SIZE=str(world))
    from torch.utils.data._utils.worker import WorkerInfo

    import lerobot_shards.reader.loading.dataset as module
    from lerobot_shards import ShardedLeRobotDataset

    module.tune_worker_malloc = lambda: None  # this process is no worker
    times, cpus, peaks = [], [], []
    for run in range(4):
        ds = ShardedLeRobotDataset(root)
        ds.num_workers = workers
        info = WorkerInfo(id=0, num_workers=workers, seed=1, dataset=ds)
        module.get_worker_info = lambda info=info: info
        if run == 3:
            tracemalloc.start()
        gc.collect()
        started, cpu = time.perf_counter(), time.process_time()
        iter(ds)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        if run == 3:
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
        else:
            times.append(elapsed)
            cpus.append(cpu)
    return {
        "epoch_start_s": statistics.median(times),
        "epoch_start_cpu": statistics.median(cpus),
        "epoch_start_peak": peaks[0],
    }


def measure_first_batch(root: str, cache: bool) -> dict:
    import multiprocessing

    multiprocessing.set_start_method("fork", force=True)
    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
    from lerobot_shards.memory import tree_usage

    with tempfile.TemporaryDirectory(
        prefix="bench-scale-cache-", ignore_cleanup_errors=True
    ) as cache_dir:
        options = {"cache": True, "cache_dir": cache_dir} if cache else {"cache": False}
        ds = ShardedLeRobotDataset(root, **options)
        loader = ShardedDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
        started, cpu = time.perf_counter(), time.process_time()
        batches = iter(loader)
        next(batches)
        first, cpu = time.perf_counter() - started, time.process_time() - cpu
        peaks = []
        ticks = os.sysconf("SC_CLK_TCK")
        for pid in _children(os.getpid()):
            with open(f"/proc/{pid}/status") as f:
                peaks += [int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM")]
            with open(f"/proc/{pid}/stat") as f:  # utime and stime: the workers are new
                cpu += sum(int(v) for v in f.read().rsplit(")", 1)[1].split()[11:13]) / ticks
        tree = tree_usage(os.getpid())["pss"]
        del batches
    return {
        "first_batch_s": first,
        "first_batch_cpu": cpu,
        "worker_peak_rss": max(peaks, default=0),
        "tree_pss": tree,
    }


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def measure_command(argv: list[str]) -> dict:
    """A command's wall time, CPU time and peak RSS (this process runs no other child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    run = subprocess.run(argv, capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    peak = after.ru_maxrss * 1024
    return {"s": wall, "cpu": cpu, "peak": peak, "rc": run.returncode, "err": run.stderr[-300:]}


def measure_verify(root: str, code: str) -> dict:
    cli = [sys.executable, "-m", "lerobot_shards.cli"]
    help_text = subprocess.run([*cli, "verify", "--help"], capture_output=True, text=True).stdout
    sample = ["--sample", "0", "--no-progress"] if "--sample" in help_text else []
    verify = measure_command([*cli, "verify", root, *sample])
    return {
        "verify_s": verify["s"],
        "verify_cpu": verify["cpu"],
        "verify_peak": verify["peak"],
        "verify_sampled": bool(sample),
    }


def measure_inspect(root: str) -> dict:
    run = measure_command([sys.executable, "-m", "lerobot_shards.cli", "inspect", root])
    return {"inspect_s": run["s"], "inspect_cpu": run["cpu"], "inspect_rc": run["rc"]}


MEASURES = {
    "construct": lambda root, code: measure_construct(root),
    "start-1x2": lambda root, code: measure_epoch_start(root, 1, 2),
    "start-8x4": lambda root, code: measure_epoch_start(root, 8, 4),
    "batch": lambda root, code: measure_first_batch(root, cache=False),
    "batch-cache": lambda root, code: measure_first_batch(root, cache=True),
    "verify": measure_verify,
    "inspect": lambda root, code: measure_inspect(root),
    "write": lambda root, code: measure_write(root),
}


def child(measure: str, root: str, code: str) -> dict:
    """Run ``measure`` in a fresh process (with ``code`` first on the path); its figures."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([code, str(HERE)])}
    argv = [sys.executable, __file__, "--child", measure, root, "--code", code]
    run = subprocess.run(argv, capture_output=True, text=True, env=env)
    if run.returncode:
        raise SystemExit(f"{measure} on {root} failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ the table


def row(name: str, figures: dict[int, str], ratios: dict[int, float] | None) -> str:
    cells = []
    for n, text in figures.items():
        ratio = f" ({ratios[n]:.1f}x)" if ratios and n in ratios and n != min(figures) else ""
        cells.append(text + ratio)
    return f"| {name} | " + " | ".join(cells) + " |"


def table(results: dict[int, dict]) -> str:
    sizes = sorted(results)

    def fig(key: str, fmt) -> tuple[dict[int, str], dict[int, float]]:
        present = [n for n in sizes if key in results[n]]
        text = {n: fmt(results[n][key]) for n in present}
        base = results[sizes[0]].get(key)
        ratios = {n: results[n][key] / base for n in present if base}
        return text, ratios

    def s(v):
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"

    def mb(v):
        return f"{v / MB:.1f} MB" if v < 10 * MB else f"{v / MB:.0f} MB"

    lines = [
        "| measure (ratio to the smallest size) | " + " | ".join(f"{n:,}" for n in sizes) + " |",
        "|---" * (len(sizes) + 1) + "|",
    ]
    for name, key, fmt in [
        ("construction: time", "construct_s", s),
        ("construction: CPU time", "construct_cpu", s),
        ("construction: memory kept per process", "kept", mb),
        ("epoch start, worker of 1 rank x 2 workers: time", "start-1x2_s", s),
        ("epoch start, worker of 1 rank x 2 workers: CPU time", "start-1x2_cpu", s),
        ("epoch start, worker of 1 rank x 2 workers: peak allocated", "start-1x2_peak", mb),
        ("epoch start, worker of rank 0 of 8 x 4 workers: time", "start-8x4_s", s),
        ("epoch start, worker of rank 0 of 8 x 4 workers: CPU time", "start-8x4_cpu", s),
        ("epoch start, worker of rank 0 of 8 x 4 workers: peak allocated", "start-8x4_peak", mb),
        ("first batch (batch 32, 2 workers)", "first_batch_s", s),
        ("first batch: CPU time (the process and its workers)", "first_batch_cpu", s),
        ("first batch: worker peak RSS", "worker_peak_rss", mb),
        ("first batch: tree PSS", "tree_pss", mb),
        ("first batch through the node cache", "cached_first_batch_s", s),
        ("first batch through the node cache: CPU time", "cached_first_batch_cpu", s),
        ("pickled dataset", "pickle", mb),
        ("pickled dataset / manifest file", "pickle_ratio", lambda v: f"{v:.2f}"),
        ("unpickle", "unpickle_s", s),
        ("manifest file", "manifest", mb),
        ("verify (the manifest side)", "verify_s", s),
        ("verify: CPU time", "verify_cpu", s),
        ("verify: peak RSS", "verify_peak", mb),
        ("inspect", "inspect_s", s),
        ("inspect: CPU time", "inspect_cpu", s),
        ("converter: rows held before the manifest is written", "rows_held", mb),
        ("converter: RSS grown while collecting them", "rows_rss", mb),
        ("converter: manifest and index.json written", "write_s", s),
        ("converter: ... CPU time", "write_cpu", s),
    ]:
        text, ratios = fig(key, fmt)
        if text:
            lines.append(row(name, text, None if key == "pickle_ratio" else ratios))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000,1000000")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench-scale")
    parser.add_argument("--cache-first-batch-up-to", type=int, default=10**9)
    parser.add_argument("--code", default=str(HERE.parent / "src"))
    parser.add_argument("--measures", default=",".join(MEASURES), help="which, comma-separated")
    parser.add_argument("--child", nargs=2, metavar=("MEASURE", "ROOT"))
    args = parser.parse_args()
    if args.child:
        measure, root = args.child
        print(json.dumps(MEASURES[measure](root, args.code)))
        return
    from _bench_common import machine_line

    sys.path.insert(0, str(HERE.parent / "src"))
    print(machine_line(), flush=True)
    print(f"code measured: {args.code}", flush=True)
    source = template(args.cache)
    results: dict[int, dict] = {}
    for n in [int(x) for x in args.sizes.split(",")]:
        root = args.cache / f"scale-{n}"
        if not (root / "index.json").exists():
            if root.exists():
                subprocess.run(["rm", "-rf", str(root)], check=True)
            print(f"making {n:,} episodes ...", flush=True)
            make(source, root, n)
        figures: dict = {}
        for measure in args.measures.split(","):
            if measure == "batch-cache" and n > args.cache_first_batch_up_to:
                continue
            if measure == "write" and args.code != str(HERE.parent / "src"):
                continue  # the converter's writer is this checkout's
            print(f"  {n:,}: {measure} ...", flush=True)
            got = child(measure, str(root), args.code)
            if measure.startswith("start-"):
                got = {
                    f"{measure}_s": got["epoch_start_s"],
                    f"{measure}_cpu": got["epoch_start_cpu"],
                    f"{measure}_peak": got["epoch_start_peak"],
                }
            if measure == "batch-cache":
                got = {
                    "cached_first_batch_s": got["first_batch_s"],
                    "cached_first_batch_cpu": got["first_batch_cpu"],
                }
            figures.update(got)
        if "pickle" in figures:
            figures["pickle_ratio"] = figures["pickle"] / figures["manifest"]
        results[n] = figures
        print(json.dumps({n: figures}), flush=True)
    print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(table(results))


if __name__ == "__main__":
    main()
