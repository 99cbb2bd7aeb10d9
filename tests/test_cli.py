"""The command line: convert (killed and resumed in a real subprocess), inspect, verify."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import click
import fsspec
import pytest
from click.testing import CliRunner

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.cli import main, parse_episodes
from lerobot_shards.converter.job import read_records
from lerobot_shards.converter.shard import write_tar
from lerobot_shards.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    FormatError,
    checksum,
    episode_key,
    manifest_rows,
    shard_path,
    video_member,
    write_manifest,
)
from lerobot_shards.testing.factory import make_dataset
from lerobot_shards.validate import read_index, read_manifest

CLI = [sys.executable, "-m", "lerobot_shards.cli"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def converted(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("cli") / "out"
    result = CliRunner().invoke(
        main, ["convert", str(golden_dir / "av1_multifile"), str(dest), "--workers", "0"]
    )
    assert result.exit_code == 0, result.output
    assert "6 episodes (6 converted, 0 already done), 74 frames" in result.output
    return dest


def test_parse_episodes():
    assert parse_episodes("0,3,5-9") == [0, 3, 5, 6, 7, 8, 9]
    assert parse_episodes("4, 2,2-3") == [4, 2, 3]
    for bad in ("a", "5-3", "1-x", "-2"):
        with pytest.raises(click.BadParameter):
            parse_episodes(bad)


def test_convert_episodes_option(golden_dir: Path, tmp_path: Path):
    result = CliRunner().invoke(
        main,
        ["convert", str(golden_dir / "image"), str(tmp_path), "--episodes", "1,3-4",
         "--workers", "0", "--no-progress"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "3 episodes (3 converted, 0 already done), 27 frames" in result.output
    assert sorted(p.name for p in tmp_path.glob("shards/*/*.tar")) == [
        "episode-000001.tar", "episode-000003.tar", "episode-000004.tar",
    ]  # fmt: skip
    result = CliRunner().invoke(
        main, ["convert", str(golden_dir / "image"), str(tmp_path), "--workers", "0"]
    )
    assert result.exit_code == 1
    assert "different options" in result.output and "--overwrite" in result.output
    result = CliRunner().invoke(
        main,
        ["convert", str(golden_dir / "image"), str(tmp_path), "--workers", "0", "--overwrite"],
    )
    assert result.exit_code == 0, result.output
    assert "6 episodes (6 converted" in result.output


def test_inspect_text_and_json(converted: Path):
    text = CliRunner().invoke(main, ["inspect", str(converted)])
    assert text.exit_code == 0, text.output
    assert "episodes: 6" in text.output and "frames:   74" in text.output
    assert "observation.images.cam_high: av1 56x40" in text.output
    assert "observation.images.cam_left_wrist: av1 32x24" in text.output
    assert "p50=" in text.output

    out = CliRunner().invoke(main, ["inspect", str(converted), "--json"])
    assert out.exit_code == 0, out.output
    summary = json.loads(out.output)
    sizes = sorted((converted / shard_path(i)).stat().st_size for i in range(6))
    assert (summary["episodes"], summary["frames"]) == (6, 74)
    assert summary["total_bytes"] == sum(sizes)
    assert summary["episode_bytes"]["p0"] == sizes[0]
    assert summary["episode_bytes"]["p100"] == sizes[-1]
    assert summary["episode_frames"] == {"p0": 1, "p50": 9, "p90": 30, "p99": 30, "p100": 30}
    assert summary["cameras"]["observation.images.cam_high"]["codec"] == "av1"


def test_inspect_takes_several_roots(converted: Path):
    both = CliRunner().invoke(main, ["inspect", str(converted), str(converted)])
    assert both.exit_code == 0, both.output
    assert both.output.count(str(converted)) == 2
    assert "2 datasets: 12 episodes, 148 frames" in both.output
    as_json = CliRunner().invoke(main, ["inspect", "--json", str(converted), str(converted)])
    summaries = json.loads(as_json.output)
    assert [s["frames"] for s in summaries] == [74, 74]


def test_inspect_refuses_an_unfinished_dataset(tmp_path: Path):
    result = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert result.exit_code == 1
    assert "index.json not found" in result.output


def test_verify_passes_then_reports_a_flipped_byte_and_a_truncated_tar(
    converted: Path, tmp_path: Path
):
    ok = CliRunner().invoke(main, ["verify", str(converted), "--deep"])
    assert ok.exit_code == 0, ok.output

    damaged = tmp_path / "damaged"
    subprocess.run(["cp", "-r", str(converted), str(damaged)], check=True)
    flipped = damaged / shard_path(2)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    truncated = damaged / shard_path(4)
    truncated.write_bytes(truncated.read_bytes()[:3000])

    result = run("verify", str(damaged))
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert any(
        line.startswith(f"episode 2 {shard_path(2)}: checksum mismatch") for line in lines
    ), result.stderr
    assert any(
        line.startswith(f"episode 4 {shard_path(4)}: shard is 3000 bytes") for line in lines
    ), result.stderr
    assert not any(line.startswith(("episode 0 ", "episode 1 ", "episode 3 ")) for line in lines)
    assert "2 problem(s)" in result.stderr


def test_verify_finds_an_mp4_with_the_wrong_frames(converted: Path, tmp_path: Path):
    """A shard that is consistent with its manifest but whose mp4 holds the wrong frames: verify
    counts its packets as the reader does, and the reader refuses it."""
    fs = fsspec.filesystem("file")
    damaged = tmp_path / "d"
    subprocess.run(["cp", "-r", str(converted), str(damaged)], check=True)
    rows = manifest_rows(read_manifest(fs, str(damaged / MANIFEST_FILE)))
    with tarfile.open(damaged / rows[2].shard) as tar:
        members = [(m.name.split(".", 1)[1], tar.extractfile(m).read()) for m in tar]
    with tarfile.open(damaged / rows[1].shard) as tar:
        one_frame = tar.extractfile(video_member(1, "observation.images.cam_high")).read()
    members[2] = ("observation.images.cam_high.mp4", one_frame)
    with open(damaged / rows[2].shard, "wb") as f:
        rows[2].checksum, rows[2].members = write_tar(f, episode_key(2), members)
        rows[2].size = f.tell()
    write_manifest(fs, str(damaged / MANIFEST_FILE), rows)
    index = read_index(fs, str(damaged))
    index.manifest_checksum = checksum((damaged / MANIFEST_FILE).read_bytes())
    index.total_bytes = sum(r.size for r in rows)
    (damaged / INDEX_FILE).write_bytes(index.to_json())

    plain = run("verify", str(damaged))
    assert plain.returncode == 1
    assert "cam_high.mp4: holds 1 packets, its header says 30 frames" in plain.stderr
    with pytest.raises(FormatError, match="episode 2"):
        list(ShardedLeRobotDataset(str(damaged)))
    result = run("verify", str(damaged), "--deep")
    assert result.returncode == 1
    assert (
        f"episode 2 {shard_path(2)}: episode-000002.observation.images.cam_high.mp4: "
        "holds 1 packets, its header says 30 frames" in result.stderr
    )


def test_killed_conversion_resumes_without_redoing_finished_episodes(tmp_path: Path):
    src = make_dataset(
        tmp_path / "src",
        episode_lengths=[3] * 24,
        cameras={"observation.images.cam": (24, 32)},
        video_files_size_in_mb=0.01,
    )
    dest = tmp_path / "out"
    fs = fsspec.filesystem("file")
    proc = subprocess.Popen(
        [*CLI, "convert", str(src), str(dest), "--workers", "1", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 60
    while len(read_records(fs, str(dest))) < 3:
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "no episode finished within 60 s"
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (dest / INDEX_FILE).exists(), "the conversion finished before it was killed"

    finished = sorted(read_records(fs, str(dest)))
    assert 3 <= len(finished) < 24
    before = {i: (dest / shard_path(i)).stat() for i in finished}

    result = run("convert", str(src), str(dest), "--workers", "1", "--no-progress")
    assert result.returncode == 0, result.stderr
    assert f"24 episodes ({24 - len(finished)} converted, {len(finished)} already done)" in (
        result.stdout
    )
    for i, st in before.items():
        now = (dest / shard_path(i)).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), f"episode {i} redone"
    assert not list(dest.glob("shards/*/.*.tmp"))

    verify = run("verify", str(dest), "--deep")
    assert verify.returncode == 0, verify.stderr
    assert verify.stdout.strip().endswith("ok")


def test_train_without_lerobot_says_where_it_runs(av1, monkeypatch):
    """Outside LeRobot's environment, ``lerobot-shards train`` names the LeRobot version it
    runs and how to get its environment."""
    import sys

    monkeypatch.setitem(sys.modules, "lerobot", None)  # as if LeRobot were not installed
    for name in [m for m in sys.modules if m.startswith("lerobot_shards.train")]:
        monkeypatch.delitem(sys.modules, name)
    result = CliRunner().invoke(main, ["train", "--shards", str(av1), "--steps=1"])
    assert result.exit_code == 1
    assert "LeRobot 0.6.1" in result.output
    assert "scripts/setup_lerobot_env.sh" in result.output
    assert "lerobot[training]==0.6.1" in result.output
