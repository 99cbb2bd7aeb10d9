"""Write one episode's tar shard and describe it as a manifest row.

The tar is built in a temporary file (hashing as it is written) and only then moved to its
final name (rename on a local disk, a single upload elsewhere), so a crash never leaves a half
shard where a finished one is expected. A local temporary file is named after its run
(``temp_name``), so a run removes only its own leftovers (``run`` removes other runs' only
while it holds the destination's lock), and it is created as any file is, ``0o666`` less the
umask, so a finished shard has the permissions of the manifest beside it.
"""

from __future__ import annotations

import io
import os
import posixpath
import secrets
import tarfile
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from typing import BinaryIO

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.converter.cut import SourceVideo
from lerobot_shards.format import (
    EpisodeHeader,
    ManifestRow,
    Member,
    checksum_of,
    episode_key,
    join,
    new_digest,
    shard_path,
)
from lerobot_shards.source import Source
from lerobot_shards.validate import check_camera, check_header_cameras, check_rows

TAR_MTIME = 0
"""Fixed member mtime: converting the same episode twice gives byte-identical tars."""

TMP_SUFFIX = ".tmp"


def temp_name(episode_index: int, run_id: str) -> str:
    """A temporary shard's file name: hidden, its run's and process's, unique."""
    unique = f"{run_id}-{os.getpid()}-{secrets.token_hex(4)}"
    return f".{episode_key(episode_index)}.{unique}{TMP_SUFFIX}"


def is_temp_of(name: str, run_id: str | None = None) -> bool:
    """Whether ``name`` is a temporary shard (of the run ``run_id``, if given)."""
    if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
        return False
    return run_id is None or f".{run_id}-" in name


_PIECE = 1 << 20


class _HashingWriter:
    """A write-only file that hashes and counts what passes through it."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.hash = new_digest()
        self.size = 0

    def write(self, data: bytes) -> None:
        # Hash and write piece by piece, so each piece is still in the CPU cache for the write.
        view = memoryview(data)
        for start in range(0, len(view), _PIECE):
            piece = view[start : start + _PIECE]
            self.hash.update(piece)
            self.raw.write(piece)
        self.size += len(view)


class SourceVideos:
    """The source videos a process has open, by path: a worker cuts episode after episode out
    of the same few files, so each is opened (and its index parsed) once, not once per episode.

    At most ``max_open`` stay open; the least recently used is closed first.
    """

    def __init__(self, source: Source, max_open: int = 8) -> None:
        self.source = source
        self.max_open = max_open
        self._open: OrderedDict[str, tuple[SourceVideo, BinaryIO | None]] = OrderedDict()

    def get(self, relative: str, where: str) -> SourceVideo:
        """The open video at ``relative`` (to the source root), opened now if it is not."""
        entry = self._open.get(relative)
        if entry is None:
            local = self.source.local_path(relative)
            file = None if local else self.source.open(relative, "rb")
            try:
                entry = (SourceVideo(local or file, where), file)
            except BaseException:
                if file is not None:
                    file.close()
                raise
            self._open[relative] = entry
            while len(self._open) > self.max_open:
                _close(self._open.popitem(last=False)[1])
        self._open.move_to_end(relative)
        return entry[0]

    def close(self) -> None:
        while self._open:
            _close(self._open.popitem()[1])


def _close(entry: tuple[SourceVideo, BinaryIO | None]) -> None:
    video, file = entry
    video.close()
    if file is not None:
        file.close()


def episode_members(
    source: Source,
    episode_index: int,
    tolerance_s: float,
    videos: SourceVideos,
    then: Sequence[int] = (),
    decode_check: bool = False,
    shard: str | None = None,
) -> tuple[EpisodeHeader, list[tuple[str, bytes]]]:
    """The episode's header and its members as ``(extension, bytes)``, in tar order, checked
    as the reader checks them (``validate.py``), so a conversion that completes is one the
    reader reads; the rows go in the shards' Arrow types (``validate.check_rows``).

    ``then``: the episodes this process converts next (their rows are read along);
    ``decode_check``: decode each cut's first frame (``cut``); ``shard``: the path the reader
    will name in its errors (default: the shard's path relative to the destination).
    """
    ep = source.episode(episode_index)
    rows = source.read_rows(episode_index, then=then)
    timestamps = _timestamps(rows, source, episode_index)
    members: list[tuple[str, bytes]] = []
    header = EpisodeHeader(
        episode_index=ep.episode_index,
        length=ep.length,
        dataset_from_index=ep.dataset_from_index,
        dataset_to_index=ep.dataset_to_index,
        tasks=list(ep.tasks) if ep.tasks is not None else _row_tasks(rows, source.tasks),
    )
    in_shard = f"{shard or shard_path(episode_index)} (episode {episode_index})"  # the reader's
    rows = check_rows(
        rows, source.features, header, source.tasks, in_shard, source.fps, tolerance_s
    )
    for key in source.video_keys:
        span = ep.videos[key]
        where = f"episode {episode_index} camera {key} ({source.path(span.path)})"
        cut = videos.get(span.path, where).cut(
            from_timestamp=span.from_timestamp,
            timestamps=timestamps,
            fps=source.fps,
            tolerance_s=tolerance_s,
            where=where,
            decode_check=decode_check,
        )
        header.cameras[key] = cut.camera
        check_camera(cut.camera, source.features[key], ep.length, key, in_shard)
        members.append((f"{key}.mp4", cut.data))
    check_header_cameras(header, source.features, in_shard)
    parquet = io.BytesIO()
    pq.write_table(rows, parquet)
    return header, [("json", header.to_json()), ("parquet", parquet.getvalue()), *members]


def _row_tasks(rows: pa.Table, tasks: Sequence[str]) -> list[str]:
    """The tasks of an episode's rows (their task_index), first use first: where the episode
    table names none (LeRobot's image-to-video conversion writes no ``tasks`` column)."""
    if "task_index" not in rows.column_names:
        return []
    used = pc.unique(rows.column("task_index")).to_pylist()
    return [tasks[i] for i in used if isinstance(i, int) and 0 <= i < len(tasks)]


def _timestamps(rows: pa.Table, source: Source, episode_index: int) -> list[float]:
    """The rows' timestamps, or k/fps when the source has no timestamp column."""
    if "timestamp" in rows.column_names:
        return [float(t) for t in rows.column("timestamp").to_pylist()]
    if source.video_keys:
        raise ValueError(f"episode {episode_index}: rows have no timestamp column")
    return [k / source.fps for k in range(rows.num_rows)]


def write_tar(
    file: BinaryIO, key: str, members: list[tuple[str, bytes]]
) -> tuple[str, list[Member]]:
    """Write the members as one WebDataset sample; returns the checksum of what was written
    and each member's data span (offsets from the start of ``file``'s writes).

    Python's tarfile rather than webdataset's TarWriter, for two reasons: TarWriter sorts a
    sample's extensions (the mp4s would land before the parquet, against the contract's order),
    and it streams every byte through tarfile's 10 KB record buffer, which made tar writing a
    quarter of the conversion time; here each member's data goes out in one write. The result
    is the same plain tar a TarWriter writes (same header fields).
    """
    out = _HashingWriter(file)
    spans = []
    for ext, data in members:
        info = tarfile.TarInfo(f"{key}.{ext}")
        info.size = len(data)
        info.mtime = TAR_MTIME
        info.mode = 0o444
        info.uname = info.gname = "bigdata"
        out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        spans.append(Member(info.name, out.size, len(data)))
        out.write(data)
        out.write(bytes(-len(data) % tarfile.BLOCKSIZE))
    # End of archive: two zero blocks, padded to a whole record as tar tools expect.
    end = 2 * tarfile.BLOCKSIZE
    out.write(bytes(end + (-(out.size + end) % tarfile.RECORDSIZE)))
    return checksum_of(out.hash), spans


def write_episode_shard(
    source: Source,
    episode_index: int,
    fs: fsspec.AbstractFileSystem,
    root: str,
    tolerance_s: float,
    videos: SourceVideos,
    then: Sequence[int] = (),
    run_id: str = "",
    decode_check: bool = False,
) -> ManifestRow:
    """Convert one episode into ``root/shards/CCC/episode-EEEEEE.tar`` and return its row
    (``then``, ``decode_check``: see ``episode_members``; ``run_id`` goes into the temporary
    file's name)."""
    relative = shard_path(episode_index)
    final = join(root, relative)
    header, members = episode_members(
        source, episode_index, tolerance_s, videos, then, decode_check, shard=final
    )
    local = isinstance(fs, LocalFileSystem)
    if local:
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = os.path.join(os.path.dirname(final), temp_name(episode_index, run_id))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # umask applies
    else:
        fd, tmp = tempfile.mkstemp(prefix=f".{episode_key(episode_index)}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            digest, spans = write_tar(f, episode_key(episode_index), members)
            size = f.tell()
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
