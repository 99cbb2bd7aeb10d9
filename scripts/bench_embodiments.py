"""What mapping three robots into one target layout costs, and what resizing as frames are
decoded saves (issue 45): samples/s and peak PSS beside a homogeneous mixture.

Three robots' datasets (generated once, cached: the factory's realistic 480x640 AV1, LeRobot's
encoder; ``--episodes`` episodes of ``--length`` frames each, equal-length episodes sharing
encodings, whose decoding costs stay those of distinct recordings), two cameras each so that
every sample decodes the same pixels (2 x 480x640):

- arm (SO-100-like): 6 named joints, 30 fps, cameras ``laptop`` and ``phone``;
- bimanual (ALOHA-like): 14 named joints, 50 fps, its two wrist cameras;
- planar (PushT-like): 2 dims, 10 fps, cameras ``top`` and ``side``.

Runs, each in a fresh process whose tree's PSS is sampled from here (peak), alternated over
``--rounds`` rounds so that load from other work falls on all alike; each streams ``--epochs``
whole epochs after a warm-up epoch through ``throughput.stream`` (2 workers, batch 8,
``return_uint8``, an action chunk of 50 steps: ``delta_indices``), every frame once per epoch:

1. ``homogeneous``: the arm dataset three times over (three ``DatasetRoot``s, no layout): the
   same decoded pixels, frames and episodes per epoch, items that batch as they are.
2. ``embodiments``: the three robots in a layout: action and state padded to 32 (by name for
   the action), three camera slots at 480x640 (each robot fills two: one zero image per
   sample), each dataset's vectors normalised by its own quantiles.
3. ``resized``: the same at ``image_size`` 224x224 (keep aspect, pad), frames scaled by swscale
   as they are converted in the decode threads.

Goals: ``embodiments`` within 10% of ``homogeneous`` in samples/s and peak PSS; ``resized``
faster than ``homogeneous``.

Usage: ``python scripts/bench_embodiments.py [--cache DIR] [--rounds 3] [--epochs 2]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_common import cached_conversion, cached_dataset, machine_line

ARM_JOINTS = ["shoulder_pan", "shoulder_lift", "elbow_flex", "wrist_flex", "wrist_roll", "gripper"]
BIMANUAL_JOINTS = [
    f"{side}_{joint}"
    for side in ("left", "right")
    for joint in ("waist", "shoulder", "elbow", "forearm_roll", "wrist_angle", "wrist_rotate",
                  "gripper")
]  # fmt: skip
FRAME = (480, 640)
ROBOTS = {
    "arm": dict(
        cameras=["observation.images.laptop", "observation.images.phone"],
        fps=30, joints=ARM_JOINTS, robot_type="so100",
    ),
    "bimanual": dict(
        cameras=["observation.images.cam_left_wrist", "observation.images.cam_right_wrist"],
        fps=50, joints=BIMANUAL_JOINTS, robot_type="aloha",
    ),
    "planar": dict(
        cameras=["observation.images.top", "observation.images.side"],
        fps=10, joints=["x", "y"], robot_type="pusht",
    ),
}  # fmt: skip
BASE, LEFT, RIGHT = (
    "observation.images.base",
    "observation.images.left_wrist",
    "observation.images.right_wrist",
)
SLOTS = {  # each robot's cameras onto two of the three slots
    "arm": [BASE, LEFT],
    "bimanual": [LEFT, RIGHT],
    "planar": [BASE, RIGHT],
}
GB = 1e9


def datasets(cache: Path, episodes: int, length: int) -> dict[str, Path]:
    """The three robots' converted datasets (generated and converted once)."""
    out = {}
    for name, robot in ROBOTS.items():
        source = cached_dataset(
            cache,
            f"embodiment-{name}-{episodes}x{length}-2x480x640",
            episode_lengths=[length] * episodes,
            cameras=dict.fromkeys(robot["cameras"], FRAME),
            fps=robot["fps"],
            video_variants=3,
            state_names=robot["joints"],
            action_names=robot["joints"],
            robot_type=robot["robot_type"],
        )
        out[name] = cached_conversion(source, cache / f"{source.name}-shards")
    return out


def layout(image_size: tuple[int, int] | None) -> dict:
    """The target layout of the three robots (as ``TargetLayout.from_dict`` reads it)."""
    return {
        "vectors": {"action": [*ARM_JOINTS, *BIMANUAL_JOINTS, "x", "y", *[None] * 10],
                    "observation.state": 32},
        "cameras": [BASE, LEFT, RIGHT],
        "image_size": image_size,
        "resize": "pad",
        "normalize": "quantiles",
        "embodiments": {
            robot["robot_type"]: {"key_map": dict(zip(robot["cameras"], SLOTS[name], strict=True))}
            for name, robot in ROBOTS.items()
        },
    }  # fmt: skip


def child(job: dict) -> None:
    """Child: stream the run's epochs; print JSON of samples/s, the CPU per sample, and from
    the workers' traces the frames decoded per frame shown and the decode time per sample."""
    from lerobot_shards import DatasetRoot
    from lerobot_shards.throughput import stream
    from lerobot_shards.trace import read_traces

    roots = job["roots"]
    traces = tempfile.mkdtemp(prefix="bench-embodiments-")
    options = {"delta_indices": {"action": list(range(50))}, "trace_dir": traces}
    if job["layout"] is not None:
        options["layout"] = job["layout"]
    else:  # three times the one dataset: names only tell them apart
        roots = [DatasetRoot(root, name=f"copy-{i}") for i, root in enumerate(roots)]
    cpu = time.process_time()
    stats = stream(
        roots,
        workers=2,
        batch_size=8,
        epochs=1 + job["epochs"],
        warmup_epochs=1,
        return_uint8=True,
        dataset_options=options,
    )
    children = os.times()
    cpu = time.process_time() - cpu + children.children_user + children.children_system
    if stats.epoch_coverage != [1.0] * (1 + job["epochs"]):
        raise SystemExit(f"incomplete epochs: coverage {stats.epoch_coverage}")
    last = [rows[-1] for rows in read_traces(traces).values()]  # every epoch, warm-up too
    shutil.rmtree(traces)
    items = sum(r["items"] for r in last)
    result = {
        "samples_per_s": stats.samples_per_s,
        "cpu_ms": cpu / stats.samples * 1e3,
        "decodes_per_frame": sum(r["frames_decoded"] for r in last) / (2 * items),
        "decode_ms": sum(r["decode_s"] for r in last) / items * 1e3,
    }
    print(json.dumps(result))


def run(kind: str, roots: dict[str, Path], epochs: int) -> dict:
    """One run in a fresh process, its tree's peak PSS sampled from here."""
    from lerobot_shards.memory import PeakMemory

    if kind == "homogeneous":
        job = {"roots": [str(roots["arm"])] * 3, "layout": None}
    else:
        size = None if kind == "embodiments" else (224, 224)
        job = {"roots": [str(roots[name]) for name in ROBOTS], "layout": layout(size)}
    job["epochs"] = epochs
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(job)], stdout=subprocess.PIPE, text=True
    )
    with PeakMemory(process.pid, interval_s=0.1) as memory:
        out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{kind} failed with exit code {process.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_pss"] = memory.peak_pss
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--episodes", type=int, default=8, help="episodes per robot")
    parser.add_argument("--length", type=int, default=60, help="frames per episode")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="timed epochs after a warm-up")
    parser.add_argument("--child", metavar="JOB", help="internal")
    args = parser.parse_args()
    if args.child:
        return child(json.loads(args.child))

    started = time.perf_counter()
    roots = datasets(args.cache, args.episodes, args.length)
    print(machine_line(), flush=True)
    kinds = ["homogeneous", "embodiments", "resized"]
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            got = run(kind, roots, args.epochs)
            runs[kind].append(got)
            print(
                f"round {r + 1}: {kind:12} {got['samples_per_s']:7.1f} samples/s, "
                f"{got['cpu_ms']:5.2f} CPU ms/sample, peak PSS {got['peak_pss'] / GB:5.2f} GB; "
                f"{got['decodes_per_frame']:.2f} decodes per frame shown, "
                f"{got['decode_ms']:.2f} ms decoding and converting per sample",
                flush=True,
            )
    print(f"\nsummary: medians of {args.rounds} rounds; ratios to homogeneous, per round")
    base = runs["homogeneous"]
    for kind in kinds:
        rows = runs[kind]
        for key, label, scale, unit in (
            ("samples_per_s", "samples/s", 1, ""),
            ("peak_pss", "peak PSS", 1 / GB, " GB"),
            ("cpu_ms", "CPU per sample", 1, " ms"),
            ("decode_ms", "decode+convert", 1, " ms"),
        ):
            value = statistics.median(r[key] for r in rows) * scale
            ratios = [r[key] / b[key] for r, b in zip(rows, base, strict=True)]
            print(
                f"{kind:12} {label:15} {value:8.2f}{unit:3}  x homogeneous "
                f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})"
            )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"load average at the end (1, 5, 15 min): {load}; ran {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
