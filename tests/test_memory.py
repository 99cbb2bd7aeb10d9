"""Real memory (PSS of the whole process tree: the loop and its DataLoader workers) over a
whole epoch, not the reader's own counters: the frame cache and the byte budget bound it, and
holding every decoded frame until drawn (a cache large enough for it) visibly does not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import lerobot_shards
from lerobot_shards.testing.factory import make_dataset

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux /proc"),
]

SCRIPT = Path(__file__).parent / "dist_scripts" / "memory_epoch.py"
EPISODES, LENGTH = 12, 100
CAMERAS = {"observation.images.a": (240, 320), "observation.images.b": (240, 320)}
FRAME_BYTES = 240 * 320 * 3
MB = 10**6


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 episodes of 100 frames, two 240x320 AV1 cameras (GOP 2), in one pool per worker."""
    root = tmp_path_factory.mktemp("memory")
    make_dataset(
        root / "source",
        episode_lengths=[LENGTH] * EPISODES,
        cameras=CAMERAS,
        fps=30,
        data_files_size_in_mb=50,
        video_files_size_in_mb=50,
    )
    lerobot_shards.convert(str(root / "source"), str(root / "shards"), progress=False)
    return root / "shards"


def epoch(shards: Path, **options) -> dict:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(shards), json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["frames"] == list(range(EPISODES * LENGTH))  # every frame exactly once
    return result


def test_budget_bounds_the_process_tree(shards):
    # A 64 MB budget: 32 MB per worker, 8 MB of it frame cache (frame_cache_gb 16 MB over two
    # workers), the rest for the compressed episodes (the whole dataset is about 8 MB).
    budget = 64 * MB
    bounded = epoch(shards, frame_cache_gb=0.016, byte_budget_gb=budget / 1e9)
    grown = bounded["peak_pss"] - bounded["first_pss"]
    # Outside the budget, as the README says: batches in flight (2 prefetched per worker, and
    # each worker's shared segments, up to 8), plus what each decode thread's allocator keeps.
    in_flight = (2 * 2 + 2 * 8) * bounded["batch_bytes"]
    assert grown <= budget + in_flight, (grown, budget, in_flight)


def test_frame_cache_cap_bounds_what_holding_every_frame_does_not(shards):
    # Items that also take camera a's frames 3 to 15 frames back: a decoded frame is wanted again
    # by later draws of its episode, so a cache that holds every frame until its last draw grows
    # toward all the frames of the resident episodes (6 per worker, 600 frames of 230 kB).
    back = {"observation.images.a": [-0.5, -0.4, -0.3, -0.2, -0.1, 0.0]}
    unbounded = epoch(shards, frame_cache_gb=10, delta_timestamps=back)
    grown_unbounded = unbounded["peak_pss"] - unbounded["first_pss"]
    assert grown_unbounded > 200 * FRAME_BYTES, grown_unbounded
    capped = epoch(shards, frame_cache_gb=0.016, delta_timestamps=back)
    grown = capped["peak_pss"] - capped["first_pss"]
    assert grown < grown_unbounded / 2, (grown, grown_unbounded)
