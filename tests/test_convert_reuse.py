"""Converting episode after episode with files kept open gives the bytes of converting each alone.

The converter's workers take runs of consecutive episodes, keep each source video open from one
episode to the next, and read the rows of the episodes that follow along with the current one.
None of that may change a byte: here every shard and the manifest are compared with a plain
conversion, each episode on its own with a freshly opened source, on the layouts LeRobot writes
(a recording, an aggregated dataset, a v2.1 dataset) and on a data file holding many episodes in
one row group (as pandas writes it), sorted or not.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from lerobot_shards import convert
from lerobot_shards.converter.cut import DEFAULT_TOLERANCE_S
from lerobot_shards.converter.shard import SourceVideos, write_episode_shard
from lerobot_shards.format import MANIFEST_FILE, write_manifest
from lerobot_shards.source import open_source
from lerobot_shards.testing.aggregate import make_aggregated_dataset
from lerobot_shards.testing.factory import make_dataset

CAMERAS = {"observation.images.cam_high": (24, 32), "observation.images.cam_wrist": (24, 32)}
LENGTHS = [5, 1, 9, 3, 7, 2, 6, 4, 8, 3, 5, 2, 7, 4, 6, 3, 9, 2]


def plain_conversion(source: Path, dest: Path) -> None:
    """Each episode alone, as the converter wrote them before it reused anything: a fresh
    source (its videos opened for that episode, its rows read on their own), then the
    manifest."""
    fs = fsspec.filesystem("file")
    rows = []
    for ep in open_source(str(source)).episodes:
        fresh = open_source(str(source))
        videos = SourceVideos(fresh)
        rows.append(
            write_episode_shard(fresh, ep.episode_index, fs, str(dest), DEFAULT_TOLERANCE_S, videos)
        )
        videos.close()
    write_manifest(fs, str(dest / MANIFEST_FILE), rows)


def one_row_group_per_file(root: Path, shuffle: bool) -> Path:
    """The data files rewritten as one row group each, with the episodes in a shuffled order
    if asked (each episode's rows stay in order)."""
    for path in sorted(root.glob("data/*/*.parquet")):
        table = pq.read_table(path)
        if shuffle:
            episodes = table.column("episode_index").to_numpy()
            order = np.random.default_rng(0).permutation(np.unique(episodes))
            rows = np.concatenate([np.flatnonzero(episodes == e) for e in order])
            table = table.take(rows)
        pq.write_table(table, path, row_group_size=1 << 20)
    return root


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("layouts")
    # Files hold several episodes each and roll over at different episodes.
    options = {
        "episode_lengths": LENGTHS,
        "cameras": CAMERAS,
        "data_files_size_in_mb": 0.01,
        "video_files_size_in_mb": 0.01,
    }
    recorded = make_dataset(base / "recorded", **options)
    parts = [{**options, "episode_lengths": LENGTHS[k::3]} for k in range(3)]
    out = {
        "recorded": recorded,
        "aggregated": make_aggregated_dataset(
            base / "aggregated", parts, data_files_size_in_mb=0.01, video_files_size_in_mb=0.02
        ),
        "v21": make_dataset(base / "v21", version="v2.1", episode_lengths=LENGTHS[:6]),
    }
    for name, shuffle in (("one_row_group", False), ("one_row_group_shuffled", True)):
        out[name] = one_row_group_per_file(shutil.copytree(recorded, base / name), shuffle)
    return out


@pytest.mark.parametrize(
    "name", ["recorded", "aggregated", "v21", "one_row_group", "one_row_group_shuffled"]
)
def test_workers_reusing_files_write_the_bytes_of_episodes_converted_alone(
    name: str, layouts: dict[str, Path], tmp_path: Path
):
    source = layouts[name]
    plain_conversion(source, tmp_path / "plain")
    for workers in (0, 2):
        dest = tmp_path / f"workers-{workers}"
        convert(str(source), str(dest), workers=workers, progress=False)
        shards = sorted(p.relative_to(dest) for p in dest.glob("shards/*/*.tar"))
        assert shards == sorted(p.relative_to(tmp_path / "plain") for p in
                                (tmp_path / "plain").glob("shards/*/*.tar"))  # fmt: skip
        assert len(shards) == len(open_source(str(source)).episodes)
        for shard in shards:
            assert (dest / shard).read_bytes() == (tmp_path / "plain" / shard).read_bytes(), shard
        manifest = (dest / MANIFEST_FILE).read_bytes()
        assert manifest == (tmp_path / "plain" / MANIFEST_FILE).read_bytes()


@pytest.mark.parametrize(
    "name", ["recorded", "aggregated", "one_row_group", "one_row_group_shuffled"]
)
def test_rows_read_along_are_the_rows_read_alone(name: str, layouts: dict[str, Path]):
    root = layouts[name]
    along = open_source(str(root))
    order = [ep.episode_index for ep in along.episodes]
    for k, i in enumerate(order):
        ep = along.episode(i)
        got = along.read_rows(i, then=order[k + 1 :])
        alone = open_source(str(root)).read_rows(i)
        whole = pq.read_table(root / ep.data_path)
        expected = whole.filter(pc.equal(whole.column("episode_index"), i))
        assert got.schema.equals(alone.schema, check_metadata=True)
        assert got.equals(alone) and got.equals(expected), i
        assert got.column("index").to_pylist() == sorted(expected.column("index").to_pylist())
