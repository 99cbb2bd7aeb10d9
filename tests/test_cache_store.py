"""The node-local cache's store (issue 38, items 2, 5 and 6): content-addressed entries verified
on every read, Belady's admission and eviction, a limit that holds at all times across
processes, at-most-once downloads, crash safety, and a folder that cannot be used.

Processes are real (spawned) wherever processes matter; what the store says is checked against
the folder itself (file sizes on disk, the database read directly, sha256 from hashlib).
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
from pathlib import Path

import pytest
from click.testing import CliRunner

from lerobot_shards.cli import main
from lerobot_shards.reader.fetch import mapped
from lerobot_shards.reader.fetch.cache import (
    CacheBusy,
    CacheStore,
    CacheUnavailable,
    Ready,
    Reservation,
    Wait,
)

SRC = Path(__file__).resolve().parents[1] / "src"
NEVER = lambda key: None  # noqa: E731  (the caller knows none of the cached keys)


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def key_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def put(store: CacheStore, data: bytes, next_use: float, priority=NEVER, label: str = "") -> str:
    key = key_of(data)
    reservation = store.reserve(key, len(data), next_use, priority, label=label)
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
    """No leftovers, every ready row has its file and no file lacks one, the limit holds, and
    every entry served is the bytes its key names, once the folder is opened again."""
    store = CacheStore(folder, limit, min_free_bytes=0)
    assert list((folder / "tmp").iterdir()) == []
    table = rows(folder)
    assert [r for r in table if r[2] != "ready"] == []
    assert on_disk(folder) == {k: s for k, s, _ in table}
    assert sum(s for _, s, _ in table) <= limit
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


def test_another_jobs_hints_protect_its_entries(tmp_path):
    """Job A's entries carry A's next-use hints; job B (which knows nothing of them) evicts one
    only if B reads its own entry sooner, and a hint gone past counts as never."""
    now = time.time()
    job_a = CacheStore(tmp_path, limit_bytes=200, min_free_bytes=0)
    x, y = payload(10, 100), payload(11, 100)
    put(job_a, x, now + 50)
    put(job_a, y, now + 60)
    job_a.set_hints({key_of(x): now + 5})
    job_b = CacheStore(tmp_path, limit_bytes=200, min_free_bytes=0)
    mine = payload(12, 100)
    assert job_b.reserve(key_of(mine), 100, now + 100, NEVER) is None  # A reads both sooner
    put(job_b, mine, now + 30)  # sooner than y (+60), later than x (+5): y goes
    assert set(on_disk(tmp_path)) == {key_of(x), key_of(mine)}
    job_a.set_hints({key_of(x): now - 1})  # A is gone; its hint is past
    put(job_b, payload(13, 100), now + 1000, {key_of(mine): now + 30}.get)
    assert set(on_disk(tmp_path)) == {key_of(mine), key_of(payload(13, 100))}
    job_a.close()
    job_b.close()


def random_worker(folder: str, limit: int, seed: int, done) -> None:
    rng = random.Random(seed)
    store = CacheStore(folder, limit, min_free_bytes=0)
    now = time.time()
    for _ in range(50):
        data = payload(rng.randrange(40), rng.randrange(1, 4) * 30_000)
        plan = {
            key_of(payload(i, n * 30_000)): now + rng.uniform(0, 100)
            for i in range(40)
            for n in (1, 2, 3)
        }
        got = store.reserve(key_of(data), len(data), now + rng.uniform(0, 100), plan.get)
        if isinstance(got, Reservation):
            time.sleep(rng.uniform(0, 0.01))
            if rng.random() < 0.8:
                got.commit(data)
            else:
                got.abort()
        elif isinstance(got, Ready):
            assert bytes(store.get(got.key, len(data))) == data
    store.close()
    done.put(seed)


def sampler(folder: str, stop, out) -> None:
    """The bytes the cache takes, read from the folder under the write lock (every change of
    entries/ happens inside one): files in entries/ plus downloads in flight."""
    db = sqlite3.connect(Path(folder) / "cache.db", timeout=60, isolation_level=None)
    worst, samples = 0, 0
    while not stop.is_set():
        db.execute("BEGIN IMMEDIATE")
        (pending,) = db.execute(
            "SELECT COALESCE(SUM(size), 0) FROM entries WHERE state = 'pending'"
        ).fetchone()
        files = sum(on_disk(Path(folder)).values())
        db.execute("ROLLBACK")
        worst, samples = max(worst, pending + files), samples + 1
        time.sleep(0.002)
    out.put((worst, samples))


def test_limit_holds_at_all_times_across_processes(tmp_path):
    limit = 400_000
    CacheStore(tmp_path, limit, min_free_bytes=0).close()
    ctx = mp.get_context("spawn")
    stop, out, done = ctx.Event(), ctx.Queue(), ctx.Queue()
    watch = ctx.Process(target=sampler, args=(str(tmp_path), stop, out))
    watch.start()
    workers = [
        ctx.Process(target=random_worker, args=(str(tmp_path), limit, s, done)) for s in range(4)
    ]
    for w in workers:
        w.start()
    finished = sorted(done.get(timeout=300) for _ in workers)
    for w in workers:
        w.join(60)
    stop.set()
    worst, samples = out.get(timeout=60)
    watch.join(60)
    assert finished == [0, 1, 2, 3]
    assert samples > 0
    assert worst <= limit, f"the cache took {worst} bytes, limit {limit}"
    assert_consistent(tmp_path, limit)


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
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(4), ctx.Queue()
    procs = [
        ctx.Process(target=claim, args=(str(tmp_path), key_of(data), len(data), barrier, out))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert sorted(kind for kind, _ in results).count("downloaded") == 1
    assert all(ok for _, ok in results)
    assert {kind for kind, _ in results} <= {"downloaded", "Wait", "Ready"}


CHILD = """
import os, sys, time, random
from lerobot_shards.reader.fetch import cache_files
from lerobot_shards.reader.fetch.cache import CacheStore, Reservation
folder, stage, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
cache_files.CHUNK = 1000
passes = [seed]  # runs past the first few pass that many points first: among evictions
def at(name):
    passes[0] -= 1
    if passes[0] < 0:
        print("AT", name, flush=True)
        time.sleep(60)
real_write, real_rename = os.write, os.rename
def write(fd, data):
    n = real_write(fd, data)
    if stage == "mid-write":
        at(stage)
    return n
def rename(src, dst):
    entry = "/entries/" in str(dst)
    if entry and stage == "before-rename":
        at(stage)
    real_rename(src, dst)
    if entry and stage == "after-rename":
        at(stage)
    if "/entries/" in str(src) and "/tmp/" in str(dst) and stage == "evicting":
        at(stage)  # a victim moved out, its row not yet deleted: the transaction is open
os.write, os.rename = write, rename
store = CacheStore(folder, 20_000, min_free_bytes=0)
rng = random.Random(seed)
def data(i):
    return random.Random(i).randbytes(1000 * (1 + i % 5))
import hashlib
print("AT start", flush=True)
while True:
    d = data(rng.randrange(30))
    key = "sha256:" + hashlib.sha256(d).hexdigest()
    soon = lambda k: time.time() + rng.random()
    r = store.reserve(key, len(d), time.time() + rng.random(), soon)
    if stage == "reserved" and isinstance(r, Reservation):
        at(stage)
    if isinstance(r, Reservation):
        r.commit(d)
"""


@pytest.mark.parametrize("run", range(20))
def test_a_killed_writer_leaves_nothing_served(tmp_path, run):
    stages = ["reserved", "mid-write", "before-rename", "after-rename", "evicting"]
    stage = stages[run] if run < 5 else stages[run % 5] if run < 12 else "random"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), stage, str(run if run < 5 else 4 * run)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert child.stdout.readline().split() == ["AT", "start"]
    if stage == "random":
        time.sleep(random.Random(run).uniform(0.05, 1.0))
    else:
        assert child.stdout.readline().split() == ["AT", stage]
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert_consistent(tmp_path, 20_000)
    # its key is free again: nobody waits for a dead writer
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
    with sqlite3.connect(tmp_path / "cache.db") as db:
        db.execute(
            "INSERT INTO entries VALUES (?, ?, 'pending', ?, '', ?, ?, NULL)",
            (key_of(data), len(data), dead, time.time(), time.time()),
        )
    (tmp_path / "tmp" / f"{dead}-0123456789abcdef").write_bytes(data[:500])
    store = CacheStore(tmp_path, 10**6, min_free_bytes=0)
    assert rows(tmp_path) == [] and list((tmp_path / "tmp").iterdir()) == []
    assert isinstance(store.reserve(key_of(data), len(data), time.time(), NEVER), Reservation)
    store.close()
