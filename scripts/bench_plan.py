"""Planner speed: draws/s against the plain reference, resume, a huge manifest.

Last printed (docs/performance.md, AMD EPYC, 2 cores, Python 3.11.7, torch 2.13.0 (CPU), PyAV 18.1
(`.venv`)): 20.2x [19.5-20.9] the reference at ``buffer_size=1024``; resume at offset 5,000,000 in
2.49 s (``buffer_size=64``); a 1,000,000-episode manifest read, split and planned in 0.56 s.

    python scripts/bench_plan.py [--draws 100000] [--buffer-size 1024] [--rounds 5]

Synthetic frame counts (uniform 100..900 frames per episode, like robot episodes), no I/O; frames
grouped in pairs as the reader plans them. The ``>= 20x`` target was set against a reference
that walked the pool for every draw; the pool now picks a resident uniformly, which the
reference does in one Python step per draw, so the ratio only says what batching the picks in
numpy saves.
Prints wall time (the targets) and the CPU time of this process (what the machine's other
load does not inflate).
"""

from __future__ import annotations

import argparse
import itertools
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_shards.format import MANIFEST_SCHEMA, shard_path
from lerobot_shards.reader.plan.partition import split_parts
from lerobot_shards.reader.plan.pool import (
    READER_GROUP,
    first_draws,
    iter_reference_draws,
    plan_part,
)
from lerobot_shards.validate import read_manifest


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line)
    except (OSError, StopIteration):
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores, load average {load}"


def timed(work: Callable[[], object]) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = work()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def synthetic_lengths(episodes: int, total: int | None = None, seed: int = 0) -> np.ndarray:
    lengths = np.random.default_rng(seed).integers(100, 901, episodes)
    if total is not None:  # adjust to exactly `total` frames
        lengths = lengths * total // lengths.sum()
        lengths[: total - lengths.sum()] += 1
    return lengths


def bench_draws(draws: int, buffer_size: int, rounds: int) -> None:
    """The reference and the planner timed in ``rounds`` interleaved rounds (load from other
    work falls on both alike); the ratio is the median round's, the spread printed beside it."""
    lengths = synthetic_lengths(20_000)
    episodes = np.arange(len(lengths))
    counts = dict(zip(episodes.tolist(), lengths.tolist(), strict=True))
    pieces = split_parts(episodes, lengths, 1, seed=0, epoch=0)[0]
    print(f"draws/s at buffer_size {buffer_size} (first {draws:,} draws, {rounds} rounds)")
    row = "  round {}: {:<22} {:12,.0f} /s wall   {:12,.0f} /s cpu"
    walls, cpus = [], []
    for r in range(1, rounds + 1):
        reference, ref_wall, ref_cpu = timed(
            lambda: list(
                itertools.islice(
                    iter_reference_draws(
                        counts, buffer_size=buffer_size, seed=0, epoch=0, group=READER_GROUP
                    ),
                    draws,
                )
            )
        )
        planned, wall, cpu = timed(
            lambda: first_draws(
                plan_part(
                    pieces,
                    None,
                    buffer_size=buffer_size,
                    byte_budget=None,
                    seed=[0, 0],
                    group=READER_GROUP,
                ),
                draws,
            )
        )
        episodes_drawn = pieces.episodes[planned[0]].tolist()
        if list(zip(episodes_drawn, planned[1].tolist(), strict=True)) != reference:
            raise SystemExit("the planner's order differs from the reference")
        print(row.format(r, "reference", draws / ref_wall, draws / ref_cpu))
        print(row.format(r, "plan_part (events)", draws / wall, draws / cpu))
        walls.append(ref_wall / wall)
        cpus.append(ref_cpu / cpu)
    print("  order identical to the reference in every round: True")
    wall_spread = f"[{min(walls):.1f}-{max(walls):.1f}]"
    cpu_spread = f"[{min(cpus):.1f}-{max(cpus):.1f}]"
    print(
        f"  ratio (median round) {np.median(walls):8.1f} x wall {wall_spread}   "
        f"{np.median(cpus):.1f} x cpu {cpu_spread}"
    )


def bench_resume(buffer_size: int, total: int = 10_000_000, offset: int = 5_000_000) -> None:
    lengths = synthetic_lengths(total // 500, total)
    pieces = split_parts(np.arange(len(lengths)), lengths, 1, seed=0, epoch=0)[0]
    events = plan_part(
        pieces,
        None,
        buffer_size=buffer_size,
        byte_budget=None,
        seed=[0, 0],
        start=offset,
        group=READER_GROUP,
    )
    _, wall, cpu = timed(lambda: first_draws(events, 1))
    print(f"resume at offset {offset:,} of a {int(lengths.sum()):,}-frame epoch "
          f"({len(lengths):,} episodes), buffer_size {buffer_size}: "
          f"{wall:.2f} s wall, {cpu:.2f} s cpu   (target < 5 s)")  # fmt: skip


def synthetic_manifest(path: Path, lengths: np.ndarray, sizes: np.ndarray) -> None:
    """A manifest.parquet of ``len(lengths)`` episodes (three members each), built columnar."""
    n = len(lengths)
    episodes = np.arange(n, dtype=np.int64)
    names = np.char.add(np.char.mod("episode-%06d", np.repeat(episodes, 3)), np.tile(
        np.array([".json", ".parquet", ".cam.mp4"]), n))  # fmt: skip
    member_sizes = np.stack([np.full(n, 512), np.full(n, 4096), sizes - 6656], axis=1).ravel()
    member_offsets = np.tile(np.array([512, 1536, 6144]), n)
    members = pa.ListArray.from_arrays(
        pa.array(np.arange(0, 3 * n + 1, 3, dtype=np.int32)),
        pa.StructArray.from_arrays(
            [pa.array(names.astype(object)), pa.array(member_offsets), pa.array(member_sizes)],
            fields=list(MANIFEST_SCHEMA.field("members").type.value_type),
        ),
    )
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    table = pa.table(
        {
            "episode_index": episodes,
            "shard": pa.array([shard_path(int(e)) for e in episodes]),
            "offset": np.zeros(n, dtype=np.int64),
            "size": sizes,
            "length": lengths,
            "dataset_from_index": starts,
            "dataset_to_index": starts + lengths,
            "tasks": pa.array([["pick"]] * n, type=pa.list_(pa.string())),
            "members": members,
            "checksum": pa.array(["sha256:" + "0" * 64] * n),
        },
        schema=MANIFEST_SCHEMA,
    )
    pq.write_table(table, path)


def bench_manifest(episodes: int = 1_000_000, buffer_size: int = 64) -> None:
    lengths = synthetic_lengths(episodes, seed=1)
    sizes = lengths * 20_000  # bytes, for a byte budget of 2 GB
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "manifest.parquet"
        synthetic_manifest(path, lengths, sizes)

        def load_and_plan():
            table = read_manifest(fsspec.filesystem("file"), str(path))
            episode_ids = table.column("episode_index").to_numpy()
            frames = table.column("length").to_numpy()
            nbytes = table.column("size").to_numpy()
            pieces = split_parts(episode_ids, frames, 1, seed=0, epoch=0)[0]
            plan = plan_part(
                pieces, nbytes, buffer_size=buffer_size, byte_budget=2 * 10**9, seed=[0, 0]
            )
            return first_draws(plan, 1)

        _, wall, cpu = timed(load_and_plan)
    print(
        f"load a {episodes:,}-episode manifest.parquet, split it and plan the first sample "
        f"(buffer_size {buffer_size}, 2 GB budget): {wall:.2f} s wall, {cpu:.2f} s cpu"
        "   (target < 2 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=100_000)
    parser.add_argument("--buffer-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved draw-rate rounds")
    args = parser.parse_args()
    print(machine())
    bench_draws(args.draws, args.buffer_size, args.rounds)
    for buffer_size in (64, args.buffer_size):
        bench_resume(buffer_size)
    bench_manifest()


if __name__ == "__main__":
    main()
