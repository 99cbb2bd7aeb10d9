"""What the benchmark scripts share: a description of the machine and cached generated datasets.

A benchmark figure means little without the machine it came from and how busy that machine
was, and generating realistic AV1 video takes minutes, so datasets are generated once under a
cache directory (marked complete only when done) and converted once beside them.
"""

from __future__ import annotations

import os
import platform
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import av

CAMERAS_2X480X640 = {
    "observation.images.cam_high": (480, 640),
    "observation.images.cam_wrist": (480, 640),
}
DONE = ".complete"
PSS_INTERVAL_S = 0.5
"""Seconds between samples of the tree's PSS. A sample reads every process's ``smaps_rollup``,
which walks its page tables holding its memory map's lock: 26-38 ms of kernel time for a
loader's tree of about 1 GB. Every 0.05 s the sampler took a third of a core from the loaders
it measured; an epoch's PSS is a plateau that twice a second finds."""


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or what the platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_line() -> str:
    """One line: CPU, cores, OS, versions and the load average (other work on the machine)."""
    import torch

    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (
        f"machine: {cpu_model()}, {os.cpu_count()} cores; {platform.platform()}; "
        f"python {platform.python_version()}, torch {torch.__version__}, av {av.__version__}; "
        f"load average (1, 5, 15 min) {load}"
    )


def cached_dataset(
    cache: Path,
    name: str,
    *,
    episode_lengths: Sequence[int],
    cameras: Mapping[str, tuple[int, int]],
    fps: int,
    content: str = "realistic",
    data_files_size_in_mb: float = 100,
    video_files_size_in_mb: float = 200,
    video_variants: int | None = None,
    **factory_options: object,
) -> Path:
    """A LeRobot v3.0 dataset from the test factory at ``cache/name``, generated on first use.

    Video is encoded as LeRobot encodes it (AV1, GOP 2, crf 30); the file-size limits default
    to LeRobot's, so episodes share large video files as in a real recording.
    ``video_variants``: see ``make_dataset`` (equal-length episodes share encodings), as are
    ``factory_options`` (robots of other shapes: ``state_names``, ``robot_type``, ...).
    """
    from lerobot_shards.testing.factory import make_dataset

    root = cache / name
    if (root / DONE).exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    frames = sum(episode_lengths)
    print(
        f"generating {len(episode_lengths)} episodes ({frames} frames, {len(cameras)} cameras) "
        f"into {root} (once; cached) ...",
        flush=True,
    )
    started = time.perf_counter()
    make_dataset(
        root,
        episode_lengths=episode_lengths,
        cameras=cameras,
        fps=fps,
        content=content,
        data_files_size_in_mb=data_files_size_in_mb,
        video_files_size_in_mb=video_files_size_in_mb,
        video_variants=video_variants,
        **factory_options,
    )
    (root / DONE).write_text("ok\n")
    print(f"generated in {time.perf_counter() - started:.0f} s", flush=True)
    return root


def cached_conversion(source: Path, dest: Path, workers: int | None = None) -> Path:
    """``source`` converted to shards at ``dest``, converted on first use.

    The converter writes ``index.json`` last and resumes an interrupted run, so a complete
    conversion is simply rerun as a no-op check.
    """
    from lerobot_shards import convert

    if not (dest / "index.json").exists():
        print(f"converting {source} -> {dest} ...", flush=True)
        convert(str(source), str(dest), workers=workers, progress=False)
    return dest
