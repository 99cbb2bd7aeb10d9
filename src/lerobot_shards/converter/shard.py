"""Write one episode's tar shard and describe it as a manifest row.

The tar is built in a temporary file (hashing as it is written) and only then moved to its
final name (rename on a local disk, a single upload elsewhere), so a crash never leaves a half
shard where a finished one is expected.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
import tempfile
from contextlib import nullcontext
from typing import BinaryIO

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.converter.cut import cut_episode
from lerobot_shards.format import (
    CHECKSUM_ALGO,
    EpisodeHeader,
    ManifestRow,
    Member,
    episode_key,
    join,
    shard_path,
)
from lerobot_shards.source import Source

TAR_MTIME = 0
"""Fixed member mtime: converting the same episode twice gives byte-identical tars."""

TMP_SUFFIX = ".tmp"


_PIECE = 1 << 20


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.hash = hashlib.new(CHECKSUM_ALGO)
        self.size = 0

    def write(self, data: bytes) -> None:
        # Hash and write piece by piece, so each piece is still in the CPU cache for the write.
        view = memoryview(data)
        for start in range(0, len(view), _PIECE):
            piece = view[start : start + _PIECE]
            self.hash.update(piece)
            self.raw.write(piece)
        self.size += len(view)


def episode_members(
    source: Source, episode_index: int, tolerance_s: float
) -> tuple[EpisodeHeader, list[tuple[str, bytes]]]:
    """The episode's header and its members as ``(extension, bytes)``, in tar order."""
    ep = source.episode(episode_index)
    rows = source.read_rows(episode_index)
    timestamps = _timestamps(rows, source, episode_index)
    videos: list[tuple[str, bytes]] = []
    header = EpisodeHeader(
        episode_index=ep.episode_index,
        length=ep.length,
        dataset_from_index=ep.dataset_from_index,
        dataset_to_index=ep.dataset_to_index,
        tasks=list(ep.tasks),
    )
    for key in source.video_keys:
        span = ep.videos[key]
        where = f"episode {episode_index} camera {key} ({source.path(span.path)})"
        local = source.local_path(span.path)
        with nullcontext(local) if local else source.open(span.path, "rb") as f:
            cut = cut_episode(
                f,
                from_timestamp=span.from_timestamp,
                timestamps=timestamps,
                fps=source.fps,
                tolerance_s=tolerance_s,
                where=where,
            )
        header.cameras[key] = cut.camera
        videos.append((f"{key}.mp4", cut.data))
    parquet = io.BytesIO()
    pq.write_table(rows, parquet)
    return header, [("json", header.to_json()), ("parquet", parquet.getvalue()), *videos]


def _timestamps(rows: pa.Table, source: Source, episode_index: int) -> list[float]:
    """The rows' timestamps, or k/fps when the source has no timestamp column."""
    if "timestamp" in rows.column_names:
        return [float(t) for t in rows.column("timestamp").to_pylist()]
    if source.video_keys:
        raise ValueError(f"episode {episode_index}: rows have no timestamp column")
    return [k / source.fps for k in range(rows.num_rows)]


def write_tar(file: BinaryIO, key: str, members: list[tuple[str, bytes]]) -> str:
    """Write the members as one WebDataset sample; returns the checksum of what was written.

    Python's tarfile rather than webdataset's TarWriter, for two reasons: TarWriter sorts a
    sample's extensions (the mp4s would land before the parquet, against the contract's order),
    and it streams every byte through tarfile's 10 KB record buffer, which made tar writing a
    quarter of the conversion time; here each member's data goes out in one write. The result
    is the same plain tar a TarWriter writes (same header fields).
    """
    out = _HashingWriter(file)
    for ext, data in members:
        info = tarfile.TarInfo(f"{key}.{ext}")
        info.size = len(data)
        info.mtime = TAR_MTIME
        info.mode = 0o444
        info.uname = info.gname = "bigdata"
        out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        out.write(data)
        out.write(bytes(-len(data) % tarfile.BLOCKSIZE))
    # End of archive: two zero blocks, padded to a whole record as tar tools expect.
    end = 2 * tarfile.BLOCKSIZE
    out.write(bytes(end + (-(out.size + end) % tarfile.RECORDSIZE)))
    return f"{CHECKSUM_ALGO}:{out.hash.hexdigest()}"


def member_spans(file: BinaryIO) -> list[Member]:
    """Each member's data offset and size, read back from the tar headers."""
    with tarfile.open(fileobj=file, mode="r:") as tar:
        return [Member(m.name, m.offset_data, m.size) for m in tar.getmembers()]


def write_episode_shard(
    source: Source,
    episode_index: int,
    fs: fsspec.AbstractFileSystem,
    root: str,
    tolerance_s: float,
) -> ManifestRow:
    """Convert one episode into ``root/shards/CCC/episode-EEEEEE.tar`` and return its row."""
    header, members = episode_members(source, episode_index, tolerance_s)
    relative = shard_path(episode_index)
    final = join(root, relative)
    local = isinstance(fs, LocalFileSystem)
    tmp_dir = os.path.dirname(final) if local else None
    if local:
        os.makedirs(tmp_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{episode_key(episode_index)}.", suffix=TMP_SUFFIX, dir=tmp_dir
    )
    try:
        with os.fdopen(fd, "w+b") as f:
            digest = write_tar(f, episode_key(episode_index), members)
            size = f.tell()
            f.seek(0)
            spans = member_spans(f)
        if local:
            os.replace(tmp, final)
        else:
            fs.makedirs(posixpath.dirname(final), exist_ok=True)
            fs.put_file(tmp, final)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return ManifestRow(
        episode_index=header.episode_index,
        shard=relative,
        offset=0,
        size=size,
        length=header.length,
        dataset_from_index=header.dataset_from_index,
        dataset_to_index=header.dataset_to_index,
        tasks=header.tasks,
        members=spans,
        checksum=digest,
    )
