"""One conversion per destination: a second convert on a locked destination is refused with
the holder's name, never disturbs the first, and a dead holder's lock or lease is no obstacle."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest

from lerobot_shards import convert
from lerobot_shards.converter import lock as lock_module
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.converter.lock import LOCK_FILE, DestinationLocked, Holder
from lerobot_shards.format import INDEX_FILE, MANIFEST_FILE
from lerobot_shards.testing.factory import make_dataset

CLI = [sys.executable, "-m", "lerobot_shards.cli"]
EPISODES = 40


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Episodes enough that a conversion is stopped (SIGSTOP) with some of them done."""
    return make_dataset(
        tmp_path_factory.mktemp("lock") / "src",
        episode_lengths=[4] * EPISODES,
        cameras={"observation.images.cam": (24, 32)},
        video_files_size_in_mb=0.05,
    )


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=os.environ.copy(),
    )  # fmt: skip


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.01)


def test_a_second_convert_is_refused_and_the_first_finishes(source: Path, tmp_path: Path):
    dest = tmp_path / "out"
    argv = [*CLI, "convert", str(source), str(dest), "--workers", "1", "--no-progress"]
    first = start(argv)
    try:
        wait_for(lambda: any(dest.glob("shards/*/*.tar")), first, "shard")
        os.killpg(first.pid, signal.SIGSTOP)  # a slow first convert, mid-way
        assert first.poll() is None, "the first convert ended before it was stopped"
        second = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        out, err = first.communicate(timeout=300)
    assert second.returncode == 1
    message = " ".join(second.stderr.split())
    assert "another conversion is writing here" in message
    assert f"pid {first.pid} on {socket.gethostname()}" in message and "since" in message
    assert "wait for it to finish" in message
    assert first.returncode == 0, err
    assert f"{EPISODES} episodes ({EPISODES} converted, 0 already done)" in out
    assert verify_dataset(str(dest)) == []
    assert not list(dest.glob("shards/*/.*.tmp"))

    again = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"(0 converted, {EPISODES} already done)" in again.stdout


def test_a_killed_holder_is_no_obstacle(source: Path, tmp_path: Path):
    """flock goes with its process: a SIGKILLed convert's lock is free at once, and the rerun
    removes the temporary files it left."""
    dest = tmp_path / "out"
    argv = [*CLI, "convert", str(source), str(dest), "--workers", "1", "--no-progress"]
    first = start(argv)
    wait_for(lambda: len(list(dest.glob("shards/*/*.tar"))) >= 3, first, "3 shards")
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    holder = Holder.from_json((dest / LOCK_FILE).read_bytes())
    assert holder is not None and holder.pid == first.pid
    (dest / "shards/000/.episode-000159.deadbeef-1-0.tmp").write_bytes(b"left by a dead run")
    summary = convert(str(source), str(dest), workers=0, progress=False)
    assert summary.episodes == EPISODES and summary.converted < EPISODES
    assert not list(dest.glob("shards/*/.*.tmp"))
    assert verify_dataset(str(dest)) == []


# --- object storage: a lease created only if absent ---


def test_a_second_convert_to_s3_is_refused_while_the_first_holds_its_lease(
    source: Path, s3_bucket, tmp_path: Path
):
    url = s3_bucket.url("out")
    fs = s3_bucket.server.direct_filesystem
    lease = f"{s3_bucket.name}/out/{LOCK_FILE}"
    first = start([*CLI, "convert", str(source), url, "--workers", "1", "--no-progress"])
    try:
        wait_for(lambda: fs.exists(lease) or fs.invalidate_cache(), first, "lease", 90)
        os.killpg(first.pid, signal.SIGSTOP)  # a slow first convert, mid-way
        assert first.poll() is None, "the first convert ended before it was stopped"
        with pytest.raises(DestinationLocked) as refused:
            convert(str(source), url, dest_storage_options=s3_bucket.storage_options,
                    workers=0, progress=False)  # fmt: skip
    finally:
        os.killpg(first.pid, signal.SIGCONT)
        _, err = first.communicate(timeout=300)
    message = str(refused.value)
    assert f"pid {first.pid} on {socket.gethostname()}" in message
    assert "lease" in message and "wait for it to finish" in message
    assert first.returncode == 0, err
    fs.invalidate_cache()
    assert not fs.exists(lease), "the lease outlived its run"
    local = tmp_path / "local"
    convert(str(source), str(local), workers=0, progress=False)
    for name in (INDEX_FILE, MANIFEST_FILE):
        assert fs.cat_file(f"{s3_bucket.name}/out/{name}") == (local / name).read_bytes()


def _plant_lease(s3_bucket, age: float) -> str:
    fs = s3_bucket.server.direct_filesystem
    path = f"{s3_bucket.name}/out/{LOCK_FILE}"
    holder = Holder("elsewhere", 4242, "f" * 32, "2026-01-01T00:00:00+00:00", time.time() - age)
    fs.pipe_file(path, json.dumps(vars(holder)).encode())
    return path


def test_a_fresh_lease_of_another_host_is_respected(source: Path, s3_bucket):
    _plant_lease(s3_bucket, age=5)
    with pytest.raises(DestinationLocked, match=r"pid 4242 on elsewhere .*since 2026-01-01"):
        convert(
            str(source), s3_bucket.url("out"), episodes=[0],
            dest_storage_options=s3_bucket.storage_options, workers=0, progress=False,
        )  # fmt: skip


def test_a_stale_lease_is_taken_over_with_a_warning(
    source: Path, s3_bucket, caplog: pytest.LogCaptureFixture
):
    path = _plant_lease(s3_bucket, age=lock_module.LEASE_TIMEOUT_S + 5)
    with caplog.at_level(logging.WARNING, logger=lock_module.__name__):
        summary = convert(str(source), s3_bucket.url("out"), episodes=[0, 1],
                          dest_storage_options=s3_bucket.storage_options, workers=0,
                          progress=False)  # fmt: skip
    assert summary.converted == 2
    assert "taking over the lease of pid 4242 on elsewhere" in caplog.text
    fs = s3_bucket.server.direct_filesystem
    fs.invalidate_cache()
    assert not fs.exists(path)


def test_a_lease_taken_over_stops_its_old_holder(
    source: Path, s3_bucket, monkeypatch: pytest.MonkeyPatch
):
    """A holder that missed its refreshes and lost its lease to another run stops at its next
    refresh instead of writing beside the new holder."""
    monkeypatch.setattr(lock_module, "LEASE_REFRESH_S", 0.05)
    fs = fsspec.filesystem("s3", **s3_bucket.storage_options, skip_instance_cache=True)
    root = f"{s3_bucket.name}/out"
    held = lock_module.acquire_lock(fs, root, "s3://" + root, "a" * 32)
    try:
        _plant_lease(s3_bucket, age=0)  # another run's write: the ETag changes
        deadline = time.monotonic() + 10
        while held._lost is None:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with pytest.raises(Exception, match="took over this run's lease"):
            held.check()
    finally:
        held.release()
    assert fs.exists(f"{root}/{LOCK_FILE}"), "the old holder deleted the new holder's lease"
