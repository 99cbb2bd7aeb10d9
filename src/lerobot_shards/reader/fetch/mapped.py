"""An episode's bytes from a local shard, mapped rather than read, and given back page by page.

Why. A pool holds ``buffer_size`` fetched episodes per DataLoader worker: at ALOHA scale (6 MB
per episode, 64 per worker, two workers) 0.8 GB of process memory, most of it video packets
that are decoded once and not needed again until the episode is evicted. Mapped from the shard
file, the bytes are the kernel's page cache: once verified and demuxed on admission, and once
each GOP's packets are copied into the decoder, :func:`release` drops the pages from the
process (``MADV_DONTNEED``); they stay cached by the kernel, which may reclaim them under
pressure and reads them back if a GOP is decoded again. Memory for fetched local episodes then
no longer grows with the pool.

Only read-only shared mappings of local files are released this way; bytes from object storage
or HTTP are ordinary process memory and are kept. A shard is never changed in place (the
converter writes a new file and renames it over the old one), so a mapping cannot change under
the reader; a shard that another program truncates while it is mapped ends the process with
SIGBUS at the next read of the lost bytes. ``LEROBOT_SHARDS_MAP_SHARDS=0`` in the environment
reads local shards into memory instead.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

WINDOW = 1 << 21
"""A read of one page of a mapped file maps in its neighbours too: Linux faults around it (64
KiB) and maps the whole page-cache folio holding it (large folios reach 2 MiB). A release drops
the whole aligned windows of this size around its bytes, or those neighbours would stay."""

DISABLE = "LEROBOT_SHARDS_MAP_SHARDS"
"""Set to ``0`` to read local shards into memory instead of mapping them."""

SUPPORTED = hasattr(mmap, "MADV_DONTNEED") and hasattr(mmap.mmap, "madvise")
"""Whether mapped bytes can be given back (Linux and macOS); elsewhere local shards are read."""


def enabled() -> bool:
    """Whether local shards are mapped here: supported, and not turned off (:data:`DISABLE`)."""
    return SUPPORTED and os.environ.get(DISABLE) != "0"


def map_span(path: str, offset: int, size: int) -> memoryview | None:
    """Bytes ``offset .. offset + size`` of the local file ``path``, mapped read-only; None if
    the file is shorter than that (the caller's read reports it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if offset < 0 or size <= 0 or offset + size > os.fstat(fd).st_size:
            return None
        start = offset - offset % mmap.ALLOCATIONGRANULARITY
        mapping = mmap.mmap(fd, offset + size - start, access=mmap.ACCESS_READ, offset=start)
    finally:
        os.close(fd)
    return memoryview(mapping)[offset - start : offset - start + size]


def map_descriptor(fd: int, size: int) -> memoryview:
    """The first ``size`` bytes of the open file ``fd``, mapped read-only. The mapping keeps a
    duplicate of ``fd`` (and so any ``flock`` taken on it) until it is released."""
    return memoryview(mmap.mmap(fd, size, access=mmap.ACCESS_READ))


def is_mapped(data: object) -> bool:
    """Whether ``data`` is a view of a mapping made by :func:`map_span`."""
    return SUPPORTED and isinstance(data, memoryview) and isinstance(data.obj, mmap.mmap)


def release(data: memoryview, start: int = 0, stop: int | None = None) -> None:
    """Drop the pages holding ``data[start:stop]`` from this process (a no-op unless
    :func:`is_mapped`), with the rest of their :data:`WINDOW`-sized windows. The bytes stay
    readable: a later read maps them in again from the page cache (or the file)."""
    if not is_mapped(data):
        return
    stop = len(data) if stop is None else min(stop, len(data))
    if stop <= start:
        return
    mapping = data.obj
    base = _address(memoryview(mapping))
    first = _address(data) + start  # windows are aligned in the address space
    end = first + stop - start
    low = max(base, first - first % WINDOW)
    high = min(base + len(mapping), end - end % -WINDOW)
    mapping.madvise(mmap.MADV_DONTNEED, low - base, high - low)


def _address(view: memoryview) -> int:
    return np.frombuffer(view[:1], dtype=np.uint8).ctypes.data
