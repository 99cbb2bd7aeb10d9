"""``lerobot-shards stream`` and ``reader.throughput.stream`` on the converted golden dataset."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fsspec
import numpy as np
import pytest
from click.testing import CliRunner

from lerobot_shards import convert
from lerobot_shards.cli import main
from lerobot_shards.format import MANIFEST_FILE
from lerobot_shards.reader.plan.partition import split_parts
from lerobot_shards.throughput import stream
from lerobot_shards.validate import read_manifest

CLI = [sys.executable, "-m", "lerobot_shards.cli", "stream"]
FRAMES = 74  # av1_multifile: episodes of 12, 1, 30, 9, 17 and 5 frames
CAMERAS = 2


@pytest.fixture(scope="module")
def converted(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("stream") / "shards"
    convert(str(golden_dir / "av1_multifile"), str(dest), workers=1, progress=False)
    return dest


def episode_bytes(root: Path) -> dict[int, int]:
    table = read_manifest(fsspec.filesystem("file"), str(root / MANIFEST_FILE))
    return dict(zip(table["episode_index"].to_pylist(), table["size"].to_pylist(), strict=True))


def test_one_epoch_without_workers_counts_everything_once(converted: Path):
    stats = stream(str(converted), workers=0, batch_size=4, warmup_batches=0)
    assert stats.epoch_coverage == [1.0]
    assert (stats.seen, stats.epoch_frames, stats.samples) == (FRAMES, FRAMES, FRAMES)
    assert stats.batches == -(-FRAMES // 4)
    assert stats.camera_frames == stats.window_camera_frames == CAMERAS * FRAMES
    # one part holds every episode whole: each episode's bytes are fetched once
    assert stats.bytes_fetched == sum(episode_bytes(converted).values())
    assert stats.first_batch_s < stats.elapsed_s


def test_two_workers_two_epochs_cover_each_epoch_and_fetch_cut_episodes_per_piece(
    converted: Path,
):
    reports = []
    stats = stream(
        str(converted), workers=2, batch_size=5, epochs=2, report=reports.append, interval_s=1e9
    )
    assert stats.epoch_coverage == [1.0, 1.0]
    assert stats.samples == 2 * FRAMES  # 74 frames split 37 + 37: no padding
    assert [(r.epoch, r.seen) for r in reports] == [(0, FRAMES), (1, FRAMES)]
    # every episode is fetched once per epoch, and an episode cut between the two workers' parts
    # once by each
    sizes = episode_bytes(converted)
    episodes, lengths = np.array(list(sizes)), np.array([12, 1, 30, 9, 17, 5])
    expected = 0
    for epoch in (0, 1):
        parts = split_parts(episodes, lengths, 2, seed=0, epoch=epoch)
        cut = set(parts[0].episodes.tolist()) & set(parts[1].episodes.tolist())
        expected += sum(sizes.values()) + sum(sizes[e] for e in cut)
    assert stats.bytes_fetched == expected
    assert stats.window_samples == stats.samples - 5  # the first batch is the warm-up


def test_warmup_epochs_time_whole_epochs(converted: Path):
    stats = stream(str(converted), workers=0, batch_size=8, epochs=3, warmup_epochs=1)
    assert stats.epoch_coverage == [1.0, 1.0, 1.0]
    assert stats.window_samples == 2 * FRAMES
    assert 0 < stats.window_s < stats.elapsed_s - stats.first_batch_s


def test_seconds_stop_the_stream_early(converted: Path):
    stats = stream(str(converted), workers=0, batch_size=1, seconds=1e-6, epochs=3)
    assert stats.batches == 1 and stats.epoch_coverage == []
    assert np.isclose(stats.coverage, 1 / FRAMES)


@pytest.mark.parametrize(
    "loader",
    [["--num-workers", "2"], ["--num-workers", "0", "--decode-threads", "1"]],
    ids=["2", "0"],
)
def test_cli_streams_one_epoch_and_reports_full_coverage(converted: Path, loader: list[str]):
    result = subprocess.run(
        [*CLI, str(converted), *loader, "--batch-size", "4", "--interval", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert f"coverage {FRAMES}/{FRAMES} (100.0%)" in result.stdout
    assert "coverage of finished epochs: 100.0%" in result.stdout
    assert "samples/s" in result.stdout and "camera frames/s" in result.stdout


def test_cli_names_a_root_that_is_not_a_converted_dataset(golden_dir: Path, tmp_path: Path):
    for root in (tmp_path / "missing", golden_dir / "av1_multifile"):
        result = CliRunner().invoke(main, ["stream", str(root)])
        assert result.exit_code == 1
        assert f"{root}/index.json not found" in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_streams_a_weighted_mixture_and_reports_each_datasets_coverage(converted: Path):
    result = subprocess.run(
        [
            *CLI,
            str(converted),
            str(converted),
            *("--weights", "3,1", "--num-workers", "2", "--batch-size", "4", "--interval", "1000"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    # 148 samples per epoch: 3/4 to dataset 0 (every frame, half of them twice), 1/4 to 1
    assert "dataset 0: 111 samples of its 111 per epoch, 74/74 distinct frames (100.0%)" in (
        result.stdout
    )
    assert "dataset 1: 37 samples of its 37 per epoch, 37/74 distinct frames (50.0%)" in (
        result.stdout
    )
    bad = subprocess.run(
        [*CLI, str(converted), str(converted), "--weights", "3"], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "1 weights for 2 datasets" in bad.stderr
