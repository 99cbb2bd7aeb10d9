"""The node-local cache's store at 10k, 100k and 1M entries: how long a hit and a miss hold the
folder's write lock, and how many entries per second 8 processes on one folder get through.

Why. Every rank and DataLoader worker of a node (8 GPUs x 8 workers: 64 processes) shares one
cache folder, and every change of it happens under one SQLite write lock. A lock held for a
time that grows with the entries serialises the node at 100k episodes (DROID has 92k) and
stops it at a million (issue 42 measured 4.49 s per miss at 100k before this store). Goal: under
5 ms per miss at 1M entries, hits at the speed of a file open.

What runs. For each size N a fresh folder is filled, full to its limit, with N ready entries
of 4 kB whose next uses are spread over the coming hour (rows and hints written directly; only
the entries a hit reads have files: a miss that evicts a row without a file is a rename that
finds nothing, which costs what an eviction's rename costs). Then, in this process:

- ``hit``: ``get`` of a cached entry (open, lock, map, verify, and the transaction that records
  its next use);
- ``miss``: ``reserve`` of a new entry read sooner than most (its evictions: a walk of the
  next-use index, a transaction that moves the victims out, one that admits the entry), and
  ``commit`` (its file written, synced, renamed into place in a transaction).

The lock hold is timed inside the store's own transaction (from the moment ``BEGIN IMMEDIATE``
holds the lock to ``COMMIT``), summed over the transactions of one call; medians and the 99th
percentile over ``--calls`` calls. ``entries/s``: 8 processes (``--processes``) each reserve,
commit and read back ``--per-process`` new entries as fast as they can on the same folder (a
process that meets a busy database past the store's 60 s timeout stops, as the reader's cache
would, and is counted).

``--baseline REF``: the same figures for the store of git commit REF (its cache.py, loaded
beside this one) at the sizes up to ``--baseline-max``, for the ratio in the same run.

Usage: ``PYTHONPATH=src python scripts/bench_cache_store.py [--sizes 10000,100000,1000000]
[--baseline 4a0988e]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import multiprocessing as mp
import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_common import machine_line

from lerobot_shards.reader.fetch import cache as current

SIZE = 4096
JOB = "bench"


def key_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def payload(seed: int) -> bytes:
    return random.Random(seed).randbytes(SIZE)


def load_store(ref: str | None):
    """The cache module of this tree, or of git commit ``ref`` (loaded under another name)."""
    if ref is None:
        return current
    if "baseline_cache" in sys.modules:
        return sys.modules["baseline_cache"]
    source = subprocess.run(
        ["git", "show", f"{ref}:src/lerobot_shards/reader/fetch/cache.py"],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[1],
    ).stdout
    path = Path(tempfile.mkdtemp()) / "baseline_cache.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_cache", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_cache"] = module
    spec.loader.exec_module(module)
    return module


HOLDS: list[float] = []


def time_the_lock(module) -> None:
    """Record how long each of the store's transactions holds the write lock."""

    @contextmanager
    def timed(self):
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        held = time.perf_counter()
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            HOLDS.append(time.perf_counter() - held)
            raise
        db.execute("COMMIT")
        HOLDS.append(time.perf_counter() - held)

    module.CacheStore._write = timed


def fill(module, folder: Path, entries: int, hits: int, every_file: bool) -> list[bytes]:
    """A folder full of ``entries`` ready entries (rows and hints written directly); the
    first ``hits`` have their files, the others (``every_file``) empty ones. Returns those
    entries' bytes."""
    store = module.CacheStore(folder, entries * SIZE, min_free_bytes=0)
    store.close()
    now = time.time()
    rng = np.random.default_rng(0)
    upcoming = now + 60 + rng.random(entries) * 3600
    upcoming[:hits] = now + 1 + rng.random(hits) * 20  # the entries hit are read soonest: kept
    with_files = [payload(i) for i in range(hits)]
    keys = [key_of(d) for d in with_files]
    keys += [f"sha256:{i:064x}" for i in range(hits, entries)]
    db = sqlite3.connect(folder / "cache.db", isolation_level=None)
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO entries VALUES (?, ?, 'ready', NULL, 'bench', ?, ?, ?)",
        ((k, SIZE, now, now, float(t)) for k, t in zip(keys, upcoming.tolist(), strict=True)),
    )
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "hints" in tables:  # this store: every job's hints, and running totals
        db.executemany(
            "INSERT INTO hints VALUES (?, ?, ?)",
            ((k, JOB, float(t)) for k, t in zip(keys, upcoming.tolist(), strict=True)),
        )
        db.execute("UPDATE settings SET value = ? WHERE name = 'used'", (entries * SIZE,))
    db.execute("COMMIT")
    db.close()
    for key, data in zip(keys[:hits], with_files, strict=True):
        path = folder / "entries" / key[7:9] / key[7:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    if every_file:  # an empty file for the rest (the earlier store drops rows without one)
        for key in keys[hits:]:
            path = folder / "entries" / key[7:9] / key[7:]
            path.parent.mkdir(exist_ok=True)
            path.touch()
    return with_files


def call(module, method, *args, **kwargs):
    """Call ``method``; the seconds its transactions held the lock."""
    HOLDS.clear()
    result = method(*args, **kwargs)
    return result, sum(HOLDS)


def single_process(
    module, folder: Path, entries: int, calls: int, every_file: bool
) -> dict[str, list[float]]:
    """Lock holds of ``calls`` hits, misses and commits."""
    datas = fill(module, folder, entries, calls, every_file)
    store = module.CacheStore(folder, entries * SIZE, min_free_bytes=0)
    named = {"job": JOB} if module is current else {}
    hit_keys = {key_of(d) for d in datas}

    def plan(key: str) -> float | None:
        """The caller reads the entries it hits soon; the rest, the stored hints decide."""
        return time.time() + 5 if key in hit_keys else None

    holds: dict[str, list[float]] = {"hit": [], "miss": [], "commit": []}
    for i, data in enumerate(datas):
        got, held = call(module, store.get, key_of(data), SIZE, **(
            {"job": JOB, "next_use": time.time() + 20} if module is current else {}
        ))  # fmt: skip
        assert got is not None, "a hit must be served"
        holds["hit"].append(held)
        fresh = payload(10**7 + i)
        reservation, held = call(
            module, store.reserve, key_of(fresh), SIZE, time.time() + 30, plan, "bench", **named
        )
        holds["miss"].append(held)
        assert isinstance(reservation, module.Reservation), reservation
        _, held = call(module, reservation.commit, fresh)
        holds["commit"].append(held)
    store.close()
    return holds


def hammer(module_ref: str | None, folder: str, seed: int, count: int, start, out) -> None:
    """One of the processes on one folder: ``count`` new entries reserved, committed and read."""
    module = load_store(module_ref)
    try:
        store = module.CacheStore(folder, None, min_free_bytes=0)
    except module.CacheUnavailable:
        out.put((0, 1))
        return
    named = {"job": f"{JOB}{seed}"} if module is current else {}
    never = lambda key: None  # noqa: E731
    start.wait()
    done = 0
    try:
        for i in range(count):
            data = payload(10**8 * (seed + 1) + i)
            reservation = store.reserve(key_of(data), SIZE, time.time() + 30, never, "", **named)
            if isinstance(reservation, module.Reservation):
                reservation.commit(data)
                done += store.get(key_of(data), SIZE) is not None
    except module.CacheUnavailable:  # what the reader then does: uncached for good (or once)
        out.put((done, 1))
        return
    store.close()
    out.put((done, 0))


def many_processes(ref: str | None, folder: Path, processes: int, per: int) -> tuple[float, int]:
    """Entries per second that ``processes`` processes get through on one (full) folder, and
    how many of them met a busy database or other failure of the store."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=hammer, args=(ref, str(folder), s, per, start, out))
        for s in range(processes)
    ]
    for p in procs:
        p.start()
    time.sleep(3)  # every process has opened the folder (its cleanup is not timed)
    began = time.perf_counter()
    start.set()
    results = [out.get(timeout=3600) for _ in procs]
    elapsed = time.perf_counter() - began
    for p in procs:
        p.join(60)
    return sum(done for done, _ in results) / elapsed, sum(failed for _, failed in results)


def ms(values: list[float], q: float) -> str:
    return f"{1e3 * float(np.quantile(values, q)):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--calls", type=int, default=200, help="hits and misses timed per size")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--per-process", type=int, default=100)
    parser.add_argument("--baseline", help="a git commit whose store runs beside this one")
    parser.add_argument("--baseline-max", type=int, default=100_000)
    parser.add_argument("--scratch", type=Path, default=Path(tempfile.gettempdir()))
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    stores = [("this store", None)]
    if args.baseline:
        stores.append((f"store of {args.baseline}", args.baseline))
    print(
        f"{SIZE}-byte entries, next uses over the coming hour; lock hold in ms (median / p99 "
        f"of {args.calls} calls); entries/s: {args.processes} processes x {args.per_process} "
        "new entries each (reserve, commit, get) on one full folder\n"
    )
    print("| entries | store | hit | miss | commit | entries/s |")
    print("|---|---|---|---|---|---|")
    for entries in sizes:
        for label, ref in stores:
            if ref is not None and entries > args.baseline_max:
                continue
            module = load_store(ref)
            time_the_lock(module)
            folder = Path(tempfile.mkdtemp(prefix="bench-store-", dir=args.scratch))
            try:
                every_file = args.baseline is not None and entries <= args.baseline_max
                holds = single_process(module, folder, entries, args.calls, every_file)
                rate, failed = many_processes(ref, folder, args.processes, args.per_process)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            cells = [f"{ms(holds[k], 0.5)} / {ms(holds[k], 0.99)}" for k in holds]
            gave_up = f" ({failed} of {args.processes} failed)" if failed else ""
            print(
                f"| {entries} | {label} | {' | '.join(cells)} | {rate:.0f}{gave_up} |", flush=True
            )
    print(f"\ngoal: a miss under 5 ms at 1M entries; {machine_line()}")


if __name__ == "__main__":
    main()
