"""The episode table and file layout of a LeRobot dataset (codebase v3.0 and v2.1).

``open_source(root)`` reads the metadata once (info.json, tasks, stats, the episode table) and
answers where each episode's rows and video frames are, on any fsspec filesystem. Nothing here
decodes video: this is what the converter needs to cut episodes out of the source files.
"""

from __future__ import annotations

import bisect
import itertools
import json
import posixpath
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.format import FormatError
from lerobot_shards.validate import check_features

SUPPORTED_VERSIONS = ("v3.0", "v2.1")
STORAGE_FORMATS = (None, "lerobot")
"""``storage_format`` values of LeRobot's own parquet layout (absent: the default). LeRobot's
main branch also reads ``"lance"``, rows stored as a Lance table, which this package does not."""
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
    tasks: list[str] | None
    """None where the episode table names none (the rows' task_index then say them)."""
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

    _ROW_GROUP_INDEXES = 16

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
        # Footers and row-group indexes of data files, so reading episode after episode from
        # one big v3.0 file reads its footer once (plain data: survives pickling).
        self._row_groups: OrderedDict[str, _RowGroupIndex] = OrderedDict()
        self._last_rows: tuple[str, set[int] | None, pa.Table, np.ndarray | None] | None = None
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

    def _read_parquet(
        self,
        full: str,
        columns: list[str] | None = None,
        what: str = "file",
        optional: Sequence[str] = (),
    ) -> pa.Table:
        """A whole (small, metadata) parquet file, by its full path on ``self.fs``; ``columns``
        must all be there (``what`` names the file in that error), and those of ``optional``
        that are there are read too.

        Through ``ParquetFile``, not ``pq.read_table``, whose dataset machinery imports pandas
        (a third of a second at every start of the converter and of each of its workers).
        """
        try:
            with self.fs.open(full, "rb") as f:
                pf = pq.ParquetFile(f)
                missing = [c for c in columns or () if c not in pf.schema_arrow.names]
                if missing:
                    raise SourceError(f"{full}: {what} lacks columns {missing}")
                if columns is not None:
                    columns = [*columns, *(c for c in optional if c in pf.schema_arrow.names)]
                return pf.read(columns=columns)
        except FileNotFoundError as exc:
            raise SourceError(f"{full}: file not found") from exc
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

    def read_rows(self, episode_index: int, *, then: Sequence[int] = ()) -> pa.Table:
        """The episode's rows with the source's exact Arrow schema.

        v3.0 reads only the row groups whose statistics can hold the episode (LeRobot writes one
        per episode). ``then`` names the episodes to be read next: those whose row groups follow
        on in the same file are read along (up to ``READ_AHEAD_BYTES`` uncompressed), so reading
        a file's episodes in order costs one read per many episodes, not one each. The row
        groups last read stay in memory, and where they are sorted by episode each episode's
        rows are found by binary search.
        """
        ep = self.episode(episode_index)
        where = f"{self.path(ep.data_path)} (episode {ep.episode_index})"
        try:
            table, sorted_episodes = self._read_row_groups(ep, then)
        except FileNotFoundError as exc:
            raise SourceError(f"{where}: data file not found") from exc
        except (pa.ArrowInvalid, OSError) as exc:
            raise SourceError(f"{where}: not a readable parquet file: {exc}") from exc
        if "episode_index" in table.column_names and self.codebase_version == "v3.0":
            if sorted_episodes is not None:
                lo, hi = np.searchsorted(sorted_episodes, [ep.episode_index, ep.episode_index + 1])
                table = table.slice(lo, hi - lo)
            table = table.filter(pc.equal(table.column("episode_index"), ep.episode_index))
        if table.num_rows != ep.length:
            raise SourceError(
                f"{where}: holds {table.num_rows} rows for the episode, "
                f"the episode table says {ep.length}"
            )
        return table

    def rows_held(self, episode_index: int) -> tuple[pa.Table, np.ndarray] | None:
        """The rows :meth:`read_rows` last read, and each row's episode, if they hold all of
        ``episode_index``'s rows (its read read them, or one just before it read ahead): work
        done once on them serves the many episodes a read holds. None if they do not."""
        ep = self.episode(episode_index)
        last = self._last_rows
        if last is None or last[0] != ep.data_path:
            return None
        if self.codebase_version == "v3.0":
            groups = self._row_group_index(ep.data_path).groups(ep.episode_index)
            if groups is None or last[1] is None or not last[1] >= set(groups):
                return None
        elif last[1] is not None:
            return None
        table = last[2]
        episodes = last[3]
        if episodes is None:
            if "episode_index" not in table.column_names:
                return None
            episodes = table.column("episode_index").to_numpy()
        return table, episodes

    def _read_row_groups(
        self, ep: EpisodeInfo, then: Sequence[int]
    ) -> tuple[pa.Table, np.ndarray | None]:
        """Row groups of ``ep``'s data file that hold it (v2.1: the whole file), and their
        episode_index column if it is sorted; from memory if the last ones read hold them."""
        groups = index = None
        if self.codebase_version == "v3.0":
            index = self._row_group_index(ep.data_path)
            groups = index.groups(ep.episode_index)
        last = self._last_rows
        if last is not None and last[0] == ep.data_path:
            held = last[1]
            if (held is None) if groups is None else (held is not None and held >= set(groups)):
                return last[2], last[3]
        read = groups
        if index is not None and groups and then:
            following = (self.episode(i) for i in then)
            read = index.ahead(
                groups,
                (index.groups(e.episode_index) for e in following if e.data_path == ep.data_path),
            )
        with self.open(ep.data_path, "rb") as f:
            pf = pq.ParquetFile(f, metadata=index.metadata if index else None)
            table = pf.read() if read is None else pf.read_row_groups(read)
        sorted_episodes = None
        if read is not None and "episode_index" in table.column_names:
            column = table.column("episode_index").to_numpy()
            if column.dtype.kind == "i" and bool(np.all(column[:-1] <= column[1:])):
                sorted_episodes = column
        if sorted_episodes is None and read != groups:
            # Not sorted: each episode would scan the whole read-ahead; read just its own.
            return self._read_row_groups(ep, ())
        self._last_rows = (
            ep.data_path,
            None if read is None else set(read),
            table,
            sorted_episodes,
        )
        return table, sorted_episodes

    def _row_group_index(self, relative: str) -> _RowGroupIndex:
        """The footer and row-group index of a data file, read once (the last few are kept)."""
        index = self._row_groups.get(relative)
        if index is None:
            with self.open(relative, "rb") as f:
                index = _RowGroupIndex(pq.ParquetFile(f).metadata)
            self._row_groups[relative] = index
            while len(self._row_groups) > self._ROW_GROUP_INDEXES:
                self._row_groups.popitem(last=False)
        self._row_groups.move_to_end(relative)
        return index

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_last_rows"] = None  # rows in memory are a cache, not worth pickling
        return state

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
        wanted = ["episode_index", "length", "dataset_from_index", "dataset_to_index"]
        wanted += ["data/chunk_index", "data/file_index"]
        for key in self.video_keys:
            wanted += [f"videos/{key}/{c}" for c in _VIDEO_COLUMNS]
        # Only the columns we need: the stats/... columns are most of the bytes. The files are
        # read concurrently (pyarrow reads without the GIL; an object store answers in parallel).
        with ThreadPoolExecutor(min(16, len(files))) as pool:
            # LeRobot's image-to-video conversion writes no tasks: the rows' task_index say them
            tables = list(
                pool.map(lambda f: self._read_parquet(f, wanted, "episode table", ["tasks"]), files)
            )
        table = pa.concat_tables(tables, promote_options="default").sort_by("episode_index")
        rows = table.to_pydict()
        no_tasks = [None] * table.num_rows
        data_tpl = self.info["data_path"]
        video_tpl = self.info.get("video_path")
        paths: dict[tuple, str] = {}  # episodes share files: format each path once

        def path(template: str, **fields: Any) -> str:
            key = (template, *fields.values())
            if key not in paths:
                paths[key] = template.format(**fields)
            return paths[key]

        episodes = []
        for i, ep_idx in enumerate(rows["episode_index"]):
            videos = {}
            for key in self.video_keys:
                col = f"videos/{key}/"
                videos[key] = VideoSpan(
                    path(
                        video_tpl,
                        video_key=key,
                        chunk_index=rows[col + "chunk_index"][i],
                        file_index=rows[col + "file_index"][i],
                    ),
                    rows[col + "from_timestamp"][i],
                    rows[col + "to_timestamp"][i],
                )
            ep = EpisodeInfo(
                episode_index=ep_idx,
                length=rows["length"][i],
                dataset_from_index=rows["dataset_from_index"][i],
                dataset_to_index=rows["dataset_to_index"][i],
                tasks=None if rows.get("tasks", no_tasks)[i] is None else list(rows["tasks"][i]),
                data_path=path(
                    data_tpl,
                    chunk_index=rows["data/chunk_index"][i],
                    file_index=rows["data/file_index"][i],
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
READ_AHEAD_BYTES = 64 << 20
"""Most uncompressed row-group bytes ``read_rows`` reads along for the episodes that follow."""


class _RowGroupIndex:
    """Which row groups of a v3.0 data file can hold an episode, from the min/max statistics
    of their episode_index column: found by binary search, so reading every episode of a file
    with a hundred thousand row groups does not scan them all for each."""

    def __init__(self, metadata: pq.FileMetaData) -> None:
        self.metadata = metadata
        # Parquet leaf columns, not Arrow fields: nested columns (images, vectors) add leaves.
        leaves = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
        self.indexed = "episode_index" in leaves
        self.unknown: list[int] = []  # row groups without statistics: they may hold anything
        bounds = []
        if self.indexed:
            col = leaves.index("episode_index")
            for g in range(metadata.num_row_groups):
                st = metadata.row_group(g).column(col).statistics
                if st is None or not st.has_min_max:
                    self.unknown.append(g)
                else:
                    bounds.append((st.min, st.max, g))
        bounds.sort()
        self.mins = [b[0] for b in bounds]
        self.maxs = [b[1] for b in bounds]
        self.ids = [b[2] for b in bounds]
        self.reach = list(itertools.accumulate(self.maxs, max))
        """Largest max among the row groups up to each (sorted by min): scanning back stops
        once it is below the episode."""

    def groups(self, episode_index: int) -> list[int] | None:
        """The row groups that can hold the episode, ascending; None: the file has no
        episode_index column (read all of it)."""
        if not self.indexed:
            return None
        found = list(self.unknown)
        k = bisect.bisect_right(self.mins, episode_index) - 1
        while k >= 0 and self.reach[k] >= episode_index:
            if self.maxs[k] >= episode_index:
                found.append(self.ids[k])
            k -= 1
        return sorted(found)

    def ahead(self, groups: list[int], following: Iterable[list[int] | None]) -> list[int]:
        """``groups`` and, while they go on contiguously and within ``READ_AHEAD_BYTES``, the
        row groups of the ``following`` episodes (``groups`` alone unless contiguous)."""
        if groups != list(range(groups[0], groups[-1] + 1)):
            return groups
        meta = self.metadata
        total = sum(meta.row_group(g).total_byte_size for g in groups)
        end = groups[-1] + 1
        for more in following:
            if not more or more[0] > end or more[-1] < end - 1:
                break
            if more != list(range(more[0], more[-1] + 1)):
                break
            extra = sum(meta.row_group(g).total_byte_size for g in range(end, more[-1] + 1))
            if total + extra > READ_AHEAD_BYTES:
                break
            total += extra
            end = max(end, more[-1] + 1)
        return list(range(groups[0], end))


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
    check_readable(info, f"{root}: {INFO_FILE}")
    return Source(str(root), fs, fs_root, info)


def check_readable(info: dict[str, Any], where: str) -> None:
    """Refuse, by name, what the reader cannot read, before anything is converted: rows stored
    other than as LeRobot's parquet files (``storage_format``), a feature of a type the reader
    does not know (the reader's own check of the features, ``validate.check_features``)."""
    storage = info.get("storage_format")
    if storage not in STORAGE_FORMATS:
        raise SourceError(
            f"{where}: storage_format {storage!r}: the rows are stored as {storage}, not as "
            "LeRobot's parquet files, which are all lerobot-shards converts (storage_format "
            "absent or 'lerobot')"
        )
    try:
        check_features(info["features"], where)
    except FormatError as exc:
        raise SourceError(str(exc)) from exc
