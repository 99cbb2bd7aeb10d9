"""The Ray executor: same bytes as the local executor, retried worker deaths, failures and resume.

One local Ray instance (2 CPUs, loopback only, no dashboard, no usage stats) serves the whole
session; a test that needs Ray is skipped, with the reason, only where Ray does not import.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner
from support.required import importorskip

from lerobot_shards import convert
from lerobot_shards.cli import main
from lerobot_shards.converter import ray_executor
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.converter.job import DONE_DIR, read_records
from lerobot_shards.converter.lock import LOCK_FILE
from lerobot_shards.converter.run import ConvertError, convert_episode
from lerobot_shards.format import INDEX_FILE, MANIFEST_FILE, checksum, shard_path
from lerobot_shards.testing.factory import make_dataset

NO_RAY = "ray is not installed (pip install 'lerobot-shards[ray]'); CI installs it"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[str]:
    """A local Ray instance for the session; yields its address."""
    ray = importorskip("ray", reason=NO_RAY)
    with pytest.MonkeyPatch.context() as mp:
        # Set before ray.init, so Ray's own processes and workers inherit them.
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        # Ray's switch for single-machine clusters: use and bind 127.0.0.1, never look up the
        # host's address on the network.
        mp.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        mp.delenv("RAY_ADDRESS", raising=False)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def golden(golden_dir: Path) -> Path:
    return golden_dir / "av1_multifile"


@pytest.fixture(scope="module")
def reference(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Every file of the golden dataset converted by the local executor."""
    dest = tmp_path_factory.mktemp("local") / "out"
    convert(str(golden), str(dest), workers=0, progress=False)
    return tree(dest)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (shards, manifest, index, meta) by path, and the resume
    records (which each process logs under a name of its own) under ``DONE_DIR``; not the lock,
    which names the run that held it."""
    files = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
        and not p.relative_to(root).as_posix().startswith(DONE_DIR)
        and p.relative_to(root).as_posix() != LOCK_FILE
    }
    records = read_records(fsspec.filesystem("file"), str(root))
    files[DONE_DIR] = repr(sorted(records.items())).encode()
    return files


def assert_same_conversion(got: dict[str, bytes], want: dict[str, bytes]) -> None:
    assert got[MANIFEST_FILE] == want[MANIFEST_FILE]
    shards = sorted(p for p in want if p.startswith("shards/"))
    assert sorted(p for p in got if p.startswith("shards/")) == shards
    for p in shards:
        assert checksum(got[p]) == checksum(want[p]), p
    assert sorted(got) == sorted(want)
    for p in want:
        assert got[p] == want[p], p


def finished_episodes(dest: Path) -> set[int]:
    return set(read_records(fsspec.filesystem("file"), str(dest)))


# --------------------------------------------------------------------------------------------


def test_ray_gives_the_bytes_of_the_local_executor(
    ray_cluster: str, golden: Path, reference: dict[str, bytes], tmp_path: Path
):
    summary = convert(str(golden), str(tmp_path / "out"), executor="ray", progress=False)
    assert (summary.episodes, summary.converted, summary.frames) == (6, 6, 74)
    assert_same_conversion(tree(tmp_path / "out"), reference)


def test_cli_connects_to_a_running_cluster(
    ray_cluster: str, golden: Path, reference: dict[str, bytes], tmp_path: Path
):
    """A separate driver process, as on a real cluster: ``--ray-address`` of a running Ray."""
    dest = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "lerobot_shards.cli", "convert", str(golden), str(dest),
         "--executor", "ray", "--ray-address", ray_cluster, "--max-in-flight", "1"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "6 episodes (6 converted, 0 already done), 74 frames" in result.stdout
    assert "convert: 100%" in result.stderr  # the progress bar, on the driver
    assert_same_conversion(tree(dest), reference)


def test_a_worker_that_dies_is_retried_without_duplicating_output(
    ray_cluster: str,
    golden: Path,
    reference: dict[str, bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    died = tmp_path / "died"
    died.mkdir()

    def dies_on_first_attempt(args, episode_index):
        """Episode 2's worker dies before writing anything, episode 4's after writing its shard
        and record; each only on its first attempt (the marker file says it already died)."""
        if episode_index not in (2, 4):
            return convert_episode(args, episode_index)
        try:
            os.close(os.open(died / str(episode_index), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return convert_episode(args, episode_index)
        if episode_index == 4:
            convert_episode(args, episode_index)
        os._exit(1)

    # Ray ships this closure to its workers by value, in place of the real task function.
    monkeypatch.setattr(ray_executor, "convert_episode", dies_on_first_attempt)
    summary = convert(str(golden), str(tmp_path / "out"), executor="ray", progress=False)
    assert sorted(p.name for p in died.iterdir()) == ["2", "4"]
    assert (summary.episodes, summary.converted) == (6, 6)
    assert_same_conversion(tree(tmp_path / "out"), reference)


def test_a_failed_episode_is_named_and_a_rerun_converts_only_what_is_missing(
    ray_cluster: str, tmp_path: Path
):
    src = make_dataset(tmp_path / "src", version="v2.1")  # one mp4 per episode and camera
    convert(str(src), str(tmp_path / "local"), workers=0, progress=False)
    video = src / "videos/chunk-000/observation.images.cam_high/episode_000005.mp4"
    good = video.read_bytes()
    video.write_bytes(good[: len(good) // 2])

    dest = tmp_path / "ray"
    # One episode in flight: 0-4 are done by the time the last, damaged, one fails.
    with pytest.raises(ConvertError, match=r"^episode 5 camera .*episode_000005\.mp4"):
        convert(str(src), str(dest), executor="ray", max_in_flight=1, progress=False)
    assert not (dest / INDEX_FILE).exists()
    done = finished_episodes(dest)
    assert done == {0, 1, 2, 3, 4}
    before = {i: (dest / shard_path(i)).stat() for i in done}

    video.write_bytes(good)
    summary = convert(str(src), str(dest), executor="ray", progress=False)
    assert (summary.episodes, summary.converted) == (6, 1)
    for i, st in before.items():
        now = (dest / shard_path(i)).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), f"episode {i} redone"
    assert_same_conversion(tree(dest), tree(tmp_path / "local"))


def test_ray_refuses_memory_paths(ray_cluster: str, golden: Path, to_memory):
    src = to_memory(golden)
    with pytest.raises(ConvertError, match="memory:// lives in one process"):
        convert(src, src + "-out", executor="ray", progress=False)
    assert not fsspec.filesystem("memory").exists(src.removeprefix("memory://") + "-out")


def test_without_ray_the_ray_executor_says_how_to_install_it(
    golden: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    dest = tmp_path / "out"
    result = CliRunner().invoke(main, ["convert", str(golden), str(dest), "--executor", "ray"])
    assert result.exit_code == 1
    assert "install it with: pip install 'lerobot-shards[ray]'" in result.output
    assert not dest.exists()


def test_ray_options_are_checked(golden: Path, tmp_path: Path):
    runner = CliRunner()
    dest = str(tmp_path / "out")
    result = runner.invoke(main, ["convert", str(golden), dest, "--ray-address", "auto"])
    assert result.exit_code == 2
    assert "--ray-address needs --executor ray" in result.output
    result = runner.invoke(
        main, ["convert", str(golden), dest, "--executor", "ray", "--workers", "2"]
    )
    assert result.exit_code == 1
    assert "workers is for the local executor" in result.output
    assert not Path(dest).exists()


def test_verify_checks_shards_on_ray(ray_cluster: str, golden: Path, tmp_path: Path):
    """``verify --executor ray``: the shards checked as Ray tasks find what one process finds."""
    dest = tmp_path / "out"
    convert(str(golden), str(dest), workers=0, progress=False)
    flipped = dest / shard_path(2)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 1
    flipped.write_bytes(bytes(data))
    here = verify_dataset(str(dest))
    assert [p.episode_index for p in here] == [2]
    assert verify_dataset(str(dest), executor="ray") == here
