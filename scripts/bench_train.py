"""LeRobot's own trainer (``lerobot-train``, LeRobot 0.6.1) with data from shards against the same
run with LeRobot's own ``LeRobotDataset``, in one run, as a ratio.

Last printed (docs/performance.md, AMD EPYC, 2 cores, LeRobot 0.6.1's environment: Python 3.12,
torch 2.11, PyAV 15 (`.venv-lerobot`); ``--episodes 24 --rounds 2``, a small diffusion policy on
the CPU): shards 0.964 against LeRobot's 0.840 steps/s with pyav (1.15x; 3 against 80 ms waiting
for data per step), 0.930 against 0.929 with torchcodec (1.00x; 4 against 27 ms).

Generates (once, cached) a LeRobot v3.0 dataset with the test factory as LeRobot records it:
``--episodes`` episodes of 200 frames, three cameras at 480x640, AV1 GOP 2 (crf 30), realistic
content, 30 fps, episodes sharing large video files; converts it once. Then, for each video
backend, runs the same training twice in fresh processes, the same policy (``--policy``: a
small diffusion policy or ACT, no pretrained weights, on the CPU unless ``--device`` says
otherwise), batch size, DataLoader
workers, seed and steps:

- shards: ``lerobot-shards train --shards <converted>``;
- LeRobot: ``lerobot-train --dataset.repo_id=... --dataset.root=<source>`` (its map-style
  ``LeRobotDataset`` and ``EpisodeAwareSampler``).

Each run records, for every step, when the trainer asked its DataLoader for the batch and when
it got it (LeRobot's ``cycle``, wrapped). Steps/s is timed from the first step after
``--warmup`` to the last; ``data wait`` is the mean time a step waited for its batch (the
trainer's ``data_s``). The sides alternate over ``--rounds`` so load from other work falls on
both alike; the median round is reported.

Usage (LeRobot's environment): ``.venv-lerobot/bin/python scripts/bench_train.py [--cache DIR]
[--steps 40] [--warmup 8] [--workers 2] [--batch-size 8] [--backends pyav,torchcodec]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CAMERAS_3X480X640 = {
    "observation.images.cam_high": (480, 640),
    "observation.images.cam_left_wrist": (480, 640),
    "observation.images.cam_right_wrist": (480, 640),
}
EPISODE_FRAMES = 200
FPS = 30
POLICIES = {
    # ACT sees every camera whole (resnet18 at 480x640): on a CPU the policy's compute dominates.
    "act": [
        "--policy.type=act",
        "--policy.dim_model=64",
        "--policy.n_heads=2",
        "--policy.dim_feedforward=128",
        "--policy.n_encoder_layers=1",
        "--policy.n_decoder_layers=1",
        "--policy.use_vae=false",
        "--policy.chunk_size=10",
        "--policy.n_action_steps=10",
    ],
    # Diffusion as LeRobot trains it on PushT (84x84 crops, 2 observation steps): 6 decoded
    # 480x640 frames per sample and little compute, so the data path shows even on a CPU.
    "diffusion": [
        "--policy.type=diffusion",
        "--policy.crop_shape=[84,84]",
        "--policy.use_group_norm=true",
        "--policy.n_obs_steps=2",
        "--policy.horizon=16",
        "--policy.n_action_steps=8",
        "--policy.down_dims=[64,128]",
        "--policy.num_train_timesteps=100",
    ],
}
COMMON = [
    "--policy.pretrained_backbone_weights=null",
    "--policy.push_to_hub=false",
    "--wandb.enable=false",
    "--save_checkpoint=false",
    "--log_freq=1000",
    "--seed=0",
]


def timed_run(side: str, timings: Path, arguments: list[str]) -> None:
    """In the child process: LeRobot's trainer (``side`` "lerobot") or ``lerobot-shards
    train`` ("shards"), its ``cycle`` timed into ``timings`` (JSON lines)."""
    from lerobot.scripts import lerobot_train

    cycle = lerobot_train.cycle

    def timed_cycle(dataloader):
        batches = cycle(dataloader)
        with timings.open("a") as out:
            while True:
                asked = time.perf_counter()
                batch = next(batches)
                out.write(json.dumps([asked, time.perf_counter()]) + "\n")
                out.flush()
                yield batch

    lerobot_train.cycle = timed_cycle
    if side == "lerobot":
        sys.argv = ["lerobot-train", *arguments]
        lerobot_train.main()
    else:
        from lerobot_shards.cli import main

        main(["train", *arguments], standalone_mode=False)


def measure(side: str, arguments: list[str], warmup: int, workdir: Path) -> dict:
    """One training run in a fresh process: its steps/s after ``warmup`` and mean data wait."""
    timings = workdir / f"{side}-{time.monotonic_ns()}.jsonl"
    command = [sys.executable, __file__, "--child", side, "--timings", str(timings), "--"]
    started = time.perf_counter()
    proc = subprocess.run([*command, *arguments], capture_output=True, text=True, cwd=workdir)
    if proc.returncode != 0:
        raise SystemExit(f"{side} run failed:\n{proc.stderr[-4000:]}")
    steps = [json.loads(line) for line in timings.read_text().splitlines()]
    measured = steps[warmup:]
    span = measured[-1][0] - measured[0][0]  # from asking for the first to asking for the last
    return {
        "steps_per_s": (len(measured) - 1) / span,
        "data_wait_s": statistics.mean(got - asked for asked, got in measured[:-1]),
        "first_batch_s": steps[0][1] - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, default=Path(".bench-cache"))
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--steps", type=int, default=40, help="measured steps (after warm-up)")
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="diffusion")
    parser.add_argument("--backends", default="pyav,torchcodec")
    parser.add_argument("--child", choices=["lerobot", "shards"], help=argparse.SUPPRESS)
    parser.add_argument("--timings", type=Path, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.child:
        timed_run(args.child, args.timings, [a for a in rest if a != "--"])
        return

    sys.path.insert(0, str(Path(__file__).parent))
    from _bench_common import cached_conversion, cached_dataset, machine_line

    name = f"train-{args.episodes}x{EPISODE_FRAMES}-3x480x640"
    source = cached_dataset(
        args.cache,
        name,
        episode_lengths=[EPISODE_FRAMES] * args.episodes,
        cameras=CAMERAS_3X480X640,
        fps=FPS,
        video_variants=4,
    )
    shards = cached_conversion(source, args.cache / f"{name}-shards")
    print(machine_line())
    print(
        f"data: {args.episodes} episodes x {EPISODE_FRAMES} frames, 3 cameras 480x640 AV1; "
        f"policy: small {args.policy} (resnet18, no pretrained weights) on {args.device}; batch "
        f"{args.batch_size}, {args.workers} workers, {args.steps} steps timed after "
        f"{args.warmup}, {args.rounds} round(s)"
    )
    common = [
        *POLICIES[args.policy],
        *COMMON,
        f"--policy.device={args.device}",
        f"--batch_size={args.batch_size}",
        f"--num_workers={args.workers}",
        f"--steps={args.warmup + args.steps + 1}",
    ]
    sides = {
        "shards": ["--shards", str(shards)],
        "lerobot": [f"--dataset.repo_id=bench/{name}", f"--dataset.root={source}"],
    }
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for backend in args.backends.split(","):
            results: dict[str, list[dict]] = {side: [] for side in sides}
            for round_ in range(args.rounds):
                for side, own in sides.items():
                    out = f"--output_dir={workdir / f'{side}-{backend}-{round_}'}"
                    arguments = [*own, *common, f"--dataset.video_backend={backend}", out]
                    results[side].append(measure(side, arguments, args.warmup, workdir))
            median = {
                side: sorted(runs, key=lambda r: r["steps_per_s"])[len(runs) // 2]
                for side, runs in results.items()
            }
            for side, result in median.items():
                print(
                    f"{backend:>10} {side:>7}: {result['steps_per_s']:.3f} steps/s, data wait "
                    f"{1000 * result['data_wait_s']:.0f} ms/step, first batch after "
                    f"{result['first_batch_s']:.1f} s"
                )
            ratio = median["shards"]["steps_per_s"] / median["lerobot"]["steps_per_s"]
            print(f"{backend:>10}   ratio: shards / LeRobot = {ratio:.2f}x steps/s")


if __name__ == "__main__":
    main()
