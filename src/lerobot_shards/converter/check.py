"""Look at and verify a converted dataset: ``inspect`` summarises, ``verify`` finds damage.

Both read only what the format promises (index.json, the manifest, the shards), so they check a
dataset the way a reader will see it, whoever wrote it; ``inspect`` also shows what ``convert``
found in the rows that poisons training (``poisons.json``, beside them).
"""

from __future__ import annotations

import functools
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import av
import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from lerobot_shards.converter.parallel import run_tasks
from lerobot_shards.depth import decode_depth_image
from lerobot_shards.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    DatasetIndex,
    EpisodeHeader,
    FormatError,
    ManifestRow,
    checksum,
    header_member,
    join,
    manifest_rows,
    read_large,
    read_whole,
    rows_member,
    video_member,
)
from lerobot_shards.poisons import POISONS_FILE, Poison, parse_poisons, summary_lines
from lerobot_shards.validate import (
    ManifestFile,
    check_camera,
    check_header_cameras,
    check_header_matches,
    check_rows,
    check_stream,
    check_tar_member,
    check_totals,
    decode_image,
    frame_channels,
    frame_size,
    is_depth_map,
    parse_header,
    parse_index,
    read_index,
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
    """A summary of a converted dataset: counts, cameras and codecs, bytes, size percentiles,
    and what ``convert`` found that poisons training (``poisons``: None if it was not recorded,
    a dataset converted by an earlier version)."""
    fs, path = _open(root, storage_options)
    index = read_index(fs, path)
    where = join(path, MANIFEST_FILE)
    # A summary decodes the two columns it sums and the row whose header it reads; checking
    # every row is verify's (a million rows' members and checksums were most of the command)
    manifest = ManifestFile(read_large(fs, where), where)
    numbers = manifest.numbers(["size", "length"])
    sizes, lengths = numbers["size"], numbers["length"]
    head = manifest.first_row()
    first = manifest_rows(head)[0] if head.num_rows else None
    cameras: dict[str, dict[str, Any]] = {}
    if first is not None:
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
        "episodes": len(sizes),
        "frames": int(lengths.sum()),
        "total_bytes": int(sizes.sum()),
        "cameras": cameras,
        "episode_bytes": _percentiles(sizes),
        "episode_frames": _percentiles(lengths),
        **_poisons(fs, path),
    }


def _poisons(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, Any]:
    """``poisons`` and ``unchecked_episodes`` as ``poisons.json`` records them (None if the
    dataset has no such file)."""
    path = join(root, POISONS_FILE)
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        return {"poisons": None, "unchecked_episodes": None}
    try:
        poisons, unchecked = parse_poisons(data, path)
    except ValueError as exc:
        raise FormatError(str(exc)) from exc
    return {"poisons": [p.to_json() for p in poisons], "unchecked_episodes": unchecked}


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
    if summary.get("poisons") is None:
        lines.append("poisons: not recorded (converted by an earlier version)")
        return "\n".join(lines)
    found = summary_lines(
        [Poison.from_json(p, "poisons") for p in summary["poisons"]],
        len(summary["unchecked_episodes"]),
    )
    lines.append(
        "poisons: none found"
        if not found
        else "poisons (LeRobot reads these; a training run may not survive them):"
    )
    lines += [f"  {line}" for line in found]
    return "\n".join(lines)


def _percentiles(values: np.ndarray) -> dict[str, int]:
    if len(values) == 0:
        return {}
    return {f"p{p}": int(np.percentile(values, p, method="inverted_cdf")) for p in PERCENTILES}


def _read_header(fs: fsspec.AbstractFileSystem, root: str, row: ManifestRow) -> EpisodeHeader:
    member = next(m for m in row.members if m.name == header_member(row.episode_index))
    data = fs.cat_file(join(root, row.shard), start=member.offset, end=member.offset + member.size)
    return parse_header(data, where=f"{row.shard}:{member.name}")


VERIFY_TASK = 32
"""Episodes one verify task checks (a worker's unit: enough that starting it costs little)."""


@dataclass(frozen=True)
class EpisodeChecks:
    """What checking a dataset's episodes needs, besides their rows: small and picklable, for
    ``verify``'s workers (a worker opens the filesystem itself)."""

    root: str
    storage_options: dict | None
    video_keys: list[str]
    deep: bool
    features: dict[str, Any]
    task_names: list[str]
    fps: float
    image_keys: list[str]


@dataclass
class DatasetFiles:
    """A converted dataset's index, manifest and metadata, read and checked by the reader's
    own code, so ``verify``, ``convert`` and the reader agree."""

    index: DatasetIndex
    manifest: bytes
    """``manifest.parquet``'s bytes (read again a batch at a time to hand out shard tasks)."""
    rows: Any
    """The numbers of every row (``reader.meta.selection.ManifestRows``), each batch checked."""
    meta: Any
    """``reader.meta.DatasetMeta``."""


def read_dataset(
    fs: fsspec.AbstractFileSystem, path: str, root: str, index_data: bytes | None = None
) -> DatasetFiles:
    """``path``'s index, manifest (checked a batch at a time, never held as a table) and
    metadata (the reader's own checks of ``meta/info.json`` and the tasks).

    Args:
        fs: The dataset's filesystem.
        path: The dataset's path in ``fs``.
        root: The dataset as the user named it (for messages).
        index_data: ``index.json``'s bytes, where the converter has not written it yet.
    """
    # no torch: verify runs without it
    from lerobot_shards.reader.meta.metadata import read_meta
    from lerobot_shards.reader.meta.selection import ManifestRows

    if index_data is None:
        index = read_index(fs, path)
    else:
        index = parse_index(index_data, where=join(path, INDEX_FILE))
    where = join(path, MANIFEST_FILE)
    data = read_whole(fs, where)
    rows = ManifestRows.read(ManifestFile(data, where))
    meta = read_meta(fs, path, index, rows.table(), root, rows.shard)
    return DatasetFiles(index, data, rows, meta)


def verify_dataset(
    root: str,
    *,
    deep: bool = False,
    storage_options: dict | None = None,
    sample: int | None = None,
    workers: int = 0,
    executor: str = "local",
    ray_address: str | None = None,
    progress: bool = False,
) -> list[Problem]:
    """Every problem found, in episode order: ``index.json``, the metadata and the manifest
    checked whole (the manifest side), then each episode's shard: checksum, tar structure,
    member offsets, header, rows; with ``deep`` also every frame of every camera decoded and
    counted.

    Args:
        root: The converted dataset (a path or fsspec URL).
        deep: Decode every frame.
        storage_options: For the dataset's filesystem.
        sample: Check this many shards drawn at random, not every one (0: the manifest side
            only).
        workers: Local processes checking shards (0 or 1: this process).
        executor: ``"local"``, or ``"ray"``: Ray tasks on the cluster at ``ray_address``
            (default ``RAY_ADDRESS``, else a new local instance).
        ray_address: See ``executor``.
        progress: Show a progress bar of the episodes checked.
    """
    fs, path = _open(root, storage_options)
    try:
        dataset = read_dataset(fs, path, root)
    except (FormatError, FileNotFoundError) as exc:
        return [Problem(None, None, str(exc))]
    index, data, every, meta = dataset.index, dataset.manifest, dataset.rows, dataset.meta
    numbers = every.table()
    problems = []
    if checksum(data) != index.manifest_checksum:
        problems.append(Problem(None, MANIFEST_FILE, "checksum differs from index.json"))
    try:
        check_totals(index, numbers, root)
    except FormatError as exc:
        problems.append(Problem(None, None, str(exc)))
    rows = np.arange(len(every.episodes))
    if sample is not None and sample < len(rows):
        rows = np.sort(np.random.default_rng().choice(len(rows), sample, replace=False))
    workers = min(workers, -(-len(rows) // VERIFY_TASK))  # no process without a task of its own
    checks = EpisodeChecks(
        str(root), storage_options, list(index.video_keys), deep, meta.features,
        meta.task_names, meta.fps, list(meta.image_keys),
    )  # fmt: skip
    found: list[tuple[int, list[Problem]]] = []
    with tqdm(total=len(rows), unit="ep", desc="verify", disable=not progress) as bar:
        for task, episode_problems in run_tasks(
            functools.partial(check_episodes, checks),
            _row_tasks(ManifestFile(data, join(path, MANIFEST_FILE)), rows) if len(rows) else (),
            workers=workers,
            executor=executor,
            ray_address=ray_address,
        ):
            found.append((task[0].episode_index, episode_problems))
            bar.update(len(task))
    for _, episode_problems in sorted(found, key=lambda f: f[0]):
        problems += episode_problems
    return problems


def _row_tasks(file: ManifestFile, rows: np.ndarray) -> Iterator[list[ManifestRow]]:
    """The manifest rows ``rows`` (sorted), ``VERIFY_TASK`` at a time: the file read again a
    batch at a time, so only a batch's table and a task's rows are ever held."""
    first, pending = 0, []
    for checked in file.batches():
        table = checked.table
        lo, hi = np.searchsorted(rows, [first, first + table.num_rows])
        for row in manifest_rows(table.take(rows[lo:hi] - first)):
            pending.append(row)
            if len(pending) == VERIFY_TASK:
                yield pending
                pending = []
        first += table.num_rows
    if pending:
        yield pending


_FILESYSTEMS: dict[tuple[str, str], tuple[fsspec.AbstractFileSystem, str]] = {}
"""Each verify worker's open filesystems, by root and storage options."""


def check_episodes(checks: EpisodeChecks, rows: list[ManifestRow]) -> list[Problem]:
    """The problems of ``rows``' episodes (a verify task, run in a worker)."""
    key = (checks.root, json.dumps(checks.storage_options, sort_keys=True, default=repr))
    if key not in _FILESYSTEMS:
        _FILESYSTEMS[key] = _open(checks.root, checks.storage_options)
    fs, path = _FILESYSTEMS[key]
    problems = []
    for row in rows:
        found = verify_episode(fs, path, row, checks.video_keys, checks.deep, checks)
        problems += [Problem(row.episode_index, row.shard, msg) for msg in found]
    return problems


def verify_episode(
    fs: fsspec.AbstractFileSystem,
    root: str,
    row: ManifestRow,
    video_keys: list[str],
    deep: bool,
    meta: Any,
) -> list[str]:
    """What is wrong with one episode's shard (empty if nothing), by the reader's own checks
    (``validate.py``) against the dataset's ``meta`` (its ``features``, ``task_names``,
    ``fps`` and ``image_keys``: a ``reader.meta.DatasetMeta`` or :class:`EpisodeChecks`)."""
    shard = join(root, row.shard)
    try:
        actual = fs.size(shard)
    except FileNotFoundError:
        return ["shard file missing"]
    if actual < row.offset + row.size:
        return [f"shard is {actual} bytes, the manifest span ends at {row.offset + row.size}"]
    data = fs.cat_file(shard, start=row.offset, end=row.offset + row.size)
    problems = []
    if len(data) != row.size:
        return [f"read {len(data)} of the span's {row.size} bytes"]
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
        header = parse_header(members[expected[0]], where=expected[0])
    except FormatError as exc:
        return [str(exc)]
    where = f"{shard} (episode {row.episode_index})"
    try:
        check_header_matches(header, vars(row), where)
        check_header_cameras(header, meta.features, where)
        for member in row.members:
            check_tar_member(data, member.offset - row.offset, member.size, member.name, where)
        rows = pq.read_table(io.BytesIO(members[expected[1]]))
        if rows.num_rows != row.length:
            return [f"{expected[1]}: {rows.num_rows} rows, expected {row.length}"]
        rows = check_rows(rows, meta.features, header, meta.task_names, where, meta.fps)
        for key in video_keys:
            check_camera(header.cameras[key], meta.features[key], row.length, key, where)
    except FormatError as exc:
        return [str(exc)]
    except (pa.ArrowException, OSError) as exc:
        return [f"{expected[1]}: rows do not parse: {exc}"]
    if deep:
        problems += _image_check(rows, meta)
    for key in video_keys:
        cam = header.cameras[key]
        name = video_member(row.episode_index, key)
        problems += [f"{name}: {msg}" for msg in _video_check(members[name], cam, deep)]
    return problems


def _image_check(rows: pa.Table, meta: Any) -> list[str]:
    """Every image of an image dataset's rows decoded as the reader decodes one
    (``validate.decode_image``: bytes, not a path, of the features' size and channels; a depth
    map's with ``depth.decode_depth_image``): the first bad one."""
    for key in meta.image_keys:
        feature = meta.features[key]
        size, channels = frame_size(feature), frame_channels(feature)
        for position, cell in enumerate(rows.column(key).to_pylist()):
            try:
                if is_depth_map(feature):
                    decode_depth_image(cell, size, allow_path=False)
                else:
                    decode_image(cell, size, allow_path=False, channels=channels)
            except ValueError as exc:
                return [f"image {key!r} of row {position}: {exc}"]
    return []


def _video_check(data: bytes, camera: Any, deep: bool) -> list[str]:
    """The mp4's size, codec, pixel format and packets as its header says (as the reader
    demuxes it); with ``deep``, every frame decoded, and each of the episode's frames (those
    between the skipped and the tail ones, in presentation order) found among them. A cut
    starting at an open GOP's keyframe may hold frames before it that no decoder starting
    there outputs; they are skipped ones."""
    try:
        with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
            stream = container.streams.video[0]
            try:
                check_stream(stream.codec_context, camera, "the video")
            except FormatError as exc:
                return [str(exc)]
            shown = sorted(p.pts for p in container.demux(stream) if p.size)
            if len(shown) != camera.frames:
                return [f"holds {len(shown)} packets, its header says {camera.frames} frames"]
        if not deep:
            return []
        with av.open(io.BytesIO(data), mode="r") as container:
            decoded = {frame.pts for frame in container.decode(video=0)}
    except (av.error.FFmpegError, IndexError) as exc:  # IndexError: no video stream
        return [f"does not decode: {exc}"]
    episode = shown[camera.skip_frames : camera.frames - camera.tail_frames]
    missing = [k for k, pts in enumerate(episode) if pts not in decoded]
    if missing:
        return [
            f"decodes to {len(decoded)} frames of {camera.frames}, without the episode's frames "
            f"{missing[:10]}"
        ]
    return []
