"""Converting to and streaming from a real S3-compatible server (moto on loopback, via s3fs).

The proxy in front of the server records every request, so the tests count what the reader
asked for: one ranged read per episode per epoch, and bytes within 2% of what the dataset is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pytest
import torch
from support.s3 import S3Bucket, S3Server

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import INDEX_FILE, MANIFEST_FILE, manifest_rows, shard_path
from lerobot_shards.testing.factory import make_dataset
from lerobot_shards.validate import read_manifest

pytestmark = pytest.mark.timeout(240)

AV1 = "av1_multifile"
FRAMES = 74


def _convert_local(source: Path, dest: Path) -> Path:
    lerobot_shards.convert(str(source), str(dest), workers=0, progress=False)
    return dest


@pytest.fixture(scope="module")
def local_av1(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The golden dataset converted to a local folder: the reference."""
    return _convert_local(golden_dir / AV1, tmp_path_factory.mktemp("local") / AV1)


def _manifest(fs, root: str) -> list:
    return manifest_rows(read_manifest(fs, f"{root}/{MANIFEST_FILE}"))


def _assert_same_items(got: list[dict], want: list[dict]) -> None:
    assert [int(i["index"]) for i in got] == [int(i["index"]) for i in want]
    for a, b in zip(got, want, strict=True):
        assert list(a) == list(b)
        for key, value in b.items():
            if isinstance(value, torch.Tensor):
                assert a[key].dtype == value.dtype, key
                assert torch.equal(a[key], value), (int(b["index"]), key)
            else:
                assert a[key] == value, (int(b["index"]), key)


@pytest.fixture(scope="module")
def s3_av1(s3_server: S3Server, golden_dir: Path) -> tuple[S3Bucket, str]:
    """The golden dataset converted straight to ``s3://<fresh bucket>/av1_multifile``."""
    s3_server.proxy.set_faults(0.0)
    bucket = S3Bucket(s3_server, s3_server.new_bucket("converted"))
    url = bucket.url(AV1)
    summary = lerobot_shards.convert(
        str(golden_dir / AV1),
        url,
        dest_storage_options=bucket.storage_options,
        workers=0,
        progress=False,
    )
    assert (summary.episodes, summary.frames) == (6, FRAMES)
    return bucket, url


def test_s3_conversion_equals_the_local_one(s3_av1: tuple[S3Bucket, str], local_av1: Path):
    bucket, _ = s3_av1
    fs = bucket.server.direct_filesystem
    fs.invalidate_cache()
    root = f"{bucket.name}/{AV1}"
    assert _manifest(fs, root) == _manifest(fsspec.filesystem("file"), str(local_av1))
    for row in _manifest(fs, root):
        assert fs.cat_file(f"{root}/{row.shard}") == (local_av1 / row.shard).read_bytes()
    assert fs.exists(f"{root}/{INDEX_FILE}")


def test_verify_a_dataset_on_s3(s3_av1: tuple[S3Bucket, str]) -> None:
    bucket, url = s3_av1
    assert verify_dataset(url, storage_options=bucket.storage_options) == []


def test_stream_from_s3_one_ranged_read_per_episode_per_epoch(
    s3_av1: tuple[S3Bucket, str], local_av1: Path
) -> None:
    """Items equal the local ones in the same order, every index once; per epoch one ranged
    GET per episode, and bytes within 2% of the shards plus the metadata files."""
    bucket, url = s3_av1
    proxy = bucket.proxy
    proxy.set_faults(0.0)
    fs = bucket.server.direct_filesystem
    fs.invalidate_cache()
    prefix = f"{bucket.name}/{AV1}/"
    rows = _manifest(fs, prefix.rstrip("/"))
    shard_bytes = sum(r.size for r in rows)
    meta_bytes = sum(
        info["size"]
        for path, info in fs.find(prefix, detail=True).items()
        if not path.removeprefix(prefix).startswith(("shards/", ".convert/"))
    )
    want_gets = sorted(
        (f"/{prefix}{r.shard}", f"bytes={r.offset}-{r.offset + r.size - 1}", r.size) for r in rows
    )

    proxy.clear()
    # the reader without its cache (on for remote roots: tests/test_cache.py counts its reads)
    ds = ShardedLeRobotDataset(
        url, storage_options=bucket.storage_options, seed=5, buffer_size=3, cache=False
    )
    ref = ShardedLeRobotDataset(local_av1, seed=5, buffer_size=3)
    for epoch in range(2):
        items = list(ds)
        _assert_same_items(items, list(ref))
        assert sorted(int(i["index"]) for i in items) == list(range(FRAMES))

        shard_gets = proxy.requests("GET", path_contains=f"/{prefix}shards/")
        got_gets = sorted((q.path, q.range, q.body_bytes) for q in shard_gets)
        assert got_gets == want_gets, f"epoch {epoch}: not one ranged read per episode"
        assert [q for q in proxy.log if q.status not in (200, 206)] == []
        total = proxy.body_bytes()
        if epoch == 0:
            # Opening the dataset also read index.json, the manifest and meta/.
            budget = shard_bytes + meta_bytes
            assert shard_bytes < total <= 1.02 * budget, (total, shard_bytes, meta_bytes)
        else:
            assert total == shard_bytes, "a later epoch read more than the shards"
        proxy.clear()


def test_conversion_to_s3_killed_midway_resumes_and_completes(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real ``lerobot-shards convert`` to S3 (credentials and endpoint from the environment,
    as users run it), SIGKILLed after a few episodes; the rerun finishes the rest."""
    episodes, stalled = 48, 40
    src = make_dataset(
        tmp_path / "src",
        episode_lengths=[3] * episodes,
        cameras={"observation.images.cam": (24, 32)},
        video_files_size_in_mb=0.01,
    )
    url = s3_bucket.url("killed")
    done = f"/{s3_bucket.name}/killed/.convert/done/"
    proxy = s3_bucket.proxy
    # The upload of episode 40's shard is held unanswered, so the run cannot finish before the
    # kill however slowly this loop polls (it once finished all 48 first on a busy machine).
    monkeypatch.setattr(proxy, "stall_s", 120.0)
    proxy.set_faults(
        1.0, kinds=("stall",), methods=["PUT"], path_contains=f"/killed/{shard_path(stalled)}"
    )
    cmd = [sys.executable, "-m", "lerobot_shards.cli", "convert", str(src), url]
    proc = subprocess.Popen(
        [*cmd, "--workers", "1", "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=os.environ.copy(),  # the session's isolated AWS settings point at the test server
    )
    try:
        deadline = time.monotonic() + 90
        while len(proxy.requests("PUT", path_contains=done)) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "no episode finished within 90 s"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        proxy.set_faults(0.0)
    fs = s3_bucket.server.direct_filesystem
    fs.invalidate_cache()
    root = f"{s3_bucket.name}/killed"
    assert not fs.exists(f"{root}/{INDEX_FILE}"), "the conversion finished before it was killed"
    finished = len(fs.find(f"{root}/.convert/done"))
    assert 3 <= finished <= stalled

    summary = lerobot_shards.convert(
        str(src), url, dest_storage_options=s3_bucket.storage_options, workers=0, progress=False
    )
    assert (summary.episodes, summary.converted) == (episodes, episodes - finished)

    fs.invalidate_cache()
    local = _convert_local(src, tmp_path / "local")
    assert _manifest(fs, root) == _manifest(fsspec.filesystem("file"), str(local))
    ds = ShardedLeRobotDataset(
        url, storage_options=s3_bucket.storage_options, shuffle=False, cache=False
    )
    assert [int(i["index"]) for i in ds] == list(range(3 * episodes))


def test_server_is_loopback_only(s3_server: S3Server) -> None:
    """The fixture's endpoints and environment point at 127.0.0.1 and carry only test keys."""
    for url in (s3_server.endpoint_url, s3_server.direct_endpoint_url):
        assert url.startswith("http://127.0.0.1:")
    assert os.environ["AWS_ENDPOINT_URL"] == s3_server.endpoint_url
    assert os.environ["AWS_ACCESS_KEY_ID"] == "testing"
    assert "AWS_PROFILE" not in os.environ
    assert not Path(os.environ["AWS_SHARED_CREDENTIALS_FILE"]).exists()


def test_a_mixture_streams_from_s3_and_local_with_each_datasets_own_options(
    local_av1: Path, s3_bucket: S3Bucket, shards
) -> None:
    """One dataset on the S3 server (its own storage options), one local: the mixture's items
    through 2 DataLoader workers equal the same mixture read all locally."""
    from torch.utils.data import DataLoader

    from lerobot_shards import DatasetRoot

    image = shards("image")
    fs = s3_bucket.server.filesystem()
    url = s3_bucket.url("image")
    fs.put(str(image), url, recursive=True)
    s3_bucket.proxy.clear()

    def items(first_root) -> list[dict]:
        ds = ShardedLeRobotDataset([first_root, local_av1], weights=[2, 1], seed=8, buffer_size=2)
        ds.num_workers = 2
        out = list(DataLoader(ds, batch_size=None, num_workers=2))
        assert len(out) == ds.epoch_samples
        return sorted(out, key=lambda i: (int(i["dataset_index"]), int(i["index"])))

    ShardedLeRobotDataset([DatasetRoot(url, storage_options=s3_bucket.storage_options)])
    # opening reads each small file whole: index, manifest, info, tasks, stats, one GET each
    assert [r.method for r in s3_bucket.proxy.requests()] == ["GET"] * 5
    remote = items(DatasetRoot(url, storage_options=s3_bucket.storage_options))
    local = items(image)
    _assert_same_items(remote, local)
    assert s3_bucket.proxy.requests("GET", path_contains="/image/shards/")  # fetched from S3


def test_forked_dataloader_workers_stream_from_s3(
    s3_av1: tuple[S3Bucket, str], local_av1: Path, tmp_path: Path
) -> None:
    """DataLoader workers *forked* (the Linux default) from a process that already read from S3.

    A training script (``support/fork_epochs.py``, its own process, killed if it hangs) reads
    epoch 0 in its main process, epochs 0 and 1 through 2 forked workers, then epoch 0 in its
    main process again. Every epoch equals the local reader's in the same layout, item for item
    and in order; every episode is read as planned, none twice. The main process's s3fs
    connections survive the workers: before the reader kept inherited filesystems alive
    (``catalog._INHERITED``), a worker's garbage collection closed them from the child, their
    sockets left the main process's epoll, and its next epoch stalled 15 s on a read timeout,
    read an episode twice and workers printed asyncio tracebacks.
    """
    import json

    from torch.utils.data import DataLoader

    bucket, url = s3_av1
    proxy = bucket.proxy
    proxy.set_faults(0.0)
    out = tmp_path / "items.pt"
    script = Path(__file__).parent / "support" / "fork_epochs.py"
    proxy.clear()
    proc = subprocess.Popen(
        [sys.executable, str(script), url, json.dumps(bucket.storage_options), str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # the workers too are killed if it hangs
    )
    try:
        _, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the script hung:\n{stderr.decode()[-3000:]}")
    assert proc.returncode == 0, stderr.decode()[-3000:]
    assert b"Traceback" not in stderr, stderr.decode()[-3000:]
    got = torch.load(out, weights_only=False)

    ref = ShardedLeRobotDataset(local_av1, seed=3)
    single = list(ref)
    ref.num_workers = 2
    workers = []
    for epoch in (0, 1):
        ref.set_epoch(epoch)
        workers.append(list(DataLoader(ref, batch_size=None, num_workers=2)))
    _assert_same_items(got["single"], single)
    _assert_same_items(got["after"], single)
    for epoch in (0, 1):
        _assert_same_items(got["fork"][epoch], workers[epoch])
        assert sorted(int(i["index"]) for i in got["fork"][epoch]) == list(range(FRAMES))
    assert [int(i["index"]) for i in got["fork"][0]] != [int(i["index"]) for i in single]

    fs = bucket.server.direct_filesystem
    rows = _manifest(fs, f"{bucket.name}/{AV1}")
    gets = proxy.requests("GET", path_contains="/shards/")
    assert [r for r in proxy.log if r.status not in (200, 206)] == []
    span = {r.episode_index: f"bytes={r.offset}-{r.offset + r.size - 1}" for r in rows}
    # The main process reads each episode once per epoch; a worker each episode it draws from
    # (the DataLoader takes the 2 workers' items in turn; an episode cut between the workers'
    # parts is read by both).
    want = [span[e] for e in span for _ in range(2)]
    for items in got["fork"]:
        want += [span[e] for w in (0, 1) for e in {int(i["episode_index"]) for i in items[w::2]}]
    assert sorted(r.range for r in gets) == sorted(want), "an episode read more than planned"
    assert got["lost"] == [], "the main process's event loop lost its sockets"
    assert got["seconds"]["after"] < 10, got["seconds"]  # a read timeout is 15 s
