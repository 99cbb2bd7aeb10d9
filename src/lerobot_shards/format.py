"""The on-disk contract between the converter and the reader (format ``lerobot-shards`` v1).

Everything both sides must agree on lives here and only here: file names, member names inside
an episode's tar, the manifest schema, ``index.json`` and the checksum. The converter writes
what this module describes; the reader reads it. Neither imports the other. Reading a file
back checks every field (``validate.py``, which builds on this module, never the reverse).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FORMAT_NAME = "lerobot-shards"
FORMAT_VERSION = 1

INDEX_FILE = "index.json"
MANIFEST_FILE = "manifest.parquet"
META_DIR = "meta"
INFO_FILE = "meta/info.json"
STATS_FILE = "meta/stats.json"
TASKS_FILE = "meta/tasks.parquet"
SHARDS_DIR = "shards"
EPISODES_PER_SHARD_DIR = 1000
CHECKSUM_ALGO = "sha256"


class FormatError(ValueError):
    """A converted dataset (or one of its files) does not follow this format."""


def episode_key(episode_index: int) -> str:
    """WebDataset sample key of an episode: no dot, so every member groups into one sample."""
    return f"episode-{episode_index:06d}"


def shard_path(episode_index: int) -> str:
    """Path of an episode's tar, relative to the dataset root."""
    chunk = episode_index // EPISODES_PER_SHARD_DIR
    return f"{SHARDS_DIR}/{chunk:03d}/{episode_key(episode_index)}.tar"


def header_member(episode_index: int) -> str:
    return f"{episode_key(episode_index)}.json"


def rows_member(episode_index: int) -> str:
    return f"{episode_key(episode_index)}.parquet"


def video_member(episode_index: int, camera_key: str) -> str:
    return f"{episode_key(episode_index)}.{camera_key}.mp4"


def checksum(data: bytes | memoryview) -> str:
    """``algo:hexdigest`` of a byte span, as stored in the manifest."""
    return checksum_of(new_digest(data))


def new_digest(data: bytes | memoryview = b"") -> hashlib._Hash:
    """A hash of the manifest's algorithm, to feed a span piece by piece (``checksum_of``)."""
    return hashlib.new(CHECKSUM_ALGO, data)


def checksum_of(digest: hashlib._Hash) -> str:
    """``algo:hexdigest`` of a hash fed with a span, as stored in the manifest."""
    return f"{CHECKSUM_ALGO}:{digest.hexdigest()}"


def join(root: str, relative: str) -> str:
    """Join a dataset root (local path or URL) and a relative path with forward slashes."""
    return posixpath.join(root.rstrip("/"), relative)


# --------------------------------------------------------------------------------------------
# Episode header (the `.json` member of each tar)
# --------------------------------------------------------------------------------------------


@dataclass
class CameraHeader:
    """What a decoder needs to know about one camera's mp4 in an episode's tar."""

    codec: str
    width: int
    height: int
    pix_fmt: str
    fps: float
    frames: int
    """Frames the mp4 holds, including the ``skip_frames`` and ``tail_frames`` dropped ones."""
    skip_frames: int = 0
    """Leading frames to drop: the cut started at an earlier keyframe than the episode."""
    tail_frames: int = 0
    """Frames after the episode's last one, to drop: with B-frames, the episode's last frames
    reference later ones, which come before them in decode order. Written only when non-zero,
    so readers from before it read every shard that has none."""


def decode_starts(pts: Sequence[int], keys: Sequence[bool]) -> list[int]:
    """For each packet of a video, in decode order (its presentation time in ``pts``, whether it
    is a keyframe in ``keys``), the index of the keyframe it decodes from: the last keyframe at
    or before it that is shown no later than it (-1: none). With closed GOPs that is its GOP's
    keyframe; with open GOPs a keyframe's leading frames (decoded after it, shown before it)
    reference the GOP before and decode from its keyframe. An episode's cut holds, for each of
    its frames, the keyframe that frame decodes from, and none of its first keyframe's leading
    frames (they decode from no keyframe of the cut).

    Args:
        pts: each packet's presentation timestamp, in decode order.
        keys: whether each packet is a keyframe.
    """
    starts: list[int] = []
    keyframes: list[int] = []
    for i, (shown, key) in enumerate(zip(pts, keys, strict=True)):
        if key:
            keyframes.append(i)
        k = len(keyframes) - 1
        while k >= 0 and pts[keyframes[k]] > shown:  # a leading frame of that keyframe
            k -= 1
        starts.append(keyframes[k] if k >= 0 else -1)
    return starts


@dataclass
class EpisodeHeader:
    episode_index: int
    length: int
    dataset_from_index: int
    dataset_to_index: int
    tasks: list[str]
    cameras: dict[str, CameraHeader] = field(default_factory=dict)

    def to_json(self) -> bytes:
        # ``asdict`` spelled out: it deep-copies every field, a tenth of a tiny episode's time.
        cameras = {
            k: {f: v for f, v in vars(c).items() if f != "tail_frames" or v}
            for k, c in self.cameras.items()
        }
        plain = {**vars(self), "cameras": cameras}
        return json.dumps(plain, sort_keys=True).encode()


# --------------------------------------------------------------------------------------------
# manifest.parquet
# --------------------------------------------------------------------------------------------

MEMBER_TYPE = pa.struct([("name", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])

MANIFEST_SCHEMA = pa.schema(
    [
        ("episode_index", pa.int64()),
        ("shard", pa.string()),
        ("offset", pa.int64()),
        ("size", pa.int64()),
        ("length", pa.int64()),
        ("dataset_from_index", pa.int64()),
        ("dataset_to_index", pa.int64()),
        ("tasks", pa.list_(pa.string())),
        ("members", pa.list_(MEMBER_TYPE)),
        ("checksum", pa.string()),
    ]
)


@dataclass
class Member:
    """A tar member's data span, in bytes from the start of the shard file."""

    name: str
    offset: int
    size: int


@dataclass
class ManifestRow:
    """One episode of the manifest."""

    episode_index: int
    shard: str
    offset: int
    size: int
    length: int
    dataset_from_index: int
    dataset_to_index: int
    tasks: list[str]
    members: list[Member]
    checksum: str


def manifest_table(rows: list[ManifestRow]) -> pa.Table:
    """Build the manifest table, sorted by episode index (column by column: a million rows)."""
    rows = sorted(rows, key=lambda r: r.episode_index)
    columns: dict[str, Any] = {
        name: [getattr(row, name) for row in rows]
        for name in MANIFEST_SCHEMA.names
        if name != "members"
    }
    members = [m for row in rows for m in row.members]
    starts = np.cumsum([0] + [len(row.members) for row in rows], dtype=np.int32)
    flat = pa.StructArray.from_arrays(
        [
            pa.array([m.name for m in members], pa.string()),
            pa.array([m.offset for m in members], pa.int64()),
            pa.array([m.size for m in members], pa.int64()),
        ],
        fields=list(MEMBER_TYPE),
    )
    columns["members"] = pa.ListArray.from_arrays(pa.array(starts), flat)
    return pa.table([columns[name] for name in MANIFEST_SCHEMA.names], schema=MANIFEST_SCHEMA)


def write_manifest(fs: fsspec.AbstractFileSystem, path: str, rows: list[ManifestRow]) -> None:
    with fs.open(path, "wb") as f:
        pq.write_table(manifest_table(rows), f)


def read_whole(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """A small file's bytes in one request: on S3, ``cat_file`` of a whole file asks for its
    size first (a HEAD) unless given a start, and a mixture opens hundreds of such files."""
    return fs.cat_file(path, start=0)


def manifest_rows(table: pa.Table) -> list[ManifestRow]:
    """Row objects of a manifest table (for the converter and tools; the reader stays columnar)."""
    out = []
    for rec in table.to_pylist():
        rec["members"] = [Member(**m) for m in rec["members"]]
        out.append(ManifestRow(**rec))
    return out


def member_spans(table: pa.Table) -> list[dict[str, tuple[int, int]]]:
    """Per episode, ``{member name: (offset relative to the episode span, size)}``."""
    offsets = table.column("offset").to_numpy()
    spans = []
    for base, members in zip(offsets, table.column("members").to_pylist(), strict=True):
        spans.append({m["name"]: (m["offset"] - int(base), m["size"]) for m in members})
    return spans


# --------------------------------------------------------------------------------------------
# index.json
# --------------------------------------------------------------------------------------------


@dataclass
class DatasetIndex:
    """Contents of ``index.json``; its presence means the conversion finished."""

    codebase_version: str
    fps: float
    features: dict[str, Any]
    total_episodes: int
    total_frames: int
    total_bytes: int
    writer_version: str
    camera_keys: list[str]
    video_keys: list[str]
    manifest_checksum: str
    format: str = FORMAT_NAME
    format_version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()


def manifest_fingerprint(table: pa.Table) -> str:
    """A short stable fingerprint of a manifest's episodes, lengths and checksums."""
    h = hashlib.sha256()
    h.update(table.column("episode_index").to_numpy().astype(np.int64).tobytes())
    h.update(table.column("length").to_numpy().astype(np.int64).tobytes())
    for c in table.column("checksum").to_pylist():
        h.update(c.encode())
    return h.hexdigest()[:16]
