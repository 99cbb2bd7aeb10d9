"""The node-local cache of remote episodes: what it downloads, what it serves, what it survives.

A real S3-compatible server on loopback behind the counting proxy (``support/s3.py``); ranks
are processes of their own (``support/cache_job.py``) with RANK, WORLD_SIZE and
LOCAL_WORLD_SIZE set as torchrun sets them. Downloads are the bytes the proxy answered to GETs
of shards. Items are compared with the uncached reader's over the same shards on local disk,
key for key and tensor for tensor (a digest of every tensor's dtype, shape and bytes).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np
import pytest
from support.batches import assert_same_items

import lerobot_shards
from lerobot_shards import DatasetRoot, ShardedLeRobotDataset
from lerobot_shards.format import MANIFEST_FILE
from lerobot_shards.testing.factory import make_dataset
from lerobot_shards.validate import read_manifest

JOB = Path(__file__).parent / "support" / "cache_job.py"
LENGTHS = [9, 14, 11, 20, 8, 17, 12, 15, 10, 19, 13, 16, 9, 18, 12, 14]
DATASET = {"seed": 3, "buffer_size": 3, "return_uint8": True}
"""The readers' settings: a pool much smaller than the dataset, as users run it."""


@dataclass(frozen=True)
class Remote:
    """The shards on S3 (``url``) and on local disk (``local``), and each episode's bytes."""

    url: str
    local: Path
    storage_options: dict
    proxy: object
    prefix: str
    sizes: np.ndarray

    @property
    def total(self) -> int:
        return int(self.sizes.sum())

    def downloaded(self) -> int:
        """Bytes of shards the server answered since the proxy was last cleared."""
        return self.proxy.body_bytes("GET", path_contains=self.prefix)


def upload(s3_server, tmp: Path, lengths: list[int], seed: int) -> Remote:
    """A factory dataset converted locally and uploaded to a fresh bucket."""
    from support.s3 import S3Bucket

    source = make_dataset(
        tmp / "source",
        episode_lengths=lengths,
        cameras={"observation.images.top": (24, 32)},
        seed=seed,
    )
    local = tmp / "shards"
    lerobot_shards.convert(str(source), str(local), workers=0, progress=False)
    s3_server.proxy.set_faults(0.0)
    bucket = S3Bucket(s3_server, s3_server.new_bucket("cache"))
    s3_server.direct_filesystem.put(str(local), f"{bucket.name}/ds", recursive=True)
    manifest = read_manifest(fsspec.filesystem("file"), str(local / MANIFEST_FILE))
    return Remote(
        url=bucket.url("ds"),
        local=local,
        storage_options=bucket.storage_options,
        proxy=s3_server.proxy,
        prefix=f"/{bucket.name}/ds/shards/",
        sizes=manifest.column("size").to_numpy(),
    )


@pytest.fixture(scope="module")
def remote(s3_server, tmp_path_factory: pytest.TempPathFactory) -> Remote:
    return upload(s3_server, tmp_path_factory.mktemp("cache"), LENGTHS, seed=0)


@pytest.fixture(scope="module")
def other_remote(s3_server, tmp_path_factory: pytest.TempPathFactory) -> Remote:
    return upload(s3_server, tmp_path_factory.mktemp("cache-other"), LENGTHS[:10], seed=1)


def start_job(
    remote: Remote,
    tmp: Path,
    *,
    epochs: list[int],
    ranks: int = 1,
    local_world: int | None = None,
    workers: int = 0,
    root: str | None = None,
    **dataset: object,
) -> list[tuple[subprocess.Popen, Path]]:
    """A job's ranks started at once, each a process of its own (``support/cache_job.py``)."""
    started = []
    for rank in range(ranks):
        out = tmp / f"job-{os.urandom(4).hex()}-rank{rank}.json"
        args = {
            "root": root or remote.url,
            "storage_options": remote.storage_options if root is None else {},
            "epochs": epochs,
            "workers": workers,
            "out": str(out),
            "dataset": {**DATASET, **dataset},
        }
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(ranks),
            "LOCAL_WORLD_SIZE": str(local_world or ranks),
            "OMP_NUM_THREADS": "1",
        }
        command = [sys.executable, str(JOB), json.dumps(args)]
        started.append((subprocess.Popen(command, env=env, stderr=subprocess.PIPE), out))
    return started


def finish(job: list[tuple[subprocess.Popen, Path]]) -> list[dict[str, list]]:
    """Each rank's items per epoch, ``(index, digest)`` in delivery order."""
    for proc, _ in job:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err.decode()
    return [json.loads(out.read_text()) for _, out in job]


def run_job(remote: Remote, tmp: Path, **options: object) -> list[dict[str, list]]:
    return finish(start_job(remote, tmp, **options))


@contextmanager
def sampled(measure: Callable[[], int], every_s: float = 0.01) -> Iterator[list[int]]:
    """``measure()`` sampled on a thread for as long as the block runs."""
    samples: list[int] = []
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            samples.append(measure())
            done.wait(every_s)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield samples
    finally:
        done.set()
        thread.join()


def test_one_node_downloads_the_dataset_once(remote: Remote, tmp_path: Path):
    """2 ranks x 2 workers on one node, a cache larger than the dataset: the first epoch
    downloads each episode's bytes once (pieces of one episode in two parts included), the
    next two nothing; every epoch's items are the uncached reader's."""
    cache = {"cache_dir": str(tmp_path / "cache"), "cache_limit_gb": 2 * remote.total / 1e9}
    for epoch in range(3):
        remote.proxy.clear()
        got = run_job(remote, tmp_path, epochs=[epoch], ranks=2, workers=2, **cache)
        downloaded = remote.downloaded()
        want = run_job(
            remote, tmp_path, epochs=[epoch], ranks=2, workers=2, root=str(remote.local),
            cache=False,
        )  # fmt: skip
        assert got == want, f"epoch {epoch}: items differ from the uncached reader's"
        indices = sorted(i for rank in got for i, _ in rank[str(epoch)])
        assert set(indices) == set(range(sum(LENGTHS)))
        if epoch == 0:
            assert abs(downloaded / remote.total - 1) <= 0.01, (downloaded, remote.total)
        else:
            assert downloaded == 0, f"epoch {epoch} downloaded {downloaded} bytes"


def belady(reads: list[int], sizes: np.ndarray, limit: int) -> int:
    """Bytes downloaded by a cache of ``limit`` bytes that, on a miss, keeps the episode if
    evicting the episodes read farthest in the future (and later than it) makes room: the
    offline rule, written here apart from the reader's."""
    cached: set[int] = set()
    downloaded = 0

    def next_read(episode: int, after: int) -> float:
        later = [i for i in range(after + 1, len(reads)) if reads[i] == episode]
        return later[0] if later else float("inf")

    for i, episode in enumerate(reads):
        if episode in cached:
            continue
        downloaded += int(sizes[episode])
        mine = next_read(episode, i)
        if mine == float("inf"):
            continue
        free = limit - sum(int(sizes[e]) for e in cached)
        victims = []
        for other in sorted(cached, key=lambda e: -next_read(e, i)):
            if free >= sizes[episode] or next_read(other, i) <= mine:
                break
            victims.append(other)
            free += int(sizes[other])
        if free >= sizes[episode]:
            cached.difference_update(victims)
            cached.add(episode)
    return downloaded


def planned_reads(ds: ShardedLeRobotDataset, epochs: range) -> list[int]:
    """The one process's fetches, in order: every admission of its plan, epoch by epoch."""
    from lerobot_shards.reader.plan.next_use import admissions

    ordering = ds._context().ordering
    reads = []
    for epoch in epochs:
        part = ds._planner.fresh_parts(ordering, 1, epoch)[0]
        _, pieces = admissions(part.plan(ordering, ds.catalog.cost))
        reads += part.episodes[pieces].tolist()
    return reads


@pytest.mark.parametrize("fraction", [0.25, 0.5])
def test_a_cache_smaller_than_the_dataset_keeps_what_is_read_soonest(
    remote: Remote, tmp_path: Path, fraction: float
):
    """With a cache of a fraction f of the dataset, epochs 2 and 3 download at most (1 - f)
    of it plus one episode, and three epochs no more than Belady's rule on the same reads."""
    limit = int(fraction * remote.total)
    ds = ShardedLeRobotDataset(
        remote.url,
        storage_options=remote.storage_options,
        cache_dir=tmp_path / "cache",
        cache_limit_gb=limit / 1e9,
        **DATASET,
    )
    downloads = []
    for epoch in range(3):
        ds.set_epoch(epoch)
        remote.proxy.clear()
        assert sorted(int(i["index"]) for i in ds) == list(range(sum(LENGTHS)))
        downloads.append(remote.downloaded())
    for epoch in (1, 2):
        assert downloads[epoch] <= (1 - fraction) * remote.total + remote.sizes.max(), downloads
    yardstick = belady(planned_reads(ds, range(3)), remote.sizes, limit)
    assert sum(downloads) <= 1.05 * yardstick, (downloads, yardstick)


def test_a_weighted_mixture_downloads_no_more_than_beladys_rule(remote: Remote, tmp_path: Path):
    """A mixture whose weights read the first half's episodes several times per epoch: eight
    epochs through a cache of a third of the dataset download no more than Belady's rule on
    the plan's reads, plus 5% (the fetches run a little ahead of the plan's order while a pool
    fills, which is what the 5% is for)."""
    limit = remote.total // 3
    EPOCHS = 8
    ds = ShardedLeRobotDataset(
        [
            DatasetRoot(remote.url, episodes=range(8)),
            DatasetRoot(remote.url, episodes=range(8, 16)),
        ],
        weights=[3, 1],
        storage_options=remote.storage_options,
        cache_dir=tmp_path / "cache",
        cache_limit_gb=limit / 1e9,
        **DATASET,
    )
    total = 0
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        remote.proxy.clear()
        assert len(list(ds)) == ds.epoch_samples
        total += remote.downloaded()
    reads = planned_reads(ds, range(EPOCHS))
    assert len(reads) > len(set(reads)) + len(LENGTHS), "the weights read episodes repeatedly"
    # both members are the same shards: a global id's episode is its own index modulo 16
    offsets = ds.catalog.offsets
    own = [r - offsets[int(np.searchsorted(offsets, r, side="right")) - 1] for r in reads]
    yardstick = belady([int(e) for e in own], remote.sizes, limit)
    assert total <= 1.05 * yardstick, (total, yardstick)


def entry_file(folder: Path, checksum: str) -> Path:
    """The cached file of the episode whose manifest checksum is ``checksum``."""
    (found,) = [p for p in (folder / "entries").rglob(checksum.split(":")[1]) if p.is_file()]
    return found


def test_a_changed_cached_file_is_fetched_again_never_served(
    remote: Remote, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A bit flipped in one cached episode and another truncated: the next epoch warns about
    both, downloads exactly those two again, and yields the uncached reader's items."""
    folder = tmp_path / "cache"
    options = {"cache_dir": folder, "cache_limit_gb": 2 * remote.total / 1e9, **DATASET}
    ds = ShardedLeRobotDataset(remote.url, storage_options=remote.storage_options, **options)
    list(ds)
    checksums = ds.catalog.members[0].selection.checksums
    flipped, truncated = entry_file(folder, checksums[3]), entry_file(folder, checksums[7])
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x10
    flipped.write_bytes(bytes(data))
    with open(truncated, "r+b") as f:
        f.truncate(truncated.stat().st_size // 2)

    ds = ShardedLeRobotDataset(remote.url, storage_options=remote.storage_options, **options)
    ds.set_epoch(1)
    remote.proxy.clear()
    with caplog.at_level(logging.WARNING, logger="lerobot_shards.reader.fetch"):
        got = list(ds)
    want = ShardedLeRobotDataset(remote.local, cache=False, **DATASET)
    want.set_epoch(1)
    assert_same_items(got, list(want))
    assert len(caplog.records) == 2, [r.getMessage() for r in caplog.records]
    shards = sorted(
        r.path.rsplit("/", 1)[1] for r in remote.proxy.requests("GET", path_contains=remote.prefix)
    )
    assert shards == ["episode-000003.tar", "episode-000007.tar"]
    assert remote.downloaded() == remote.sizes[3] + remote.sizes[7]


@pytest.mark.parametrize("folder", ["unwritable", "full"])
def test_a_cache_that_cannot_be_written_streams_uncached_with_one_warning(
    remote: Remote, tmp_path: Path, caplog: pytest.LogCaptureFixture, folder: str
):
    """A cache folder that cannot be made (its parent is a file), or a disk with no room:
    two epochs stream every item, with one warning in all."""
    if folder == "unwritable":
        (tmp_path / "a-file").write_text("not a folder")
        cache_dir = tmp_path / "a-file" / "cache"
        mounted = None
    else:
        if sys.platform != "linux" or os.geteuid() != 0:
            pytest.skip("mounting a tiny tmpfs needs root on Linux")
        mounted = cache_dir = tmp_path / "tiny"
        cache_dir.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(cache_dir)], check=True
        )
    try:
        ds = ShardedLeRobotDataset(
            remote.url,
            storage_options=remote.storage_options,
            cache_dir=cache_dir,
            cache_limit_gb=2 * remote.total / 1e9,
            **DATASET,
        )
        want = ShardedLeRobotDataset(remote.local, cache=False, **DATASET)
        with caplog.at_level(logging.WARNING, logger="lerobot_shards.reader.fetch"):
            for epoch in range(2):
                ds.set_epoch(epoch)
                want.set_epoch(epoch)
                assert_same_items(list(ds), list(want))
        warned = [r.getMessage() for r in caplog.records if "cache" in r.getMessage()]
        assert len(warned) == 1, warned
    finally:
        if mounted is not None:
            subprocess.run(["umount", str(mounted)], check=True)


def disk_use(folder: Path) -> int:
    """Bytes of the cache's episodes on disk: entries and downloads being written (a file
    that goes while it is counted counts as gone)."""
    total = 0
    for sub in ("entries", "tmp"):
        for path in (folder / sub).rglob("*"):
            with suppress(FileNotFoundError):
                total += path.stat().st_size if path.is_file() else 0
    return total


@pytest.mark.parametrize("second", ["same dataset", "another dataset"])
def test_two_jobs_share_one_cache_within_its_limit(
    remote: Remote, other_remote: Remote, tmp_path: Path, second: str
):
    """Two jobs at once on one cache folder of half the first dataset: both read exactly the
    uncached reader's items, and the cache's files never exceed the limit."""
    folder = tmp_path / "cache"
    limit = remote.total // 2
    cache = {"cache_dir": str(folder), "cache_limit_gb": limit / 1e9}
    second_remote = remote if second == "same dataset" else other_remote
    with sampled(lambda: disk_use(folder)) as samples:
        jobs = [
            start_job(remote, tmp_path, epochs=[0, 1], workers=2, **cache),
            start_job(second_remote, tmp_path, epochs=[0, 1], workers=2, **cache),
        ]
        got = [finish(job) for job in jobs]
    assert max(samples) <= limit, max(samples)
    for job, which in zip(got, (remote, second_remote), strict=True):
        want = run_job(
            which, tmp_path, epochs=[0, 1], workers=2, root=str(which.local), cache=False
        )
        assert job == want


def children(pid: int) -> list[int]:
    """The process's child processes (its DataLoader workers)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with suppress(FileNotFoundError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="reads child processes from /proc")
def test_jobs_killed_at_random_points_leave_nothing_served(remote: Remote, tmp_path: Path):
    """A job, or one of its DataLoader workers, SIGKILLed at a random moment of its downloads
    and evictions, 20 times over one cache folder of half the dataset: the next job's items
    are exact, no download in progress survives its start, and the limit holds throughout."""
    folder = tmp_path / "cache"
    limit = remote.total // 2
    cache = {"cache_dir": str(folder), "cache_limit_gb": limit / 1e9}
    rng = np.random.default_rng(20)
    killed = 0
    with sampled(lambda: disk_use(folder)) as samples:
        for attempt in range(20):
            epochs = [4 * attempt + k for k in range(4)]  # long enough to be killed mid-way
            ((proc, _),) = start_job(remote, tmp_path, epochs=epochs, workers=2, **cache)
            before = disk_use(folder)
            while proc.poll() is None and disk_use(folder) == before:  # downloads under way
                time.sleep(0.005)
            time.sleep(float(rng.uniform(0.0, 0.5)))
            workers = children(proc.pid)
            if proc.poll() is None:
                victim = workers[0] if workers and attempt % 2 else proc.pid
                with suppress(ProcessLookupError):
                    os.kill(victim, signal.SIGKILL)
                killed += 1
            for pid in [proc.pid, *workers]:  # what the kill left (a whole job's workers)
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.communicate()
        assert killed >= 10, "most attempts must be killed mid-epoch to test anything"
        got = run_job(remote, tmp_path, epochs=[80], workers=2, **cache)
    assert got == run_job(
        remote, tmp_path, epochs=[80], workers=2, root=str(remote.local), cache=False
    )
    assert not [p for p in (folder / "tmp").rglob("*") if p.is_file()]
    assert max(samples) <= limit, max(samples)


NODES_SCRIPT = Path(__file__).parent / "dist_scripts" / "cache_nodes.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(args: dict, nodes: int, out: Path) -> dict[int, dict]:
    """``torchrun --nnodes=nodes`` launched once per node on loopback (2 ranks each); each
    rank's ``{"node", "indices"}``."""
    out.mkdir(parents=True)
    args = {**args, "out": str(out)}
    port = free_port()
    launches = []
    for node in range(nodes):
        where = ["--standalone"] if nodes == 1 else [
            f"--nnodes={nodes}", f"--node_rank={node}", "--master_addr=127.0.0.1",
            f"--master_port={port}",
        ]  # fmt: skip
        command = [
            sys.executable, "-m", "torch.distributed.run", *where, "--nproc_per_node=2",
            str(NODES_SCRIPT), json.dumps(args),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        launches.append(
            subprocess.Popen(command, env=env, stderr=subprocess.PIPE, start_new_session=True)
        )
    for launch in launches:
        try:
            _, err = launch.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for each in launches:
                os.killpg(each.pid, signal.SIGKILL)
            raise
        assert launch.returncode == 0, err.decode()[-5000:]
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in out.glob("rank-*.json")}


def test_two_nodes_each_keep_their_share(remote: Remote, tmp_path: Path):
    """Two nodes (two torchrun launches of 2 ranks, a cache folder each holding half the
    dataset and one episode): every epoch every frame exactly once over the 4 ranks, epochs 2
    and 3 download nothing (each node reads its own share again: node affinity, on by default
    here); a checkpoint taken mid-epoch resumes on one node into exactly the rest."""
    frames = set(range(sum(LENGTHS)))

    def exactly_once(indices: list[int]) -> None:
        """Every frame, and no more repeats than padding allows (fewer than the 8 parts)."""
        assert set(indices) == frames
        assert len(indices) - len(frames) < 8

    args = {
        "root": remote.url,
        "storage_options": remote.storage_options,
        "caches": [str(tmp_path / "node0"), str(tmp_path / "node1")],
        "limit_gb": (remote.total / 2 + remote.sizes.max()) / 1e9,
    }
    for epoch in range(3):
        remote.proxy.clear()
        ranks = launch_nodes({**args, "epoch": epoch}, 2, tmp_path / f"epoch{epoch}")
        assert [ranks[r]["node"] for r in range(4)] == [0, 0, 1, 1]
        exactly_once([i for r in ranks.values() for i in r["indices"]])
        if epoch:
            assert remote.downloaded() == 0, f"epoch {epoch}"
    stopped = launch_nodes({**args, "epoch": 3, "stop_after": 3}, 2, tmp_path / "stopped")
    state = tmp_path / "stopped" / "state-0.json"
    rest = launch_nodes({**args, "epoch": 3, "resume": str(state)}, 1, tmp_path / "resumed")
    taken = [i for r in stopped.values() for i in r["indices"]]
    exactly_once(taken + [i for r in rest.values() for i in r["indices"]])


def test_cache_fill_makes_the_first_epoch_local(remote: Remote, tmp_path: Path):
    """``lerobot-shards cache fill`` with a job's layout (1 rank, 2 workers): its first epoch
    then downloads nothing and yields the uncached reader's items."""
    from click.testing import CliRunner

    from lerobot_shards.cli import main

    folder = tmp_path / "cache"
    remote.proxy.clear()
    limit = str(2 * remote.total / 1e9)
    options = json.dumps(remote.storage_options)
    job = ["--num-workers", "2", "--seed", str(DATASET["seed"])]
    job += ["--buffer-size", str(DATASET["buffer_size"])]
    command = ["cache", "fill", remote.url, "--storage-options", options]
    command += ["--cache-dir", str(folder), "--cache-limit-gb", limit, *job]
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 0, result.output
    assert f"{len(LENGTHS)} episodes" in result.output
    assert remote.downloaded() == remote.total
    remote.proxy.clear()
    cache = {"cache_dir": str(folder), "cache_limit_gb": 2 * remote.total / 1e9}
    got = run_job(remote, tmp_path, epochs=[0], workers=2, **cache)
    assert remote.downloaded() == 0
    assert got == run_job(
        remote, tmp_path, epochs=[0], workers=2, root=str(remote.local), cache=False
    )


def test_which_roots_are_cached_by_default(remote: Remote, tmp_path: Path):
    """Remote roots are cached by default, local ones not unless a folder is given; False is
    off for any root."""
    options = {"storage_options": remote.storage_options}
    assert ShardedLeRobotDataset(remote.url, **options).cache is not None
    assert ShardedLeRobotDataset(remote.url, cache=False, **options).cache is None
    assert ShardedLeRobotDataset(remote.local).cache is None
    assert ShardedLeRobotDataset(remote.local, cache_dir=tmp_path).cache is not None
    assert ShardedLeRobotDataset(remote.local, cache_dir=tmp_path, cache=False).cache is None
