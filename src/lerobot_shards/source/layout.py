"""The episode table and file layout of a LeRobot dataset (v3.0 and v2.1). INTERFACE STUB.

This file pins the interface the converter codes against; the source implementation fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import fsspec
import pyarrow as pa


class SourceError(ValueError):
    """The source is not a readable LeRobot dataset; the message names the file and episode."""


@dataclass(frozen=True)
class VideoSpan:
    """Where one camera's frames of one episode are."""

    path: str
    """Path of the mp4, relative to the dataset root."""
    from_timestamp: float
    """Start of the episode inside that file, seconds (0 for v2.1)."""
    to_timestamp: float


@dataclass(frozen=True)
class EpisodeInfo:
    episode_index: int
    length: int
    dataset_from_index: int
    dataset_to_index: int
    tasks: list[str]
    data_path: str
    """Parquet file holding the episode's rows, relative to the root."""
    videos: dict[str, VideoSpan] = field(default_factory=dict)


class Source:
    """A LeRobot dataset on any fsspec filesystem.

    Attributes: ``root`` (as given), ``fs`` (fsspec filesystem), ``info`` (info.json dict),
    ``codebase_version``, ``fps``, ``features``, ``video_keys``, ``image_keys``, ``camera_keys``
    (video then image keys, in ``features`` order), ``tasks`` (task string by task_index),
    ``stats`` (stats.json dict or None), ``episodes`` (list of EpisodeInfo sorted by index),
    ``total_frames``.
    """

    root: str
    fs: fsspec.AbstractFileSystem
    info: dict[str, Any]
    codebase_version: str
    fps: float
    features: dict[str, Any]
    video_keys: list[str]
    image_keys: list[str]
    camera_keys: list[str]
    tasks: list[str]
    stats: dict[str, Any] | None
    episodes: list[EpisodeInfo]
    total_frames: int

    def episode(self, episode_index: int) -> EpisodeInfo:
        """The episode with this index; SourceError if there is none."""
        raise NotImplementedError

    def read_rows(self, episode_index: int) -> pa.Table:
        """The episode's rows with the source's exact Arrow schema (reads one row group in v3.0)."""
        raise NotImplementedError

    def path(self, relative: str) -> str:
        """Full path/URL (for ``self.fs``) of a file relative to the root."""
        raise NotImplementedError

    def open(self, relative: str, mode: str = "rb"):
        """Open a file relative to the root through ``self.fs``."""
        raise NotImplementedError


def open_source(root: str, storage_options: dict | None = None) -> Source:
    """Open a LeRobot dataset at a local path or fsspec URL; SourceError if it is not one."""
    raise NotImplementedError
