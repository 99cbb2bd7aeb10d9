"""A node-local cache of remote episodes: one folder shared by every process on a node.

Why. Training reads a remote dataset tens of times; each episode should cross the network once.
Every rank, DataLoader worker and concurrent job of a node opens the same folder: the
bookkeeping is a SQLite database in WAL mode (made for many processes at once), the entries are
files named by their manifest checksum, so an entry can never be served for another dataset or a
changed shard, and each is verified against that checksum whenever it is served.

What is kept follows the plan, not recency: the caller says when each episode is read next
(``next_use``, and ``priority`` for what is cached), and :meth:`CacheStore.reserve` applies
Belady's rule: it evicts what is read farthest in the future, and admits an episode only if
everything it evicts is read later than it. The limit holds at all times, downloads in flight
included. A folder that cannot be written, or a full disk, raises :class:`CacheUnavailable`:
the caller warns once and reads uncached. Details: docs/cache.md.
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

SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    key TEXT PRIMARY KEY,          -- sha256:<hex>, the manifest checksum of the span
    size INTEGER NOT NULL,
    state TEXT NOT NULL,           -- 'pending' (a download in flight) or 'ready'
    owner TEXT,                    -- host.pid.start of a pending row's writer
    label TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    last_used REAL NOT NULL,
    next_use REAL                  -- hint: when some process reads it next (time.time() scale)
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value);
"""


class CacheUnavailable(OSError):
    """The cache folder cannot be used (not writable, full, a database error): read uncached."""


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


def default_limit(directory: str | Path) -> int:
    """Half of what the cache could have at most now (the disk's free space plus what the cache
    already holds): the other half stays for everything else on the disk."""
    directory = Path(directory)
    return (files.free_bytes(directory)[0] + files.held_bytes(directory / "entries")) // 2


def dataset_of(label: str) -> str:
    """The dataset part of an entry's label (``"s3://bucket/ds episode 12"`` -> ``s3://bucket/ds``)."""
    return label.rsplit(" episode ", 1)[0]


class CacheStore:
    """One cache folder shared by every process on a node (ranks, DataLoader workers, other jobs).

    ``limit_bytes``: the most its entries (ready and in flight) may hold; None takes the limit
    the folder was last given, else :func:`default_limit`. Each process enforces the limit it
    opened with. ``min_free_bytes``: free space never taken (default: ``free_floor``).
    """

    def __init__(
        self,
        directory: str | Path,
        limit_bytes: int | None = None,
        min_free_bytes: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.entries_dir = self.directory / "entries"
        self.tmp_dir = self.directory / "tmp"
        self._pid = -1
        try:
            self._open()
            stored = self._settings("limit")
            self.limit = limit_bytes if limit_bytes is not None else stored
            if self.limit is None:
                self.limit = default_limit(self.directory)
            elif limit_bytes is not None and stored != limit_bytes:
                self._execute("INSERT OR REPLACE INTO settings VALUES ('limit', ?)", limit_bytes)
            self.min_free = (
                files.free_floor(self.directory) if min_free_bytes is None else min_free_bytes
            )
            self._clean()
        except (OSError, sqlite3.Error) as exc:
            self.close()  # what was opened before the failure: its files, its lock
            raise CacheUnavailable(f"cache folder {self.directory}: {exc}") from exc

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
            if db.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
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

    def _settings(self, name: str) -> object:
        rows = self._execute("SELECT value FROM settings WHERE name = ?", name)
        return rows[0][0] if rows else None

    def _clean(self) -> None:
        """Remove what dead processes left: their pending rows (and a file one renamed into
        place before it died), their temporary files, entry files without a ready row, and
        ready rows without their file (an eviction killed inside its transaction)."""
        doomed = []
        with self._write() as db:
            for key, owner, created in db.execute(
                "SELECT key, owner, created FROM entries WHERE state = 'pending'"
            ).fetchall():
                if not _owner(owner).alive(created):
                    db.execute("DELETE FROM entries WHERE key = ?", (key,))
            ready = {k for (k,) in db.execute("SELECT key FROM entries WHERE state = 'ready'")}
            on_disk = files.entry_files(self.entries_dir)
            for key, path in on_disk.items():
                if key not in ready:
                    doomed.append(self._retire(path))
            # a process killed while evicting had moved the files out before its rows went
            for key in ready - set(on_disk):
                db.execute("DELETE FROM entries WHERE key = ?", (key,))
            for tmp in os.scandir(self.tmp_dir):
                owner = files.owner_of_tmp(tmp.name)
                if owner is None or not owner.alive(tmp.stat().st_mtime):
                    doomed.append(Path(tmp.path))
        for path in doomed:
            files.unlink_quietly(path)

    def _retire(self, path: Path) -> Path:
        """Move an entry file out of entries/ (inside a transaction; unlinked after it)."""
        gone = self.tmp_dir / files.tmp_name(self._me)
        with suppress(FileNotFoundError):
            os.rename(path, gone)
        return gone

    def get(self, key: str, size: int) -> memoryview | bytes | None:
        """The cached bytes of ``key``, verified against it; None if not cached or damaged (a
        damaged entry is removed with a warning, so the caller fetches it again)."""
        path = files.entry_path(self.entries_dir, key)
        try:
            rows = self._execute("SELECT size FROM entries WHERE key = ? AND state = 'ready'", key)
            if not rows:
                return None
            data, inode, problem = _load(path, size)
            if problem is None and rows[0][0] != size:
                problem = f"recorded as {rows[0][0]} bytes, asked for {size}"
            if problem is None and checksum(data) != key:
                problem = "checksum mismatch"
            if problem is None:
                with self._write() as db:
                    db.execute("UPDATE entries SET last_used = ? WHERE key = ?", (time.time(), key))
                return data
            log.warning("cache entry %s (%s): %s; removed, fetching again", key, path, problem)
            with self._write() as db:
                doomed = None
                if inode is None or _inode(path) == inode:
                    db.execute("DELETE FROM entries WHERE key = ? AND state = 'ready'", (key,))
                    doomed = self._retire(path)
            if doomed is not None:
                files.unlink_quietly(doomed)
            return None
        except (OSError, sqlite3.Error) as exc:
            raise CacheUnavailable(f"cache folder {self.directory}: {exc}") from exc

    def reserve(
        self,
        key: str,
        size: int,
        next_use: float,
        priority: Callable[[str], float | None],
        label: str = "",
    ) -> Reservation | Ready | Wait | None:
        """Make room for ``key`` (``size`` bytes, read next at ``next_use``) and claim its
        download; :class:`Ready` if it is cached, :class:`Wait` if another live process is
        downloading it, None if it should not be cached (Belady's rule, or the disk's floor).

        ``priority(k)``: when the caller reads cached key ``k`` next (``time.time()`` scale),
        ``math.inf`` if it never does, None if ``k`` is not the caller's (another job's): then
        the stored hint decides (:func:`effective_next_use`).
        """
        files.hex_of(key)
        doomed: list[Path] = []
        try:
            with self._write() as db:
                now = time.time()
                row = db.execute(
                    "SELECT state, owner, created FROM entries WHERE key = ?", (key,)
                ).fetchone()
                if row is not None and row[0] == "ready":
                    _hint(db, {key: next_use}, now)
                    return Ready(key)
                if row is not None:
                    if _owner(row[1]).alive(row[2]):
                        return Wait(key)
                    db.execute("DELETE FROM entries WHERE key = ?", (key,))
                    doomed.append(self._retire(files.entry_path(self.entries_dir, key)))
                victims = self._victims(db, size, next_use, priority, now)
                if victims is None:
                    return None
                for victim in victims:
                    db.execute("DELETE FROM entries WHERE key = ?", (victim,))
                    doomed.append(self._retire(files.entry_path(self.entries_dir, victim)))
                db.execute(
                    "INSERT INTO entries VALUES (?, ?, 'pending', ?, ?, ?, ?, ?)",
                    (key, size, self._me.tag(), label, now, now, next_use),
                )
            return Reservation(self, key, size)
        except (OSError, sqlite3.Error) as exc:
            raise CacheUnavailable(f"cache folder {self.directory}: {exc}") from exc
        finally:
            for path in doomed:
                files.unlink_quietly(path)

    def _victims(
        self,
        db: sqlite3.Connection,
        size: int,
        next_use: float,
        priority: Callable[[str], float | None],
        now: float,
    ) -> list[str] | None:
        """The ready entries to evict so that ``size`` more bytes fit, farthest next use first
        (least recently used first among those never read again); None if that would evict
        one read sooner than (or as soon as) the new entry, or leave the disk too full."""
        if size > self.limit:
            return None
        (used,) = db.execute("SELECT COALESCE(SUM(size), 0) FROM entries").fetchone()
        need = used + size - self.limit
        victims, freed = [], 0
        if need > 0:
            rows = db.execute(
                "SELECT key, size, last_used, next_use FROM entries WHERE state = 'ready'"
            ).fetchall()
            ranked = [
                (effective_next_use(priority(k), hint, now), last_used, k, s)
                for k, s, last_used, hint in rows
            ]
            ranked.sort(key=lambda r: (-r[0], r[1]))
            for when, _, victim, victim_size in ranked:
                if freed >= need:
                    break
                if when <= next_use:
                    return None
                victims.append(victim)
                freed += victim_size
            if freed < need:
                return None
        if files.free_bytes(self.directory)[0] + freed - size < self.min_free:
            return None
        return victims

    def set_hints(self, hints: Mapping[str, float]) -> None:
        """Record when this process reads these keys next (for other processes' evictions)."""
        try:
            with self._write() as db:
                _hint(db, hints, time.time())
        except (OSError, sqlite3.Error) as exc:
            raise CacheUnavailable(f"cache folder {self.directory}: {exc}") from exc

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
        """(bytes of ready and pending entries, the limit)."""
        (used,) = self._execute("SELECT COALESCE(SUM(size), 0) FROM entries")[0]
        return used, self.limit

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
                db.execute("DELETE FROM entries")
                doomed = [self._retire(p) for p in files.entry_files(self.entries_dir).values()]
            for path in doomed + [Path(t.path) for t in os.scandir(self.tmp_dir)]:
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
            self.done = True
        except (OSError, sqlite3.Error) as exc:
            files.unlink_quietly(tmp)  # first: on a full disk, the database needs its room
            self.abort()
            raise CacheUnavailable(f"cache folder {store.directory}: {exc}") from exc
        finally:
            files.unlink_quietly(tmp)

    def abort(self) -> None:
        """Give the key up (another process may then download it)."""
        if self.done:
            return
        self.done = True
        try:
            with self.store._write() as db:
                db.execute(
                    "DELETE FROM entries WHERE key = ? AND state = 'pending' AND owner = ?",
                    (self.key, self.store._me.tag()),
                )
        except sqlite3.Error as exc:
            log.warning("cache folder %s: %s", self.store.directory, exc)


def effective_next_use(mine: float | None, hint: float | None, now: float) -> float:
    """When a cached key is read next, as far as anyone knows: the caller's own answer where it
    has one (``math.inf``: never again), else the stored hint of whoever touched it last; a
    hint already past counts as never (its writer read it, or died)."""
    if mine is not None:
        return mine
    return hint if hint is not None and hint >= now else math.inf


def _hint(db: sqlite3.Connection, hints: Mapping[str, float], now: float) -> None:
    """Store next-use hints (the last writer's knowledge wins)."""
    db.executemany(
        "UPDATE entries SET next_use = ? WHERE key = ?", [(t, k) for k, t in hints.items()]
    )


def _owner(tag: str) -> files.Owner:
    host, pid, start = tag.rsplit(".", 2)
    return files.Owner(host, int(pid), int(start))


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        return None


def _load(path: Path, size: int) -> tuple[memoryview | bytes, int | None, str | None]:
    """An entry file's bytes (mapped where local shards are), its inode, and what is wrong with
    its size (None if nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b"", None, "file missing"
    try:
        st = os.fstat(fd)
        if st.st_size != size:
            return b"", st.st_ino, f"{st.st_size} bytes on disk, expected {size}"
        if size and mapped.enabled():
            data = mapped.map_span(str(path), 0, size)
        else:
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(size)
    finally:
        os.close(fd)
    if data is None or len(data) != size:
        return b"", st.st_ino, "file changed while read"
    return data, st.st_ino, None
