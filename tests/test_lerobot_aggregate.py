"""The factory's aggregated layout is LeRobot's own: both merge the same recordings, compared.

Runs where LeRobot 0.6.1 is installed (``scripts/test.sh`` runs it in LeRobot's environment).
"""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from support.required import importorskip

from lerobot_shards.testing import make_dataset
from lerobot_shards.testing.aggregate import aggregate

aggregate_module = importorskip(
    "lerobot.datasets.aggregate", reason="LeRobot is optional; CI's LeRobot env runs this"
)

CAMERAS = {"observation.images.cam_high": (24, 32), "observation.images.cam_wrist": (24, 32)}
# Small limits: the parts' files are several, and the merged files roll over too.
PARTS = [
    {
        "episode_lengths": [5, 7, 6, 3],
        "data_files_size_in_mb": 0.004,
        "video_files_size_in_mb": 0.003,
    },
    {"episode_lengths": [4, 8], "tasks": ["open the lid", "sort the cubes"]},
    {"episode_lengths": [9, 2, 6], "video_files_size_in_mb": 0.002},
]
DATA_MB = 0.003
VIDEO_MB = 0.003


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("aggregate")
    parts = []
    for i, part in enumerate(PARTS):
        options = {"cameras": CAMERAS, "seed": i, **part}
        parts.append(make_dataset(base / f"part-{i}", **options))
    ours = aggregate(
        parts, base / "ours", data_files_size_in_mb=DATA_MB, video_files_size_in_mb=VIDEO_MB
    )
    theirs = base / "theirs"
    aggregate_module.aggregate_datasets(
        [f"local/part-{i}" for i in range(len(parts))],
        "local/theirs",
        roots=parts,
        aggr_root=theirs,
        data_files_size_in_mb=DATA_MB,
        video_files_size_in_mb=VIDEO_MB,
    )
    return ours, theirs


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _packets(path: Path) -> list[tuple[int, int, int, bytes]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [(p.pts, p.dts, p.duration, bytes(p)) for p in container.demux(stream) if p.size]


def test_same_files(merged):
    ours, theirs = merged
    assert _files(ours) == _files(theirs)
    assert len([f for f in _files(ours) if f.endswith(".mp4")]) > len(CAMERAS)
    assert len([f for f in _files(ours) if f.startswith("data/")]) > 1


def test_same_rows_row_groups_and_episode_table(merged):
    ours, theirs = merged
    for name in _files(ours):
        if not name.endswith(".parquet"):
            continue
        a, b = pq.ParquetFile(ours / name), pq.ParquetFile(theirs / name)
        assert a.metadata.num_row_groups == b.metadata.num_row_groups, name
        assert a.schema_arrow.remove_metadata() == b.schema_arrow.remove_metadata(), name
        assert a.read().equals(b.read()), name


def test_same_packets_and_timestamps(merged):
    ours, theirs = merged
    for name in _files(ours):
        if name.endswith(".mp4"):
            assert _packets(ours / name) == _packets(theirs / name), name
    episodes = pq.read_table(ours / "meta/episodes/chunk-000/file-000.parquet")
    starts = episodes.column("videos/observation.images.cam_high/from_timestamp").to_pylist()
    assert any(s > 0 for s in starts[len(PARTS[0]["episode_lengths"]) :])


def test_same_info_and_stats(merged):
    ours, theirs = merged
    assert json.loads((ours / "meta/info.json").read_text()) == json.loads(
        (theirs / "meta/info.json").read_text()
    )
    a = json.loads((ours / "meta/stats.json").read_text())
    b = json.loads((theirs / "meta/stats.json").read_text())
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].keys() == b[key].keys()
        for stat in a[key]:
            assert np.allclose(a[key][stat], b[key][stat]), (key, stat)
