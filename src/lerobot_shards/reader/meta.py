"""A converted dataset's metadata (``meta/info.json``, tasks, stats) and the manifest rows of
the episodes a reader selected: what the reader knows before it fetches any shard."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_shards.format import (
    INFO_FILE,
    MANIFEST_FILE,
    STATS_FILE,
    TASKS_FILE,
    DatasetIndex,
    FormatError,
    join,
    manifest_fingerprint,
    read_manifest,
)
from lerobot_shards.reader.fetch import Span


@dataclass
class DatasetMeta:
    """The dataset's metadata, named as LeRobot's ``LeRobotDataset.meta`` names it."""

    info: dict[str, Any]
    fps: float
    features: dict[str, Any]
    camera_keys: list[str]
    video_keys: list[str]
    image_keys: list[str]
    stats: dict[str, Any] | None
    tasks: list[str]
    """Task string by ``task_index``."""
    total_frames: int
    total_episodes: int
    codebase_version: str


def read_meta(fs: fsspec.AbstractFileSystem, path: str, index: DatasetIndex) -> DatasetMeta:
    """The metadata of the converted dataset at ``path`` (its ``index.json`` already read);
    a missing or unreadable file raises ``FormatError`` naming it."""

    def read_json(relative: str, required: bool) -> Any:
        file = join(path, relative)
        try:
            with fs.open(file, "rb") as f:
                return json.load(f)
        except FileNotFoundError:
            if required:
                raise FormatError(
                    f"{file} not found: the converted dataset is incomplete"
                ) from None
            return None
        except ValueError as exc:
            raise FormatError(f"{file}: not JSON: {exc}") from exc

    info = read_json(INFO_FILE, True)
    tasks_path = join(path, TASKS_FILE)
    try:
        with fs.open(tasks_path, "rb") as f:
            table = pq.read_table(f, columns=["task_index", "task"])
    except FileNotFoundError:
        raise FormatError(f"{tasks_path} not found: the converted dataset is incomplete") from None
    except Exception as exc:
        raise FormatError(f"{tasks_path}: tasks do not parse: {exc}") from exc
    indices = table.column("task_index").to_pylist()
    tasks = [""] * (max(indices, default=-1) + 1)
    for i, task in zip(indices, table.column("task").to_pylist(), strict=True):
        tasks[i] = task
    video_keys = list(index.video_keys)
    return DatasetMeta(
        info=info,
        fps=index.fps,
        features=info.get("features", index.features),
        camera_keys=list(index.camera_keys),
        video_keys=video_keys,
        image_keys=[k for k in index.camera_keys if k not in video_keys],
        stats=read_json(STATS_FILE, False),
        tasks=tasks,
        total_frames=index.total_frames,
        total_episodes=index.total_episodes,
        codebase_version=index.codebase_version,
    )


class Selection:
    """The manifest rows of the selected episodes, in episode order, as the arrays the planner
    and the fetcher use: ``episodes``, ``lengths`` (frames), ``sizes`` (shard bytes)."""

    def __init__(self, table: pa.Table, path: str) -> None:
        self.table = table
        self.path = path
        self.episodes = table.column("episode_index").to_numpy()
        self.lengths = table.column("length").to_numpy()
        self.sizes = table.column("size").to_numpy()
        self._offsets = table.column("offset").to_numpy()
        self._shards = table.column("shard").to_pylist()
        self._checksums = table.column("checksum").to_pylist()
        self._row_of = {int(e): i for i, e in enumerate(self.episodes.tolist())}
        self._fingerprint: str | None = None

    @classmethod
    def read(
        cls,
        fs: fsspec.AbstractFileSystem,
        path: str,
        episodes: Sequence[int] | None,
        root: str,
    ) -> Selection:
        """The rows of ``episodes`` (all with None) of the manifest at ``path``; an episode the
        manifest lacks raises ``ValueError`` naming it and ``root``."""
        table = read_manifest(fs, join(path, MANIFEST_FILE))
        present = table.column("episode_index").to_numpy()
        if episodes is None:
            rows = np.arange(len(present))
        else:
            wanted = np.unique(np.asarray(list(episodes), dtype=np.int64))
            rows = np.minimum(np.searchsorted(present, wanted), max(len(present) - 1, 0))
            missing = wanted[(len(present) == 0) | (present[rows] != wanted)]
            if len(missing):
                raise ValueError(
                    f"episodes {missing.tolist()} are not in {root} ({len(present)} episodes)"
                )
        return cls(table.take(rows), path)

    @property
    def fingerprint(self) -> str:
        """``manifest_fingerprint`` of these rows: what a checkpoint is checked against."""
        if self._fingerprint is None:
            self._fingerprint = manifest_fingerprint(self.table)
        return self._fingerprint

    def lengths_of(self, episodes: np.ndarray) -> np.ndarray:
        """Frames of each of ``episodes`` (selected ones)."""
        return self.lengths[np.searchsorted(self.episodes, episodes)]

    def cost(self, episode: int, start: int, stop: int) -> int:
        """What a piece (rows ``start:stop``) costs the pool budget while resident: its
        episode's shard bytes, fetched whole whichever rows it draws (decoded frames are in the
        frame cache, budgeted apart)."""
        return int(self.sizes[self._row_of[episode]])

    def span(self, episode: int) -> Span:
        """The byte span of ``episode`` in its shard, with its checksum."""
        row = self._row_of[episode]
        return Span(
            episode,
            join(self.path, self._shards[row]),
            int(self._offsets[row]),
            int(self.sizes[row]),
            self._checksums[row],
        )

    def members(self, episode: int) -> dict[str, tuple[int, int]]:
        """``episode``'s tar members: name to (offset within its span, size)."""
        row = self._row_of[episode]
        base = int(self._offsets[row])
        return {
            m["name"]: (m["offset"] - base, m["size"])
            for m in self.table.column("members")[row].as_py()
        }

    def length(self, episode: int) -> int:
        """Frames of ``episode``."""
        return int(self.lengths[self._row_of[episode]])
