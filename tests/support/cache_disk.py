"""The bytes a cache folder takes on disk, as the disk sees them: the files in ``entries/`` and
``tmp/`` (entries, downloads being written, evicted files), and files under the folder that
were deleted while some process still maps them (their blocks stay until the last mapping
goes). Read from the folder and from every process's ``/proc/PID/map_files``, never from the
store's own books."""

from __future__ import annotations

import os
from contextlib import suppress
from pathlib import Path


def disk_bytes(folder: Path, pids: list[int] | None = None) -> int:
    """Bytes of the cache's files on disk, deleted-but-mapped ones (by ``pids``, default: any
    process) included, each file once."""
    seen: dict[int, int] = {}
    for sub in ("entries", "tmp"):
        for path in (folder / sub).rglob("*"):
            with suppress(FileNotFoundError):
                st = path.stat()
                if path.is_file():
                    seen[st.st_ino] = st.st_size
    seen.update(deleted_but_mapped(folder, pids))
    return sum(seen.values())


def deleted_but_mapped(folder: Path, pids: list[int] | None = None) -> dict[int, int]:
    """inode -> size of the files under ``folder`` that are deleted and still mapped by one of
    ``pids`` (default: any process; ``/proc/PID/maps`` marks them "(deleted)")."""
    found: dict[int, int] = {}
    prefix = str(folder.resolve())
    every = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    for pid in every if pids is None else pids:
        with suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(maxsplit=5)
                if len(fields) < 6 or not fields[5].endswith("(deleted)"):
                    continue
                if not fields[5].startswith(prefix):
                    continue
                with suppress(OSError):
                    st = os.stat(f"/proc/{pid}/map_files/{fields[0]}")
                    found[st.st_ino] = st.st_size
    return found
