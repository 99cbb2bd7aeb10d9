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
``--rounds`` rounds so that load from other work falls on all alike; each streams a warm-up
epoch then ``--epochs`` timed ones (2 workers, batch 8, ``return_uint8``, an action chunk of 50
steps: ``delta_indices``), every sample checked to be its epoch's exactly once. CPU per sample
counts every process of the run over the timed epochs: on a shared machine it moves much less
with other work than samples/s does.

1. ``homogeneous``: the arm dataset three times over (three ``DatasetRoot``s, no layout): the
   same decoded pixels, frames and episodes per epoch, items that batch as they are.
2. ``embodiments``: the three robots in a layout: action and state padded to 32 (by name for
   the action), three camera slots at 480x640 (each robot fills two: one zero image per
   sample), each dataset's vectors normalised by its own quantiles.
3. ``two-slots``: the same with every robot's cameras on the same two slots (no zero image):
   the mapping's own cost, the delivered bytes those of ``homogeneous``.
4. ``resized``: ``embodiments`` at ``image_size`` 224x224 (keep aspect, pad), frames scaled
   by swscale into ``yuv422p``, then converted, in the DataLoader workers.
5. ``homogeneous+copy`` and ``resized+copy``: 1 and 4 with the training process copying each
   batch's frames once, as ``pin_memory`` or a host-to-device transfer does.

First, on one thread, what one 480x640 frame of the arm's costs: its GOP's decode (per frame),
its conversion to rgb24 at full size, and its conversion to 224x168 (the picture ``pad`` puts
into 224x224): the reader's (swscale's bilinear scaler into ``yuv422p``, then converted), and
PyAV's ``reformat`` in one pass with swscale's bilinear scaler, area averaging and fast
bilinear.

Goals (issue 45): ``embodiments`` within 10% of ``homogeneous`` in samples/s and peak PSS;
``resized`` faster than ``homogeneous``.

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

import numpy as np
from _bench_common import PSS_INTERVAL_S, cached_conversion, cached_dataset, machine_line

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


def layout(image_size: tuple[int, int] | None, two_slots: bool = False) -> dict:
    """The target layout of the three robots (as ``TargetLayout.from_dict`` reads it); with
    ``two_slots``, every robot's cameras on the first two slots."""
    slots = {name: [BASE, LEFT] for name in ROBOTS} if two_slots else SLOTS
    return {
        "vectors": {"action": [*ARM_JOINTS, *BIMANUAL_JOINTS, "x", "y", *[None] * 10],
                    "observation.state": 32},
        "cameras": [BASE, LEFT] if two_slots else [BASE, LEFT, RIGHT],
        "image_size": image_size,
        "resize": "pad",
        "normalize": "quantiles",
        "embodiments": {
            robot["robot_type"]: {"key_map": dict(zip(robot["cameras"], slots[name], strict=True))}
            for name, robot in ROBOTS.items()
        },
    }  # fmt: skip


def tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its descendants so far (``/proc``: live DataLoader workers
    included, which ``os.times`` counts only once they are waited for)."""
    clock = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / clock
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return total


def child(job: dict) -> None:
    """Child: stream a warm-up epoch, then ``epochs`` timed ones, every sample checked to be
    its epoch's exactly once; with ``copy``, the main process copies each batch's frames once
    (as ``pin_memory`` or a host-to-device transfer does). Prints JSON of samples/s and CPU
    per sample over the timed epochs (every process), and from the workers' traces the frames
    decoded per frame shown."""
    from collections import Counter

    from lerobot_shards import DatasetRoot, ShardedDataLoader, ShardedLeRobotDataset
    from lerobot_shards.trace import read_traces

    roots = job["roots"]
    traces = tempfile.mkdtemp(prefix="bench-embodiments-")
    options = {"delta_indices": {"action": list(range(50))}, "trace_dir": traces}
    if job["layout"] is not None:
        options["layout"] = job["layout"]
    else:  # three times the one dataset: names only tell them apart
        roots = [DatasetRoot(root, name=f"copy-{i}") for i, root in enumerate(roots)]
    ds = ShardedLeRobotDataset(roots, return_uint8=True, pad=False, **options)
    loader = ShardedDataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    expected = Counter(
        (d, i)
        for d, member in enumerate(ds.datasets)
        for start, length in zip(member.selection.table["dataset_from_index"].to_pylist(),
                                 member.selection.table["length"].to_pylist(), strict=True)
        for i in range(start, start + length)
    )  # fmt: skip
    copies: dict[str, np.ndarray] = {}
    samples = 0
    for epoch in range(1 + job["epochs"]):
        if epoch == 1:
            wall, cpu = time.perf_counter(), tree_cpu(os.getpid())
        ds.set_epoch(epoch)
        seen: Counter = Counter()
        for batch in loader:
            seen.update(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))
            samples += len(batch["index"]) if epoch else 0
            for key in ds.meta.camera_keys if job["copy"] else ():
                frames = batch[key].movedim(1, -1).numpy()  # the channel-last memory
                buffer = copies.setdefault(key, np.empty_like(frames))
                np.copyto(buffer[: len(frames)], frames)
        if seen != expected:
            raise SystemExit(f"epoch {epoch} is not every frame once")
    wall, cpu = time.perf_counter() - wall, tree_cpu(os.getpid()) - cpu
    del loader  # the workers write their last trace as they stop
    time.sleep(1)
    last = [rows[-1] for rows in read_traces(traces).values()]
    shutil.rmtree(traces)
    items = sum(r["items"] for r in last)
    result = {
        "samples_per_s": samples / wall,
        "cpu_ms": cpu / samples * 1e3,
        "decodes_per_frame": sum(r["frames_decoded"] for r in last) / (2 * items),
    }
    print(json.dumps(result))


def run(kind: str, roots: dict[str, Path], epochs: int) -> dict:
    """One run in a fresh process, its tree's peak PSS sampled from here."""
    from lerobot_shards.memory import PeakMemory

    base = kind.removesuffix("+copy")
    if base == "homogeneous":
        job = {"roots": [str(roots["arm"])] * 3, "layout": None}
    else:
        size = (224, 224) if base == "resized" else None
        job = {
            "roots": [str(roots[name]) for name in ROBOTS],
            "layout": layout(size, two_slots=base == "two-slots"),
        }
    job.update(epochs=epochs, copy=kind.endswith("+copy"))
    process = subprocess.Popen(
        [sys.executable, __file__, "--child", json.dumps(job)], stdout=subprocess.PIPE, text=True
    )
    with PeakMemory(process.pid, interval_s=PSS_INTERVAL_S) as memory:
        out, _ = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"{kind} failed with exit code {process.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["peak_pss"] = memory.peak_pss
    return result


def conversion_costs(root: Path) -> None:
    """Print the CPU of decoding and converting one 480x640 frame, on this thread (best of 5
    passes over an episode)."""
    import io

    import av
    import pyarrow.parquet as pq
    import torch

    row = pq.read_table(root / "manifest.parquet").to_pylist()[0]
    data = (root / row["shard"]).read_bytes()
    member = next(m for m in row["members"] if m["name"].endswith(".mp4"))
    mp4 = data[member["offset"] : member["offset"] + member["size"]]

    def best(work) -> float:
        times = []
        for _ in range(5):
            started = time.process_time()
            count = work()
            times.append((time.process_time() - started) / count)
        return min(times) * 1e3

    def decode() -> int:
        with av.open(io.BytesIO(mp4)) as container:
            return sum(1 for _ in container.decode(video=0))

    with av.open(io.BytesIO(mp4)) as container:
        frames = list(container.decode(video=0))
    from av.video.reformatter import VideoReformatter

    from lerobot_shards.reader.frames.rgb24 import one_thread_options

    def convert(**size) -> float:
        reformatter = VideoReformatter()

        def work() -> int:
            for frame in frames:
                reformatter.reformat(frame, format="rgb24", **size, **one_thread_options())
            return len(frames)

        return best(work)

    from lerobot_shards.reader.frames.resize import Resize, write_resized_rgb24

    resize, out = Resize(224, 224, "pad"), torch.empty((224, 224, 3), dtype=torch.uint8)

    def reader() -> int:
        for frame in frames:
            write_resized_rgb24(frame, out, resize)
        return len(frames)

    print(
        f"one 480x640 frame, one thread: decode {best(decode):.2f} ms; to rgb24 "
        f"{convert():.2f} ms; to 224x224 (pad) as the reader does, into yuv422p then rgb24 "
        f"{best(reader):.2f} ms; to 224x168 rgb24 in one pass: bilinear "
        f"{convert(width=224, height=168):.2f} ms, area "
        f"{convert(width=224, height=168, interpolation='AREA'):.2f} ms, fast bilinear "
        f"{convert(width=224, height=168, interpolation='FAST_BILINEAR'):.2f} ms",
        flush=True,
    )


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
    conversion_costs(roots["arm"])
    kinds = [
        "homogeneous", "embodiments", "two-slots", "resized", "homogeneous+copy", "resized+copy"
    ]  # fmt: skip
    runs: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            got = run(kind, roots, args.epochs)
            runs[kind].append(got)
            print(
                f"round {r + 1}: {kind:16} {got['samples_per_s']:7.1f} samples/s, "
                f"{got['cpu_ms']:5.2f} CPU ms/sample, peak PSS {got['peak_pss'] / GB:5.2f} GB; "
                f"{got['decodes_per_frame']:.2f} decodes per frame shown",
                flush=True,
            )
    print(f"\nsummary: medians of {args.rounds} rounds; ratios to homogeneous, per round")
    for kind in kinds:
        rows = runs[kind]
        base = runs["homogeneous+copy" if kind.endswith("+copy") else "homogeneous"]
        for key, label, scale, unit in (
            ("samples_per_s", "samples/s", 1, ""),
            ("peak_pss", "peak PSS", 1 / GB, " GB"),
            ("cpu_ms", "CPU per sample", 1, " ms"),
        ):
            value = statistics.median(r[key] for r in rows) * scale
            ratios = [r[key] / b[key] for r, b in zip(rows, base, strict=True)]
            print(
                f"{kind:16} {label:15} {value:8.2f}{unit:3}  x homogeneous "
                f"{statistics.median(ratios):.3f} (rounds {min(ratios):.3f}-{max(ratios):.3f})"
            )
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"load average at the end (1, 5, 15 min): {load}; ran {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
