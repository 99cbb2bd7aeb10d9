"""Converted datasets of any number of episodes, made in seconds (benchmarks and tests at scale).

A *template*, a small converted dataset with real shards, lends its episodes: episode ``e`` of
the scaled dataset is the template's episode ``e % K`` renumbered (its rows' ``episode_index``
and ``index``, its header's indices, its members' names), frames and videos unchanged, its
global frame range after episode ``e - 1``'s. Only the episodes a run reads (``read``) get a
shard, tarred by the converter's own ``write_tar``, so reading one is reading a real episode.
Every other episode gets the row its shard would have (the template's members, each video a
few percent longer or shorter so that sizes differ as a recording's do, and a checksum of its
own) and no file. The manifest is written by the converter's own writer
(``format.ManifestColumns``), then ``index.json``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_shards.converter.shard import write_tar
from lerobot_shards.format import (
    INDEX_FILE,
    INFO_FILE,
    MANIFEST_FILE,
    META_DIR,
    DatasetIndex,
    EpisodeHeader,
    ManifestColumns,
    ManifestRow,
    Member,
    episode_key,
    manifest_rows,
    shard_path,
)
from lerobot_shards.validate import parse_header, read_index, read_manifest

SIZE_SPREAD = 0.05
"""How much longer or shorter than the template's each unread episode's videos are."""


@dataclass(frozen=True)
class Template:
    """A small converted dataset whose episodes a scaled one renumbers."""

    root: Path
    index: DatasetIndex
    rows: list[ManifestRow]
    members: list[list[tuple[str, bytes]]]
    """Per episode, its tar members as ``(extension, bytes)``, in tar order."""

    @classmethod
    def open(cls, root: str | Path) -> Template:
        """The template at ``root`` (a converted dataset), every shard read into memory."""
        root = Path(root)
        fs = fsspec.filesystem("file")
        index = read_index(fs, str(root))
        rows = manifest_rows(read_manifest(fs, str(root / MANIFEST_FILE)))
        members = []
        for row in rows:
            data = (root / row.shard).read_bytes()
            key = episode_key(row.episode_index)
            members.append(
                [(m.name[len(key) + 1 :], data[m.offset : m.offset + m.size]) for m in row.members]
            )
        return cls(root, index, rows, members)


def scaled_rows(
    template: Template,
    episodes: int,
    dest: Path,
    read: Collection[int] = (),
    seed: int = 0,
    length: int | None = None,
) -> Iterator[ManifestRow]:
    """The manifest rows of ``episodes`` episodes made from ``template``, in episode order,
    writing the shards of those in ``read`` under ``dest``; ``length``: the frames of each
    unread episode (default: its template episode's)."""
    rng = np.random.default_rng(seed)
    start = 0
    for e in range(episodes):
        t = e % len(template.rows)
        source, members = template.rows[t], template.members[t]
        if e % 4096 == 0:  # each unread video a few percent longer or shorter
            spread = rng.uniform(1 - SIZE_SPREAD, 1 + SIZE_SPREAD, (4096, len(members)))
        if e in read:
            row = _write_shard(source, members, e, start, dest)
        else:
            sizes = [
                int(len(data) * s) if ext.endswith(".mp4") else len(data)
                for (ext, data), s in zip(members, spread[e % 4096].tolist(), strict=False)
            ]
            row = _unwritten_row(source, [ext for ext, _ in members], sizes, e, start, seed)
            if length is not None:
                row.length, row.dataset_to_index = length, start + length
        start += row.length
        yield row


def write_scaled(template: Template, dest: Path, rows: ManifestColumns) -> None:
    """The dataset files of ``rows`` at ``dest``: ``meta/`` (the template's, ``info.json``'s
    totals the scaled dataset's), the manifest as the converter writes it, then ``index.json``."""
    (dest / META_DIR).mkdir(parents=True, exist_ok=True)
    for path in (template.root / META_DIR).iterdir():
        shutil.copyfile(path, dest / META_DIR / path.name)
    info = json.loads((template.root / INFO_FILE).read_text())
    info.update(total_episodes=len(rows), total_frames=rows.total_frames)
    if "splits" in info:
        info["splits"] = {"train": f"0:{len(rows)}"}
    (dest / INFO_FILE).write_text(json.dumps(info, indent=4))
    manifest_checksum = rows.write(str(dest / MANIFEST_FILE))
    index = replace(
        template.index,
        total_episodes=len(rows),
        total_frames=rows.total_frames,
        total_bytes=rows.total_bytes,
        manifest_checksum=manifest_checksum,
    )
    (dest / INDEX_FILE).write_bytes(index.to_json())


def make_scaled_dataset(
    template: str | Path,
    dest: str | Path,
    episodes: int,
    read: Collection[int] = (),
    seed: int = 0,
    length: int | None = None,
) -> Path:
    """A converted dataset of ``episodes`` episodes at ``dest`` made from the converted dataset
    ``template``, with shards for the episodes in ``read`` only (``scaled_rows``)."""
    dest = Path(dest)
    source = Template.open(template)
    rows = ManifestColumns()
    for row in scaled_rows(source, episodes, dest, read, seed, length):
        rows.add(row)
    write_scaled(source, dest, rows)
    return dest


def _write_shard(
    source: ManifestRow, members: list[tuple[str, bytes]], episode: int, start: int, dest: Path
) -> ManifestRow:
    """Episode ``episode``'s shard: the template episode's members renumbered, tarred."""
    renumbered = []
    for ext, data in members:
        if ext == "json":
            header = parse_header(data)
            data = EpisodeHeader(
                episode_index=episode,
                length=header.length,
                dataset_from_index=start,
                dataset_to_index=start + header.length,
                tasks=header.tasks,
                cameras=header.cameras,
            ).to_json()
        elif ext == "parquet":
            data = _renumbered_rows(data, episode, start)
        renumbered.append((ext, data))
    path = dest / shard_path(episode)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        digest, spans = write_tar(f, episode_key(episode), renumbered)
        size = f.tell()
    return replace(
        source,
        episode_index=episode,
        shard=shard_path(episode),
        offset=0,
        size=size,
        dataset_from_index=start,
        dataset_to_index=start + source.length,
        members=spans,
        checksum=digest,
    )


def _renumbered_rows(data: bytes, episode: int, start: int) -> bytes:
    table = pq.read_table(pa.BufferReader(data))
    n = table.num_rows
    for name, values in (("episode_index", np.full(n, episode)), ("index", start + np.arange(n))):
        at = table.schema.get_field_index(name)
        table = table.set_column(at, table.schema.field(at), pa.array(values, table[name].type))
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def _unwritten_row(
    source: ManifestRow,
    extensions: list[str],
    sizes: list[int],
    episode: int,
    start: int,
    seed: int,
) -> ManifestRow:
    """The row episode ``episode``'s shard would have, with members of ``sizes`` bytes, laid
    out as ``write_tar`` lays them out."""
    key = episode_key(episode)
    at, spans = 0, []
    for ext, size in zip(extensions, sizes, strict=True):
        at += _header_size(ext, len(key))
        spans.append(Member(f"{key}.{ext}", at, size))
        at += size + (-size % tarfile.BLOCKSIZE)
    end = 2 * tarfile.BLOCKSIZE
    at += end + (-(at + end) % tarfile.RECORDSIZE)
    digest = hashlib.sha256(f"lerobot-shards scale {seed} {episode}".encode()).hexdigest()
    return ManifestRow(
        episode, shard_path(episode), 0, at, source.length, start, start + source.length,
        source.tasks, spans, f"sha256:{digest}",
    )  # fmt: skip


@functools.cache
def _header_size(extension: str, key_length: int) -> int:
    """Bytes of the tar header ``write_tar`` writes before a member so named (a key of
    ``key_length`` characters): the same for every episode whose key is as long."""
    info = tarfile.TarInfo(f"{'0' * key_length}.{extension}")
    return len(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
