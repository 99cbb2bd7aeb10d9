"""One conversion at a time per destination: a lock held for the whole run.

Two converts writing one destination would clean up each other's temporary files and race on
the manifest, so ``convert`` holds ``DEST/.convert/lock.json`` from before it touches anything
until it has written ``index.json``. The file names the holder (host, pid, run, since when), so
a refused run can say who holds it.

- Local and shared filesystems: ``flock`` on the file. The kernel (or the NFS server) drops the
  lock when its holder dies, however it dies, so a stale lock cannot exist and nothing is ever
  taken over.
- Object storage (and filesystems without ``flock``): a lease object created only if absent
  (S3: ``PutObject`` with ``If-None-Match: *``; elsewhere whatever fsspec's
  ``pipe_file(mode="create")`` gives, which may be a check-then-write). The holder rewrites it
  every ``LEASE_REFRESH_S``. A lease is stale, and is taken over with a warning, if its holder
  ran on this host (same host name) and its process is gone, or if it was not rewritten for
  ``LEASE_TIMEOUT_S`` (by the clock it records, so hosts' clocks must roughly agree). On S3,
  takeover and refresh are conditional on the ETag last seen (``If-Match``), so two runs cannot
  both take over a stale lease, and a holder whose lease was taken over learns it at its next
  refresh and stops. Elsewhere takeover and refresh are plain overwrites: the weaker rule.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

import fsspec
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.converter.job import STATE_DIR, ConvertError
from lerobot_shards.format import join

try:
    import fcntl
except ImportError:  # Windows: leases only
    fcntl = None

LOCK_FILE = f"{STATE_DIR}/lock.json"
LEASE_REFRESH_S = 60.0
LEASE_TIMEOUT_S = 600.0
"""A lease not refreshed for this long is stale: ten missed refreshes."""

log = logging.getLogger(__name__)


class DestinationLocked(ConvertError):
    """Another conversion holds the destination."""


@dataclass(frozen=True)
class Holder:
    """Who holds a destination, as recorded in its lock file."""

    host: str
    pid: int
    run_id: str
    since: str
    """UTC, ISO 8601."""
    refreshed: float = 0.0
    """Unix time of the last lease refresh (leases only)."""

    @classmethod
    def me(cls, run_id: str) -> Holder:
        now = time.time()
        since = datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds")
        return cls(socket.gethostname(), os.getpid(), run_id, since, now)

    def to_json(self) -> bytes:
        return json.dumps(asdict(self)).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Holder | None:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None  # being written this instant, or not ours

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.host} (run {self.run_id[:8]}, since {self.since})"


class DestinationLock:
    """The lock of one destination, held from ``acquire_lock`` until ``release``."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str, dest: str, holder: Holder):
        self.fs, self.path, self.dest, self.holder = fs, path, dest, holder
        self._fd: int | None = None
        self._etag: str | None = None
        self._lost: str | None = None
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self._leased = False

    def check(self) -> None:
        """Raise if the lease was taken over by another run (then this run must stop)."""
        if self._lost is not None:
            raise ConvertError(self._lost)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # drops the flock; the file stays (deleting it would race)
            self._fd = None
            return
        if self._refresher is not None:
            self._stop.set()
            self._refresher.join()
            self._refresher = None
            if self._lost is None:
                self.fs.rm_file(self.path)

    def __enter__(self) -> DestinationLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # --- flock ---

    def _flock(self) -> bool:
        """Take the flock; False if this filesystem has none (then a lease is used)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            data = os.pread(fd, 4096, 0)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise self._refusal(Holder.from_json(data)) from None
            return False  # ENOLCK, EOPNOTSUPP...: no flock here
        data = self.holder.to_json()
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        self._fd = fd
        return True

    # --- lease ---

    def _lease(self) -> None:
        self._leased = True
        try:
            self._etag = self._put(self.holder, mode="create")
        except FileExistsError:
            self._take_over()
        self._refresher = threading.Thread(target=self._refresh, name="lease", daemon=True)
        self._refresher.start()

    def _take_over(self) -> None:
        try:
            data = self.fs.cat_file(self.path)
            etag = self.fs.info(self.path).get("ETag")
        except FileNotFoundError:  # released meanwhile: try once more
            try:
                self._etag = self._put(self.holder, mode="create")
            except FileExistsError:
                raise self._refusal(None) from None
            return
        current = Holder.from_json(data)
        age = time.time() - current.refreshed if current else LEASE_TIMEOUT_S
        if current and current.host == socket.gethostname() and not _alive(current.pid):
            why = "its process is gone"
        elif age >= LEASE_TIMEOUT_S:
            why = f"not refreshed for {age:.0f} s (stale after {LEASE_TIMEOUT_S:.0f} s)"
        else:
            raise self._refusal(current, age)
        log.warning(
            "%s: taking over the lease of %s: %s", self.dest, current or "an unreadable holder", why
        )
        try:
            self._etag = self._put(self.holder, if_match=etag)
        except OSError as exc:  # another run took it over first
            raise self._refusal(None) from exc

    def _put(
        self, holder: Holder, mode: str = "overwrite", if_match: str | None = None
    ) -> str | None:
        """Write the lease; returns its ETag on S3 (None elsewhere)."""
        kwargs = {"IfMatch": if_match} if if_match and self._s3 else {}
        out = self.fs.pipe_file(self.path, holder.to_json(), mode=mode, **kwargs)
        return out.get("ETag") if isinstance(out, dict) else None

    @property
    def _s3(self) -> bool:
        protocols = (self.fs.protocol,) if isinstance(self.fs.protocol, str) else self.fs.protocol
        return "s3" in protocols or "s3a" in protocols

    def _refresh(self) -> None:
        while not self._stop.wait(LEASE_REFRESH_S):
            holder = Holder(**{**asdict(self.holder), "refreshed": time.time()})
            try:
                self._etag = self._put(holder, if_match=self._etag)
            except FileNotFoundError:
                self._lost = f"{self.dest}: this run's lease {self.path} was deleted; stopping"
                return
            except OSError as exc:
                if exc.errno == errno.EINVAL:  # S3 412 Precondition Failed: no longer ours
                    self._lost = (
                        f"{self.dest}: another conversion took over this run's lease "
                        f"{self.path} (it was not refreshed in time); stopping"
                    )
                    return
                log.warning("%s: could not refresh the lease %s: %s", self.dest, self.path, exc)

    def _refusal(self, holder: Holder | None, age: float | None = None) -> DestinationLocked:
        who = str(holder) if holder else "another process"
        if age is None and not self._leased:
            how = "wait for it to finish, or stop it and rerun (its lock goes with its process)"
        else:
            how = (
                "wait for it to finish; if it died, a rerun on its host takes the lease over at "
                f"once, elsewhere once the lease is stale ({LEASE_TIMEOUT_S:.0f} s after its "
                "last refresh)"
            )
        fresh = "" if age is None else f", lease refreshed {age:.0f} s ago"
        return DestinationLocked(
            f"{self.dest}: another conversion is writing here: {who}{fresh} "
            f"(lock {self.path}); {how}"
        )


def _alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's
        return True
    return True


def acquire_lock(
    fs: fsspec.AbstractFileSystem, root: str, dest: str, run_id: str
) -> DestinationLock:
    """Lock the destination ``root`` for this run, or raise ``DestinationLocked`` naming the
    holder and what to do."""
    lock = DestinationLock(fs, join(root, LOCK_FILE), dest, Holder.me(run_id))
    if not (isinstance(fs, LocalFileSystem) and fcntl is not None and lock._flock()):
        lock._lease()
    return lock
