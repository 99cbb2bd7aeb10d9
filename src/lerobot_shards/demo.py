"""The end-to-end demo: make a LeRobot dataset, convert it, stream it and train a few steps.

Everything it needs is made here (no network): the factory writes a LeRobot v3.0 dataset the
way LeRobot does, the converter shards it, and a tiny policy trains from the exact-coverage
stream while the demo checks that one epoch saw every frame exactly once.
"""

from __future__ import annotations

import shutil
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

DEMO_CAMERAS = {"observation.images.top": (96, 128), "observation.images.wrist": (48, 64)}
DEMO_EPISODE_LENGTHS = (40, 1, 75, 22, 60, 33, 90, 18, 51, 47, 64, 29)


@dataclass
class DemoReport:
    source: Path
    shards: Path
    frames: int
    episodes: int
    shard_bytes: int
    convert_seconds: float
    samples_seen: int
    distinct_seen: int
    duplicates: int
    padding: int
    train_steps: int
    losses: list[float]
    stream_seconds: float

    @property
    def samples_per_s(self) -> float:
        return self.samples_seen / self.stream_seconds if self.stream_seconds else 0.0


class TinyPolicy(torch.nn.Module):
    """Pools each camera to a few numbers and regresses the action: enough to show learning."""

    def __init__(self, num_cameras: int, state_dim: int, action_dim: int) -> None:
        super().__init__()
        self.head = torch.nn.Linear(3 * num_cameras + state_dim, action_dim)

    def forward(self, images: list[torch.Tensor], state: torch.Tensor) -> torch.Tensor:
        pooled = [image.float().mean(dim=(-2, -1)) / 255 for image in images]
        return self.head(torch.cat([*pooled, state], dim=-1))


def make_demo_dataset(folder: str | Path, seed: int = 0) -> Path:
    """The demo's sample LeRobot v3.0 dataset at ``folder`` (``WORKDIR/lerobot``): 12 episodes
    of 1-90 frames at 30 fps, cameras ``observation.images.top`` (96x128) and
    ``observation.images.wrist`` (48x64), 4-dimensional ``observation.state`` and ``action``.
    The README's tour and the guides' snippets run on it."""
    from lerobot_shards.testing.factory import make_dataset

    return make_dataset(
        Path(folder),
        episode_lengths=DEMO_EPISODE_LENGTHS,
        cameras=DEMO_CAMERAS,
        fps=30,
        content="realistic",
        seed=seed,
    )


def run_demo(
    workdir: str | Path,
    *,
    workers: int | None = None,
    num_workers: int = 2,
    batch_size: int = 8,
    seed: int = 0,
) -> DemoReport:
    """Make, convert (``workers`` converter processes; None: the CPU count) and stream
    (``num_workers`` DataLoader workers) the sample dataset in ``workdir`` (recreated); train
    one epoch."""
    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset, convert

    workdir = Path(workdir)
    if workdir.exists():
        shutil.rmtree(workdir)
    source = make_demo_dataset(workdir / "lerobot", seed=seed)
    started = time.perf_counter()
    summary = convert(str(source), str(workdir / "shards"), workers=workers, progress=False)
    convert_seconds = time.perf_counter() - started

    ds = ShardedLeRobotDataset(str(workdir / "shards"), seed=seed, buffer_size=4, return_uint8=True)
    loader = ShardedDataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    model = TinyPolicy(len(ds.meta.camera_keys), state_dim=4, action_dim=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def normalise(batch: dict, key: str) -> torch.Tensor:
        stats = ds.meta.stats[key]
        mean, std = (torch.as_tensor(stats[s], dtype=torch.float32) for s in ("mean", "std"))
        return (batch[key] - mean) / std

    seen: Counter[int] = Counter()
    losses = []
    started = time.perf_counter()
    for batch in loader:
        seen.update(batch["index"].tolist())
        images = [batch[key] for key in ds.meta.camera_keys]
        prediction = model(images, normalise(batch, "observation.state"))
        loss = torch.nn.functional.mse_loss(prediction, normalise(batch, "action"))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    stream_seconds = time.perf_counter() - started
    return DemoReport(
        source=source,
        shards=workdir / "shards",
        frames=summary.frames,
        episodes=summary.episodes,
        shard_bytes=summary.bytes,
        convert_seconds=convert_seconds,
        samples_seen=sum(seen.values()),
        distinct_seen=len(seen),
        duplicates=sum(n - 1 for n in seen.values()),
        padding=ds.padding,
        train_steps=len(losses),
        losses=losses,
        stream_seconds=stream_seconds,
    )


def format_report(report: DemoReport) -> str:
    covered = "every frame exactly once" if report.distinct_seen == report.frames else "INCOMPLETE"
    return "\n".join(
        [
            f"source   {report.source}  (LeRobot v3.0, {report.episodes} episodes, "
            f"{report.frames} frames)",
            f"shards   {report.shards}  ({report.shard_bytes / 1e6:.1f} MB, converted in "
            f"{report.convert_seconds:.1f} s)",
            f"coverage {report.distinct_seen}/{report.frames} frames seen, "
            f"{report.duplicates} repeats ({report.padding} padding): {covered}",
            f"stream   {report.samples_seen} samples in {report.stream_seconds:.1f} s "
            f"({report.samples_per_s:.0f} samples/s, training included)",
            f"train    {report.train_steps} steps, loss {report.losses[0]:.3g} -> "
            f"{report.losses[-1]:.3g}",
        ]
    )
