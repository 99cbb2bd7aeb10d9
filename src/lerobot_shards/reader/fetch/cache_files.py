"""The cache's files and owners: where an entry lives, who wrote a temporary file, whether that
process still lives, and how much of the disk is free.

Why apart from the store. The store (:mod:`.cache`) decides what is cached; this module only
knows the folder: a temporary file's name says which process wrote it (host, pid and the pid's
start time, so a reused pid is not taken for the writer), which is all a later open needs to
clean what a killed process left.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import socket
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

STALE_S = 3600.0
"""A pending download or temporary file of another host (a cache folder on a shared filesystem)
cannot be checked for life; after this long it is taken for dead."""

CHUNK = 1 << 22
"""Entries are written in pieces of this size (a full disk stops the write early)."""

UNAVAILABLE_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT}
"""Errors that mean the folder cannot take the entry: the caller goes on uncached."""


@dataclass(frozen=True)
class Owner:
    """A process, as written in pending rows and temporary file names."""

    host: str
    pid: int
    start: int
    """The pid's start time (clock ticks since boot, from /proc; 0 where there is no /proc)."""

    def tag(self) -> str:
        return f"{self.host}.{self.pid}.{self.start}"

    def alive(self, since: float) -> bool:
        """Whether this process still runs. ``since``: when it was last seen to (its row's or
        file's time), for owners on other hosts, who are taken for dead after :data:`STALE_S`."""
        if self.host != socket.gethostname():
            return time.time() - since < STALE_S
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return start_time(self.pid) == self.start


def start_time(pid: int) -> int:
    """When ``pid`` started (field 22 of /proc/PID/stat), 0 if unknown (no /proc, or gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def me() -> Owner:
    pid = os.getpid()
    return Owner(socket.gethostname(), pid, start_time(pid))


def owner_of_tmp(name: str) -> Owner | None:
    """The writer named in a temporary file's name (``host.pid.start-random``), None if foreign."""
    tag, _, _ = name.rpartition("-")
    host, _, rest = tag.rpartition(".")
    host, _, pid = host.rpartition(".")
    if not host or not pid.isdigit() or not rest.isdigit():
        return None
    return Owner(host, int(pid), int(rest))


def tmp_name(owner: Owner) -> str:
    return f"{owner.tag()}-{secrets.token_hex(8)}"


def hex_of(key: str) -> str:
    """The hex digest of a ``sha256:<hex>`` key: the entry's file name."""
    algo, _, digest = key.partition(":")
    if algo != "sha256" or len(digest) != 64 or not all(c in "0123456789abcdef" for c in digest):
        raise ValueError(f"cache key {key!r} is not a sha256:<hex> checksum")
    return digest


def entry_path(entries: Path, key: str) -> Path:
    digest = hex_of(key)
    return entries / digest[:2] / digest


def write_synced(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to a new file ``path`` and flush it to the disk."""
    view = memoryview(data).cast("B")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done : done + CHUNK])
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: Path) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)


def free_bytes(directory: Path) -> tuple[int, int]:
    """(bytes free to this user, size) of the filesystem holding ``directory`` (or its nearest
    existing parent)."""
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def free_floor(directory: Path) -> int:
    """Free space the cache always leaves: 5% of the disk, at most 1 GiB."""
    return min(free_bytes(directory)[1] // 20, 1 << 30)


def held_bytes(entries: Path) -> int:
    """Bytes of the files under ``entries/`` (what the cache holds now)."""
    total = 0
    if not entries.is_dir():
        return 0
    for sub in os.scandir(entries):
        if sub.is_dir(follow_symlinks=False):
            total += sum(f.stat().st_size for f in os.scandir(sub.path) if f.is_file())
    return total


def entry_files(entries: Path) -> dict[str, Path]:
    """``sha256:<hex>`` -> path of every entry file on disk."""
    found = {}
    for sub in os.scandir(entries):
        if sub.is_dir(follow_symlinks=False):
            for f in os.scandir(sub.path):
                found[f"sha256:{f.name}"] = Path(f.path)
    return found


MOUNTINFO = Path("/proc/self/mountinfo")
NETWORK_FILESYSTEMS = {
    "nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "gpfs", "beegfs", "glusterfs",
    "afs", "9p", "panfs", "wekafs", "fuse",
}  # fmt: skip
"""Filesystem types (before a FUSE type's dot) whose files live on another host."""
LOCAL_FUSE = {"fuse.fuse-overlayfs", "fuse.lxcfs", "fuseblk"}
"""FUSE filesystems that are local: a container's root, lxcfs's /proc files, a local disk."""


def network_filesystem(directory: Path) -> tuple[str, str] | None:
    """``(type, mount point)`` of the network or FUSE filesystem that holds ``directory`` (or
    its nearest existing parent), None on a local one or where the mounts cannot be read
    (no ``/proc``). Why: the cache's SQLite database in WAL mode is unsafe across hosts, and a
    cache on a network filesystem reads every hit over the network again."""
    try:
        lines = MOUNTINFO.read_text().splitlines()
    except OSError:
        return None
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    path = os.path.realpath(directory)
    best: tuple[str, str] | None = None
    for line in lines:
        fields, _, after = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not after:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), parts[4])  # \040: a space
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(best[1])):
            best = (after.split()[0], point)  # the last mount over a point is the one seen
    if best is None or best[0] in LOCAL_FUSE or best[0].split(".")[0] not in NETWORK_FILESYSTEMS:
        return None
    return best
