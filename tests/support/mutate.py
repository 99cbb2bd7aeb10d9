"""A converted dataset taken apart into plain data, and put back together as a complete dataset:
tars rebuilt, every member offset and size, span and checksum recomputed, so that a change a
test makes is a lie of the content itself, not a checksum a reader would catch anyway.

    parts = take_apart(root)
    parts.headers[2]["length"] = 0           # any file, any field
    put_together(parts, dest)                # a dataset whose bytes all check out
    put_together(parts, dest, edit_rows=...) # or lie in the manifest itself, after recomputing

Rows that name the same shard are written into one tar, one after the other, each row's span
from its first member's tar header to its last member's data (shards that hold several
episodes); ``edit_shard`` changes a shard's bytes (its tar headers, say) before the checksums
are computed.
"""

from __future__ import annotations

import copy
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_shards.format import (
    INDEX_FILE,
    INFO_FILE,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    checksum,
    header_member,
    rows_member,
)


@dataclass
class Parts:
    """Every file of a converted dataset as data: JSON as dicts, parquet as tables, the rest as
    bytes; each episode's tar as its members in order (name, bytes)."""

    index: dict
    info: dict
    rows: list[dict]
    """The manifest's rows (recomputed from the tars when put together)."""
    members: list[list[tuple[str, bytes]]]
    """Per manifest row, the tar's members in order."""
    others: dict[str, bytes]
    """Other files by relative path (meta/stats.json, meta/tasks.parquet)."""
    scratch: str = ""
    """A folder outside the dataset, for a file a lie points to."""

    def header(self, row: int) -> dict:
        return json.loads(self.member(row, header_member(self.rows[row]["episode_index"])))

    def set_header(self, row: int, header: dict) -> None:
        name = header_member(self.rows[row]["episode_index"])
        self.set_member(row, name, json.dumps(header).encode())

    def table(self, row: int) -> pa.Table:
        name = rows_member(self.rows[row]["episode_index"])
        return pq.read_table(io.BytesIO(self.member(row, name)))

    def set_table(self, row: int, table: pa.Table) -> None:
        out = io.BytesIO()
        pq.write_table(table, out)
        self.set_member(row, rows_member(self.rows[row]["episode_index"]), out.getvalue())

    def member(self, row: int, name: str) -> bytes:
        return dict(self.members[row])[name]

    def set_member(self, row: int, name: str, data: bytes) -> None:
        self.members[row] = [(n, data if n == name else d) for n, d in self.members[row]]

    def copy(self) -> Parts:
        return copy.deepcopy(self)


def take_apart(root: Path) -> Parts:
    rows = pq.read_table(root / MANIFEST_FILE).to_pylist()
    members = []
    for row in rows:
        with tarfile.open(root / row["shard"]) as tar:
            members.append([(m.name, tar.extractfile(m).read()) for m in tar.getmembers()])
    others = {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in (root / "meta").rglob("*")
        if p.is_file() and p.relative_to(root).as_posix() != INFO_FILE
    }
    return Parts(
        index=json.loads((root / INDEX_FILE).read_text()),
        info=json.loads((root / INFO_FILE).read_text()),
        rows=rows,
        members=members,
        others=others,
    )


def put_together(
    parts: Parts,
    dest: Path,
    *,
    edit_rows: Callable[[list[dict]], None] | None = None,
    edit_index: Callable[[dict], None] | None = None,
    edit_shard: Callable[[int, bytearray, dict], None] | None = None,
    rechecksum: bool = False,
) -> None:
    """Write ``parts`` as a dataset at ``dest`` (replaced). ``edit_shard(row, shard, entry)``
    changes row ``row``'s shard bytes in place (``entry``: its manifest row, spans set) before
    the checksums; ``edit_rows`` changes the manifest's rows after they are recomputed (with
    ``rechecksum``, each row's checksum is then taken again over the span it names), and
    ``edit_index`` index.json after its manifest checksum is."""
    if dest.exists():
        shutil.rmtree(dest)
    shards: dict[str, list[int]] = {}
    for i, row in enumerate(parts.rows):
        relative = row["shard"] if _inside(row["shard"]) else "shards/x.tar"
        shards.setdefault(relative, []).append(i)
    rows: list[dict] = [{} for _ in parts.rows]
    files: dict[str, bytearray] = {}
    for relative, owners in shards.items():
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for i in owners:
                start, spans = out.tell(), []
                for name, data in parts.members[i]:
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    spans.append({"name": name, "offset": out.tell() + 512, "size": len(data)})
                    tar.addfile(info, io.BytesIO(data))
                rows[i] = {**parts.rows[i], "offset": start, "size": out.tell() - start,
                           "members": spans}  # fmt: skip
        data = bytearray(out.getvalue())
        if len(owners) == 1:  # a shard of its own: the whole tar, end blocks included
            rows[owners[0]]["size"] = len(data)
        for i in owners:
            if edit_shard is not None:
                edit_shard(i, data, rows[i])
        files[relative] = data
    for relative, data in files.items():
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_bytes(data)
        for i in shards[relative]:
            rows[i]["checksum"] = _span_checksum(data, rows[i])
    totals = {  # of the honest rows: like the checksums, recomputed before any lie
        "total_episodes": len(rows),
        "total_frames": sum(r["length"] for r in rows),
        "total_bytes": sum(r["size"] for r in rows),
    }
    if edit_rows is not None:
        edit_rows(rows)
        if rechecksum:
            for row in rows:
                data = files.get(row.get("shard"))
                if data is not None and _span_checksum(data, row) is not None:
                    row["checksum"] = _span_checksum(data, row)
    manifest = io.BytesIO()
    pq.write_table(_table(rows), manifest)
    (dest / MANIFEST_FILE).write_bytes(manifest.getvalue())
    index = {**parts.index, **totals, "manifest_checksum": checksum(manifest.getvalue())}
    if edit_index is not None:
        edit_index(index)
    (dest / INDEX_FILE).write_text(json.dumps(index))
    (dest / INFO_FILE).parent.mkdir(parents=True, exist_ok=True)
    (dest / INFO_FILE).write_text(json.dumps(parts.info))
    for relative, data in parts.others.items():
        (dest / relative).parent.mkdir(parents=True, exist_ok=True)
        (dest / relative).write_bytes(data)


def _span_checksum(data: bytearray, row: dict) -> str | None:
    """The checksum of the span ``row`` names in ``data``, if it names one inside it."""
    offset, size = row.get("offset"), row.get("size")
    if not (isinstance(offset, int) and isinstance(size, int)):
        return None
    if isinstance(offset, bool) or offset < 0 or size < 0 or offset + size > len(data):
        return None
    return checksum(bytes(data[offset : offset + size]))


TAR_FIELDS = {"name": (0, 100), "mode": (100, 8), "size": (124, 12), "mtime": (136, 12),
              "chksum": (148, 8), "typeflag": (156, 1), "linkname": (157, 100),
              "magic": (257, 6)}  # fmt: skip
"""Where each field of a ustar header block lies: (offset, length)."""


def set_tar_field(
    shard: bytearray, header: int, field: str, value: bytes, seal: bool = True
) -> None:
    """Write ``value`` (NUL-padded) into ``field`` of the tar header block at ``header``; with
    ``seal``, the block's own checksum is recomputed, so that only the field lies."""
    at, length = TAR_FIELDS[field]
    shard[header + at : header + at + length] = value[:length].ljust(length, b"\0")
    if seal:
        block = shard[header : header + 512]
        block[148:156] = b" " * 8
        shard[header + 148 : header + 156] = b"%06o\0 " % sum(block)


def _inside(relative: str) -> bool:
    """Whether a shard path (as a test left it) would be written inside the destination."""
    return (
        isinstance(relative, str)
        and not relative.startswith("/")
        and ".." not in relative.split("/")
        and "://" not in relative
    )


def _table(rows: list[dict]) -> pa.Table:
    """The rows as a manifest table: each column of the schema's type where its values fit it,
    else of what pyarrow infers, else as JSON text (a lie of type is a lie too)."""
    columns = {}
    for field in MANIFEST_SCHEMA:
        values = [row.get(field.name) for row in rows]
        columns[field.name] = _column(values, field.type)
    return pa.table(columns)


def _column(values: list, typ: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=typ)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    try:
        return pa.array(values)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        return pa.array([json.dumps(v) for v in values])


def black_mp4(
    width: int, height: int, frames: int, codec: str = "mpeg4", pix_fmt: str = "yuv420p"
) -> bytes:
    """An mp4 of ``frames`` black frames (MPEG-4 part 2 by default: quick to encode at any
    size; ``codec`` and ``pix_fmt`` for a valid video of another kind than a header says)."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=10)
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        if codec == "libx264":  # every frame a keyframe: no B-frames, GOPs closed
            stream.options = {"g": "1", "bf": "0"}
        for _ in range(frames):
            frame = av.VideoFrame.from_ndarray(np.zeros((height, width, 3), np.uint8), "rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()
