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
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


Part = bytes | tuple[np.ndarray, int]
"""A piece of :func:`formatted` strings: bytes, the same in every string, or ``(values,
width)``: each string's value, zero-padded to at least ``width`` digits."""


def formatted(parts: Sequence[Part], n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` strings, each the concatenation of ``parts`` (non-negative values), as their
    lengths and their bytes end to end: the names of a million episodes at numpy's speed (a
    Python f-string each took seconds, and Arrow's string kernels several passes).

    Strings whose numbers have as many digits are as long: each such group is written as one
    matrix, a column at a time (a manifest sorted by episode has one group below a million)."""
    numbers = [p for p in parts if not isinstance(p, bytes)]
    digits = [digit_counts(values, width) for values, width in numbers]
    fixed = sum(len(p) for p in parts if isinstance(p, bytes))
    lengths = fixed + sum(digits, np.zeros(n, np.int64))
    starts = np.cumsum(lengths) - lengths
    data = np.empty(int(lengths.sum()), np.uint8)
    layout = sum((d * 32**k for k, d in enumerate(digits)), np.zeros(n, np.int64))
    keys = [] if not n else [layout[0]] if layout.min() == layout.max() else np.unique(layout)
    for key in keys:
        rows = np.flatnonzero(layout == key)
        widths = iter([int(d[rows[0]]) for d in digits])
        block = np.empty((len(rows), int(lengths[rows[0]])), np.uint8)
        column = 0
        for part in parts:
            if isinstance(part, bytes):
                block[:, column : column + len(part)] = np.frombuffer(part, np.uint8)
                column += len(part)
                continue
            values, width = part[0][rows], next(widths)
            for k in range(width, 0, -3):  # three digits at a time, from a table of 000..999
                span = min(3, k)
                text = _THREE_DIGITS[values // 10 ** (k - span) % 1000, 3 - span :]
                block[:, column + width - k : column + width - k + span] = text
            column += width
        first = int(starts[rows[0]])
        if rows[-1] - rows[0] + 1 == len(rows):  # contiguous: one copy
            data[first : first + block.size] = block.ravel()
        else:
            data[(starts[rows][:, None] + np.arange(block.shape[1])).ravel()] = block.ravel()
    return lengths, data


_THREE_DIGITS = np.frombuffer("".join(f"{i:03d}" for i in range(1000)).encode(), np.uint8).reshape(
    1000, 3
)


def digit_counts(values: np.ndarray, width: int) -> np.ndarray:
    """Digits of each of ``values`` (non-negative) zero-padded to at least ``width``."""
    values = np.asarray(values, dtype=np.int64)
    if not len(values) or values.max() < 10**width:
        if len(values) and values.min() < 0:
            raise ValueError("formatted numbers must be non-negative")
        return np.full(len(values), width, np.int64)
    return digit_counts(values, width + 1) - (values < 10**width)


def string_array(lengths: np.ndarray, data: np.ndarray) -> pa.Array:
    """An Arrow string array of strings given as :func:`formatted` gives them."""
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    large = pa.LargeStringArray.from_buffers(
        len(lengths), pa.py_buffer(offsets), pa.py_buffer(data)
    )
    return large.cast(pa.string())


def episode_keys(episodes: np.ndarray) -> pa.Array:
    """:func:`episode_key` of each of ``episodes`` (non-negative)."""
    episodes = np.asarray(episodes, dtype=np.int64)
    return string_array(*formatted([b"episode-", (episodes, 6)], len(episodes)))


def shard_paths(episodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`shard_path` of each of ``episodes`` (non-negative), as :func:`formatted`."""
    episodes = np.asarray(episodes, dtype=np.int64)
    chunks = episodes // EPISODES_PER_SHARD_DIR
    parts = [f"{SHARDS_DIR}/".encode(), (chunks, 3), b"/episode-", (episodes, 6), b".tar"]
    return formatted(parts, len(episodes))


def string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's value offsets (from its first value's) and bytes, without a copy."""
    _, offsets, data = array.buffers()[:3]
    ends = np.frombuffer(offsets, np.int32, len(array) + 1, array.offset * 4).astype(np.int64)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return ends - ends[0], raw[ends[0] : ends[-1]]


def equal_strings(
    column: pa.Array | pa.ChunkedArray, lengths: np.ndarray, data: np.ndarray
) -> np.ndarray:
    """Whether each string of ``column`` (no nulls) is the one :func:`formatted` gave: one
    comparison of the bytes where all are (a format-written manifest), else string by string."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = np.zeros(len(column), bool)
    row = at = 0
    for chunk in chunks:
        want = lengths[row : row + len(chunk)]
        size = int(want.sum())
        offsets, got = string_buffers(chunk)
        expected = data[at : at + size]
        if np.array_equal(np.diff(offsets), want) and np.array_equal(got, expected):
            out[row : row + len(chunk)] = True
        else:
            same = pc.equal(chunk, string_array(want, expected)).fill_null(False)
            out[row : row + len(chunk)] = same.to_numpy(zero_copy_only=False)
        row, at = row + len(chunk), at + size
    return out


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


CHECKSUM_PREFIX = f"{CHECKSUM_ALGO}:".encode()
_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
_BYTE_OF_PAIR = np.full(1 << 16, 256, np.uint16)
"""Two hex digits read as one little-endian uint16 -> the byte they spell (256: not hex)."""
_BYTE_OF_PAIR[_HEX_DIGITS[None, :].astype(np.uint16) << 8 | _HEX_DIGITS[:, None]] = np.arange(
    256
).reshape(16, 16)


def checksum_digests(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """The digests of ``column``'s checksums (no nulls) as an ``(n, 32)`` byte matrix, a third
    of their text, and which are checksums at all (``algo:`` and 64 lowercase hex digits)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    width = len(CHECKSUM_PREFIX) + 64
    prefix = np.frombuffer(CHECKSUM_PREFIX, np.uint8)
    digests, valid = [], []
    for chunk in chunks:
        offsets, data = string_buffers(chunk)
        ok = np.diff(offsets) == width
        if ok.all():
            text = data.reshape(-1, width)
        else:  # some are not even as long as a checksum
            text = np.zeros((len(chunk), width), np.uint8)
            rows = np.flatnonzero(ok)
            text[rows] = data[offsets[rows][:, None] + np.arange(width)]
        pairs = np.ascontiguousarray(text[:, len(prefix) :]).view("<u2")
        values = _BYTE_OF_PAIR[pairs]
        ok &= (text[:, : len(prefix)] == prefix).all(axis=1) & (values.max(axis=1) < 256)
        digests.append(values.astype(np.uint8))
        valid.append(ok)
    if not digests:
        return np.zeros((0, 32), np.uint8), np.zeros(0, bool)
    return np.concatenate(digests), np.concatenate(valid)


def checksum_texts(digests: np.ndarray) -> pa.Array:
    """The checksums of an ``(n, 32)`` digest matrix (:func:`checksum_digests`) as text."""
    n = len(digests)
    text = np.empty((n, len(CHECKSUM_PREFIX) + 64), np.uint8)
    text[:, : len(CHECKSUM_PREFIX)] = np.frombuffer(CHECKSUM_PREFIX, np.uint8)
    text[:, len(CHECKSUM_PREFIX) :: 2] = _HEX_DIGITS[digests >> 4]
    text[:, len(CHECKSUM_PREFIX) + 1 :: 2] = _HEX_DIGITS[digests & 15]
    return string_array(np.full(n, text.shape[1], np.int64), text.ravel())


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


MANIFEST_CHUNK = 8192
"""Rows a :class:`ManifestColumns` collects as objects before it packs them into columns."""


class ManifestColumns:
    """Manifest rows collected as Arrow columns, a few hundred bytes each: what a conversion
    holds until it writes the manifest (a million :class:`ManifestRow` objects took 2 GB).

    Rows come in any order (a pool's workers finish out of order); :meth:`table` sorts them by
    episode, the last row given for an episode winning. Member names are held as what follows
    the episode's key (``.json``, ``.<camera>.mp4``, a handful of distinct strings), dictionary
    encoded; a name that does not start with its episode's key is held whole.
    """

    def __init__(self) -> None:
        self._rows: list[ManifestRow] = []
        self._batches: list[pa.RecordBatch] = []
        self.total_frames = 0
        self.total_bytes = 0

    def add(self, row: ManifestRow) -> None:
        """Hold ``row`` (its frames and bytes join the totals)."""
        self._rows.append(row)
        self.total_frames += row.length
        self.total_bytes += row.size
        if len(self._rows) >= MANIFEST_CHUNK:
            self._pack()

    def __len__(self) -> int:
        return sum(b.num_rows for b in self._batches) + len(self._rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held (packed into columns first)."""
        self._pack()
        return sum(batch.nbytes for batch in self._batches)

    def _pack(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        columns: dict[str, Any] = {
            name: pa.array([getattr(row, name) for row in rows], MANIFEST_SCHEMA.field(name).type)
            for name in MANIFEST_SCHEMA.names
            if name not in ("tasks", "members")
        }
        tasks = pa.array([task for row in rows for task in row.tasks], pa.string())
        columns["tasks"] = pa.ListArray.from_arrays(
            _list_offsets([len(row.tasks) for row in rows]), tasks.dictionary_encode()
        )
        names, keyed = [], []
        for row in rows:
            key = episode_key(row.episode_index) if row.episode_index >= 0 else None
            for m in row.members:
                own = key is not None and m.name.startswith(key)
                names.append(m.name[len(key) :] if own else m.name)
                keyed.append(own)
        members = [m for row in rows for m in row.members]
        flat = pa.StructArray.from_arrays(
            [
                pa.array(names, pa.string()).dictionary_encode(),
                pa.array(keyed, pa.bool_()),
                pa.array([m.offset for m in members], pa.int64()),
                pa.array([m.size for m in members], pa.int64()),
            ],
            names=["rest", "keyed", "offset", "size"],
        )
        columns["members"] = pa.ListArray.from_arrays(
            _list_offsets([len(row.members) for row in rows]), flat
        )
        self._batches.append(pa.record_batch(columns))

    def table(self) -> pa.Table:
        """Every row held, sorted by episode, as the manifest's table (``MANIFEST_SCHEMA``)."""
        self._pack()
        if not self._batches:
            return MANIFEST_SCHEMA.empty_table()
        held = pa.Table.from_batches(self._batches).combine_chunks()
        episodes = held.column("episode_index").to_numpy()
        order = np.argsort(episodes, kind="stable")
        last = np.append(episodes[order][1:] != episodes[order][:-1], True)  # of each episode
        held = held.take(order[last]).combine_chunks()
        episodes = held.column("episode_index").to_numpy()
        tasks = held.column("tasks").chunk(0) if held.num_rows else None
        members = held.column("members").chunk(0)
        flat = members.values
        owners = np.repeat(episodes, np.diff(members.offsets.to_numpy()))
        rest = flat.field("rest").cast(pa.string())
        names = pc.if_else(
            flat.field("keyed"), pc.binary_join_element_wise(episode_keys(owners), rest, ""), rest
        )
        columns = {name: held.column(name) for name in MANIFEST_SCHEMA.names}
        columns["tasks"] = pa.ListArray.from_arrays(
            tasks.offsets, tasks.values.cast(pa.string()), type=MANIFEST_SCHEMA.field("tasks").type
        )
        columns["members"] = pa.ListArray.from_arrays(
            members.offsets,
            pa.StructArray.from_arrays(
                [names, flat.field("offset"), flat.field("size")], fields=list(MEMBER_TYPE)
            ),
            type=MANIFEST_SCHEMA.field("members").type,
        )
        return pa.table([columns[name] for name in MANIFEST_SCHEMA.names], schema=MANIFEST_SCHEMA)


def _list_offsets(counts: list[int]) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32))


def manifest_table(rows: Iterable[ManifestRow]) -> pa.Table:
    """Build the manifest table, sorted by episode index (:class:`ManifestColumns`)."""
    columns = ManifestColumns()
    for row in rows:
        columns.add(row)
    return columns.table()


def manifest_bytes(table: pa.Table) -> bytes:
    """The parquet file of a manifest table, as the converter writes it."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def write_manifest(fs: fsspec.AbstractFileSystem, path: str, rows: Iterable[ManifestRow]) -> None:
    with fs.open(path, "wb") as f:
        f.write(manifest_bytes(manifest_table(rows)))


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
    for chunk in table.column("checksum").chunks:  # the checksums' text, end to end
        h.update(string_buffers(chunk)[1])
    return h.hexdigest()[:16]
