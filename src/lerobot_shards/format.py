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
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.arrow import as_numpy, system_allocator

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


BLOCK_ROWS = 8192
"""Strings :class:`Formatted` makes at once: a block small enough to stay in the CPU's cache
while every part is written into it."""


class Formatted:
    """``n`` strings, each the concatenation of ``parts`` (non-negative values): the names of a
    million episodes at numpy's speed (a Python f-string each took seconds, Arrow's string
    kernels a pass over every name per piece of it), made a block of rows at a time.

    Rows whose numbers have as many digits are as long; each run of such rows is written as
    matrices of ``BLOCK_ROWS`` rows: the constant bytes in one copy of a template row, each
    number three digits at a time (a manifest sorted by episode has one run below a million).
    """

    def __init__(self, parts: Sequence[Part], n: int) -> None:
        self.parts = list(parts)
        self.n = n
        numbers = [p for p in self.parts if not isinstance(p, bytes)]
        self._digits = [digit_counts(values, width) for values, width in numbers]
        fixed = sum(len(p) for p in self.parts if isinstance(p, bytes))
        self.lengths = fixed + sum(self._digits, np.zeros(n, np.int64))
        """Each string's length in bytes."""
        layout = sum((d * 32**k for k, d in enumerate(self._digits)), np.zeros(n, np.int64))
        breaks = np.flatnonzero(np.diff(layout)) + 1
        self._runs = np.concatenate([[0], breaks, [n]]) if n else np.zeros(1, np.int64)

    def blocks(self) -> Iterator[tuple[int, int, np.ndarray]]:
        """``(first, stop, data)``: rows ``first:stop`` as their bytes end to end."""
        for lo, hi, template, fill in self._run_layouts():
            for first in range(lo, hi, BLOCK_ROWS):
                stop = min(hi, first + BLOCK_ROWS)
                block = np.empty((stop - first, len(template)), np.uint8)
                fill(block, first - lo)
                yield first, stop, block.ravel()

    def data(self) -> np.ndarray:
        """Every string's bytes, end to end (each block written in place)."""
        data = np.empty(int(self.lengths.sum()), np.uint8)
        at = 0
        for lo, hi, template, fill in self._run_layouts():
            run = data[at : at + (hi - lo) * len(template)].reshape(hi - lo, len(template))
            for first in range(0, hi - lo, BLOCK_ROWS):
                fill(run[first : first + BLOCK_ROWS], first)
            at += run.size
        return data

    def _run_layouts(
        self,
    ) -> Iterator[tuple[int, int, np.ndarray, Callable[[np.ndarray, int], None]]]:
        """Each run's rows ``lo:hi``, its template row and a function that writes the rows
        from a run's row ``first`` on into a matrix (as many rows as it has)."""
        for lo, hi in zip(self._runs[:-1].tolist(), self._runs[1:].tolist(), strict=True):
            template, columns = self._layout(lo)
            texts: dict[tuple[int, int], np.ndarray] = {}  # each number's digits, once a run
            for (values, _), (_, width) in zip(self._numbers(), columns, strict=True):
                if (id(values), width) not in texts:
                    texts[id(values), width] = _digits(values[lo:hi], width)
            pieces = [
                (column, width, texts[id(values), width])
                for (values, _), (column, width) in zip(self._numbers(), columns, strict=True)
            ]

            def fill(block: np.ndarray, first: int, template=template, pieces=pieces) -> None:
                block[:] = template
                for column, width, text in pieces:
                    block[:, column : column + width] = text[first : first + len(block)]

            yield lo, hi, template, fill

    def rows(self, first: int, stop: int) -> Formatted:
        """Rows ``first:stop`` alone."""
        cut: dict[int, np.ndarray] = {}  # each array once: a number's digits are made once
        parts = [
            p if isinstance(p, bytes) else (cut.setdefault(id(p[0]), p[0][first:stop]), p[1])
            for p in self.parts
        ]
        return Formatted(parts, stop - first)

    def _numbers(self) -> list[tuple[np.ndarray, int]]:
        return [p for p in self.parts if not isinstance(p, bytes)]

    def _layout(self, row: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Row ``row``'s constant bytes (zeros for its digits), and each number's column and
        width: the same for every row of its run."""
        template, columns = bytearray(), []
        widths = iter([int(d[row]) for d in self._digits])
        for part in self.parts:
            if isinstance(part, bytes):
                template += part
            else:
                width = next(widths)
                columns.append((len(template), width))
                template += bytes(width)
        return np.frombuffer(bytes(template), np.uint8), columns


def formatted(parts: Sequence[Part], n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` strings made of ``parts`` (:class:`Formatted`), as their lengths and bytes."""
    strings = Formatted(parts, n)
    return strings.lengths, strings.data()


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    """``values`` zero-padded to ``width`` digits (all of them that many), a row of bytes each:
    three digits at a time, each three a uint32 of a table of ``000`` to ``999``."""
    groups = -(-width // 3)
    text = np.empty((len(values), 4 * groups), np.uint8)
    words = text.view("<u4")
    for g in range(groups):
        words[:, g] = _THREE_DIGITS[values // 10 ** (3 * (groups - 1 - g)) % 1000]
    keep = np.arange(4 * groups) % 4 < 3  # each word's three digits, the padding byte dropped
    return text[:, keep][:, 3 * groups - width :]


_THREE_DIGITS = np.array(
    [int.from_bytes(f"{i:03d}".encode(), "little") for i in range(1000)], "<u4"
)
"""``000`` to ``999`` as the little-endian uint32 of their three bytes (and a zero)."""


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


def shard_paths(episodes: np.ndarray) -> Formatted:
    """:func:`shard_path` of each of ``episodes`` (non-negative)."""
    episodes = np.asarray(episodes, dtype=np.int64)
    chunks = episodes // EPISODES_PER_SHARD_DIR
    parts = [f"{SHARDS_DIR}/".encode(), (chunks, 3), b"/episode-", (episodes, 6), b".tar"]
    return Formatted(parts, len(episodes))


def string_buffers(array: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string array's value offsets (from its first value's) and bytes, without a copy."""
    _, offsets, data = array.buffers()[:3]
    ends = np.frombuffer(offsets, np.int32, len(array) + 1, array.offset * 4).astype(np.int64)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return ends - ends[0], raw[ends[0] : ends[-1]]


def equal_strings(
    column: pa.Array | pa.ChunkedArray, strings: Formatted, lengths: np.ndarray | None = None
) -> np.ndarray:
    """Whether each string of ``column`` (no nulls) is one of ``strings``: block by block over
    the bytes where all are (a format-written manifest), else string by string.

    ``lengths``: the lengths of ``column``'s strings as they should be, where each of
    ``strings`` is several of them end to end (an episode's member names), as many each (a
    column chunk holds whole rows); default: ``strings.lengths``."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    lengths = strings.lengths if lengths is None else lengths
    per_row = len(lengths) // max(1, strings.n)
    out = np.zeros(len(column), bool)
    at = 0
    for chunk in chunks:
        want = lengths[at : at + len(chunk)]
        first = at // per_row if per_row else 0
        rows = strings.rows(first, first + len(chunk) // max(1, per_row))
        offsets, got = string_buffers(chunk)
        same = np.array_equal(np.diff(offsets), want)
        for lo, _, block in rows.blocks() if same else ():
            start = int(offsets[lo * per_row])
            if not np.array_equal(got[start : start + len(block)], block):
                same = False
                break
        if same:
            out[at : at + len(chunk)] = True
        else:
            equal = pc.equal(chunk, string_array(want, rows.data())).fill_null(False)
            out[at : at + len(chunk)] = as_numpy(equal.cast(pa.uint8()))  # bools: bits
        at += len(chunk)
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


def file_checksum(path: str, block: int = 1 << 20) -> str:
    """:func:`checksum` of a local file's bytes, read a block at a time."""
    digest = new_digest()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            digest.update(chunk)
    return checksum_of(digest)


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


_PAIR_OF_BYTE = (
    _HEX_DIGITS[np.arange(256) & 15].astype(np.uint16) << 8 | _HEX_DIGITS[np.arange(256) >> 4]
)
"""A byte -> its two hex digits, read as one little-endian uint16."""


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
        pairs = text[:, len(prefix) :].view("<u2")
        values = _BYTE_OF_PAIR[pairs]
        ok &= (text[:, : len(prefix)] == prefix).all(axis=1) & (values.max(axis=1) < 256)
        digests.append(values.astype(np.uint8))
        valid.append(ok)
    if not digests:
        return np.zeros((0, 32), np.uint8), np.zeros(0, bool)
    return np.concatenate(digests), np.concatenate(valid)


def checksum_texts(digests: np.ndarray) -> pa.Array:
    """The checksums of an ``(n, 32)`` digest matrix (:func:`checksum_digests`) as text."""
    text = _checksum_bytes(digests)
    return string_array(np.full(len(digests), text.shape[1], np.int64), text.ravel())


def _checksum_bytes(digests: np.ndarray) -> np.ndarray:
    """The text of the checksums of an ``(n, 32)`` digest matrix, a row of bytes each."""
    text = np.empty((len(digests), len(CHECKSUM_PREFIX) + 64), np.uint8)
    text[:, : len(CHECKSUM_PREFIX)] = np.frombuffer(CHECKSUM_PREFIX, np.uint8)
    text[:, len(CHECKSUM_PREFIX) :].view("<u2")[:] = _PAIR_OF_BYTE[digests]
    return text


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


MANIFEST_CHUNK = 8192
"""Rows a :class:`ManifestColumns` collects as objects before it packs them into columns."""
MANIFEST_ROW_GROUP = 65536
"""Rows of each row group the converter writes (and of each batch it makes them from)."""


class ManifestColumns:
    """Manifest rows collected as columns, a few hundred bytes each: what a conversion holds
    until it writes the manifest (a million :class:`ManifestRow` objects took 2 GB).

    Rows come in any order (a pool's workers finish out of order); :meth:`table` sorts them by
    episode, the last row given for an episode winning. Member names are held as a code for
    what follows the episode's key (``.json``, ``.<camera>.mp4``: a handful of distinct
    strings), tasks as a code each; a name that does not start with its episode's key is held
    whole (as a code too). Every ``MANIFEST_CHUNK`` rows are packed into numpy and Arrow
    columns, so what is held is columns, and the manifest is made from them with no loop over
    rows or members (``Formatted`` writes the names).
    """

    def __init__(self) -> None:
        self._rows: list[ManifestRow] = []
        self._chunks: list[dict[str, Any]] = []
        self._codes: dict[tuple[bool, str], int] = {}
        """``(keyed, text)`` of a member name (keyed: what follows the episode's key) -> code."""
        self._tasks: dict[str, int] = {}
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
        return sum(len(c["episode_index"]) for c in self._chunks) + len(self._rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held (packed into columns first)."""
        self._pack()
        return sum(value.nbytes for chunk in self._chunks for value in chunk.values())

    def _pack(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        chunk: dict[str, Any] = {
            name: np.array([getattr(row, name) for row in rows], np.int64) for name in _HELD_NUMBERS
        }
        chunk["shard"] = pa.array([row.shard for row in rows], pa.string())
        chunk["checksum"] = pa.array([row.checksum for row in rows], pa.string())
        tasks = self._tasks
        chunk["task_counts"] = np.array([len(row.tasks) for row in rows], np.int32)
        chunk["tasks"] = np.array(
            [tasks.setdefault(t, len(tasks)) for row in rows for t in row.tasks], np.int32
        )
        codes, members = self._codes, []
        for row in rows:
            key = episode_key(row.episode_index) if row.episode_index >= 0 else None
            for m in row.members:
                keyed = key is not None and m.name.startswith(key)
                text = m.name[len(key) :] if keyed else m.name
                members.append((codes.setdefault((keyed, text), len(codes)), m.offset, m.size))
        chunk["member_counts"] = np.array([len(row.members) for row in rows], np.int32)
        held = np.array(members, np.int64).reshape(-1, 3)
        chunk["names"] = held[:, 0].astype(np.int32)
        chunk["member_offsets"], chunk["member_sizes"] = held[:, 1].copy(), held[:, 2].copy()
        self._chunks.append(chunk)

    def table(self) -> pa.Table:
        """Every row held, sorted by episode, as the manifest's table (``MANIFEST_SCHEMA``)."""
        return pa.Table.from_batches(list(self.batches()), schema=MANIFEST_SCHEMA)

    def write(self, path: str) -> str:
        """Write the manifest file of every row held to the local file ``path``, as the
        converter writes it, and return its checksum: written a batch (a row group) at a time,
        never a table of a million rows at once, and straight to the file (growing a buffer in
        memory for a million rows' 141 MB cost twice the CPU, most of it the kernel's)."""
        with system_allocator(), pq.ParquetWriter(path, MANIFEST_SCHEMA, **MANIFEST_WRITE) as f:
            for batch in self.batches():
                f.write_batch(batch)
        return file_checksum(path)

    def batches(self, size: int = MANIFEST_ROW_GROUP) -> Iterator[pa.RecordBatch]:
        """Every row held, sorted by episode (the last of an episode's winning), as manifest
        record batches of ``size`` rows, each gathered from the held pieces (rows collected in
        order are slices of them: nothing held is copied whole)."""
        self._pack()
        chunks = self._chunks
        held = {name: _Pieces([c[name] for c in chunks]) for name in (chunks[0] if chunks else ())}
        episodes = np.concatenate([c["episode_index"] for c in chunks] or [np.zeros(0, np.int64)])
        order = None
        if len(episodes) > 1 and (np.diff(episodes) <= 0).any():  # not in order: sort
            order = np.argsort(episodes, kind="stable")
            last = np.append(episodes[order][1:] != episodes[order][:-1], True)  # of each
            order = order[last]
        total = len(episodes) if order is None else len(order)
        ends = {  # where each row's list values end, end to end
            kind: np.cumsum(held[counts].take(slice(0, len(episodes)))) if chunks else None
            for kind, counts in (("tasks", "task_counts"), ("members", "member_counts"))
        }
        texts = pa.array(list(self._tasks), pa.string())
        for first in range(0, total, size):
            stop = min(total, first + size)
            rows: np.ndarray | slice = slice(first, stop) if order is None else order[first:stop]
            columns: dict[str, Any] = {}
            for name in MANIFEST_SCHEMA.names:
                if name not in ("tasks", "members"):
                    values = held[name].take(rows)
                    columns[name] = values if isinstance(values, pa.Array) else pa.array(values)
            task_counts, task_at = _list_rows(held["task_counts"], ends["tasks"], rows)
            columns["tasks"] = pa.ListArray.from_arrays(
                _list_offsets(task_counts),
                texts.take(held["tasks"].take(task_at)),
                type=MANIFEST_SCHEMA.field("tasks").type,
            )
            counts, at = _list_rows(held["member_counts"], ends["members"], rows)
            names = self._names(held["episode_index"].take(rows), counts, held["names"].take(at))
            sizes = pa.array(held["member_sizes"].take(at))
            values = pa.StructArray.from_arrays(
                [names, pa.array(held["member_offsets"].take(at)), sizes],
                fields=list(MEMBER_TYPE),
            )
            columns["members"] = pa.ListArray.from_arrays(
                _list_offsets(counts), values, type=MANIFEST_SCHEMA.field("members").type
            )
            yield pa.record_batch(
                [columns[name] for name in MANIFEST_SCHEMA.names], schema=MANIFEST_SCHEMA
            )

    def _names(self, episodes: np.ndarray, counts: np.ndarray, codes: np.ndarray) -> pa.Array:
        """The member names of rows of ``episodes`` with ``counts`` members, of ``codes``."""
        kinds = list(self._codes)
        width = int(counts[0]) if len(counts) else 0
        pattern = codes[:width]
        if (
            len(counts)
            and (counts == width).all()
            and all(kinds[c][0] for c in pattern.tolist())
            and (codes.reshape(-1, width) == pattern).all()
        ):  # every row's names the same after its key: one pass, in member order
            rests = [kinds[c][1].encode() for c in pattern.tolist()]
            parts = [p for rest in rests for p in (b"episode-", (episodes, 6), rest)]
            keys = 8 + digit_counts(episodes, 6)
            lengths = (keys[:, None] + np.array([len(r) for r in rests])).ravel()
            return string_array(lengths, Formatted(parts, len(episodes)).data())
        owners = np.repeat(episodes, counts)
        pieces, where = [], []
        for code, (keyed, text) in enumerate(kinds):
            at = np.flatnonzero(codes == code)
            if not len(at):
                continue
            if keyed:
                parts = [b"episode-", (owners[at], 6), text.encode()]
                pieces.append(string_array(*formatted(parts, len(at))))
            else:
                pieces.append(pa.array([text] * len(at), pa.string()))
            where.append(at)
        if not pieces:
            return pa.array([], pa.string())
        return pa.concat_arrays(pieces).take(np.argsort(np.concatenate(where)))


_HELD_NUMBERS = ["episode_index", "offset", "size", "length"]
_HELD_NUMBERS += ["dataset_from_index", "dataset_to_index"]


def _list_offsets(counts: np.ndarray) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int32))


def _list_rows(
    counts: _Pieces, ends: np.ndarray, rows: np.ndarray | slice
) -> tuple[np.ndarray, np.ndarray | slice]:
    """Rows ``rows`` of list values held end to end (row ``i`` has ``counts[i]`` of them,
    ending at ``ends[i]``): their counts and where their values are (a slice for a slice)."""
    taken = counts.take(rows).astype(np.int64)
    if isinstance(rows, slice):
        return taken, slice(
            int(ends[rows.start] - taken[0]) if len(taken) else 0,
            int(ends[rows.stop - 1]) if len(taken) else 0,
        )
    begins = ends[rows] - taken
    at = np.repeat(begins - (np.cumsum(taken) - taken), taken) + np.arange(int(taken.sum()))
    return taken, at


class _Pieces:
    """A column held as pieces end to end (a numpy array or an Arrow array each), read at
    positions without joining the pieces: a run of positions is slices of a few of them."""

    def __init__(self, pieces: list[Any]) -> None:
        self.pieces = pieces
        self.starts = np.concatenate([[0], np.cumsum([len(p) for p in pieces])]).astype(np.int64)

    def take(self, at: np.ndarray | slice) -> Any:
        """The values at positions ``at``: a slice (a run), or an array of any order."""
        arrow = bool(self.pieces) and isinstance(self.pieces[0], pa.Array)
        run = isinstance(at, np.ndarray) and len(at) and at[-1] - at[0] + 1 == len(at)
        if run and (np.diff(at) == 1).all():
            at = slice(int(at[0]), int(at[-1]) + 1)
        if isinstance(at, slice):
            lo, hi = at.start, at.stop
            if hi <= lo or not self.pieces:
                return self.pieces[0][:0] if self.pieces else np.zeros(0, np.int64)
            first = int(np.searchsorted(self.starts, lo, side="right")) - 1
            last = int(np.searchsorted(self.starts, hi, side="left"))
            parts = [
                self.pieces[k][max(lo, self.starts[k]) - self.starts[k] : hi - self.starts[k]]
                for k in range(first, last)
            ]
            if arrow:
                return pa.concat_arrays(parts)
            return np.concatenate(parts)
        which = np.searchsorted(self.starts, at, side="right") - 1
        if arrow:
            return pa.chunked_array(self.pieces).take(at).combine_chunks()
        out = np.empty(len(at), self.pieces[0].dtype if self.pieces else np.int64)
        for k in np.unique(which).tolist():
            mine = which == k
            out[mine] = self.pieces[k][at[mine] - self.starts[k]]
        return out


def manifest_table(rows: Iterable[ManifestRow]) -> pa.Table:
    """Build the manifest table, sorted by episode index (:class:`ManifestColumns`)."""
    columns = ManifestColumns()
    for row in rows:
        columns.add(row)
    return columns.table()


MANIFEST_DICTIONARY = ["tasks.list.element", "length", "offset"]
"""The manifest columns written dictionary encoded: those that repeat. Every other value is an
episode's own (its index, shard, members, checksum): parquet's dictionary would be tried and
dropped, a sixth of the write at a million episodes."""


def _leaf_columns(name: str, kind: pa.DataType) -> Iterator[str]:
    """Parquet's paths of the leaf columns of a field ``name`` of type ``kind``."""
    if pa.types.is_list(kind):
        yield from _leaf_columns(f"{name}.list.element", kind.value_type)
    elif pa.types.is_struct(kind):
        for child in kind:
            yield from _leaf_columns(f"{name}.{child.name}", child.type)
    else:
        yield name


MANIFEST_COMPRESSION = {
    leaf: "none" if leaf == "checksum" else "lz4"
    for field in MANIFEST_SCHEMA
    for leaf in _leaf_columns(field.name, field.type)
}
"""The manifest's codec by column: pyarrow's ``lz4``, which every reader of this format
(pyarrow 14 on) decodes; the checksums, random hex that LZ4 shrinks by a twelfth, stored as
they are (a sixth of the write at a million episodes). A million episodes' manifest decodes in
half the CPU time of snappy's, parquet's default: opening a dataset is mostly this decoding. A
manifest written with any other codec reads the same (the codec is the file's own, not the
format's)."""
MANIFEST_WRITE: dict[str, Any] = {
    "use_dictionary": MANIFEST_DICTIONARY,
    "compression": MANIFEST_COMPRESSION,
    "write_statistics": False,
}
"""How the converter writes a manifest (``pq.ParquetWriter``'s options). No column statistics:
the reader reads every row and filters none by them, and the minimum and maximum of five
million member names were a fifth of the write at a million episodes."""


def manifest_bytes(table: pa.Table) -> bytes:
    """The parquet file of a manifest table, as the converter writes it."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **MANIFEST_WRITE)
    return sink.getvalue().to_pybytes()


def write_manifest(fs: fsspec.AbstractFileSystem, path: str, rows: Iterable[ManifestRow]) -> None:
    with fs.open(path, "wb") as f:
        f.write(manifest_bytes(manifest_table(rows)))


def read_whole(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """A small file's bytes in one request: on S3, ``cat_file`` of a whole file asks for its
    size first (a HEAD) unless given a start, and a mixture opens hundreds of such files."""
    return fs.cat_file(path, start=0)


def read_large(fs: fsspec.AbstractFileSystem, path: str) -> bytes | pa.Buffer:
    """A large file's bytes (a manifest): a local file mapped, not copied (a million episodes'
    manifest took a tenth of a second of CPU to copy out of the page cache), any other read
    whole (:func:`read_whole`)."""
    inner = getattr(fs, "fs", fs)  # a wrapper's filesystem (``RetryingReads``)
    if isinstance(inner, LocalFileSystem):
        with pa.memory_map(path) as mapped:
            return mapped.read_buffer()
    return read_whole(fs, path)


def manifest_rows(table: pa.Table) -> list[ManifestRow]:
    """Row objects of a manifest table (for the converter and tools; the reader stays columnar)."""
    out = []
    for rec in table.to_pylist():
        rec["members"] = [Member(**m) for m in rec["members"]]
        out.append(ManifestRow(**rec))
    return out


def member_spans(table: pa.Table) -> list[dict[str, tuple[int, int]]]:
    """Per episode, ``{member name: (offset relative to the episode span, size)}``."""
    offsets = as_numpy(table.column("offset"))
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
    h.update(as_numpy(table.column("episode_index")).astype(np.int64).tobytes())
    h.update(as_numpy(table.column("length")).astype(np.int64).tobytes())
    for chunk in table.column("checksum").chunks:  # the checksums' text, end to end
        h.update(string_buffers(chunk)[1])
    return h.hexdigest()[:16]


def digests_fingerprint(episodes: np.ndarray, lengths: np.ndarray, digests: np.ndarray) -> str:
    """:func:`manifest_fingerprint` of rows kept as numbers and checksum digests (the text
    remade a block at a time, never whole)."""
    h = hashlib.sha256()
    h.update(np.asarray(episodes, np.int64).tobytes())
    h.update(np.asarray(lengths, np.int64).tobytes())
    for first in range(0, len(digests), BLOCK_ROWS):
        h.update(_checksum_bytes(digests[first : first + BLOCK_ROWS]).tobytes())
    return h.hexdigest()[:16]
