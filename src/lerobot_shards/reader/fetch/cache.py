"""A node-local cache of remote episodes: one folder shared by every process on a node.

Why. Training reads a remote dataset tens of times; each episode should cross the network once.
Every rank, DataLoader worker and concurrent job of a node opens the same folder: the
bookkeeping is a SQLite database in WAL mode (made for many processes at once), the entries are
files named by their manifest checksum, so an entry can never be served for another dataset or a
changed shard, and each is verified against that checksum whenever it is served.

What is kept follows the plan, not recency. Every job (the processes that share one node
schedule) records when it reads each entry next (a hint, kept current at each of its reads);
an entry's next use is the soonest of every live job's, kept in an index, so a miss ranks only
the few entries it may evict, never all of them, and no job evicts what another reads sooner.
:meth:`CacheStore.reserve` applies Belady's rule: it evicts what is read farthest in the future,
and admits an episode only if everything it evicts is read later than it.

The limit holds at all times: downloads in flight count, and an evicted file that some process
still maps (its blocks stay on disk) counts until the last mapping goes (each mapping holds a
shared ``flock`` on its file; see :func:`_load`). The free-space floor counts the downloads
admitted but not yet written. A folder that cannot be written or a full disk raises
:class:`CacheUnavailable` (``transient=False``: the caller warns once and reads uncached); a
busy database or a file another process removed meanwhile is transient (one uncached read).
Details: docs/cache.md.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from lerobot_shards.format import checksum
from lerobot_shards.reader.fetch import cache_files as files
from lerobot_shards.reader.fetch import mapped

log = logging.getLogger("lerobot_shards.reader.fetch")

DEFAULT_DIR_ENV = "LEROBOT_SHARDS_CACHE_DIR"
"""The cache folder, where none is given."""

BUSY_TIMEOUT_S = 60.0
"""How long a process waits for another's transaction (they last milliseconds)."""

WAIT_POLL_S = 0.02

LOOK = 16
"""Eviction candidates a miss looks at at least (with twice the bytes it needs), so that the
entries whose stored hint is late (their job's plan says sooner now) do not go first."""

WALK = 64
"""Eviction candidates a miss looks at at most: the lock is held for a time that does not grow
with the number of entries."""

RECLAIM = 16
"""Evicted files still mapped somewhere that one transaction tries to remove."""

DEAD_JOB_ROWS = 256
"""Hints of a job that ended removed per transaction."""

JOB_GRACE_S = 120.0
"""A job whose last writer is gone and that wrote nothing for this long has ended."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,          -- sha256:<hex>, the manifest checksum of the span
    size INTEGER NOT NULL,
    state TEXT NOT NULL,           -- 'pending' (a download in flight) or 'ready'
    owner TEXT,                    -- host.pid.start of a pending row's writer
    label TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    next_use REAL                  -- the soonest of the jobs' hints (time.time()); NULL: none
);
CREATE INDEX IF NOT EXISTS entries_by_next_use ON entries (state, next_use, last_used);
CREATE TABLE IF NOT EXISTS hints (  -- when each job reads each entry next
    key TEXT NOT NULL, job TEXT NOT NULL, at REAL NOT NULL, PRIMARY KEY (key, job)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS hints_by_job ON hints (job);
CREATE TABLE IF NOT EXISTS jobs (  -- who writes hints, and the clock its hints are on
    job TEXT PRIMARY KEY, writer TEXT NOT NULL, seen REAL NOT NULL, start REAL, pace REAL
);
CREATE TABLE IF NOT EXISTS retired (  -- evicted files in tmp/ that a process may still map
    name TEXT PRIMARY KEY, size INTEGER NOT NULL, tried REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value);
"""


class CacheUnavailable(OSError):
    """The cache folder cannot be used now: read uncached.

    ``transient``: whether the next attempt may succeed (a busy database, a file another
    process removed meanwhile): then one read goes uncached and the cache stays in use;
    otherwise (not writable, a full disk, a broken database) it is off for the process."""

    def __init__(self, message: str, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class CacheBusy(RuntimeError):
    """The cache is in use by another process, so it cannot be cleared."""


@dataclass(frozen=True)
class Ready:
    """:meth:`CacheStore.reserve`'s answer when the key is cached: :meth:`CacheStore.get` it."""

    key: str


@dataclass(frozen=True)
class Wait:
    """Another live process is downloading the key: :meth:`CacheStore.wait_ready`, then get."""

    key: str


@dataclass(frozen=True)
class Entry:
    key: str
    size: int
    state: str
    label: str
    last_used: float
    next_use: float | None


def default_cache_dir() -> Path:
    """$LEROBOT_SHARDS_CACHE_DIR, else $XDG_CACHE_HOME/lerobot-shards, else
    ~/.cache/lerobot-shards."""
    if os.environ.get(DEFAULT_DIR_ENV):
        return Path(os.environ[DEFAULT_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lerobot-shards"


def dataset_of(label: str) -> str:
    """The dataset part of an entry's label (``"s3://bucket/ds episode 12"`` -> ``s3://bucket/ds``)."""
    return label.rsplit(" episode ", 1)[0]


def unavailable(directory: Path, exc: BaseException) -> CacheUnavailable:
    """``exc`` as a :class:`CacheUnavailable`, transient where a later attempt may succeed."""
    transient = isinstance(exc, FileNotFoundError) or (
        isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc)
    )
    if isinstance(exc, OSError) and exc.errno in files.UNAVAILABLE_ERRNOS:
        transient = False
    return CacheUnavailable(f"cache folder {directory}: {exc}", transient)


class CacheStore:
    """One cache folder shared by every process on a node (ranks, DataLoader workers, other jobs).

    Args:
        directory: the folder (made if missing).
        limit_bytes: the most its entries may hold (ready, in flight, and evicted but still
            mapped); None takes the limit the folder was last given, else half of what it could
            hold (the disk's free space plus what it holds). Each process enforces the limit it
            opened with.
        min_free_bytes: free space never taken (default: ``cache_files.free_floor``).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        limit_bytes: int | None = None,
        min_free_bytes: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.entries_dir = self.directory / "entries"
        self.tmp_dir = self.directory / "tmp"
        self._pid = -1
        try:
            self._open()
            with self._write() as db:
                used = _setting(db, "used")
                if used is None:  # new, or of an earlier version: count once, forget its hints
                    db.execute("UPDATE entries SET next_use = NULL")
                    (used,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()
                    (pending,) = db.execute(
                        "SELECT COALESCE(SUM(size), 0) FROM entries WHERE state = 'pending'"
                    ).fetchone()
                    _set(db, "used", used)
                    _set(db, "pending", pending)
                stored = _setting(db, "limit")
                if limit_bytes is not None and stored != limit_bytes:
                    _set(db, "limit", limit_bytes)
            self.limit = limit_bytes if limit_bytes is not None else stored
            if self.limit is None:
                self.limit = (files.free_bytes(self.directory)[0] + int(used)) // 2
            self.min_free = (
                files.free_floor(self.directory) if min_free_bytes is None else min_free_bytes
            )
            self._clean()
        except (OSError, sqlite3.Error) as exc:
            self.close()  # what was opened before the failure: its files, its lock
            raise unavailable(self.directory, exc) from exc

    def __reduce__(self):
        return (CacheStore, (self.directory, self.limit, self.min_free))

    def _open(self) -> None:
        """This process's hold on the folder (again in a forked child: a connection never
        crosses a fork); connections are made per thread (:meth:`_conn`)."""
        for folder in (self.directory, self.entries_dir, self.tmp_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_SH)
        self._me = files.me()
        self._pid = os.getpid()
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._connections_lock = threading.Lock()
        self._conn().executescript(SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection: a reader's fetch threads use the store at once, and one
        SQLite connection serves one thread."""
        if self._pid != os.getpid():
            self._open()
        db = getattr(self._local, "db", None)
        if db is None:
            # check_same_thread=False only so that close() may close it from another thread
            db = sqlite3.connect(
                self.directory / "cache.db",
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
            if _journal_mode_wal(db) != "wal":
                raise sqlite3.OperationalError("WAL journal mode is not available here")
            db.execute("PRAGMA synchronous=NORMAL")
            self._local.db = db
            with self._connections_lock:
                self._connections.append(db)
        return db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: every change of rows and of entries/ happens inside one,
        so they never disagree for another process."""
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _execute(self, sql: str, *args: object) -> list[tuple]:
        return self._conn().execute(sql, args).fetchall()

    # ------------------------------------------------------------------ opening

    def _clean(self) -> None:
        """Remove what dead processes left: their pending rows (and a file one renamed into
        place before it died), their temporary files, and evictions they had begun but not
        committed (the file goes back into place). Work in proportion to what is in flight and
        in tmp/, never to the entries."""
        doomed = []
        with self._write() as db:
            self._reclaim(db, time.time(), most=-1)  # every one nobody maps
            for key, size, owner, created in db.execute(
                "SELECT key, size, owner, created FROM entries WHERE state = 'pending'"
            ).fetchall():
                if not _owner(owner).alive(created):
                    _drop_rows(db, [key])
                    _add(db, used=-size, pending=-size)
                    doomed.append(files.entry_path(self.entries_dir, key))
            retired = {name for (name,) in db.execute("SELECT name FROM retired")}
            for tmp in files.scan(self.tmp_dir):
                if tmp.name in retired:
                    continue
                owner, key = files.owner_of_tmp(tmp.name), files.key_of_tmp(tmp.name)
                with suppress(FileNotFoundError):
                    if owner is not None and owner.alive(tmp.stat().st_mtime):
                        continue
                    if key is not None and self._restore(db, key, Path(tmp.path)):
                        continue
                doomed.append(Path(tmp.path))
        for path in doomed:
            files.unlink_quietly(path)

    def _restore(self, db: sqlite3.Connection, key: str, path: Path) -> bool:
        """Put back an entry whose eviction a dead process began and never committed (its row
        is still ready, its file moved to tmp/); whether it was one."""
        row = db.execute("SELECT state FROM entries WHERE key = ?", (key,)).fetchone()
        final = files.entry_path(self.entries_dir, key)
        if row is None or row[0] != "ready" or final.exists():
            return False
        final.parent.mkdir(exist_ok=True)
        os.rename(path, final)
        return True

    # ------------------------------------------------------------------ hits

    def get(
        self, key: str, size: int, job: str = "", next_use: float = math.inf
    ) -> memoryview | bytes | None:
        """The cached bytes of ``key``, verified against it; None if not cached, being
        evicted, or damaged (a damaged entry is removed with a warning, so the caller fetches
        it again). A hit records that ``job`` reads it next at ``next_use``."""
        path = files.entry_path(self.entries_dir, key)
        try:
            rows = self._execute("SELECT size FROM entries WHERE key = ? AND state = 'ready'", key)
            if not rows:
                return None
            data, inode, problem = _load(path, size)
            if problem == _EVICTED:
                return None
            if problem is None and rows[0][0] != size:
                problem = f"recorded as {rows[0][0]} bytes, asked for {size}"
            if problem is None and checksum(data) != key:
                problem = "checksum mismatch"
            now = time.time()
            if problem is None:
                with self._write() as db:
                    db.execute("UPDATE entries SET last_used = ? WHERE key = ?", (now, key))
                    self._hint(db, {key: next_use}, job, now)
                return data
            log.warning("cache entry %s (%s): %s; removed, fetching again", key, path, problem)
            data = b""  # a mapping of the damaged file is let go before it is removed
            with self._write() as db:
                if inode is None or _inode(path) == inode:
                    self._evict(db, [(key, int(rows[0][0]))])
            with self._write() as db:
                self._reclaim(db, time.time())
            return None
        except (OSError, sqlite3.Error) as exc:
            raise unavailable(self.directory, exc) from exc

    # ------------------------------------------------------------------ misses

    def reserve(
        self,
        key: str,
        size: int,
        next_use: float,
        priority: Callable[[str], float | None],
        label: str = "",
        job: str = "",
    ) -> Reservation | Ready | Wait | None:
        """Make room for ``key`` (``size`` bytes, which ``job`` reads next at ``next_use``)
        and claim its download; :class:`Ready` if it is cached, :class:`Wait` if another live
        process is downloading it, None if it should not be cached (Belady's rule, or the
        disk's floor).

        ``priority(k)``: when ``job`` reads cached key ``k`` next from what it knows now
        (``time.time()`` scale; ``math.inf`` if never; None if ``k`` is not its own): it
        corrects the job's own stored hints of the few entries a miss looks at.
        """
        files.hex_of(key)
        try:
            for evicted in (False, True):
                with self._write() as db:
                    now = time.time()
                    self._reclaim(db, now)
                    self._end_dead_jobs(db, now)
                    known = self._known(db, key, next_use, job, now)
                    if known is not None:
                        return known
                    victims = self._victims(db, size, next_use, priority, job, now)
                    if victims is None or (victims and evicted):
                        return None  # not admitted (or the room made was taken meanwhile)
                    if not victims:
                        db.execute(
                            "INSERT INTO entries VALUES (?, ?, 'pending', ?, ?, ?, ?, NULL)",
                            (key, size, self._me.tag(), label, now, now),
                        )
                        _add(db, used=size, pending=size)
                        self._hint(db, {key: next_use}, job, now)
                        return Reservation(self, key, size)
                    # Committed before any file goes: the next transaction removes the
                    # victims' files (no process maps them) and admits the key.
                    self._evict(db, victims)
            raise AssertionError("unreachable")
        except (OSError, sqlite3.Error) as exc:
            raise unavailable(self.directory, exc) from exc

    def _known(
        self, db: sqlite3.Connection, key: str, next_use: float, job: str, now: float
    ) -> Ready | Wait | None:
        """:class:`Ready` or :class:`Wait` if ``key`` is cached or being downloaded (``job``'s
        hint recorded); None if not (a dead writer's pending row and file removed first)."""
        row = db.execute(
            "SELECT state, owner, created, size FROM entries WHERE key = ?", (key,)
        ).fetchone()
        if row is None:
            return None
        if row[0] == "ready" or _owner(row[1]).alive(row[2]):
            self._hint(db, {key: next_use}, job, now)
            return Ready(key) if row[0] == "ready" else Wait(key)
        _drop_rows(db, [key])  # its writer died: what it left goes
        _add(db, used=-row[3], pending=-row[3])
        files.unlink_quietly(files.entry_path(self.entries_dir, key))
        self._drop_downloads(_owner(row[1]))
        return None

    def _drop_downloads(self, writer: files.Owner) -> None:
        """Remove the downloads a dead ``writer`` left in tmp/, as its pending row goes: the
        books no longer count them, so the disk must not hold them (``_clean`` would, only at
        the next opening). Its evictions in tmp/ stay for ``_clean`` to put back."""
        for tmp in files.scan(self.tmp_dir):
            if files.key_of_tmp(tmp.name) is None and files.owner_of_tmp(tmp.name) == writer:
                files.unlink_quietly(Path(tmp.path))

    def _victims(
        self,
        db: sqlite3.Connection,
        size: int,
        next_use: float,
        priority: Callable[[str], float | None],
        job: str,
        now: float,
    ) -> list[tuple[str, int]] | None:
        """The ready entries to evict so that ``size`` more bytes fit (none if they fit now),
        farthest next use first (least recently used first among those nobody reads again);
        None if that would evict one read sooner than (or as soon as) the new entry, or take
        the disk below its floor (counting the downloads admitted and not yet written).

        The index gives the candidates in the order of their stored next use; each one's is
        corrected where the caller's own plan knows better (:meth:`_corrected`: a hint written
        ahead of the plan's clock, say), and the victims are the farthest of the corrected
        first :data:`LOOK` to :data:`WALK` candidates, passing over those some process maps
        now (evicting one would free nothing yet)."""
        if size > self.limit:
            return None
        used, pending = _setting(db, "used") or 0, _setting(db, "pending") or 0
        need = used + size - self.limit
        victims: list[tuple[str, int]] = []
        freed = 0
        if need > 0:
            ranked = []  # (next use, candidate order, key, size): the walk, corrected
            corrections: dict[str, float] = {}
            try:
                seen = 0
                for key, victim_size, stored in _by_next_use(db):
                    when = self._corrected(db, key, stored, priority, job, corrections)
                    ranked.append((when, len(ranked), key, victim_size))
                    seen += victim_size if when > next_use else 0
                    if len(ranked) >= WALK or (len(ranked) >= LOOK and seen >= 2 * need):
                        break
            finally:  # the walk's cursors are done: the corrected hints may move rows now
                self._hint(db, corrections, job, now)
            ranked.sort(key=lambda r: (-r[0], r[1]))
            for when, _, key, victim_size in ranked:
                if when <= next_use:
                    return None  # the rest is read as soon or sooner than the new entry
                if _unlocked(files.entry_path(self.entries_dir, key)):
                    victims.append((key, victim_size))
                    freed += victim_size
                    if freed >= need:
                        break
            if freed < need:
                return None
        if files.free_bytes(self.directory)[0] - pending + freed - size < self.min_free:
            return None
        return victims

    def _corrected(
        self,
        db: sqlite3.Connection,
        key: str,
        stored: float | None,
        priority: Callable[[str], float | None],
        job: str,
        corrections: dict[str, float],
    ) -> float:
        """When ``key`` is read next: the soonest of every job's hint, the caller's own taken
        from ``priority`` (its plan now) rather than from its stored hint (recorded in
        ``corrections``, to be stored)."""
        mine = priority(key)
        if mine is None:
            return math.inf if stored is None else stored
        (others,) = db.execute(
            "SELECT MIN(at) FROM hints WHERE key = ? AND job != ?", (key, job)
        ).fetchone()
        corrections[key] = mine
        return min(mine, math.inf if others is None else others)

    def _evict(self, db: sqlite3.Connection, victims: list[tuple[str, int]]) -> None:
        """Move the victims' files out of entries/ and drop their rows; each file stays in
        ``retired``, and counts against the limit, until no process maps it (:meth:`_reclaim`)."""
        keys = [key for key, _ in victims]
        _drop_rows(db, keys)
        for key, victim_size in victims:
            name = files.tmp_name(self._me, key)
            try:
                os.rename(files.entry_path(self.entries_dir, key), self.tmp_dir / name)
            except FileNotFoundError:
                _add(db, used=-victim_size, pending=0)  # gone already (removed by hand)
                continue
            db.execute("INSERT INTO retired VALUES (?, ?, ?)", (name, victim_size, 0.0))

    def _reclaim(self, db: sqlite3.Connection, now: float, most: int = RECLAIM) -> None:
        """Remove the evicted files that no process maps any more (the oldest tries first,
        at most ``most``)."""
        for name, retired_size in db.execute(
            "SELECT name, size FROM retired ORDER BY tried LIMIT ?", (most,)
        ).fetchall():
            path = self.tmp_dir / name
            if _unlocked(path, remove=True):
                db.execute("DELETE FROM retired WHERE name = ?", (name,))
                _add(db, used=-retired_size, pending=0)
            else:
                db.execute("UPDATE retired SET tried = ? WHERE name = ?", (now, name))

    # ------------------------------------------------------------------ hints

    def set_hints(self, hints: Mapping[str, float], job: str = "") -> None:
        """Record when ``job`` reads these keys next (``math.inf``: never)."""
        try:
            with self._write() as db:
                now = time.time()
                self._hint_job(db, job, now)
                self._hint(db, hints, job, now)
        except (OSError, sqlite3.Error) as exc:
            raise unavailable(self.directory, exc) from exc

    def _hint(
        self, db: sqlite3.Connection, hints: Mapping[str, float], job: str, now: float
    ) -> None:
        """Store ``job``'s next uses and each entry's soonest over the jobs."""
        if not hints:
            return
        self._hint_job(db, job, now)
        for key, at in hints.items():
            if math.isinf(at):
                db.execute("DELETE FROM hints WHERE key = ? AND job = ?", (key, job))
            else:
                db.execute("INSERT OR REPLACE INTO hints VALUES (?, ?, ?)", (key, job, at))
        _settle_next_use(db, hints.keys())

    def _hint_job(self, db: sqlite3.Connection, job: str, now: float) -> None:
        """``job`` lives: this process writes for it now."""
        db.execute(
            "INSERT INTO jobs (job, writer, seen) VALUES (?, ?, ?) ON CONFLICT (job) "
            "DO UPDATE SET writer = excluded.writer, seen = excluded.seen",
            (job, self._me.tag(), now),
        )

    def job_clock(self, job: str, draw: int, pace: float) -> tuple[float, float]:
        """``(start, pace)`` of ``job``'s clock: its hints for draw ``d`` are ``start + d *
        pace`` (``time.time()`` scale), one clock for all its processes, so that its hints keep
        the order of its draws whoever wrote them. Made from ``pace`` (seconds per draw) at
        draw ``draw`` if the job has none; moved to ``pace`` (continuous at ``draw``) if it is
        off by more than half."""
        try:
            with self._write() as db:
                now = time.time()
                self._hint_job(db, job, now)
                start, kept = db.execute(
                    "SELECT start, pace FROM jobs WHERE job = ?", (job,)
                ).fetchone()
                if start is None or not 0.5 < kept / pace < 1.5:
                    at = now if start is None else start + draw * kept
                    start, kept = at - draw * pace, pace
                    db.execute(
                        "UPDATE jobs SET start = ?, pace = ? WHERE job = ?", (start, kept, job)
                    )
                return start, kept
        except (OSError, sqlite3.Error) as exc:
            raise unavailable(self.directory, exc) from exc

    def _end_dead_jobs(self, db: sqlite3.Connection, now: float) -> None:
        """Drop the hints of jobs that ended (their last writer is gone and nobody wrote for
        them since :data:`JOB_GRACE_S`), :data:`DEAD_JOB_ROWS` per transaction."""
        for job, writer, seen in db.execute(
            "SELECT job, writer, seen FROM jobs WHERE seen < ?", (now - JOB_GRACE_S,)
        ).fetchall():
            if _owner(writer).alive(seen):
                continue
            keys = [
                k
                for (k,) in db.execute(
                    "SELECT key FROM hints WHERE job = ? LIMIT ?", (job, DEAD_JOB_ROWS)
                )
            ]
            db.executemany("DELETE FROM hints WHERE key = ? AND job = ?", [(k, job) for k in keys])
            _settle_next_use(db, keys)
            if len(keys) < DEAD_JOB_ROWS:
                db.execute("DELETE FROM jobs WHERE job = ?", (job,))
            return

    # ------------------------------------------------------------------ the rest

    def wait_ready(self, key: str, timeout_s: float) -> bool:
        """Wait until ``key`` is ready; False once its download is given up (or its writer
        died), or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            rows = self._execute("SELECT state, owner, created FROM entries WHERE key = ?", key)
            if rows and rows[0][0] == "ready":
                return True
            if not rows or not _owner(rows[0][1]).alive(rows[0][2]):
                return False
            if time.monotonic() >= deadline:
                return False
            time.sleep(WAIT_POLL_S)

    def entries(self) -> list[Entry]:
        rows = self._execute(
            "SELECT key, size, state, label, last_used, next_use FROM entries ORDER BY label, key"
        )
        return [Entry(*row) for row in rows]

    def usage(self) -> tuple[int, int]:
        """(bytes the cache takes: ready and pending entries, evicted files still mapped;
        the limit)."""
        (used,) = self._execute("SELECT value FROM settings WHERE name = 'used'")[0]
        return int(used), self.limit

    def clear(self) -> None:
        """Remove every entry; :class:`CacheBusy` while another process has the cache open."""
        self._conn()
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CacheBusy(
                f"cache folder {self.directory} is in use by another process; "
                "clear it once nothing reads from it"
            ) from None
        try:
            with self._write() as db:
                for table in ("entries", "hints", "jobs", "retired"):
                    db.execute(f"DELETE FROM {table}")
                _set(db, "used", 0)
                _set(db, "pending", 0)
                doomed = list(files.entry_files(self.entries_dir).values())
                doomed += [Path(t.path) for t in files.scan(self.tmp_dir)]
                for path in doomed:
                    files.unlink_quietly(path)
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_SH)

    def close(self) -> None:
        if self._pid == os.getpid() and hasattr(self, "_connections"):
            with self._connections_lock:
                for db in self._connections:
                    db.close()
                self._connections.clear()
            os.close(self._lock_fd)
        self._pid = -1


def _journal_mode_wal(db: sqlite3.Connection) -> str:
    """Switch ``db`` to WAL mode (a no-op once the file is): the journal mode it is in after.

    Processes that open a new cache folder at once (a node's ranks and DataLoader workers)
    switch together, and SQLite answers some of them "database is locked" at once, without
    waiting out the busy timeout (a shared lock it cannot raise while another holds one): they
    try again until the timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            return db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(WAIT_POLL_S)


class Reservation:
    """The claim on one key's download: :meth:`commit` its bytes, or :meth:`abort`."""

    def __init__(self, store: CacheStore, key: str, size: int) -> None:
        self.store, self.key, self.size = store, key, size
        self.done = False

    def commit(self, data: bytes | memoryview) -> None:
        """Write the entry (a temporary file, synced, renamed into place) and mark it ready.
        :class:`CacheUnavailable` if the folder cannot take it (the reservation is dropped)."""
        store = self.store
        if memoryview(data).nbytes != self.size:
            self.abort()
            raise ValueError(
                f"cache entry {self.key}: {memoryview(data).nbytes} bytes, reserved {self.size}"
            )
        tmp = store.tmp_dir / files.tmp_name(store._me)
        try:
            files.write_synced(tmp, data)
            final = files.entry_path(store.entries_dir, self.key)
            with store._write() as db:
                mine = db.execute(
                    "SELECT 1 FROM entries WHERE key = ? AND state = 'pending' AND owner = ?",
                    (self.key, store._me.tag()),
                ).fetchone()
                if mine:
                    final.parent.mkdir(exist_ok=True)
                    os.rename(tmp, final)
                    db.execute(
                        "UPDATE entries SET state = 'ready', owner = NULL WHERE key = ?",
                        (self.key,),
                    )
                    _add(db, used=0, pending=-self.size)
            self.done = True
        except (OSError, sqlite3.Error) as exc:
            files.unlink_quietly(tmp)  # first: on a full disk, the database needs its room
            self.abort()
            raise unavailable(store.directory, exc) from exc
        finally:
            files.unlink_quietly(tmp)

    def abort(self) -> None:
        """Give the key up (another process may then download it)."""
        if self.done:
            return
        self.done = True
        try:
            with self.store._write() as db:
                gone = db.execute(
                    "DELETE FROM entries WHERE key = ? AND state = 'pending' AND owner = ?",
                    (self.key, self.store._me.tag()),
                ).rowcount
                if gone:
                    db.execute("DELETE FROM hints WHERE key = ?", (self.key,))
                    _add(db, used=-self.size, pending=-self.size)
        except sqlite3.Error as exc:
            log.warning("cache folder %s: %s", self.store.directory, exc)


# ---------------------------------------------------------------------- helpers


def _setting(db: sqlite3.Connection, name: str) -> object:
    row = db.execute("SELECT value FROM settings WHERE name = ?", (name,)).fetchone()
    return None if row is None else row[0]


def _set(db: sqlite3.Connection, name: str, value: object) -> None:
    db.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", (name, value))


def _add(db: sqlite3.Connection, used: int, pending: int) -> None:
    """Move the running totals: bytes the cache takes, and bytes admitted but not yet written."""
    for name, delta in (("used", used), ("pending", pending)):
        if delta:
            db.execute("UPDATE settings SET value = value + ? WHERE name = ?", (int(delta), name))


def _drop_rows(db: sqlite3.Connection, keys: list[str]) -> None:
    """Delete the entries' rows and hints."""
    db.executemany("DELETE FROM entries WHERE key = ?", [(k,) for k in keys])
    db.executemany("DELETE FROM hints WHERE key = ?", [(k,) for k in keys])


def _settle_next_use(db: sqlite3.Connection, keys) -> None:
    """Each entry's next use: the soonest of its jobs' hints (NULL when no job reads it)."""
    db.executemany(
        "UPDATE entries SET next_use = (SELECT MIN(at) FROM hints WHERE hints.key = ?) "
        "WHERE key = ?",
        [(k, k) for k in keys],
    )


def _by_next_use(db: sqlite3.Connection) -> Iterator[tuple[str, int, float | None]]:
    """Ready entries in eviction order: those nobody reads again, least recently used first,
    then the farthest next use first (both walks of ``entries_by_next_use``)."""
    yield from db.execute(
        "SELECT key, size, NULL FROM entries "
        "WHERE state = 'ready' AND next_use IS NULL ORDER BY last_used"
    )
    yield from db.execute(
        "SELECT key, size, next_use FROM entries "
        "WHERE state = 'ready' AND next_use IS NOT NULL ORDER BY next_use DESC"
    )


def _owner(tag: str) -> files.Owner:
    host, pid, start = tag.rsplit(".", 2)
    return files.Owner(host, int(pid), int(start))


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _unlocked(path: Path, remove: bool = False) -> bool:
    """Whether no process maps ``path`` (none holds its shared lock: :func:`_load`); with
    ``remove``, it is removed then. A missing file counts as unlocked."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    else:
        if remove:
            files.unlink_quietly(path)
        return True
    finally:
        os.close(fd)


_EVICTED = "being evicted"


def _load(path: Path, size: int) -> tuple[memoryview | bytes, int | None, str | None]:
    """An entry file's bytes (mapped where local shards are), its inode, and what is wrong with
    it (None if nothing; :data:`_EVICTED` if another process is evicting it).

    A mapping holds a shared ``flock`` on the file for as long as it lives (the mapping keeps a
    duplicate of the descriptor the lock was taken on), so an eviction sees that the file's
    blocks are still in use and keeps counting them (``CacheStore._reclaim``). The file must
    still be the entry once locked, or it was evicted meanwhile."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", None, "file missing"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return b"", None, _EVICTED
        st = os.fstat(fd)
        if _inode(path) != st.st_ino:
            return b"", None, _EVICTED
        if st.st_size != size:
            return b"", st.st_ino, f"{st.st_size} bytes on disk, expected {size}"
        if size and mapped.enabled():
            data = mapped.map_descriptor(fd, size)
        else:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(size)
    finally:
        os.close(fd)
    if data is None or len(data) != size:
        return b"", st.st_ino, "file changed while read"
    return data, st.st_ino, None
