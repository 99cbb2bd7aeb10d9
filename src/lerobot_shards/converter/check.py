"""Look at and verify a converted dataset: ``inspect`` summarises, ``verify`` finds damage.

Both read only what the format promises (index.json, the manifest, the shards), so they check a
dataset the way a reader will see it, whoever wrote it.
"""

from __future__ import annotations

import io
import tarfile
from dataclasses import dataclass
from typing import Any

import av
import fsspec
import numpy as np
import pyarrow.parquet as pq

from lerobot_shards.format import (
    MANIFEST_FILE,
    EpisodeHeader,
    FormatError,
    ManifestRow,
    checksum,
    header_member,
    join,
    manifest_rows,
    read_index,
    read_manifest,
    rows_member,
    video_member,
)

PERCENTILES = (0, 50, 90, 99, 100)


@dataclass
class Problem:
    """One thing wrong with a converted dataset."""

    episode_index: int | None
    shard: str | None
    message: str

    def __str__(self) -> str:
        where = []
        if self.episode_index is not None:
            where.append(f"episode {self.episode_index}")
        if self.shard is not None:
            where.append(self.shard)
        return f"{' '.join(where) + ': ' if where else ''}{self.message}"


def _open(root: str, storage_options: dict | None) -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(str(root), **(storage_options or {}))
    return fs, path.rstrip("/") or "/"


def inspect_dataset(root: str, storage_options: dict | None = None) -> dict[str, Any]:
    """A summary of a converted dataset: counts, cameras and codecs, bytes, size percentiles."""
    fs, path = _open(root, storage_options)
    index = read_index(fs, path)
    table = read_manifest(fs, join(path, MANIFEST_FILE))
    sizes = table.column("size").to_numpy()
    lengths = table.column("length").to_numpy()
    cameras: dict[str, dict[str, Any]] = {}
    if table.num_rows:
        first = manifest_rows(table.slice(0, 1))[0]
        header = _read_header(fs, path, first)
        cameras = {
            key: {"codec": c.codec, "width": c.width, "height": c.height, "pix_fmt": c.pix_fmt}
            for key, c in header.cameras.items()
        }
    for key in index.camera_keys:
        if key not in cameras:
            shape = index.features.get(key, {}).get("shape", [None, None])
            cameras[key] = {"codec": "image (in parquet)", "width": shape[1], "height": shape[0]}
    return {
        "root": str(root),
        "format": index.format,
        "format_version": index.format_version,
        "codebase_version": index.codebase_version,
        "fps": index.fps,
        "episodes": int(table.num_rows),
        "frames": int(lengths.sum()),
        "total_bytes": int(sizes.sum()),
        "cameras": cameras,
        "episode_bytes": _percentiles(sizes),
        "episode_frames": _percentiles(lengths),
    }


def format_inspection(summary: dict[str, Any]) -> str:
    """Human-readable text of :func:`inspect_dataset`'s result."""
    lines = [
        f"{summary['root']}  ({summary['format']} v{summary['format_version']}, "
        f"from LeRobot {summary['codebase_version']}, {summary['fps']} fps)",
        f"episodes: {summary['episodes']}",
        f"frames:   {summary['frames']}",
        f"bytes:    {summary['total_bytes']} ({summary['total_bytes'] / 1e6:.1f} MB)",
        "cameras:",
    ]
    for key, cam in summary["cameras"].items():
        lines.append(f"  {key}: {cam['codec']} {cam['width']}x{cam['height']}")
    for name, unit in (("episode_bytes", "bytes"), ("episode_frames", "frames")):
        pct = "  ".join(f"{k}={v}" for k, v in summary[name].items())
        lines.append(f"{name.replace('_', ' ')} ({unit}): {pct}")
    return "\n".join(lines)


def _percentiles(values: np.ndarray) -> dict[str, int]:
    if len(values) == 0:
        return {}
    return {f"p{p}": int(np.percentile(values, p, method="inverted_cdf")) for p in PERCENTILES}


def _read_header(fs: fsspec.AbstractFileSystem, root: str, row: ManifestRow) -> EpisodeHeader:
    member = next(m for m in row.members if m.name == header_member(row.episode_index))
    data = fs.cat_file(join(root, row.shard), start=member.offset, end=member.offset + member.size)
    return EpisodeHeader.from_json(data, where=f"{row.shard}:{member.name}")


def verify_dataset(
    root: str, *, deep: bool = False, storage_options: dict | None = None
) -> list[Problem]:
    """Every problem found: checksums, tar structure, member offsets, headers, rows; with
    ``deep`` also every frame of every camera decoded and counted."""
    fs, path = _open(root, storage_options)
    try:
        index = read_index(fs, path)
        table = read_manifest(fs, join(path, MANIFEST_FILE))
    except (FormatError, FileNotFoundError) as exc:
        return [Problem(None, None, str(exc))]
    problems = []
    with fs.open(join(path, MANIFEST_FILE), "rb") as f:
        if checksum(f.read()) != index.manifest_checksum:
            problems.append(Problem(None, MANIFEST_FILE, "checksum differs from index.json"))
    rows = manifest_rows(table)
    totals = {
        "total_episodes": len(rows),
        "total_frames": sum(r.length for r in rows),
        "total_bytes": sum(r.size for r in rows),
    }
    for name, value in totals.items():
        if getattr(index, name) != value:
            problems.append(
                Problem(None, None, f"index.json {name}={getattr(index, name)}, manifest: {value}")
            )
    for row in rows:
        problems += [
            Problem(row.episode_index, row.shard, msg)
            for msg in verify_episode(fs, path, row, index.video_keys, deep)
        ]
    return problems


def verify_episode(
    fs: fsspec.AbstractFileSystem, root: str, row: ManifestRow, video_keys: list[str], deep: bool
) -> list[str]:
    """What is wrong with one episode's shard (empty if nothing)."""
    shard = join(root, row.shard)
    try:
        actual = fs.size(shard)
    except FileNotFoundError:
        return ["shard file missing"]
    if actual < row.offset + row.size:
        return [f"shard is {actual} bytes, the manifest span ends at {row.offset + row.size}"]
    data = fs.cat_file(shard, start=row.offset, end=row.offset + row.size)
    problems = []
    if checksum(data) != row.checksum:
        problems.append("checksum mismatch: the shard's bytes differ from the manifest")
    expected = [header_member(row.episode_index), rows_member(row.episode_index)]
    expected += [video_member(row.episode_index, key) for key in video_keys]
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            found = [(m.name, row.offset + m.offset_data, m.size) for m in tar.getmembers()]
    except (tarfile.TarError, EOFError) as exc:
        return [*problems, f"not a readable tar: {exc}"]
    if [name for name, _, _ in found] != expected:
        problems.append(f"tar members {[n for n, _, _ in found]}, expected {expected}")
    if found != [(m.name, m.offset, m.size) for m in row.members]:
        problems.append("member offsets or sizes differ from the manifest")
    if problems:
        return problems
    members = {
        m.name: data[m.offset - row.offset : m.offset - row.offset + m.size] for m in row.members
    }
    try:
        header = EpisodeHeader.from_json(members[expected[0]], where=expected[0])
    except FormatError as exc:
        return [str(exc)]
    if (header.episode_index, header.length) != (row.episode_index, row.length):
        problems.append(
            f"header says episode {header.episode_index} with {header.length} frames, "
            f"the manifest episode {row.episode_index} with {row.length}"
        )
    try:
        n_rows = pq.read_metadata(io.BytesIO(members[expected[1]])).num_rows
    except Exception as exc:
        problems.append(f"{expected[1]}: parquet does not parse: {exc}")
    else:
        if n_rows != row.length:
            problems.append(f"{expected[1]}: {n_rows} rows, expected {row.length}")
    for key in video_keys:
        cam = header.cameras.get(key)
        if cam is None:
            problems.append(f"header has no camera {key}")
        elif cam.frames != row.length + cam.skip_frames + cam.tail_frames:
            problems.append(
                f"camera {key}: header says {cam.frames} frames, expected "
                f"{row.length} + {cam.skip_frames} skipped + {cam.tail_frames} after"
            )
        elif deep:
            name = video_member(row.episode_index, key)
            problems += [f"{name}: {msg}" for msg in _decode_check(members[name], cam.frames)]
    return problems


def _decode_check(data: bytes, frames: int) -> list[str]:
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            count = sum(1 for _ in container.decode(video=0))
    except av.error.FFmpegError as exc:
        return [f"does not decode: {exc}"]
    if count != frames:
        return [f"decodes to {count} frames, expected {frames}"]
    return []
