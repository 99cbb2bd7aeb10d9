"""The episode table and file layout of a LeRobot dataset (codebase v3.0 and v2.1).

``open_source(root)`` reads the metadata once (info.json, tasks, stats, the episode table) and
answers where each episode's rows and video frames are, on any fsspec filesystem. Nothing here
decodes video: this is what the converter needs to cut episodes out of the source files.
"""

from __future__ import annotations

import json
import posixpath
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

SUPPORTED_VERSIONS = ("v3.0", "v2.1")
INFO_FILE = "meta/info.json"
STATS_FILE = "meta/stats.json"


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

    _FOOTER_CACHE_SIZE = 16

    def __init__(
        self, root: str, fs: fsspec.AbstractFileSystem, fs_root: str, info: dict[str, Any]
    ) -> None:
        self.root = root
        self.fs = fs
        self._fs_root = fs_root.rstrip("/") or "/"
        self.info = info
        self.codebase_version = info["codebase_version"]
        self.fps = info["fps"]
        self.features = info["features"]
        self.video_keys = [k for k, f in self.features.items() if f.get("dtype") == "video"]
        self.image_keys = [k for k, f in self.features.items() if f.get("dtype") == "image"]
        self.camera_keys = [*self.video_keys, *self.image_keys]
        # Parquet footers of data files, so reading episode after episode from one big v3.0
        # file does not re-fetch its footer each time (plain data: survives pickling).
        self._footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()
        if self.codebase_version == "v3.0":
            self.tasks = self._tasks_v30()
            self.episodes = self._episodes_v30()
            self.stats = self._read_json(STATS_FILE) if self.exists(STATS_FILE) else None
        else:
            self.tasks = self._tasks_v21()
            self.episodes = self._episodes_v21()
            self.stats = self._stats_v21()
        self._by_index = {ep.episode_index: i for i, ep in enumerate(self.episodes)}
        self.total_frames = sum(ep.length for ep in self.episodes)

    # ---------------------------------------------------------------- files

    def path(self, relative: str) -> str:
        """Full path/URL (for ``self.fs``) of a file relative to the root."""
        return posixpath.join(self._fs_root, relative)

    def open(self, relative: str, mode: str = "rb"):
        """Open a file relative to the root through ``self.fs``."""
        return self.fs.open(self.path(relative), mode)

    def exists(self, relative: str) -> bool:
        return self.fs.exists(self.path(relative))

    def local_path(self, relative: str) -> str | None:
        """The OS path of a file when the filesystem is local (decoders open those directly)."""
        return self.path(relative) if isinstance(self.fs, LocalFileSystem) else None

    def _read_json(self, relative: str) -> Any:
        try:
            with self.open(relative, "rb") as f:
                return json.load(f)
        except FileNotFoundError as exc:
            raise SourceError(f"{self.path(relative)}: file not found") from exc
        except ValueError as exc:
            raise SourceError(f"{self.path(relative)}: not valid JSON: {exc}") from exc

    def _read_jsonl(self, relative: str) -> list[dict[str, Any]]:
        try:
            with self.open(relative, "rb") as f:
                lines = f.read().decode().splitlines()
        except FileNotFoundError as exc:
            raise SourceError(f"{self.path(relative)}: file not found") from exc
        try:
            return [json.loads(line) for line in lines if line.strip()]
        except ValueError as exc:
            raise SourceError(f"{self.path(relative)}: not valid JSON lines: {exc}") from exc

    def _read_parquet(self, full: str, columns: list[str] | None = None) -> pa.Table:
        """A whole (small, metadata) parquet file, by its full path on ``self.fs``."""
        try:
            with self.fs.open(full, "rb") as f:
                return pq.read_table(f, columns=columns)
        except FileNotFoundError as exc:
            raise SourceError(f"{full}: file not found") from exc
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{full}: not a readable parquet file: {exc}") from exc

    def _read_parquet_schema(self, full: str) -> pa.Schema:
        try:
            with self.fs.open(full, "rb") as f:
                return pq.read_schema(f)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{full}: not a readable parquet file: {exc}") from exc

    # ---------------------------------------------------------------- episodes

    def episode(self, episode_index: int) -> EpisodeInfo:
        """The episode with this index; SourceError if there is none."""
        try:
            return self.episodes[self._by_index[int(episode_index)]]
        except KeyError:
            raise SourceError(
                f"{self.root}: no episode {episode_index} "
                f"(the dataset has {len(self.episodes)} episodes)"
            ) from None

    def read_rows(self, episode_index: int) -> pa.Table:
        """The episode's rows with the source's exact Arrow schema (reads one row group in v3.0)."""
        ep = self.episode(episode_index)
        where = f"{self.path(ep.data_path)} (episode {ep.episode_index})"
        try:
            with self.open(ep.data_path, "rb") as f:
                pf = pq.ParquetFile(f, metadata=self._footers.get(ep.data_path))
                self._remember_footer(ep.data_path, pf.metadata)
                if self.codebase_version == "v3.0":
                    table = self._episode_row_groups(pf, ep.episode_index)
                else:
                    table = pf.read()
        except FileNotFoundError as exc:
            raise SourceError(f"{where}: data file not found") from exc
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{where}: not a readable parquet file: {exc}") from exc
        if "episode_index" in table.column_names and self.codebase_version == "v3.0":
            mask = pc.equal(table.column("episode_index"), ep.episode_index)
            table = table.filter(mask)
        if table.num_rows != ep.length:
            raise SourceError(
                f"{where}: holds {table.num_rows} rows for the episode, "
                f"the episode table says {ep.length}"
            )
        return table

    def _remember_footer(self, relative: str, metadata: pq.FileMetaData) -> None:
        self._footers[relative] = metadata
        self._footers.move_to_end(relative)
        while len(self._footers) > self._FOOTER_CACHE_SIZE:
            self._footers.popitem(last=False)

    @staticmethod
    def _episode_row_groups(pf: pq.ParquetFile, episode_index: int) -> pa.Table:
        """Read only the row groups whose episode_index statistics can hold the episode."""
        meta = pf.metadata
        # Parquet leaf columns, not Arrow fields: nested columns (images, vectors) add leaves.
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        if "episode_index" not in leaves:
            return pf.read()
        col = leaves.index("episode_index")
        groups = []
        for g in range(meta.num_row_groups):
            st = meta.row_group(g).column(col).statistics
            if st is None or not st.has_min_max or st.min <= episode_index <= st.max:
                groups.append(g)
        return pf.read_row_groups(groups)

    # ---------------------------------------------------------------- v3.0

    def _tasks_v30(self) -> list[str]:
        table = self._read_parquet(self.path("meta/tasks.parquet"))
        name = "task" if "task" in table.column_names else "__index_level_0__"
        if name not in table.column_names or "task_index" not in table.column_names:
            raise SourceError(
                f"{self.path('meta/tasks.parquet')}: expected columns task and task_index, "
                f"found {table.column_names}"
            )
        return _tasks_by_index(
            table.column("task_index").to_pylist(),
            table.column(name).to_pylist(),
            self.path("meta/tasks.parquet"),
        )

    def _episodes_v30(self) -> list[EpisodeInfo]:
        pattern = self.path("meta/episodes/chunk-*/file-*.parquet")
        files = sorted(self.fs.glob(pattern))
        if not files:
            raise SourceError(f"{self.path('meta/episodes')}: no episode parquet files")
        wanted = ["episode_index", "tasks", "length", "dataset_from_index", "dataset_to_index"]
        wanted += ["data/chunk_index", "data/file_index"]
        for key in self.video_keys:
            wanted += [f"videos/{key}/{c}" for c in _VIDEO_COLUMNS]
        tables = []
        for full in files:
            names = self._read_parquet_schema(full).names
            missing = [c for c in wanted if c not in names]
            if missing:
                raise SourceError(f"{full}: episode table lacks columns {missing}")
            # Only the columns we need: the stats/... columns are most of the bytes.
            tables.append(self._read_parquet(full, columns=wanted))
        rows = pa.concat_tables(tables).sort_by("episode_index").to_pydict()
        data_tpl = self.info["data_path"]
        video_tpl = self.info.get("video_path")
        episodes = []
        for i, ep_idx in enumerate(rows["episode_index"]):
            videos = {}
            for key in self.video_keys:
                col = f"videos/{key}/"
                path = video_tpl.format(
                    video_key=key,
                    chunk_index=rows[col + "chunk_index"][i],
                    file_index=rows[col + "file_index"][i],
                )
                videos[key] = VideoSpan(
                    path, rows[col + "from_timestamp"][i], rows[col + "to_timestamp"][i]
                )
            ep = EpisodeInfo(
                episode_index=ep_idx,
                length=rows["length"][i],
                dataset_from_index=rows["dataset_from_index"][i],
                dataset_to_index=rows["dataset_to_index"][i],
                tasks=list(rows["tasks"][i]),
                data_path=data_tpl.format(
                    chunk_index=rows["data/chunk_index"][i], file_index=rows["data/file_index"][i]
                ),
                videos=videos,
            )
            if ep.dataset_to_index - ep.dataset_from_index != ep.length:
                raise SourceError(
                    f"{self.path('meta/episodes')}: episode {ep_idx} has length {ep.length} but "
                    f"index range [{ep.dataset_from_index}, {ep.dataset_to_index})"
                )
            episodes.append(ep)
        return episodes

    # ---------------------------------------------------------------- v2.1

    def _tasks_v21(self) -> list[str]:
        rows = self._read_jsonl("meta/tasks.jsonl")
        where = self.path("meta/tasks.jsonl")
        return _tasks_by_index([r["task_index"] for r in rows], [r["task"] for r in rows], where)

    def _episodes_v21(self) -> list[EpisodeInfo]:
        rows = sorted(self._read_jsonl("meta/episodes.jsonl"), key=lambda r: r["episode_index"])
        chunks_size = self.info.get("chunks_size", 1000)
        data_tpl = self.info["data_path"]
        video_tpl = self.info.get("video_path")
        episodes = []
        start = 0
        for row in rows:
            ep_idx, length = int(row["episode_index"]), int(row["length"])
            chunk = ep_idx // chunks_size
            videos = {
                key: VideoSpan(
                    video_tpl.format(episode_chunk=chunk, video_key=key, episode_index=ep_idx),
                    0.0,
                    length / self.fps,
                )
                for key in self.video_keys
            }
            episodes.append(
                EpisodeInfo(
                    episode_index=ep_idx,
                    length=length,
                    dataset_from_index=start,
                    dataset_to_index=start + length,
                    tasks=list(row.get("tasks", [])),
                    data_path=data_tpl.format(episode_chunk=chunk, episode_index=ep_idx),
                    videos=videos,
                )
            )
            start += length
        return episodes

    def _stats_v21(self) -> dict[str, Any] | None:
        if self.exists(STATS_FILE):
            return self._read_json(STATS_FILE)
        if not self.exists("meta/episodes_stats.jsonl"):
            return None
        per_episode = [r["stats"] for r in self._read_jsonl("meta/episodes_stats.jsonl")]
        return aggregate_stats(per_episode)


_VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp", "to_timestamp")


def _tasks_by_index(indices: list[int], tasks: list[str], where: str) -> list[str]:
    out: list[str | None] = [None] * len(indices)
    for i, task in zip(indices, tasks, strict=True):
        if not 0 <= i < len(out) or out[i] is not None:
            raise SourceError(f"{where}: task indices are not 0..{len(out) - 1}: {indices}")
        out[i] = task
    return out  # type: ignore[return-value]


def aggregate_stats(per_episode: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Whole-dataset stats from per-episode stats (v2.1 may ship only those): counts add,
    min/max reduce, means are count-weighted and variances pooled around the total mean."""
    out: dict[str, Any] = {}
    keys = [k for k in per_episode[0] if all(k in s for s in per_episode)] if per_episode else []
    for key in keys:
        stats = [s[key] for s in per_episode]
        if not all({"min", "max", "mean", "std", "count"} <= s.keys() for s in stats):
            continue
        counts = np.array([np.asarray(s["count"], dtype=np.float64).reshape(-1)[0] for s in stats])
        means = np.stack([np.asarray(s["mean"], dtype=np.float64) for s in stats])
        stds = np.stack([np.asarray(s["std"], dtype=np.float64) for s in stats])
        w = counts.reshape((-1,) + (1,) * (means.ndim - 1))
        total = counts.sum()
        mean = (means * w).sum(0) / total
        var = (w * (stds**2 + (means - mean) ** 2)).sum(0) / total
        out[key] = {
            "min": np.min(np.stack([np.asarray(s["min"]) for s in stats]), 0).tolist(),
            "max": np.max(np.stack([np.asarray(s["max"]) for s in stats]), 0).tolist(),
            "mean": mean.tolist(),
            "std": np.sqrt(var).tolist(),
            "count": [int(total)],
        }
    return out


def open_source(root: str, storage_options: dict | None = None) -> Source:
    """Open a LeRobot dataset at a local path or fsspec URL; SourceError if it is not one."""
    fs, fs_root = fsspec.core.url_to_fs(str(root), **(storage_options or {}))
    info_path = posixpath.join(fs_root.rstrip("/"), INFO_FILE)
    try:
        with fs.open(info_path, "rb") as f:
            info = json.load(f)
    except FileNotFoundError:
        raise SourceError(f"{root}: not a LeRobot dataset ({INFO_FILE} not found)") from None
    except ValueError as exc:
        raise SourceError(f"{root}: {INFO_FILE} is not valid JSON: {exc}") from exc
    if not isinstance(info, dict) or "codebase_version" not in info:
        raise SourceError(f"{root}: {INFO_FILE} has no codebase_version: not a LeRobot dataset")
    version = info["codebase_version"]
    if version not in SUPPORTED_VERSIONS:
        raise SourceError(
            f"{root}: unsupported LeRobot codebase_version {version!r} in {INFO_FILE} "
            f"(supported: {', '.join(SUPPORTED_VERSIONS)})"
        )
    for key in ("fps", "features", "data_path"):
        if key not in info:
            raise SourceError(f"{root}: {INFO_FILE} lacks {key!r}")
    return Source(str(root), fs, fs_root, info)
