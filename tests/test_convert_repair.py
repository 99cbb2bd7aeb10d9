"""Reruns repair and never harm: damaged shards are redone, a rerun killed while it rewrites
them leaves what the next rerun repairs (exactly that), and files get the permissions the umask
says."""

from __future__ import annotations

import os
import shutil
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
def finished(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden dataset converted once, undisturbed, with its resume records (read-only:
    tests that damage it work on a copy)."""
    dest = tmp_path_factory.mktemp("clean") / AV1
    convert(str(golden_dir / AV1), str(dest), workers=0, progress=False)
    return dest


@pytest.fixture(scope="module")
def clean(finished: Path) -> dict[str, bytes]:
    """What every repaired dataset must equal."""
    return dataset_files(finished)


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


# A rerun through the command line that stops at one point of its work, says so (creates the
# file argv[3]) and waits there to be killed: the kill lands exactly there, whatever the
# machine's load. The converter runs as it is; only the function at the point is wrapped.
STOP_AT = r"""
import sys, threading
from pathlib import Path
from lerobot_shards import cli
from lerobot_shards.converter import job, run, shard
from lerobot_shards.format import INDEX_FILE, episode_key

point, episode, marker = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])

def stop_here():
    marker.touch()
    threading.Event().wait()

if point == "mid-shard":  # the episode's temporary tar holds its first member, then stops
    write_tar = shard.write_tar

    def partial_tar(file, key, members):
        if key != episode_key(episode):
            return write_tar(file, key, members)

        class Stop:
            writes = 0

            def write(self, data):
                file.write(data)
                self.writes += 1
                if self.writes == 2:  # the first member's tar header and data
                    file.flush()
                    stop_here()

        return write_tar(Stop(), key, members)

    shard.write_tar = partial_tar
elif point == "before-record":  # the episode's shard is in place, its record not yet saved
    save = job._Records.save

    def save_after_stop(self, converted):
        if converted.row.episode_index == episode:
            stop_here()
        save(self, converted)

    job._Records.save = save_after_stop
elif point == "before-index":  # every shard and the manifest done, index.json not yet
    put = run._put

    def put_after_stop(fs, path, data):
        if path.endswith(INDEX_FILE):
            stop_here()
        put(fs, path, data)

    run._put = put_after_stop
else:
    raise SystemExit(f"unknown point {point}")
sys.argv = ["lerobot-shards", *sys.argv[4:]]
cli.run()
"""

DAMAGED = (1, 3, 4)
"""The episodes whose shards ``damage`` breaks: a rerun redoes them in this order."""


def damage(dest: Path) -> None:
    """Episode 1's shard deleted, a byte of episode 3's flipped, episode 4's truncated."""
    (dest / shard_path(1)).unlink()
    flipped = dest / shard_path(3)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    truncated = dest / shard_path(4)
    truncated.write_bytes(truncated.read_bytes()[:-1000])


def kill_rerun_at(point: str, episode: int, src: str, dest: Path, marker: Path) -> None:
    """Start a rerun that stops at ``point`` (of ``episode``), wait until it is there (it
    must not end first), SIGKILL it."""
    argv = [sys.executable, "-c", STOP_AT, point, str(episode), str(marker)]
    argv += ["convert", src, str(dest), "--workers", "0", "--no-progress"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if proc.poll() is not None:
                pytest.fail(
                    f"the rerun ended (exit {proc.returncode}) before it reached {point}:\n"
                    + proc.stderr.read().decode()[-3000:]
                )
            assert time.monotonic() < deadline, f"the rerun did not reach {point} in 120 s"
            time.sleep(0.02)
        assert proc.poll() is None, "the rerun went on past its stop"
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def temp_shards(dest: Path) -> list[Path]:
    return sorted(p for p in (dest / "shards").rglob(".*") if p.is_file())


KILLS = {
    # what the killed rerun was doing: (stop point, its episode, shards it had redone, the one
    # half-written in a temporary file, what the next rerun must redo)
    "mid-first-shard": ("mid-shard", 1, (), 1, (1, 3, 4)),
    "mid-second-shard": ("mid-shard", 3, (1,), 3, (3, 4)),
    "second-shard-unrecorded": ("before-record", 3, (1, 3), None, (4,)),
    "before-index": ("before-index", 0, (1, 3, 4), None, ()),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("moment", list(KILLS))
def test_a_rerun_killed_while_it_rewrites_shards_leaves_exactly_the_rest_to_the_next(
    moment: str, golden_dir: Path, finished: Path, clean: dict[str, bytes], tmp_path: Path
):
    """Three shards of a finished dataset broken (deleted, a flipped byte, truncated); a rerun
    rewriting them SIGKILLed at a point of its work: mid-way through a shard's temporary tar,
    after a shard's rename before its record, before ``index.json``. At the kill, the shards
    it redid equal a clean conversion, the one it was writing is untouched at its name (the
    temporary tar holds a prefix of its bytes), the rest are still broken, and the dataset-level
    files are the old ones. The next rerun redoes exactly the shards still missing or broken
    (no other shard file is replaced), removes the temporary tar, and the dataset equals a
    clean conversion byte for byte and verifies, every frame decoded."""
    point, episode, redone, partial, left = KILLS[moment]
    src = str(golden_dir / AV1)
    dest = tmp_path / "out"
    shutil.copytree(finished, dest)
    damage(dest)
    broken = dataset_files(dest)
    assert sorted(p.episode_index for p in verify_dataset(str(dest))) == list(DAMAGED)

    kill_rerun_at(point, episode, src, dest, tmp_path / "stopped")

    now = dataset_files(dest)
    for i in range(6):
        name = shard_path(i)
        want = clean if i in redone else broken
        assert now.get(name) == want.get(name), f"episode {i}'s shard at the kill ({moment})"
    temps = temp_shards(dest)
    if partial is None:
        assert temps == []
    else:
        (temp,) = temps
        assert temp.name.startswith(f".episode-{partial:06d}.")
        written, whole = temp.read_bytes(), clean[shard_path(partial)]
        assert 0 < len(written) < len(whole) and whole.startswith(written), "not mid-write"
    for name in (INDEX_FILE, MANIFEST_FILE):
        assert now[name] == clean[name]
    if not left:
        assert verify_dataset(str(dest)) == []  # whole again, index.json still the old one

    inodes = {i: p.stat().st_ino for i in range(6) if (p := dest / shard_path(i)).exists()}
    again = convert(src, str(dest), workers=0, progress=False)
    replaced = {i for i in range(6) if (dest / shard_path(i)).stat().st_ino != inodes.get(i)}
    assert (again.converted, replaced) == (len(left), set(left))
    assert temp_shards(dest) == []
    assert dataset_files(dest) == clean
    assert verify_dataset(str(dest), deep=True) == []


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
