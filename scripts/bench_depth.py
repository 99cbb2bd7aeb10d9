"""Depth decoding against LeRobot's own ``LeRobotDataset``, and what open GOPs cost the shards.

Run in LeRobot's environment (it records the depth data with LeRobot's own API):
``.venv-lerobot/bin/python scripts/bench_depth.py [--cache DIR] [--workers 2] [--rounds 3]``.

Last printed (docs/depth.md; AMD EPYC, 2 cores, Python 3.12, torch 2.11, PyAV 15, load average
17-25 from other work): reader 2.06x [1.57-2.59] LeRobot's ``LeRobotDataset``; open GOPs 1.48x
the packets decoded per frame of closed ones (1.32x with each frame decoded alone), no bytes
outside LeRobot's episodes; a continuous H.264 recording 29.0 kB per shard outside its episode
with closed GOPs, 28.8 with open ones. Dequantizing a frame (run since): 0.27-0.49 ms against
LeRobot's 0.62-1.15 ms.

Records (once, cached) with ``LeRobotDataset.create`` / ``add_frame`` / ``save_episode`` /
``finalize`` a dataset of one 480x640 depth camera (uint16 millimetres: a slanted floor, boxes
that move, sensor noise, dropouts) with LeRobot's default depth encoding (12-bit log codes, HEVC
lossless ``gray12le``, GOP 2, x265's open GOPs), and the same frames with closed GOPs
(``open-gop=0``); converts both. Then:

- reader against LeRobot: samples/s of ``ShardedLeRobotDataset`` and of LeRobot's
  ``LeRobotDataset`` (pyav: LeRobot decodes depth with PyAV whatever the backend), both with
  ``return_uint8=True`` (``lerobot-train``'s setting; depth stays float32 millimetres), batch 8,
  shuffled, the same DataLoader workers (one intra-op thread each); interleaved rounds, median;
- open GOPs' decode cost: the reader in process, every frame decoded on its own from its
  keyframe (``decode_threads=0, frame_cache_gb=0``) and with its defaults, on the open- and the
  closed-GOP shards: packets decoded per frame (the decoders' work, which the machine's load
  does not change) and seconds per frame, open / closed;
- dequantizing one frame: the reader's table lookup against LeRobot's ``dequantize_depth``;
- bytes: each shard's frames that are not its episode's (``skip_frames``, ``tail_frames``), in
  bytes per shard, for LeRobot's depth and for a continuous H.264 recording (GOP 30, B-frames:
  users' own encodes, where episodes start mid-GOP) with closed and with open GOPs (the test
  factory's ``continuous_video``), and the decode cost of the latter two as above.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import av
import numpy as np
import torch
from _bench_common import DONE, cached_conversion, machine_line
from torch.utils.data import DataLoader

from lerobot_shards.throughput import stream

HEIGHT, WIDTH = 480, 640
FPS = 30
DEPTH = "observation.images.depth"


def one_thread(worker_id: int) -> None:
    torch.set_num_threads(1)


# ----------------------------------------------------------------------------- data


def depth_frame(episode: int, frame: int, rng: np.random.Generator) -> np.ndarray:
    """A depth camera's frame in millimetres (uint16 HxWx1): a floor sloping away, two boxes
    moving with the frame, noise growing with distance, a dropout patch (0)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    depth = 600 + 4500 * (1 - y / HEIGHT) ** 2 + 0.3 * x
    for k, (size, speed) in enumerate(((90, 3), (60, -5))):
        cx = (160 + 300 * k + speed * frame + 37 * episode) % WIDTH
        cy = 200 + 80 * k
        box = (np.abs(x - cx) < size) & (np.abs(y - cy) < size * 0.7)
        depth[box] = 900 + 400 * k + 5 * frame
    depth += rng.normal(0, 1, depth.shape) * depth * 0.002
    depth[20:60, 500:560] = 0
    return np.clip(depth, 0, 65535).astype(np.uint16)[..., None]


def record_depth(root: Path, lengths: list[int], open_gop: bool) -> Path:
    """The depth dataset recorded with LeRobot's API (cached under ``root``)."""
    from lerobot.configs.video import DepthEncoderConfig
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    if (root / DONE).exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    print(f"recording {len(lengths)} episodes ({sum(lengths)} frames) into {root} ...", flush=True)
    started = time.perf_counter()
    encoder = (
        None
        if open_gop
        else DepthEncoderConfig(extra_options={"x265-params": "lossless=1:open-gop=0"})
    )
    features = {
        DEPTH: {
            "dtype": "video",
            "shape": (HEIGHT, WIDTH, 1),
            "names": ["height", "width", "channels"],
            "info": {"is_depth_map": True},
        },
        "observation.state": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
        "action": {"dtype": "float32", "shape": (2,), "names": ["x", "y"]},
    }
    dataset = LeRobotDataset.create(
        f"bench/{root.name}", fps=FPS, features=features, root=root, depth_encoder=encoder
    )
    rng = np.random.default_rng(0)
    for episode, length in enumerate(lengths):
        for frame in range(length):
            state = np.array([episode, frame], dtype=np.float32)
            dataset.add_frame(
                {
                    DEPTH: depth_frame(episode, frame, rng),
                    "observation.state": state,
                    "action": state + 1,
                    "task": "pick",
                }
            )
        dataset.save_episode()
    dataset.finalize()
    (root / DONE).write_text("ok\n")
    print(f"recorded in {time.perf_counter() - started:.0f} s", flush=True)
    return root


def continuous_h264(root: Path, lengths: list[int], open_gop: bool) -> Path:
    """One 480x640 H.264 camera recorded continuously (GOP 30, B-frames), the test factory's."""
    from lerobot_shards.testing import video as vid
    from lerobot_shards.testing.factory import make_dataset

    if (root / DONE).exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    gops = "open-gop=1" if open_gop else "open-gop=0"
    encoder = replace(vid.H264_LONG_GOP, extra=(("bf", "3"), ("x264-params", f"scenecut=0:{gops}")))
    make_dataset(
        root,
        episode_lengths=lengths,
        cameras={"observation.images.cam": (HEIGHT, WIDTH)},
        fps=FPS,
        content="realistic",
        encoder=encoder,
        continuous_video=True,
    )
    (root / DONE).write_text("ok\n")
    return root


# ----------------------------------------------------------------------------- measurements


def reader_rate(shards: Path, args: argparse.Namespace, workers: int, **options) -> float:
    """Samples/s of the reader over whole epochs after a warm-up epoch."""
    stats = stream(
        str(shards),
        workers=workers,
        batch_size=args.batch_size,
        epochs=1 + args.reader_epochs,
        warmup_epochs=1,
        return_uint8=True,
        dataset_options=options,
    )
    if stats.epoch_coverage != [1.0] * (1 + args.reader_epochs):
        raise SystemExit(f"reader: incomplete epochs, coverage {stats.epoch_coverage}")
    return stats.samples_per_s


def lerobot_rate(source: Path, args: argparse.Namespace) -> float:
    """Samples/s of LeRobot's LeRobotDataset under a shuffling DataLoader, after a warm-up."""
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(f"bench/{source.name}", root=source, return_uint8=True)
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
    for _ in range(4):
        next(it)
    samples, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        samples += len(next(it)["index"])
    return samples / (time.perf_counter() - started)


def per_frame(shards: Path, frames: int, **options) -> tuple[float, float]:
    """(seconds, packets decoded) per sample of one shuffled epoch read in process (no
    DataLoader workers: the decode threads' counters are this process's)."""
    from lerobot_shards import ShardedLeRobotDataset
    from lerobot_shards.trace import COUNTERS

    ds = ShardedLeRobotDataset(shards, return_uint8=True, buffer_size=8, **options)
    packets = COUNTERS.snapshot()["packets_decoded"]
    started = time.perf_counter()
    count = sum(1 for _ in ds)
    elapsed = time.perf_counter() - started
    if count != frames:
        raise SystemExit(f"{shards}: an epoch gave {count} samples, not {frames}")
    return elapsed / count, (COUNTERS.snapshot()["packets_decoded"] - packets) / count


def dequantize_ms(source: Path, repeats: int = 50) -> tuple[float, float]:
    """Milliseconds to dequantize one 480x640 frame of codes on one thread: the reader's table
    lookup (``reader/frames/depth.py``) and LeRobot's ``dequantize_depth``, median of
    ``repeats``; their values must be equal."""
    from lerobot.datasets.depth_utils import dequantize_depth

    from lerobot_shards.depth import Quantization, dequantization_table

    (path,) = (source / "videos" / DEPTH).rglob("*.mp4")
    with av.open(str(path)) as container:
        codes = next(container.decode(video=0)).to_ndarray(format="gray12le")
    table = dequantization_table(Quantization(), "mm")
    out = np.empty(codes.shape, dtype=np.float32)
    torch.set_num_threads(1)

    def timed(work) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            work()
            times.append(time.perf_counter() - started)
        return float(np.median(times)) * 1e3

    ours = timed(lambda: np.take(table, codes, out=out, mode="clip"))
    theirs = timed(lambda: dequantize_depth(torch.from_numpy(codes)[None]))
    if not torch.equal(
        torch.from_numpy(out)[None], dequantize_depth(torch.from_numpy(codes)[None])
    ):
        raise SystemExit("the table's depth differs from LeRobot's dequantize_depth")
    return ours, theirs


def outside_bytes(shards: Path) -> tuple[float, float, int]:
    """(mean bytes per shard of the frames that are not its episode's, their share of the
    shards' video bytes, shards): the skipped and tail frames' packets."""
    index = json.loads((shards / "index.json").read_text())
    outside = video = 0
    paths = sorted((shards / "shards").rglob("*.tar"))
    for path in paths:
        with tarfile.open(path) as tar:
            header = next(m for m in tar.getmembers() if m.name.endswith(".json"))
            cameras = json.loads(tar.extractfile(header).read())["cameras"]
            for key, camera in cameras.items():
                member = next(m for m in tar.getmembers() if m.name.endswith(f".{key}.mp4"))
                data = tar.extractfile(member).read()
                with av.open(io.BytesIO(data)) as container:
                    packets = sorted((p.pts, p.size) for p in container.demux(video=0) if p.size)
                skip, tail = camera["skip_frames"], camera.get("tail_frames", 0)
                dropped = packets[:skip] + packets[len(packets) - tail :]
                outside += sum(size for _, size in dropped)
                video += sum(size for _, size in packets)
    assert len(paths) == index["total_episodes"]
    return outside / len(paths), outside / video, len(paths)


def decode_costs(open_shards: Path, closed_shards: Path, frames: int, rounds: int) -> None:
    """Open GOPs against closed, read in process: every frame decoded on its own (uncached,
    inline) and with the reader's defaults; packets decoded per frame (the decoders' work,
    whatever the machine's load) and seconds per frame (median of ``rounds``, alternating)."""
    for name, options in (
        ("each frame decoded alone", {"decode_threads": 0, "frame_cache_gb": 0}),
        ("reader defaults", {}),
    ):
        runs: dict[str, list[tuple[float, float]]] = {"open": [], "closed": []}
        for _ in range(rounds):
            runs["open"].append(per_frame(open_shards, frames, **options))
            runs["closed"].append(per_frame(closed_shards, frames, **options))
        seconds = {k: float(np.median([s for s, _ in v])) for k, v in runs.items()}
        packets = {k: v[0][1] for k, v in runs.items()}
        print(
            f"  {name}: packets decoded per frame open {packets['open']:.2f}, closed "
            f"{packets['closed']:.2f} ({packets['open'] / packets['closed']:.2f}x); ms per frame "
            f"open {seconds['open'] * 1e3:.2f}, closed {seconds['closed'] * 1e3:.2f} "
            f"({seconds['open'] / seconds['closed']:.2f}x, median of {rounds})",
            flush=True,
        )


# ----------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/lerobot-shards-bench"))
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers (both loaders)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--reader-epochs", type=int, default=2, help="timed epochs after warm-up")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved reader/LeRobot rounds")
    parser.add_argument("--seconds", type=float, default=15.0, help="LeRobot's timing window")
    args = parser.parse_args()

    lengths = np.random.default_rng(0).integers(40, 81, args.episodes).tolist()
    frames = sum(lengths)
    name = f"depth-{args.episodes}ep-480x640"
    source = record_depth(args.cache / name, lengths, open_gop=True)
    closed = record_depth(args.cache / f"{name}-closed-gop", lengths, open_gop=False)
    shards = cached_conversion(source, args.cache / f"{name}-shards")
    closed_shards = cached_conversion(closed, args.cache / f"{name}-closed-gop-shards")
    h264 = {
        gops: cached_conversion(
            continuous_h264(args.cache / f"h264-{gops}-{args.episodes}ep", lengths, gops == "open"),
            args.cache / f"h264-{gops}-{args.episodes}ep-shards",
        )
        for gops in ("open", "closed")
    }
    for path in args.cache.rglob("*"):  # the page cache warm for every reader alike
        if path.is_file():
            path.read_bytes()

    print(machine_line())
    print(
        f"dataset: {source} ({args.episodes} episodes, {frames} frames, one depth camera "
        f"480x640, LeRobot's default depth encoding: HEVC lossless gray12le, GOP 2, open GOPs)"
    )
    print(
        f"config: {args.workers} DataLoader workers (1 intra-op thread each), batch "
        f"{args.batch_size}, return_uint8=True (depth: float32 mm), shuffle",
        flush=True,
    )
    ratios = []
    for r in range(args.rounds):
        ours = reader_rate(shards, args, args.workers)
        theirs = lerobot_rate(source, args)
        ratios.append(ours / theirs)
        print(
            f"round {r + 1}: reader {ours:7.1f} samples/s, LeRobot's LeRobotDataset "
            f"{theirs:7.1f} samples/s: {ours / theirs:.2f}x",
            flush=True,
        )
    print(
        f"reader / LeRobot (median of {args.rounds} rounds): {float(np.median(ratios)):.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )
    ours, theirs = dequantize_ms(source)
    print(
        f"dequantizing a 480x640 frame, one thread: table lookup {ours:.2f} ms, LeRobot's "
        f"dequantize_depth {theirs:.2f} ms (equal values): {theirs / ours:.1f}x"
    )
    print("open GOPs' decode cost, depth (LeRobot's default against open-gop=0):")
    decode_costs(shards, closed_shards, frames, args.rounds)
    for what, path in (
        ("depth, LeRobot's default (open GOPs)", shards),
        ("depth, closed GOPs", closed_shards),
        ("H.264 continuous, closed GOPs", h264["closed"]),
        ("H.264 continuous, open GOPs", h264["open"]),
    ):
        per_shard, share, count = outside_bytes(path)
        print(
            f"bytes outside the episode, {what}: {per_shard / 1e3:.1f} kB per shard "
            f"({100 * share:.1f}% of the video bytes, {count} shards)"
        )
    print("open GOPs' decode cost, H.264 continuous (open-gop=1 against open-gop=0):")
    decode_costs(h264["open"], h264["closed"], frames, args.rounds)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average at the end (1, 5, 15 min): {load}")


if __name__ == "__main__":
    main()
