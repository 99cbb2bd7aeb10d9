"""The node-local cache's store (issue 38, items 2, 5 and 6; issue 42, items 2 to 5):
content-addressed entries verified on every read, Belady's admission and eviction over every
job's hints, a limit that holds at all times across processes with different limits (evicted
files still mapped counted, sampled under the store's lock), a free-space floor that counts
downloads admitted, at-most-once downloads, crash safety at each named stage, opens that race
evictions, transient failures that cost one read, and a folder that cannot be used.

Processes are real (spawned) wherever processes matter; what the store says is checked against
the folder itself (file sizes on disk, deleted files still mapped read from /proc, the
database read directly, sha256 from hashlib).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import math
import multiprocessing as mp
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import fsspec
import pytest
from click.testing import CliRunner

from lerobot_shards.cli import main
from lerobot_shards.reader.fetch import cache as cache_module
from lerobot_shards.reader.fetch import cache_files as files_module
from lerobot_shards.reader.fetch import mapped
from lerobot_shards.reader.fetch.cache import (
    CacheBusy,
    CacheStore,
    CacheUnavailable,
    Ready,
    Reservation,
    Wait,
)
from lerobot_shards.reader.fetch.cached import CachedReads
from lerobot_shards.reader.fetch.ranged import Span

SRC = Path(__file__).resolve().parents[1] / "src"
NEVER = lambda key: None  # noqa: E731  (the caller knows none of the cached keys)


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def key_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put(
    store: CacheStore, data: bytes, next_use: float, priority=NEVER, label: str = "", job=""
) -> str:
    key = key_of(data)
    named = {"job": job} if job else {}
    reservation = store.reserve(key, len(data), next_use, priority, label=label, **named)
    assert isinstance(reservation, Reservation), reservation
    reservation.commit(data)
    return key


def on_disk(folder: Path) -> dict[str, int]:
    """``sha256:<hex>`` -> size of every file under entries/, read from the folder itself."""
    return {
        "sha256:" + p.name: p.stat().st_size
        for p in (folder / "entries").glob("*/*")
        if p.is_file()
    }


def rows(folder: Path) -> list[tuple[str, int, str]]:
    with sqlite3.connect(folder / "cache.db") as db:
        return db.execute("SELECT key, size, state FROM entries").fetchall()


def assert_consistent(folder: Path, limit: int) -> None:
    """No leftovers, every ready row has its file and no file lacks one, the limit holds, the
    store's running total is what the rows add up to, and every entry served is the bytes its
    key names, once the folder is opened again."""
    store = CacheStore(folder, limit, min_free_bytes=0)
    assert list((folder / "tmp").iterdir()) == []
    table = rows(folder)
    assert [r for r in table if r[2] != "ready"] == []
    assert on_disk(folder) == {k: s for k, s, _ in table}
    assert sum(s for _, s, _ in table) <= limit
    assert store.usage()[0] == sum(s for _, s, _ in table)
    for key, size, _ in table:
        data = store.get(key, size)
        assert data is not None and key_of(bytes(data)) == key
    store.close()


@pytest.fixture(params=["mapped", "read"])
def mapping(request, monkeypatch):
    if request.param == "read":
        monkeypatch.setenv(mapped.DISABLE, "0")
    return request.param


def test_round_trip_is_content_addressed(tmp_path, mapping):
    store = CacheStore(tmp_path, limit_bytes=10_000, min_free_bytes=0)
    data = payload(1, 3000)
    key = put(store, data, time.time() + 10, label="s3://b/ds episode 3")
    got = store.get(key, len(data))
    assert bytes(got) == data
    assert mapped.is_mapped(got) == (mapping == "mapped")
    assert store.get(key_of(payload(2, 3000)), 3000) is None  # another span: never these bytes
    assert store.reserve(key, len(data), time.time(), NEVER) == Ready(key)
    assert store.usage() == (3000, 10_000)
    [entry] = store.entries()
    assert (entry.key, entry.size, entry.state, entry.label) == (
        key,
        3000,
        "ready",
        "s3://b/ds episode 3",
    )
    with pytest.raises(ValueError, match="sha256"):
        store.reserve("md5:abc", 3, time.time(), NEVER)
    store.close()


@pytest.mark.parametrize("damage", ["flip", "truncate", "longer", "wrong size asked", "deleted"])
def test_damaged_entry_is_never_served(tmp_path, mapping, damage, caplog):
    store = CacheStore(tmp_path, limit_bytes=10_000, min_free_bytes=0)
    data = payload(3, 4096)
    key = put(store, data, time.time() + 10)
    [path] = (tmp_path / "entries").glob("*/*")
    asked = len(data)
    if damage == "flip":
        damaged = bytearray(data)
        damaged[1234] ^= 0x10
        path.write_bytes(bytes(damaged))
    elif damage == "truncate":
        path.write_bytes(data[:2000])
    elif damage == "longer":
        path.write_bytes(data + b"\0")
    elif damage == "deleted":
        path.unlink()
    else:
        asked = len(data) + 1
    with caplog.at_level(logging.WARNING, logger="lerobot_shards.reader.fetch"):
        assert store.get(key, asked) is None
    assert key in caplog.text
    assert rows(tmp_path) == [] and on_disk(tmp_path) == {}
    assert isinstance(store.reserve(key, len(data), time.time(), NEVER), Reservation)  # refetch
    store.close()


def test_belady_evicts_the_farthest_and_admits_only_what_is_read_sooner(tmp_path):
    now = time.time()
    store = CacheStore(tmp_path, limit_bytes=300, min_free_bytes=0)
    a, b, c, d, e = (payload(i, 100) for i in range(5))
    when = {key_of(a): now + 10, key_of(b): now + 30, key_of(c): now + 20}
    for x in (a, b, c):
        put(store, x, when[key_of(x)], when.get)
    # d is read at +15: b (+30) is the farthest, so b goes
    put(store, d, now + 15, when.get)
    when[key_of(d)] = now + 15
    assert set(on_disk(tmp_path)) == {key_of(a), key_of(c), key_of(d)}
    # e is read at +40, after everything cached: not admitted, nothing evicted
    assert store.reserve(key_of(e), 100, now + 40, when.get) is None
    assert set(on_disk(tmp_path)) == {key_of(a), key_of(c), key_of(d)}
    # an entry never read again goes first, even before the farthest
    when[key_of(a)] = math.inf
    put(store, e, now + 25, when.get)
    assert set(on_disk(tmp_path)) == {key_of(c), key_of(d), key_of(e)}
    # too big for the limit at all: not cached
    assert store.reserve(key_of(payload(9, 301)), 301, now, NEVER) is None
    store.close()


def test_neither_job_evicts_what_the_other_reads_sooner(tmp_path):
    """Jobs A and B share entry K: A reads it in 300 s, B in 5 s. A miss of A's read in 10 s
    keeps K (B reads it sooner) and evicts what both read later; one of A's in 100 s is not
    admitted, though A's own plan reads K only in 300 s; B, knowing nothing of A's entries,
    evicts one only for an episode it reads sooner than A does."""
    now = time.time()
    store = CacheStore(tmp_path, limit_bytes=300, min_free_bytes=0)
    k, x, y = payload(20, 100), payload(21, 100), payload(22, 100)
    put(store, k, now + 300, job="A")
    store.set_hints({key_of(k): now + 5}, job="B")
    put(store, x, now + 50, job="A")
    put(store, y, now + 400, job="B")
    a_plan = {key_of(k): now + 300, key_of(x): now + 50}
    mine = payload(23, 100)
    put(store, mine, now + 10, a_plan.get, job="A")  # y (+400) goes; K (+5 for B) stays
    assert set(on_disk(tmp_path)) == {key_of(k), key_of(x), key_of(mine)}
    a_plan[key_of(mine)] = now + 10
    later = payload(25, 100)  # A reads it in 100 s, before its own 300 s for K, after B's 5 s
    assert store.reserve(key_of(later), 100, now + 100, a_plan.get, job="A") is None
    assert set(on_disk(tmp_path)) == {key_of(k), key_of(x), key_of(mine)}
    late = payload(24, 100)
    assert store.reserve(key_of(late), 100, now + 200, NEVER, job="B") is None  # all sooner
    store.set_hints({key_of(k): math.inf}, job="B")  # B reads K no more: A's +300 counts
    put(store, late, now + 200, NEVER, job="B")
    assert set(on_disk(tmp_path)) == {key_of(x), key_of(mine), key_of(late)}
    store.close()


def job_that_ends(folder: str) -> None:
    store = CacheStore(folder, 200, min_free_bytes=0)
    put(store, payload(30, 100), time.time() + 1000, job="gone")
    put(store, payload(31, 100), time.time() + 1000, job="gone")
    store.close()


def test_the_hints_of_a_job_that_ended_are_dropped(tmp_path, monkeypatch):
    """A job whose processes are gone protects its entries no longer (after a grace period,
    here none): another job evicts them for episodes it reads at any time."""
    ctx = mp.get_context("spawn")
    job = ctx.Process(target=job_that_ends, args=(str(tmp_path),))
    job.start()
    job.join(120)
    store = CacheStore(tmp_path, 200, min_free_bytes=0)
    assert store.reserve(key_of(payload(32, 100)), 100, time.time() + 9999, NEVER) is None
    monkeypatch.setattr(cache_module, "JOB_GRACE_S", 0.0)
    put(store, payload(32, 100), time.time() + 9999)
    put(store, payload(33, 100), time.time() + 9999)
    assert set(on_disk(tmp_path)) == {key_of(payload(32, 100)), key_of(payload(33, 100))}
    store.close()


def test_an_evicted_file_still_mapped_counts_until_its_last_mapping_goes(tmp_path):
    """An entry a pool still maps is not evicted while another that nobody maps can be; once
    evicted while mapped (the pool mapped it between the choice and the move), its blocks count
    against the limit until the mapping is released, and the file goes then."""
    now = time.time()
    store = CacheStore(tmp_path, limit_bytes=200, min_free_bytes=0)
    a, b, c = payload(40, 100), payload(41, 100), payload(42, 100)
    put(store, a, now + 100)
    put(store, b, now + 50)
    held = store.get(key_of(a), 100)  # a pool maps A, the farthest
    assert mapped.is_mapped(held)
    put(store, c, now + 10)  # B goes: A is mapped
    assert set(on_disk(tmp_path)) == {key_of(a), key_of(c)}
    assert store.usage()[0] == 200
    # evicted while mapped: moved out of entries/, its bytes still counted
    with store._write() as db:
        store._evict(db, [(key_of(a), 100)])
    assert store.usage()[0] == 200 and len(list((tmp_path / "tmp").iterdir())) == 1
    d = payload(43, 100)
    put(store, d, now + 1)  # room for D: C goes, A's blocks still count
    assert store.usage()[0] == 200 and set(on_disk(tmp_path)) == {key_of(d)}
    del held
    put(store, payload(44, 100), now + 0.5)  # the mapping went: A's file goes, which makes room
    assert list((tmp_path / "tmp").iterdir()) == []
    assert set(on_disk(tmp_path)) == {key_of(d), key_of(payload(44, 100))}
    assert store.usage()[0] == 200
    store.close()


def random_worker(folder: str, limit: int, seed: int, done) -> None:
    """Reserves, commits, aborts and reads at random, holding its last three hits mapped (as a
    pool holds its episodes) while other processes evict them."""
    rng = random.Random(seed)
    store = CacheStore(folder, limit, min_free_bytes=0)
    now = time.time()
    held: list = []
    keys = [key_of(payload(i, n * 30_000)) for i in range(40) for n in (1, 2, 3)]
    for _ in range(50):
        data = payload(rng.randrange(40), rng.randrange(1, 4) * 30_000)
        plan = {key: now + rng.uniform(0, 100) for key in keys}
        got = store.reserve(key_of(data), len(data), now + rng.uniform(0, 100), plan.get)
        if isinstance(got, Reservation):
            time.sleep(rng.uniform(0, 0.01))
            if rng.random() < 0.8:
                got.commit(data)
            else:
                got.abort()
        elif isinstance(got, Ready):
            hit = store.get(got.key, len(data))
            if hit is not None:  # None: evicted meanwhile
                assert bytes(hit) == data
                held = [*held[-2:], hit]
    held.clear()
    store.close()
    done.put(seed)


def sampler(folder: str, pids: list[int], stop, out) -> None:
    """The bytes the cache takes on disk (``support/cache_disk.py``: its files and deleted files
    still mapped), sampled under the store's write lock, which every change of the folder's
    books happens under."""
    from support.cache_disk import disk_bytes

    db = sqlite3.connect(Path(folder) / "cache.db", timeout=60, isolation_level=None)
    worst, samples = 0, 0
    while not stop.is_set():
        start = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        taken = disk_bytes(Path(folder), pids)
        db.execute("ROLLBACK")
        worst, samples = max(worst, taken), samples + 1
        time.sleep(max(0.005, 2 * (time.perf_counter() - start)))  # the lock a third of the time
    out.put((worst, samples))


def test_limit_holds_at_all_times_across_processes(tmp_path):
    """Four processes, two with a limit of 400 kB and two of 300 kB, reserving, committing,
    aborting and holding hits mapped while the others evict them: the files on disk, with the
    deleted ones still mapped, never take more than the larger limit."""
    limits = [400_000, 300_000, 400_000, 300_000]
    CacheStore(tmp_path, max(limits), min_free_bytes=0).close()
    ctx = mp.get_context("spawn")
    stop, out, done = ctx.Event(), ctx.Queue(), ctx.Queue()
    workers = [
        ctx.Process(target=random_worker, args=(str(tmp_path), limit, s, done))
        for s, limit in enumerate(limits)
    ]
    for w in workers:
        w.start()
    pids = [w.pid for w in workers]
    watch = ctx.Process(target=sampler, args=(str(tmp_path), pids, stop, out))
    watch.start()
    finished = sorted(done.get(timeout=300) for _ in workers)
    for w in workers:
        w.join(60)
    stop.set()
    worst, samples = out.get(timeout=60)
    watch.join(60)
    assert finished == [0, 1, 2, 3]
    assert samples > 0
    assert worst <= max(limits), f"the cache took {worst} bytes, limit {max(limits)}"
    assert_consistent(tmp_path, max(limits))


def released_at_once(n: int, method: str, target, *args) -> list:
    """What each of ``n`` processes (``method``: fork or spawn) of ``target(*args, barrier,
    out)`` puts in ``out``, all of them released by ``barrier`` at once."""
    ctx = mp.get_context(method)
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, barrier, out)) for _ in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def open_at_once(folder: str, barrier, out) -> None:
    barrier.wait()
    try:
        CacheStore(folder, 10**6, min_free_bytes=0).close()
        out.put("opened")
    except CacheUnavailable as exc:
        out.put(str(exc))


@pytest.mark.skipif(sys.platform != "linux", reason="forks")
def test_processes_opening_a_new_cache_folder_at_once_all_open_it(tmp_path):
    """A node's ranks and workers open a new cache folder together: each of 8 processes,
    released at once, opens it, in each of 20 new folders (the switch to WAL mode answered
    "database is locked" without waiting, for about a quarter of such starts of 4)."""
    for n in range(20):
        results = released_at_once(8, "fork", open_at_once, str(tmp_path / str(n)))
        assert results == ["opened"] * 8, (n, results)


def die_downloading(folder: str, data: bytes) -> None:
    """A writer killed while it writes its download: its row pending, its temporary file on
    disk, nothing committed."""
    store = CacheStore(folder, 10**6, min_free_bytes=0)
    assert isinstance(store.reserve(key_of(data), len(data), time.time(), NEVER), Reservation)
    files_module.write_synced(store.tmp_dir / files_module.tmp_name(store._me), data)
    os._exit(0)


@pytest.mark.skipif(sys.platform != "linux", reason="forks")
def test_a_dead_writers_download_goes_with_its_row(tmp_path):
    """A process that finds a dead writer's download pending (the cache already open: no
    cleaning at opening) removes its temporary file as it drops its row: the disk never holds
    bytes the books no longer count."""
    from support.cache_disk import disk_bytes

    data = payload(5, 20_000)
    store = CacheStore(tmp_path, 10**6, min_free_bytes=0)
    child = mp.get_context("fork").Process(target=die_downloading, args=(str(tmp_path), data))
    child.start()
    child.join(60)
    assert [p.name for p in (tmp_path / "tmp").iterdir()]  # what it left
    got = store.reserve(key_of(data), len(data), time.time(), NEVER)
    assert isinstance(got, Reservation)  # the dead writer's claim is dropped, ours taken
    got.commit(data)
    assert not list((tmp_path / "tmp").iterdir())
    assert disk_bytes(tmp_path) <= store.usage()[0] == len(data)
    store.close()


def claim(folder: str, key: str, size: int, barrier, out) -> None:
    store = CacheStore(folder, 10**6, min_free_bytes=0)
    barrier.wait()
    got = store.reserve(key, size, time.time(), NEVER)
    if isinstance(got, Reservation):
        time.sleep(0.3)  # the download
        got.commit(payload(7, size))
        out.put(("downloaded", True))
    else:
        ready = isinstance(got, Ready) or store.wait_ready(key, 30)
        out.put((type(got).__name__, ready and bytes(store.get(key, size)) == payload(7, size)))
    store.close()


def test_a_node_downloads_an_episode_at_most_once(tmp_path):
    data = payload(7, 50_000)
    results = released_at_once(4, "spawn", claim, str(tmp_path), key_of(data), len(data))
    assert sorted(kind for kind, _ in results).count("downloaded") == 1
    assert all(ok for _, ok in results)
    assert {kind for kind, _ in results} <= {"downloaded", "Wait", "Ready"}


CHILD = """
import os, sys, time, random, hashlib
from lerobot_shards.reader.fetch import cache_files
from lerobot_shards.reader.fetch.cache import CacheStore, Reservation
folder, stage, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache_files.CHUNK = 1000
passes = [3]  # stop at the fourth time the stage is reached: among evictions
def at(name):
    passes[0] -= 1
    if passes[0] < 0:
        print("AT", name, flush=True)
        time.sleep(60)
real_write, real_rename, real_unlink = os.write, os.rename, os.unlink
def write(fd, data):
    n = real_write(fd, data)
    if stage == "download":
        at(stage)  # part of a download written to tmp/
    return n
def rename(src, dst):
    into_entries = "/entries/" in str(dst)
    if into_entries and stage == "rename":
        at(stage)  # a download written and synced, not yet in place
    real_rename(src, dst)
    if into_entries and stage == "commit":
        at(stage)  # in place, its row not yet ready: the transaction is open
    if "/entries/" in str(src) and "/tmp/" in str(dst) and stage == "eviction":
        at(stage)  # a victim moved out, its row not yet deleted: the transaction is open
def unlink(path, *args, **kwargs):
    real_unlink(path, *args, **kwargs)
    if "/tmp/" in str(path) and "." in os.path.basename(path) and stage == "unlink":
        at(stage)  # an evicted file removed, its book not yet closed
os.write, os.rename, os.unlink = write, rename, unlink
store = CacheStore(folder, 20_000, min_free_bytes=0)
rng = random.Random(seed)
def data(i):
    return random.Random(i).randbytes(1000 * (1 + i % 5))
print("AT start", flush=True)
while True:
    d = data(rng.randrange(30))
    key = "sha256:" + hashlib.sha256(d).hexdigest()
    soon = lambda k: time.time() + rng.random()
    r = store.reserve(key, len(d), time.time() + rng.random(), soon)
    if stage == "reserved" and isinstance(r, Reservation):
        at(stage)  # its room reserved, nothing written
    if isinstance(r, Reservation):
        r.commit(d)
"""

STAGES = ["reserved", "download", "rename", "commit", "eviction", "unlink"]


@pytest.mark.parametrize("stage", STAGES)
def test_a_writer_killed_at_each_stage_leaves_nothing_served(tmp_path, stage):
    """A process SIGKILLed at each named stage of its downloads and evictions (the fourth
    time it reaches it, once the cache is full): the folder opened again serves only whole
    entries, its books add up, nothing is left over, and nobody waits for the dead writer."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), stage, str(STAGES.index(stage))],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout.readline().split() == ["AT", "start"]
    assert child.stdout.readline().split() == ["AT", stage]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert_consistent(tmp_path, 20_000)
    store = CacheStore(tmp_path, 20_000, min_free_bytes=0)
    for i in range(30):
        d = random.Random(i).randbytes(1000 * (1 + i % 5))
        assert not isinstance(store.reserve(key_of(d), len(d), time.time() + 5, NEVER), Wait)
    store.close()


def test_a_folder_that_cannot_be_made_is_unavailable(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(CacheUnavailable):
        CacheStore(tmp_path / "file" / "cache")
    with pytest.raises(CacheUnavailable):
        CacheStore("/proc/lerobot-shards-cache")


def test_a_read_only_folder_is_unavailable(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    if subprocess.run(["mount", "--bind", folder, folder], capture_output=True).returncode:
        pytest.skip("bind mounts are not allowed here")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", folder, folder], check=True)
        with pytest.raises(CacheUnavailable):
            CacheStore(folder)
    finally:
        subprocess.run(["umount", "-l", folder], check=True)


def test_a_full_disk_drops_the_entry(tmp_path, monkeypatch):
    store = CacheStore(tmp_path, limit_bytes=10**6, min_free_bytes=0)
    data = payload(4, 5000)
    reservation = store.reserve(key_of(data), len(data), time.time(), NEVER)

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CacheUnavailable, match="No space"):
        reservation.commit(data)
    monkeypatch.undo()
    assert rows(tmp_path) == [] and on_disk(tmp_path) == {}
    assert list((tmp_path / "tmp").iterdir()) == []
    store.close()


def test_a_real_full_disk(tmp_path):
    folder = tmp_path / "tiny"
    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder], capture_output=True
    ).returncode:
        pytest.skip("tmpfs mounts are not allowed here")
    try:
        store = CacheStore(folder, limit_bytes=10**7, min_free_bytes=0)
        big = payload(5, 2 * 2**20)
        assert store.reserve(key_of(big), len(big), time.time(), NEVER) is None  # would not fit
        data = payload(6, 400 * 1024)
        reservation = store.reserve(key_of(data), len(data), time.time(), NEVER)
        (folder / "filler").write_bytes(bytes(700 * 1024))  # the disk fills meanwhile
        with pytest.raises(CacheUnavailable):
            reservation.commit(data)
        assert rows(folder) == [] and on_disk(folder) == {}
        assert list((folder / "tmp").iterdir()) == []
        store.close()
    finally:
        subprocess.run(["umount", "-l", folder], check=True)


@contextmanager
def tiny_disk(folder: Path, size: str):
    """A tmpfs of ``size`` mounted at ``folder`` (skipped where mounts are not allowed)."""
    folder.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", folder], capture_output=True
    ).returncode:
        pytest.skip("tmpfs mounts are not allowed here")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], check=True)


def test_the_floor_counts_downloads_admitted_and_not_yet_written(tmp_path):
    """A 2 MiB disk, a limit larger than it and a floor of 256 KiB: three downloads of
    600 KiB reserved at once would leave 248 KiB, so the third is refused before anything is
    written, and the two admitted commit without filling the disk."""
    with tiny_disk(tmp_path / "tiny", "2m") as folder:
        store = CacheStore(folder, limit_bytes=10**8, min_free_bytes=256 * 1024)
        datas = [payload(50 + i, 600 * 1024) for i in range(3)]
        first, second = (
            store.reserve(key_of(d), len(d), time.time() + 10, NEVER) for d in datas[:2]
        )
        assert isinstance(first, Reservation) and isinstance(second, Reservation)
        assert store.reserve(key_of(datas[2]), len(datas[2]), time.time() + 10, NEVER) is None
        first.commit(datas[0])
        second.commit(datas[1])
        assert set(on_disk(folder)) == {key_of(d) for d in datas[:2]}
        assert files_module.free_bytes(folder)[0] >= 256 * 1024
        store.close()


class Vanished:
    """A directory entry another process removes between the listing and its ``stat``."""

    def __init__(self, entry: os.DirEntry) -> None:
        self.name, self.path = entry.name, entry.path

    def is_dir(self, follow_symlinks: bool = True) -> bool:
        return False

    def is_file(self, follow_symlinks: bool = True) -> bool:
        return True

    def stat(self, follow_symlinks: bool = True):
        raise FileNotFoundError(errno.ENOENT, "removed by another process", self.path)


def test_opening_the_store_tolerates_files_removed_meanwhile(tmp_path, monkeypatch):
    """Every file another process removes while the store opens (a download's temporary file,
    an evicted entry), with the stored limit and with the default one: the open succeeds and
    the folder stays consistent."""
    store = CacheStore(tmp_path, 60_000, min_free_bytes=0)
    put(store, payload(70, 1000), time.time() + 10)
    store.close()
    dead = f"{socket.gethostname()}.999999999.1-0123456789abcdef"
    (tmp_path / "tmp" / dead).write_bytes(b"x")
    real_scandir = os.scandir

    class Listing:
        def __init__(self, path):
            self.entries = [Vanished(e) for e in real_scandir(path)]

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            return iter(self.entries)

    monkeypatch.setattr(os, "scandir", Listing)
    for limit in (60_000, None):
        CacheStore(tmp_path, limit, min_free_bytes=0).close()
    monkeypatch.undo()
    assert_consistent(tmp_path, 60_000)


def test_a_transient_failure_costs_one_uncached_read(tmp_path, monkeypatch, caplog):
    """The database busy past its timeout (another process holds its lock): that one read is
    served uncached with no warning, and the next reads use the cache again; a permanent
    failure warns once and turns the cache off for the process."""
    shard = tmp_path / "shard.tar"
    data = payload(60, 5000)
    shard.write_bytes(data)
    span = Span(0, str(shard), 0, len(data), key_of(data))
    fs = fsspec.filesystem("file")
    reads = CachedReads(tmp_path / "cache", 10**6)
    read = partial(reads.read, fs, span, retries=1, priority=NEVER, label="", next_use=1e12)
    monkeypatch.setattr(cache_module, "BUSY_TIMEOUT_S", 0.2)
    assert bytes(read()) == data and len(rows(tmp_path / "cache")) == 1  # cached
    blocker = sqlite3.connect(tmp_path / "cache" / "cache.db", timeout=5, isolation_level=None)
    reads._store.close()
    reads._store = None  # its connections were made with the long timeout: open anew
    blocker.execute("BEGIN IMMEDIATE")
    with caplog.at_level(logging.WARNING, logger="lerobot_shards.reader.fetch"):
        assert bytes(read()) == data  # uncached: the store could not be asked
        blocker.execute("ROLLBACK")
        assert mapped.is_mapped(read()) or not mapped.enabled()  # from the cache again
    assert not caplog.records and not reads._broken
    with caplog.at_level(logging.WARNING, logger="lerobot_shards.reader.fetch"):
        reads._failed(CacheUnavailable("disk full", transient=False))
        reads._failed(CacheUnavailable("disk full", transient=False))
    assert reads._broken and len(caplog.records) == 1
    assert bytes(read()) == data


def hold(folder: str, opened, release) -> None:
    store = CacheStore(folder, 10**6, min_free_bytes=0)
    opened.set()
    release.wait(60)
    store.close()


def test_clear_refuses_while_in_use(tmp_path):
    store = CacheStore(tmp_path, limit_bytes=10**6, min_free_bytes=0)
    put(store, payload(6, 1000), time.time(), label="s3://b/ds episode 1")
    put(store, payload(8, 2000), time.time(), label="s3://b/ds episode 2")
    store.close()
    listing = CliRunner().invoke(main, ["cache", "ls", "--cache-dir", str(tmp_path)])
    assert listing.exit_code == 0 and "s3://b/ds: 2 episodes, 0.0 MB" in listing.output
    ctx = mp.get_context("spawn")
    opened, release = ctx.Event(), ctx.Event()
    other = ctx.Process(target=hold, args=(str(tmp_path), opened, release))
    other.start()
    assert opened.wait(60)
    store = CacheStore(tmp_path, min_free_bytes=0)
    with pytest.raises(CacheBusy, match="in use"):
        store.clear()
    refused = CliRunner().invoke(main, ["cache", "clear", "--cache-dir", str(tmp_path)])
    assert refused.exit_code != 0 and "in use" in refused.output
    assert len(on_disk(tmp_path)) == 2
    release.set()
    other.join(60)
    store.clear()
    assert rows(tmp_path) == [] and on_disk(tmp_path) == {}
    store.close()
    cleared = CliRunner().invoke(main, ["cache", "clear", "--cache-dir", str(tmp_path)])
    assert cleared.exit_code == 0, cleared.output


def test_a_reused_pid_is_not_taken_for_the_owner(tmp_path):
    """A pending row and a temporary file whose pid lives again (here: this very process) but
    started at another time belong to a dead process: cleaned at open."""
    CacheStore(tmp_path, 10**6, min_free_bytes=0).close()
    host, pid = socket.gethostname(), os.getpid()
    start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    dead = f"{host}.{pid}.{start - 1}"
    data = payload(9, 1000)
    with sqlite3.connect(tmp_path / "cache.db") as db:  # as the dead process left it
        db.execute(
            "INSERT INTO entries VALUES (?, ?, 'pending', ?, '', ?, ?, NULL)",
            (key_of(data), len(data), dead, time.time(), time.time()),
        )
        db.execute(
            "UPDATE settings SET value = value + ? WHERE name IN ('used', 'pending')", (len(data),)
        )
    (tmp_path / "tmp" / f"{dead}-0123456789abcdef").write_bytes(data[:500])
    store = CacheStore(tmp_path, 10**6, min_free_bytes=0)
    assert rows(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []
    assert store.usage()[0] == 0
    assert isinstance(store.reserve(key_of(data), len(data), time.time(), NEVER), Reservation)
    store.close()
