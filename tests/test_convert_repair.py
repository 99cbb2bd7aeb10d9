"""Reruns repair and never harm: damaged shards are redone, a killed rerun leaves a finished
dataset readable, and files get the permissions the umask says."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lerobot_shards import convert
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import INDEX_FILE, MANIFEST_FILE, shard_path

CLI = [sys.executable, "-m", "lerobot_shards.cli"]
AV1 = "av1_multifile"


def dataset_files(root: Path) -> dict[str, bytes]:
    """Every file of a converted dataset by relative path, without the converter's state."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.relative_to(root).as_posix().startswith(".convert/")
    }


@pytest.fixture(scope="module")
def clean(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The golden dataset converted once, undisturbed: what every repaired dataset must equal."""
    dest = tmp_path_factory.mktemp("clean") / AV1
    convert(str(golden_dir / AV1), str(dest), workers=0, progress=False)
    return dataset_files(dest)


@pytest.mark.parametrize("where", ["middle", "first", "last"])
def test_rerun_redoes_a_shard_with_a_flipped_byte(
    where: str, golden_dir: Path, tmp_path: Path, clean: dict[str, bytes]
):
    src = str(golden_dir / AV1)
    convert(src, str(tmp_path), workers=0, progress=False)
    shard = tmp_path / shard_path(3)
    data = bytearray(shard.read_bytes())
    k = {"middle": len(data) // 2, "first": 0, "last": len(data) - 1}[where]
    data[k] ^= 0x01  # same size: the size check alone trusted it
    shard.write_bytes(bytes(data))
    untouched = (tmp_path / shard_path(0)).stat()
    assert verify_dataset(str(tmp_path)) != []

    again = convert(src, str(tmp_path), workers=0, progress=False)
    assert (again.episodes, again.converted) == (6, 1)
    assert (tmp_path / shard_path(0)).stat().st_mtime_ns == untouched.st_mtime_ns
    assert verify_dataset(str(tmp_path), deep=True) == []
    assert dataset_files(tmp_path) == clean


@pytest.mark.parametrize("how", ["api", "cli"])
def test_trust_finished_keeps_a_same_size_shard_and_redoes_a_truncated_one(
    how: str, golden_dir: Path, tmp_path: Path
):
    """``trust_finished`` (``--trust-finished``) checks sizes only: a flipped byte stays (verify
    finds it), a shard that lost bytes is redone."""
    src = str(golden_dir / AV1)
    convert(src, str(tmp_path), workers=0, progress=False)
    flipped, truncated = tmp_path / shard_path(3), tmp_path / shard_path(1)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-1])
    if how == "api":
        again = convert(src, str(tmp_path), workers=0, progress=False, trust_finished=True)
        assert (again.episodes, again.converted) == (6, 1)
    else:
        args = ["convert", src, str(tmp_path), "--workers", "0", "--trust-finished"]
        result = subprocess.run([*CLI, *args, "--no-progress"], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert "6 episodes (1 converted, 5 already done)" in result.stdout
    assert [p.episode_index for p in verify_dataset(str(tmp_path))] == [3]


def test_rerun_of_a_finished_dataset_writes_nothing(golden_dir: Path, tmp_path: Path):
    src = str(golden_dir / AV1)
    convert(src, str(tmp_path), workers=0, progress=False)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    time.sleep(0.01)
    again = convert(src, str(tmp_path), workers=0, progress=False)
    assert again.converted == 0
    after = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    lock = tmp_path / ".convert/lock.json"
    assert {p: t for p, t in after.items() if p != lock} == {
        p: t for p, t in before.items() if p != lock
    }


def test_a_rerun_killed_at_any_moment_leaves_the_dataset_readable(
    golden_dir: Path, tmp_path: Path, clean: dict[str, bytes]
):
    """SIGKILL a rerun of a finished dataset at moments spread over its run: after each kill
    the dataset verifies and equals a clean conversion; the next run is not locked out."""
    from lerobot_shards import ShardedLeRobotDataset

    src = str(golden_dir / AV1)
    dest = tmp_path / "out"
    convert(src, str(dest), workers=0, progress=False)
    argv = [*CLI, "convert", src, str(dest), "--workers", "0", "--no-progress"]
    started = time.monotonic()
    subprocess.run(argv, check=True, capture_output=True)
    whole = time.monotonic() - started  # a no-op rerun, start-up included
    for fraction in (0.2, 0.4, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0):
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(fraction * whole)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert (dest / INDEX_FILE).exists(), f"killed at {fraction:.0%}"
        assert verify_dataset(str(dest)) == [], f"killed at {fraction:.0%}"
        assert dataset_files(dest) == clean
    assert len(list(ShardedLeRobotDataset(str(dest), shuffle=False))) == 74
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "(0 converted, 6 already done)" in result.stdout


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_files_are_created_as_the_umask_says(umask: int, golden_dir: Path, tmp_path: Path):
    old = os.umask(umask)
    try:
        convert(str(golden_dir / AV1), str(tmp_path / "out"), workers=0, progress=False)
    finally:
        os.umask(old)
    modes = {
        p.relative_to(tmp_path).as_posix(): stat.S_IMODE(p.stat().st_mode)
        for p in (tmp_path / "out").rglob("*")
        if p.is_file()
    }
    assert f"out/{shard_path(0)}" in modes and f"out/{MANIFEST_FILE}" in modes
    assert f"out/{INDEX_FILE}" in modes and "out/.convert/lock.json" in modes
    assert modes == dict.fromkeys(modes, 0o666 & ~umask)


def test_pool_workers_create_shards_as_the_umask_says(golden_dir: Path, tmp_path: Path):
    """The command line with a process pool: workers come from a forkserver started by the
    command itself, under the umask it was started with."""
    dest = tmp_path / "out"
    argv = [*CLI, "convert", str(golden_dir / AV1), str(dest), "--workers", "2", "--no-progress"]
    subprocess.run(argv, check=True, capture_output=True, preexec_fn=lambda: os.umask(0o002))
    modes = {stat.S_IMODE(p.stat().st_mode) for p in dest.rglob("*") if p.is_file()}
    assert modes == {0o664}
