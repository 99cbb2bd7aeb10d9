"""A converted dataset's metadata (``meta/info.json``, tasks, stats, its episodes), and a
mixture's: what the reader knows before it fetches any shard (the selected episodes' manifest
rows: ``selection.py``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from lerobot_shards.arrow import as_numpy
from lerobot_shards.format import (
    INDEX_FILE,
    INFO_FILE,
    STATS_FILE,
    TASKS_FILE,
    DatasetIndex,
    FormatError,
    join,
    read_whole,
)
from lerobot_shards.validate import check_ranges, check_stats, check_tasks, is_depth_map

LANGUAGE_COLUMNS = ("language_persistent", "language_events")
"""The columns that make LeRobot's training loop collate with ``lerobot_collate_fn``."""


class EpisodeTable:
    """Per-episode metadata, read as LeRobot's ``meta.episodes`` is: ``episodes["column"]``
    gives a column as a list, ``episodes[i]`` row ``i`` as a dict (rows in episode order).

    Columns: ``episode_index``, ``length``, ``dataset_from_index``, ``dataset_to_index``
    (the episode's global frame indices, as LeRobot's). Held as numpy columns (four lists of a
    million Python ints took 144 MB in every process); the lists are made when asked for.
    """

    def __init__(self, manifest: pa.Table) -> None:
        self._episodes = as_numpy(manifest.column("episode_index"))
        self._lengths = as_numpy(manifest.column("length"))
        self._starts = as_numpy(manifest.column("dataset_from_index"))

    @property
    def column_names(self) -> list[str]:
        """The columns ``episodes["column"]`` gives."""
        return ["episode_index", "length", "dataset_from_index", "dataset_to_index"]

    def _column(self, name: str) -> Any:
        if name == "dataset_to_index":
            return self._starts + self._lengths
        return {"episode_index": self._episodes, "length": self._lengths}.get(name, self._starts)

    def __len__(self) -> int:
        return len(self._episodes)

    def __getitem__(self, key: str | int) -> Any:
        if isinstance(key, str):
            if key not in self.column_names:
                raise KeyError(f"{key!r}: episodes have the columns {self.column_names}")
            return self._column(key).tolist()
        start, length = int(self._starts[key]), int(self._lengths[key])
        return {
            "episode_index": int(self._episodes[key]),
            "length": length,
            "dataset_from_index": start,
            "dataset_to_index": start + length,
        }

    def __repr__(self) -> str:
        return f"EpisodeTable({len(self)} episodes, columns {self.column_names})"


class _FeatureViews:
    """``names`` and ``shapes`` by feature, as LeRobot's metadata gives them."""

    features: dict[str, Any]

    @property
    def names(self) -> dict[str, Any]:
        """Per feature, its ``names`` (None where it has none), as LeRobot's."""
        return {key: ft.get("names") for key, ft in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Per feature, its shape as a tuple, as LeRobot's."""
        return {key: tuple(ft["shape"]) for key, ft in self.features.items()}


class DatasetMeta(_FeatureViews):
    """A converted dataset's metadata, as LeRobot's ``LeRobotDatasetMetadata`` gives it: what
    LeRobot's ``make_policy``, its processors and its training script read (``features``,
    ``stats`` as numpy arrays, ``fps``, camera keys, ``tasks``, ``episodes``, totals, ...)."""

    def __init__(
        self,
        info: dict[str, Any],
        index: DatasetIndex,
        stats: dict[str, Any] | None,
        task_names: list[str],
        manifest: pa.Table,
        root: str,
    ) -> None:
        self.info: dict[str, Any] = info
        """``meta/info.json`` of the source dataset, as converted."""
        self.root = root
        """The converted dataset's root, as the reader was given it."""
        self.repo_id: str = info.get("repo_id") or root
        """The source's Hub id where the conversion recorded one, else the converted root."""
        self.codebase_version: str = index.codebase_version
        """The source's LeRobot format (``"v3.0"``, ``"v2.1"``)."""
        features = info.get("features", index.features)
        self.features: dict[str, Any] = {  # shapes as tuples, as LeRobot loads them
            key: {**ft, "shape": tuple(ft["shape"])} if "shape" in ft else dict(ft)
            for key, ft in features.items()
        }
        """Per key, its feature (``dtype``, ``shape`` as a tuple, ``names``, ``info``), as
        LeRobot's."""
        self.fps: int | float = info.get("fps", index.fps)
        """Frames per second."""
        self.video_keys: list[str] = list(index.video_keys)
        """The cameras stored as video."""
        self.camera_keys: list[str] = list(index.camera_keys)
        """Every camera: the video keys and the image keys."""
        self.image_keys: list[str] = [k for k in self.camera_keys if k not in self.video_keys]
        """The cameras stored as images in the rows."""
        self.stats = stats
        """Per feature, per statistic: numpy arrays, as LeRobot loads ``meta/stats.json``
        (``validate.check_stats``)."""
        self.task_names = task_names
        """Task string by ``task_index``."""
        self.total_frames: int = index.total_frames
        """Frames in the whole converted dataset (whatever a reader selected)."""
        self.total_episodes: int = index.total_episodes
        """Episodes in the whole converted dataset."""
        self.episodes: EpisodeTable = EpisodeTable(manifest)
        """Per-episode metadata, as LeRobot's ``meta.episodes``."""

    @property
    def tasks(self) -> Any:
        """A pandas ``DataFrame`` indexed by task string with a ``task_index`` column, as
        LeRobot's (needs pandas, which LeRobot installs)."""
        try:
            import pandas as pd
        except ImportError as exc:
            raise ImportError(
                "meta.tasks is a pandas DataFrame, as in LeRobot: pip install pandas (or use "
                "meta.task_names, the task strings by task_index)"
            ) from exc
        frame = pd.DataFrame({"task_index": range(len(self.task_names))}, index=self.task_names)
        frame.index.name = "task"
        return frame

    def get_task_index(self, task: str) -> int | None:
        """``task``'s ``task_index``, or None if the dataset has no such task."""
        try:
            return self.task_names.index(task)
        except ValueError:
            return None

    @property
    def total_tasks(self) -> int:
        """How many tasks the dataset has."""
        return len(self.task_names)

    @property
    def robot_type(self) -> str | None:
        """The robot the source recorded (``info.json``'s ``robot_type``)."""
        return self.info.get("robot_type")

    @property
    def chunks_size(self) -> int | None:
        """The source's files per chunk (``info.json``; the shards do not use it)."""
        return self.info.get("chunks_size")

    @property
    def data_files_size_in_mb(self) -> int | None:
        """The source's parquet file size cap (``info.json``; the shards do not use it)."""
        return self.info.get("data_files_size_in_mb")

    @property
    def video_files_size_in_mb(self) -> int | None:
        """The source's video file size cap (``info.json``; the shards do not use it)."""
        return self.info.get("video_files_size_in_mb")

    @property
    def data_path(self) -> str | None:
        """The source's parquet path template (the shards do not use it)."""
        return self.info.get("data_path")

    @property
    def video_path(self) -> str | None:
        """The source's video path template (the shards do not use it)."""
        return self.info.get("video_path")

    @property
    def depth_keys(self) -> list[str]:
        """Cameras whose feature info marks them as depth maps, by LeRobot's rule."""
        return [key for key, ft in self.features.items() if is_depth_map(ft)]

    @property
    def has_language_columns(self) -> bool:
        """Whether the features hold LeRobot's language columns (its trainer then collates
        with ``lerobot_collate_fn``)."""
        return any(column in self.features for column in LANGUAGE_COLUMNS)

    def __repr__(self) -> str:
        return (
            f"DatasetMeta({self.repo_id!r}, {self.total_episodes} episodes, "
            f"{self.total_frames} frames, fps={self.fps}, cameras={self.camera_keys})"
        )


def read_meta(
    fs: fsspec.AbstractFileSystem,
    path: str,
    index: DatasetIndex,
    manifest: pa.Table,
    root: str,
    shard_of: Callable[[int], str] | None = None,
) -> DatasetMeta:
    """The metadata of the converted dataset at ``path`` (its ``index.json`` and manifest
    already read; ``root`` as the user gave it); a missing or unreadable file raises
    ``FormatError`` naming it. ``manifest`` may hold only the rows' numbers (``episode_index``,
    ``length``, ``dataset_from_index``, ``dataset_to_index``), ``shard_of(row)`` giving their
    shards."""

    def read_json(relative: str, required: bool) -> Any:
        file = join(path, relative)
        try:
            return json.loads(read_whole(fs, file))  # one GET on object storage
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
        data = read_whole(fs, tasks_path)
    except FileNotFoundError:
        raise FormatError(f"{tasks_path} not found: the converted dataset is incomplete") from None
    try:  # a failed read (above) is not a bad file
        table = pq.ParquetFile(pa.BufferReader(data)).read(columns=["task_index", "task"])
        if table.column_names != ["task_index", "task"]:  # a column it lacks is left out
            raise ValueError(f"it has columns {table.schema.names}, not task_index and task")
    except Exception as exc:
        raise FormatError(f"{tasks_path}: tasks do not parse: {exc}") from exc
    indices = table.column("task_index").to_pylist()
    check_tasks(indices, tasks_path)
    if not all(isinstance(t, str) for t in table.column("task").to_pylist()):
        raise FormatError(f"{tasks_path}: every task must be a string")
    if not isinstance(info, dict):
        raise FormatError(f"{join(path, INFO_FILE)}: not an object")
    for key in ("features", "fps", "codebase_version"):
        if info.get(key, getattr(index, key)) != getattr(index, key):
            raise FormatError(
                f"{join(path, INFO_FILE)}: its {key} differs from {join(path, INDEX_FILE)}'s"
            )
    if info.get("total_tasks", len(indices)) != len(indices):
        raise FormatError(
            f"{tasks_path}: {len(indices)} tasks, {join(path, INFO_FILE)} says total_tasks="
            f"{info['total_tasks']!r}"
        )
    check_ranges(manifest, info, join(path, INFO_FILE), shard_of)
    tasks = [""] * len(indices)
    for i, task in zip(indices, table.column("task").to_pylist(), strict=True):
        tasks[i] = task
    stats = read_json(STATS_FILE, False)
    if stats is not None:
        stats = check_stats(stats, info.get("features", index.features), join(path, STATS_FILE))
    return DatasetMeta(info, index, stats, tasks, manifest, root)


class MixtureMeta(_FeatureViews):
    """A mixture's metadata, as LeRobot's training loop reads a dataset's: its features, keys
    and shapes under the common names (those of dataset 0 through its ``key_map``; every
    dataset has them, the mixture checks it), ``stats`` aggregated over the datasets as LeRobot
    aggregates them (``stats.aggregate_stats``), and each dataset's own ``DatasetMeta`` in
    ``datasets``. ``fps`` is dataset 0's (``fps_per_dataset`` gives each one's; each resolves
    ``delta_timestamps``, which are seconds, at its own)."""

    def __init__(
        self, datasets: Sequence[DatasetMeta], key_maps: Sequence[dict[str, str | None]]
    ) -> None:
        self.datasets = list(datasets)
        """Each dataset's own metadata, in the mixture's order."""
        self.key_maps = [dict(k) for k in key_maps]
        first, rename = self.datasets[0], self.key_maps[0]

        def name(key: str) -> str | None:
            return rename.get(key, key)

        self.features: dict[str, Any] = {
            name(k): ft for k, ft in first.features.items() if name(k) is not None
        }
        """Dataset 0's features under the common names."""
        self.video_keys = [name(k) for k in first.video_keys if name(k) is not None]
        """The cameras stored as video, under the common names."""
        self.image_keys = [name(k) for k in first.image_keys if name(k) is not None]
        """The cameras stored as images, under the common names."""
        self.camera_keys = [*self.video_keys, *self.image_keys]
        """Every camera, under the common names."""
        self.depth_keys = [name(k) for k in first.depth_keys if name(k) is not None]
        """The depth cameras, under the common names."""
        self.fps = first.fps
        """Dataset 0's frames per second."""
        self.fps_per_dataset = [d.fps for d in self.datasets]
        self.stats = self._combined_stats()
        """Per feature, per statistic: numpy arrays aggregated over the datasets with stats."""
        self.total_frames = sum(d.total_frames for d in self.datasets)
        """Frames of every dataset, together."""
        self.total_episodes = sum(d.total_episodes for d in self.datasets)
        """Episodes of every dataset, together."""
        robots = {d.robot_type for d in self.datasets}
        self.robot_type = robots.pop() if len(robots) == 1 else None
        """The datasets' robot type if they share one, else None."""

    def _combined_stats(self) -> dict[str, dict[str, Any]] | None:
        """The datasets' stats under the common names, aggregated as LeRobot aggregates them."""
        from lerobot_shards.reader.meta.stats import aggregate_stats

        with_stats = [
            (d.stats, k) for d, k in zip(self.datasets, self.key_maps, strict=True) if d.stats
        ]
        if not with_stats:
            return None
        return aggregate_stats([s for s, _ in with_stats], [k for _, k in with_stats])

    @property
    def has_language_columns(self) -> bool:
        """Whether any dataset has language columns (LeRobot's trainer then collates them)."""
        return any(d.has_language_columns for d in self.datasets)

    def __repr__(self) -> str:
        return (
            f"MixtureMeta({len(self.datasets)} datasets, {self.total_episodes} episodes, "
            f"{self.total_frames} frames, cameras={self.camera_keys})"
        )
