"""Shared fixtures: the golden LeRobot datasets (v3.0 by LeRobot 0.6.1, v2.1 by LeRobot 0.3.3)
and throwaway copies of datasets; hypothesis's profiles."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import fsspec
import pytest
from hypothesis import HealthCheck, settings

# Property tests: in CI (the environment variable CI set, not to 0 or false: .ci/run sets it,
# as CI services do) the examples are derandomized, so a run is the same on every push and a
# failure the same on a rerun, with no example database carried over; elsewhere they are random,
# to find new cases. Either way a failure prints the @reproduce_failure blob that replays it. A
# test's own @settings (its max_examples; the fuzz's derandomize and database) win over these.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    print_blob=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],  # a loaded CI machine is slow, not wrong
)
# From hypothesis's defaults, not from whatever profile is loaded (its own "ci", where CI is set).
settings.register_profile("dev", settings.get_profile("default"), print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "dev")

if TYPE_CHECKING:
    from support.s3 import S3Bucket, S3Server

GOLDEN_DIR = Path(__file__).parent / "data" / "lerobot-0.6.1"
GOLDEN_V21_DIR = Path(__file__).parent / "data" / "lerobot-0.3.3-v2.1"
GOLDEN: dict[str, Path] = {
    "av1_multifile": GOLDEN_DIR,
    "image": GOLDEN_DIR,
    "depth_video": GOLDEN_DIR,
    "depth_image": GOLDEN_DIR,
    "language": GOLDEN_DIR,
    "language_none": GOLDEN_DIR,
    "v21_video": GOLDEN_V21_DIR,
    "v21_image": GOLDEN_V21_DIR,
    "aggregated": GOLDEN_DIR,
    "aggregated_image": GOLDEN_DIR,
}
"""Each golden dataset's folder, which holds it and the items LeRobot returned for it."""


def pytest_configure(config: pytest.Config) -> None:
    """DataLoader workers start from a forkserver, not by forking the test process.

    The test process runs threads (S3 server, proxies, prefetch pools, queue feeders); forking
    it while one of them starts or exits can deadlock the child inside CPython's after-fork
    code (seen here: a worker stuck in ``PyOS_AfterFork_Child``). A forkserver has no such
    threads. Tests that need plain fork (the Linux default) ask for it explicitly.

    And the session may not take real-time scheduling: an AV1 encoder a test opens (PyAV's,
    LeRobot's recorder) would make this process real-time as root, and every process it starts
    after (``lerobot_shards.testing.video.scheduling_kept`` says why that hangs tests).
    """
    from lerobot_shards.testing.video import forbid_realtime_scheduling

    multiprocessing.set_start_method("forkserver", force=True)
    forbid_realtime_scheduling()
    multiprocessing.set_forkserver_preload(["torch", "av", "lerobot_shards.reader.loading.dataset"])


@pytest.fixture(autouse=True)
def episode_cache_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Each test's default cache of remote episodes in a folder of its own (never the user's
    cache, and never an earlier test's: entries are keyed by content, and tests that convert
    the same data would otherwise read each other's)."""
    folder = tmp_path_factory.mktemp("episode-cache")
    monkeypatch.setenv("LEROBOT_SHARDS_CACHE_DIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def golden_dir() -> Path:
    """Folder of the golden datasets and their recorded items (see its README.md)."""
    return GOLDEN_DIR


@pytest.fixture(scope="session")
def golden_path() -> Callable[[str], Path]:
    """``golden_path(name)``: the golden dataset ``name`` (any of ``GOLDEN``); its recorded items
    are beside it (``<name>.items.npz``, ``<name>.delta.items.npz``)."""
    return lambda name: GOLDEN[name] / name


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``shards(name)``: the golden dataset ``name`` (any of ``GOLDEN``) converted once per
    session (read-only: tests that damage shards work on a copy)."""
    import lerobot_shards

    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            dest = tmp_path_factory.mktemp("shards") / name
            lerobot_shards.convert(str(GOLDEN[name] / name), str(dest), workers=0, progress=False)
            made[name] = dest
        return made[name]

    return get


@pytest.fixture(scope="session")
def av1(shards: Callable[[str], Path]) -> Path:
    """The golden ``av1_multifile`` dataset, converted."""
    return shards("av1_multifile")


@pytest.fixture(scope="session")
def golden_delta_timestamps() -> dict[str, list[float]]:
    """The delta_timestamps the golden ``*.delta.items.npz`` were recorded with."""
    return {
        "action": [0.0, 0.1, 0.2, 0.3],
        "observation.images.cam_high": [-0.2, -0.1, 0.0],
        "observation.state": [-0.1, 0.0],
    }


@pytest.fixture
def golden_copy(tmp_path: Path) -> Callable[[str], Path]:
    """``golden_copy(name)`` copies a golden dataset into tmp_path, for tests that damage it."""

    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(GOLDEN_DIR / name, dest)
        return dest

    return copy


@pytest.fixture
def to_memory() -> Iterator[Callable[[Path], str]]:
    """``to_memory(local_dir)`` copies a folder into fsspec's memory filesystem; returns its URL."""
    fs = fsspec.filesystem("memory")
    roots: list[str] = []

    def copy(local_dir: Path) -> str:
        root = f"/{uuid.uuid4().hex}"
        for path in sorted(Path(local_dir).rglob("*")):
            if path.is_file():
                fs.pipe(f"{root}/{path.relative_to(local_dir).as_posix()}", path.read_bytes())
        roots.append(root)
        return f"memory://{root}"

    yield copy
    for root in roots:
        fs.rm(root, recursive=True)


# --- S3: moto's standalone server on loopback, a recording/fault proxy in front ---


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """One moto server for the session, reached through ``s3_server.proxy``.

    The environment is pinned to the test keys and endpoint for the whole session, so neither
    this process nor its children can pick up real AWS credentials or config.
    """
    from support.s3 import isolated_aws_env, running_s3_server  # moto is slow to import

    with running_s3_server() as server, pytest.MonkeyPatch.context() as mp:
        scratch = tmp_path_factory.mktemp("aws")
        for name, value in isolated_aws_env(server.endpoint_url, scratch).items():
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, value)
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> Iterator[S3Bucket]:
    """A fresh bucket; the proxy's log is cleared and its faults are off when the test starts."""
    from support.s3 import S3Bucket

    s3_server.proxy.set_faults(0.0)
    bucket = S3Bucket(s3_server, s3_server.new_bucket())
    s3_server.proxy.clear()
    yield bucket
    s3_server.proxy.set_faults(0.0)
