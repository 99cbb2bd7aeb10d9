"""Which episodes a rerun may skip: those whose shard still holds exactly the recorded bytes.

A resume record (``job.read_converted``) says an episode's shard was written; it does not say the
shard is still intact. A shard may have been truncated, overwritten or had a byte flipped since,
so a rerun trusts a record only if the shard has the recorded size *and* checksum, and converts
everything else again. Hashing reads every finished shard once: on a local disk that runs at
the disk's (or the page cache's) speed on all cores (``docs/converter.md`` has figures); on
object storage it downloads them, in parallel.
"""

from __future__ import annotations

import os
import posixpath
from concurrent.futures import ThreadPoolExecutor

import fsspec
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.converter.job import Converted, read_converted
from lerobot_shards.format import SHARDS_DIR, ManifestRow, checksum_of, join, new_digest

_PIECE = 4 << 20
THREADS = 32
"""Shards hashed at once from object storage, whose reads wait on the network; on a local disk
two per core (hashlib and file reads release the GIL)."""


def finished_rows(
    fs: fsspec.AbstractFileSystem, root: str, selected: list[int], hashed: bool = True
) -> dict[int, Converted]:
    """The records of the selected episodes already done: a record exists and its shard has
    the recorded size and (if ``hashed``) checksum."""
    records = read_converted(fs, root)
    shards_dir = join(root, SHARDS_DIR)
    if not records or not fs.exists(shards_dir):
        return {}
    sizes = {
        posixpath.relpath(path, root): info["size"]
        for path, info in fs.find(shards_dir, detail=True).items()
    }
    sized = [
        record
        for i in selected
        if (record := records.get(i)) is not None and sizes.get(record.row.shard) == record.row.size
    ]
    if not hashed:
        return {record.row.episode_index: record for record in sized}
    local = isinstance(fs, LocalFileSystem)
    workers = min(THREADS, 2 * (os.cpu_count() or 1)) if local else THREADS
    with ThreadPoolExecutor(workers) as pool:
        intact = pool.map(lambda record: _intact(fs, root, record.row), sized)
        return {r.row.episode_index: r for r, ok in zip(sized, intact, strict=True) if ok}


def _intact(fs: fsspec.AbstractFileSystem, root: str, row: ManifestRow) -> bool:
    """Whether the shard's span hashes to the recorded checksum (read a piece at a time)."""
    digest = new_digest()
    try:
        with fs.open(join(root, row.shard), "rb", block_size=_PIECE) as f:
            f.seek(row.offset)
            left = row.size
            while left > 0:
                piece = f.read(min(_PIECE, left))
                if not piece:
                    return False
                digest.update(piece)
                left -= len(piece)
    except FileNotFoundError:
        return False
    return checksum_of(digest) == row.checksum
