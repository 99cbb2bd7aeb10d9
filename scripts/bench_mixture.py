"""What a mixture costs: opening hundreds of datasets, and streaming several instead of one.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`), load average 5-9): opening 500 datasets locally 1.91 s against 0.27 s for one (3.3 ms
per extra dataset), on loopback S3 24.4 s against 0.57 s (5.3 requests per dataset); a mixture
against one dataset of the same frames 0.95-1.20 (median 473 and 553 samples/s): mixing costs
nothing measurable.

Issue 16 asks for two figures, each printed beside its baseline measured in the same run:

1. Opening ``--datasets`` (500) datasets. ``--kinds`` (5) distinct small datasets (3-5
   episodes, two cameras at 48x64; generated and converted once, cached) are copied into
   ``--datasets`` folders, each a complete converted dataset, and uploaded to a local S3
   server (moto, in a process of its own so that it does not share the measured process's GIL;
   the upload is timed, not counted). Locally and on S3, a fresh process times constructing
   ``ShardedLeRobotDataset([...every root...])`` and construction to the first batch through
   ``ShardedDataLoader(ds, batch_size=8, num_workers=2)``, and reads PSS: its own before and
   after construction, and its tree's (it and its two workers) after the first batch. On S3
   the server's requests and CPU seconds are counted too (on 2 cores, moto's CPU is time the
   reader waits). Baseline: the same for one of those datasets alone. A fresh process pays
   one-time costs (lazy imports, the S3 client) once, so the cost of opening per dataset is
   the difference over the extra datasets, ``(mixture - single) / (N - 1)``.
2. Mixing costs nothing. bench_read's dataset (24 episodes of 60-100 frames, two cameras at
   480x640, AV1; generated once, cached) streamed whole, against a mixture of the same frames:
   its episodes in four disjoint ranges, one ``DatasetRoot`` each, no weights (every frame once
   per epoch). Both go through ``throughput.stream`` (2 workers, batch 8, ``return_uint8``,
   ``--epochs`` whole epochs timed after a warm-up epoch, as bench_read times the reader),
   alternated over ``--rounds`` rounds so that load from other work falls on both alike. The
   CPU seconds per sample of each run (the process and its workers, start-up included) are
   printed too: on a shared machine they move much less with other work than samples/s do.

Usage: ``python scripts/bench_mixture.py [--cache DIR] [--datasets 500] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from _bench_common import CAMERAS_2X480X640, cached_conversion, cached_dataset, machine_line

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.s3 import isolated_aws_env, storage_options

SMALL_CAMERAS = {"observation.images.cam_high": (48, 64), "observation.images.cam_wrist": (48, 64)}
BUCKET = "bench-mixture"
MB = 1e6


# ----------------------------------------------------------------------------- data


def small_datasets(cache: Path, kinds: int) -> list[Path]:
    """``kinds`` distinct small converted datasets (3 to 5 episodes of 20-40 frames each)."""
    shards = []
    for k in range(kinds):
        lengths = np.random.default_rng(k).integers(20, 41, 3 + k % 3).tolist()
        name = f"mixture-small-{k}-{len(lengths)}ep-2x48x64"
        source = cached_dataset(cache, name, episode_lengths=lengths, cameras=SMALL_CAMERAS, fps=30)
        shards.append(cached_conversion(source, cache / f"{name}-shards"))
    return shards


def lay_out(cache: Path, kinds: list[Path], n: int) -> list[Path]:
    """``n`` converted datasets, copy ``i`` of kind ``i % len(kinds)``, laid out once."""
    layout = cache / f"mixture-layout-{n}x{len(kinds)}"
    roots = [layout / f"ds-{i:04d}" for i in range(n)]
    if not (layout / ".complete").exists():
        shutil.rmtree(layout, ignore_errors=True)
        ignore = shutil.ignore_patterns(".convert")  # the converter's resume records
        for i, root in enumerate(roots):
            shutil.copytree(kinds[i % len(kinds)], root, ignore=ignore)
        (layout / ".complete").write_text("ok\n")
    return roots


def read_big(cache: Path) -> tuple[Path, int, int]:
    """bench_read's dataset (generated and converted once): (shards, episodes, frames)."""
    lengths = np.random.default_rng(0).integers(60, 101, 24).tolist()
    name = "read-v30-24ep-2x480x640"
    source = cached_dataset(cache, name, episode_lengths=lengths, cameras=CAMERAS_2X480X640, fps=30)
    return cached_conversion(source, cache / f"{name}-shards"), len(lengths), sum(lengths)


# ----------------------------------------------------------------------------- S3 server


class RequestCount(logging.Handler):
    """Counts werkzeug's one log record per request (instead of printing it)."""

    requests = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.requests += 1


def moto_server() -> None:
    """Child: moto's server on a free loopback port; prints the port, then answers each line
    on stdin with the requests served so far, until stdin ends."""
    from moto.server import ThreadedMotoServer

    counter = RequestCount()
    log = logging.getLogger("werkzeug")
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(counter)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    print(server.get_host_and_port()[1], flush=True)
    for _ in sys.stdin:
        print(counter.requests, flush=True)
    server.stop()


class Moto:
    """A moto server process (apart, so it does not share the measured process's GIL), its
    endpoint, and what it served; this process's environment pinned to it."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--moto-server"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.endpoint = f"http://127.0.0.1:{int(self.process.stdout.readline())}"
        scratch = Path(os.environ.get("TMPDIR", "/tmp"))
        for name, value in isolated_aws_env(self.endpoint, scratch).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

    def served(self) -> tuple[int, float]:
        """(requests served, CPU seconds used) so far."""
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        requests = int(self.process.stdout.readline())
        fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return requests, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def upload(roots: list[Path], endpoint: str) -> tuple[list[str], float]:
    """``roots`` put recursively into a fresh bucket: (their URLs, seconds the upload took)."""
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **storage_options(endpoint))
    fs.call_s3("create_bucket", Bucket=BUCKET)
    started = time.perf_counter()
    fs.put(f"{roots[0].parent}/", f"{BUCKET}/", recursive=True)
    seconds = time.perf_counter() - started
    urls = [f"s3://{BUCKET}/{root.name}" for root in roots]
    if not fs.exists(f"{BUCKET}/{roots[-1].name}/index.json"):
        raise SystemExit(f"upload incomplete: {urls[-1]}/index.json is missing")
    return urls, seconds


# ----------------------------------------------------------------------------- opening


def open_child(job: dict) -> None:
    """Child: construct the dataset and take its first batch (2 workers); print JSON of the
    times, the CPU construction took (all threads), and PSS: this process's before and after
    construction and, after the first batch, its tree's and its workers'."""
    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
    from lerobot_shards.memory import tree_memory

    me = os.getpid()
    roots = job["roots"] if len(job["roots"]) > 1 else job["roots"][0]
    before = tree_memory(me)[0]
    started, cpu = time.perf_counter(), time.process_time()
    ds = ShardedLeRobotDataset(roots, return_uint8=True, storage_options=job["storage_options"])
    opened, cpu = time.perf_counter(), time.process_time() - cpu
    main_pss = tree_memory(me)[0]
    batches = iter(ShardedDataLoader(ds, batch_size=8, num_workers=2))
    next(batches)
    first = time.perf_counter()
    workers = Path(f"/proc/{me}/task/{me}/children").read_text().split()
    result = {
        "open_s": opened - started,
        "open_cpu_s": cpu,
        "first_batch_s": first - started,
        "open_mb": (main_pss - before) / MB,
        "tree_mb": tree_memory(me)[0] / MB,
        "workers_mb": sum(tree_memory(int(pid))[0] for pid in workers) / MB,
        "episodes": ds.num_episodes,
    }
    del batches  # stops the workers
    print(json.dumps(result), flush=True)


def measure_open(roots: list[str], options: dict | None, moto: Moto | None) -> dict:
    """What ``open_child`` measured in a fresh process, and what the S3 server served it."""
    if moto is not None:
        requests, cpu = moto.served()
    job = json.dumps({"roots": roots, "storage_options": options})
    command = [sys.executable, __file__, "--open-child", job]
    out = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True).stdout
    got = json.loads(out.splitlines()[-1])
    if moto is not None:
        after_requests, after_cpu = moto.served()
        got.update(requests=after_requests - requests, server_cpu_s=after_cpu - cpu)
    return got


def part1(args: argparse.Namespace) -> dict[tuple[str, str], list[dict]]:
    """Opening ``args.datasets`` datasets against one, locally and on S3, in rounds."""
    kinds = small_datasets(args.cache, args.kinds)
    local = lay_out(args.cache, kinds, args.datasets)
    size = sum(f.stat().st_size for f in local[0].parent.rglob("*") if f.is_file())
    print(
        f"part 1: {args.datasets} converted datasets ({size / MB:.1f} MB), copies of "
        f"{args.kinds} distinct ones (3-5 episodes of 20-40 frames, 2 cameras 48x64), in "
        f"{local[0].parent}; each measurement in a fresh process",
        flush=True,
    )
    moto = Moto()
    try:
        urls, upload_s = upload(local, moto.endpoint)
        print(
            f"uploaded to s3://{BUCKET} (moto at {moto.endpoint}) in {upload_s:.1f} s (not counted)"
        )
        places = {
            "local": ([str(r) for r in local], None, None),
            "S3": (urls, storage_options(moto.endpoint), moto),
        }
        opens: dict[tuple[str, str], list[dict]] = {}
        for r in range(args.rounds):
            for place, (roots, options, server) in places.items():
                for kind, chosen in (("single", roots[:1]), ("mixture", roots)):
                    got = measure_open(chosen, options, server)
                    opens.setdefault((place, kind), []).append(got)
                    served = (
                        f", server {got['requests']} requests, {got['server_cpu_s']:.1f} CPU s"
                        if server
                        else ""
                    )
                    print(
                        f"round {r + 1}: {place:5} {kind:7} ({len(chosen):3} datasets, "
                        f"{got['episodes']:4} episodes): open {got['open_s']:6.3f} s, first "
                        f"batch {got['first_batch_s']:6.3f} s; PSS: open +{got['open_mb']:5.1f} "
                        f"MB, tree {got['tree_mb']:4.0f} MB (workers {got['workers_mb']:3.0f})"
                        f"{served}",
                        flush=True,
                    )
    finally:
        moto.stop()
    return opens


# ----------------------------------------------------------------------------- throughput


def cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of its children that have ended."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def measure_stream(roots, args: argparse.Namespace, frames: int) -> tuple[float, float]:
    """(samples/s over ``args.epochs`` whole epochs after a warm-up epoch, CPU milliseconds
    per sample of the whole run, workers included: what load from other work barely moves)."""
    from lerobot_shards.throughput import stream

    cpu = cpu_seconds()
    stats = stream(
        roots,
        workers=2,
        batch_size=8,
        epochs=1 + args.epochs,
        warmup_epochs=1,
        buffer_size=64,
        return_uint8=True,
    )
    cpu = cpu_seconds() - cpu  # the workers have ended: stream() shuts them down
    if stats.epoch_coverage != [1.0] * (1 + args.epochs) or stats.epoch_frames != frames:
        raise SystemExit(f"incomplete epochs: coverage {stats.epoch_coverage} of {roots}")
    return stats.samples_per_s, cpu / stats.samples * 1e3


def part2(args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    """Samples/s and CPU per sample of one dataset and of a mixture of the same frames,
    alternated in rounds."""
    from lerobot_shards import DatasetRoot

    big, episodes, frames = read_big(args.cache)
    print(
        f"part 2: {big} ({episodes} episodes, {frames} frames, 2 cameras 480x640 AV1) whole, "
        f"against 4 DatasetRoots of disjoint episode ranges of it; 2 workers, batch 8, "
        f"return_uint8, {args.epochs} timed epochs after a warm-up epoch",
        flush=True,
    )
    parts = np.array_split(np.arange(episodes), 4)
    roots = {"single": str(big), "mixture": [DatasetRoot(big, episodes=p.tolist()) for p in parts]}
    runs: dict[str, list[tuple[float, float]]] = {"single": [], "mixture": []}
    for r in range(args.rounds):
        for kind in ("single", "mixture") if r % 2 == 0 else ("mixture", "single"):
            runs[kind].append(measure_stream(roots[kind], args, frames))
        (single, single_cpu), (mixture, mixture_cpu) = runs["single"][-1], runs["mixture"][-1]
        print(
            f"round {r + 1}: single {single:6.1f} samples/s ({single_cpu:.2f} CPU ms/sample), "
            f"mixture {mixture:6.1f} samples/s ({mixture_cpu:.2f} CPU ms/sample); "
            f"mixture/single {mixture / single:.3f} samples/s, {mixture_cpu / single_cpu:.3f} CPU",
            flush=True,
        )
    return runs


# ----------------------------------------------------------------------------- main


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def summary(args: argparse.Namespace, opens: dict, runs: dict[str, list]) -> None:
    n = args.datasets
    print(f"\nsummary: medians of {args.rounds} rounds; baseline = one of the datasets alone")
    print(f"{'':34} {'single':>9} {f'mixture of {n}':>15} {'ratio':>7}  per extra dataset")
    rows = (  # label, key, decimals, per extra dataset: scale, unit
        ("open (s)", "open_s", 3, 1e3, "ms"),
        ("open CPU, all threads (s)", "open_cpu_s", 3, 1e3, "ms"),
        ("open to first batch (s)", "first_batch_s", 3, 1e3, "ms"),
        ("PSS added by open (MB)", "open_mb", 1, 1e3, "kB"),
        ("tree PSS after 1st batch (MB)", "tree_mb", 1, 1e3, "kB"),
        (" of which 2 workers' (MB)", "workers_mb", 1, 1e3, "kB"),
        ("requests served (to 1st batch)", "requests", 0, 1, "requests"),
        ("server CPU (s, to 1st batch)", "server_cpu_s", 2, 1e3, "ms"),
    )
    for place in ("local", "S3"):
        single, mix = opens[(place, "single")], opens[(place, "mixture")]
        for label, key, d, scale, unit in rows:
            if key in single[0]:
                a, b = median([g[key] for g in single]), median([g[key] for g in mix])
                print(
                    f"{place + ' ' + label:34} {a:9.{d}f} {b:15.{d}f} {b / a:6.1f}x  "
                    f"{(b - a) / (n - 1) * scale:8.2f} {unit}"
                )
    episodes = [opens[("local", kind)][0]["episodes"] for kind in ("single", "mixture")]
    print(f"{'episodes':34} {episodes[0]:9} {episodes[1]:15}")
    for label, i, unit in (("throughput", 0, "samples/s"), ("CPU per sample", 1, "ms")):
        a, b = (median([run[i] for run in runs[kind]]) for kind in ("single", "mixture"))
        ratios = [m[i] / s[i] for s, m in zip(runs["single"], runs["mixture"], strict=True)]
        print(
            f"{f'{label} ({unit})':34} {a:9.2f} {'mixture of 4':>15}: {b:.2f}; mixture/single "
            f"{median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--datasets", type=int, default=500, help="datasets in the mixture")
    parser.add_argument("--kinds", type=int, default=5, help="distinct small datasets copied")
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of each figure")
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs after warm-up")
    parser.add_argument("--moto-server", action="store_true", help="internal")
    parser.add_argument("--open-child", metavar="JOB", help="internal")
    args = parser.parse_args()
    if args.moto_server:
        return moto_server()
    if args.open_child:
        return open_child(json.loads(args.open_child))

    started = time.perf_counter()
    small_datasets(args.cache, args.kinds)  # generated before the machine line, as are these
    read_big(args.cache)
    print(machine_line(), flush=True)
    opens = part1(args)
    runs = part2(args)
    summary(args, opens, runs)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"load average at the end (1, 5, 15 min): {load}; ran {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
