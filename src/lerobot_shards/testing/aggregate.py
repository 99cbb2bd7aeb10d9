"""Aggregated LeRobot datasets laid out as LeRobot 0.6.1's ``aggregate_datasets`` lays them out.

LeRobot merges recordings file by file, not episode by episode, so hundreds of episodes end up
in each file:

- videos: each source mp4 is copied in as a new destination file, or concatenated onto the
  current one (FFmpeg's concat demuxer, stream copy, ``movflags=faststart``) unless that would
  pass ``video_files_size_in_mb``; an episode's ``from_timestamp`` moves by where its source
  file starts in the destination file (the sum of the file durations before it).
- data: each source parquet goes through pandas with its rows renumbered (``episode_index``,
  ``index``, ``task_index``), then becomes a new file or is appended to the current one (read
  back, concatenated, rewritten with one row group per episode) unless the two files' sizes
  pass ``data_files_size_in_mb``. Through pandas, vector columns become ``list<float>`` and the
  schema carries pandas metadata instead of ``huggingface`` metadata, as in LeRobot's output.
- ``meta/episodes``: each source file renumbered (indices, data and video file indices,
  timestamps, the shifted index statistics) and appended the same way, one row group per file.
- tasks: every source's tasks, first use first; ``info.json`` and ``stats.json`` for the whole.

``make_aggregated_dataset`` records each part with ``make_dataset`` and merges the parts so.
Image datasets are not covered (LeRobot routes them through Hugging Face ``datasets``).
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lerobot_shards.testing import stats as st
from lerobot_shards.testing import video as vid
from lerobot_shards.testing.factory import (
    V30_DATA_PATH,
    V30_EPISODES_PATH,
    V30_VIDEO_PATH,
    _next_file,
    make_dataset,
    write_tasks_parquet,
)

MB = 1024**2
EPISODES_FILE_SIZE_IN_MB = 100  # LeRobot writes meta/episodes with its default limits
EPISODES_CHUNKS_SIZE = 1000


def make_aggregated_dataset(
    root: str | os.PathLike,
    parts: Sequence[Mapping[str, Any]],
    *,
    data_files_size_in_mb: float = 100,
    video_files_size_in_mb: float = 200,
    chunks_size: int = 1000,
) -> Path:
    """Record each part with ``make_dataset(**part)`` (v3.0), then aggregate them at ``root``.

    A part that gives no ``seed`` gets its position, so parts show different frames. Within a
    part, frame content follows the part's own episode numbers (``frame_content(episode - first
    episode of the part, ...)``).
    """
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root}: refusing to write a dataset into a non-empty path")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root.parent, prefix=f".{root.name}-parts-") as scratch:
        sources = [
            make_dataset(Path(scratch) / f"part-{i}", **{"seed": i, **part})
            for i, part in enumerate(parts)
        ]
        aggregate(
            sources,
            root,
            data_files_size_in_mb=data_files_size_in_mb,
            video_files_size_in_mb=video_files_size_in_mb,
            chunks_size=chunks_size,
        )
    return root


def aggregate(
    sources: Sequence[Path],
    root: Path,
    *,
    data_files_size_in_mb: float = 100,
    video_files_size_in_mb: float = 200,
    chunks_size: int = 1000,
) -> Path:
    """Merge the v3.0 datasets ``sources`` (same fps and features) into ``root``."""
    infos = [json.loads((Path(s) / "meta/info.json").read_text()) for s in sources]
    for src, info in zip(sources, infos, strict=True):
        if info["fps"] != infos[0]["fps"] or list(info["features"]) != list(infos[0]["features"]):
            raise ValueError(f"{src}: fps or features differ from {sources[0]}")
        if any(f["dtype"] == "image" for f in info["features"].values()):
            raise ValueError(f"{src}: image datasets are not covered")
    video_keys = [k for k, f in infos[0]["features"].items() if f["dtype"] == "video"]
    tasks: dict[str, int] = {}
    for src in sources:
        for task in _tasks(Path(src)):
            tasks.setdefault(task, len(tasks))
    state = _State(root, video_keys, data_files_size_in_mb, video_files_size_in_mb, chunks_size)
    for src in sources:
        state.add(Path(src), tasks)
    _finish(root, sources, infos, tasks, state, data_files_size_in_mb, video_files_size_in_mb)
    return root


def _tasks(root: Path) -> list[str]:
    table = pq.read_table(root / "meta/tasks.parquet")
    order = np.argsort(table.column("task_index").to_numpy())
    return [table.column("task").to_pylist()[i] for i in order]


class _State:
    """Where the next file of each kind goes, and the totals so far."""

    def __init__(
        self, root: Path, video_keys: list[str], data_mb: float, video_mb: float, chunks: int
    ) -> None:
        self.root, self.video_keys = root, video_keys
        self.data_mb, self.video_mb, self.chunks = data_mb, video_mb, chunks
        self.data = (0, 0)
        self.meta = (0, 0)
        self.videos = {key: (0, 0) for key in video_keys}
        self.durations: dict[tuple[str, tuple[int, int]], float] = {}
        self.episodes = self.frames = 0

    def add(self, src: Path, tasks: Mapping[str, int]) -> None:
        """One source dataset: its videos, its data, then its episodes metadata."""
        episodes = pa.concat_tables(
            pq.read_table(p) for p in sorted(src.glob("meta/episodes/chunk-*/file-*.parquet"))
        )
        video_maps = {key: self._videos(src, key, episodes) for key in self.video_keys}
        data_map = self._data(src, episodes, tasks)
        self._meta(src, episodes, tasks, data_map, video_maps)
        self.episodes += episodes.num_rows
        self.frames += int(pc.sum(episodes.column("length")).as_py())

    # ------------------------------------------------------------------ videos

    def _videos(
        self, src: Path, key: str, episodes: pa.Table
    ) -> dict[tuple[int, int], tuple[tuple[int, int], float]]:
        """Copy or concatenate the source's files of camera ``key``; for each source file, its
        destination file and the offset (seconds) at which it starts there."""
        chunk, file = self.videos[key]
        out = {}
        for src_file in _pairs(episodes, f"videos/{key}/"):
            src_path = src / _video_path(key, src_file)
            dst_path = self.root / _video_path(key, (chunk, file))
            duration = vid.duration_s(src_path)  # LeRobot's get_video_duration_in_s
            if not dst_path.exists():
                dst_path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src_path, dst_path)
                out[src_file] = ((chunk, file), 0.0)
                self.durations[key, (chunk, file)] = duration
                continue
            src_mb = src_path.stat().st_size / MB
            if dst_path.stat().st_size / MB + src_mb >= self.video_mb:
                chunk, file = _next_file(chunk, file, self.chunks)
                dst_path = self.root / _video_path(key, (chunk, file))
                dst_path.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(src_path, dst_path)
                out[src_file] = ((chunk, file), 0.0)
                self.durations[key, (chunk, file)] = duration
            else:
                offset = self.durations.get((key, (chunk, file)), 0.0)
                vid.concatenate([dst_path, src_path], dst_path)
                out[src_file] = ((chunk, file), offset)
                self.durations[key, (chunk, file)] = offset + duration
        self.videos[key] = (chunk, file)
        return out

    # ------------------------------------------------------------------ data

    def _data(
        self, src: Path, episodes: pa.Table, tasks: Mapping[str, int]
    ) -> dict[tuple[int, int], tuple[int, int]]:
        """Renumber and append the source's data files; for each, its destination file."""
        src_tasks = _tasks(src)
        remap = np.array([tasks[t] for t in src_tasks], dtype=np.int64)
        out = {}
        for src_file in _pairs(episodes, "data/"):
            src_path = src / V30_DATA_PATH.format(chunk_index=src_file[0], file_index=src_file[1])
            df = pq.read_table(src_path).to_pandas()
            df["episode_index"] = df["episode_index"] + self.episodes
            df["index"] = df["index"] + self.frames
            df["task_index"] = remap[df["task_index"].to_numpy()]
            self.data = _append_parquet(
                df, src_path, self.root, V30_DATA_PATH, self.data, self.data_mb, self.chunks, True
            )
            out[src_file] = self.data
        return out

    # ------------------------------------------------------------------ meta/episodes

    def _meta(
        self,
        src: Path,
        episodes: pa.Table,
        tasks: Mapping[str, int],
        data_map: Mapping[tuple[int, int], tuple[int, int]],
        video_maps: Mapping[str, Mapping[tuple[int, int], tuple[tuple[int, int], float]]],
    ) -> None:
        for meta_file in _pairs(episodes, "meta/episodes/"):
            path = src / V30_EPISODES_PATH.format(chunk_index=meta_file[0], file_index=meta_file[1])
            df = pq.read_table(path).to_pandas()
            df["meta/episodes/chunk_index"] += self.meta[0]
            df["meta/episodes/file_index"] += self.meta[1]
            files = zip(df["data/chunk_index"], df["data/file_index"], strict=True)
            data = [data_map[(c, f)] for c, f in files]
            df["data/chunk_index"] = [c for c, _ in data]
            df["data/file_index"] = [f for _, f in data]
            for key, video_map in video_maps.items():
                col = f"videos/{key}/"
                files = zip(df[col + "chunk_index"], df[col + "file_index"], strict=True)
                moved = [video_map[(c, f)] for c, f in files]
                df[col + "chunk_index"] = [dst[0] for dst, _ in moved]
                df[col + "file_index"] = [dst[1] for dst, _ in moved]
                offsets = np.array([offset for _, offset in moved])
                df[col + "from_timestamp"] = df[col + "from_timestamp"] + offsets
                df[col + "to_timestamp"] = df[col + "to_timestamp"] + offsets
            df["dataset_from_index"] += self.frames
            df["dataset_to_index"] += self.frames
            df["episode_index"] += self.episodes
            _shift_index_stats(df, self.episodes, self.frames, tasks)
            self.meta = _append_parquet(
                df,
                path,
                self.root,
                V30_EPISODES_PATH,
                self.meta,
                EPISODES_FILE_SIZE_IN_MB,
                EPISODES_CHUNKS_SIZE,
                False,
            )


def _pairs(episodes: pa.Table, prefix: str) -> list[tuple[int, int]]:
    """The (chunk, file) pairs the episodes use under ``prefix``, sorted."""
    chunks = episodes.column(prefix + "chunk_index").to_pylist()
    files = episodes.column(prefix + "file_index").to_pylist()
    return sorted(set(zip(chunks, files, strict=True)))


def _video_path(key: str, chunk_file: tuple[int, int]) -> str:
    return V30_VIDEO_PATH.format(video_key=key, chunk_index=chunk_file[0], file_index=chunk_file[1])


def _shift_index_stats(df: Any, episodes: int, frames: int, tasks: Mapping[str, int]) -> None:
    """Per-episode statistics of the renumbered columns, renumbered with them."""
    for name, offset in (("episode_index", episodes), ("index", frames)):
        for stat in ("min", "max", "mean", "q01", "q10", "q50", "q90", "q99"):
            col = f"stats/{name}/{stat}"
            if col in df.columns:
                df[col] = df[col] + offset
    quantiles = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
    ids = [np.array([tasks[t] for t in row], dtype=np.float64) for row in df["tasks"]]
    reduce = {"min": np.min, "max": np.max, "std": np.std, "mean": np.mean}
    for stat in ("min", "max", "mean", "std", *quantiles):
        col = f"stats/task_index/{stat}"
        if col in df.columns:
            values = [
                np.quantile(i, quantiles[stat]) if stat in quantiles else reduce[stat](i)
                for i in ids
            ]
            df[col] = [np.full_like(orig, v) for orig, v in zip(df[col], values, strict=True)]


def _parquet_mb(path: Path) -> float:
    """LeRobot's size of a parquet file: its columns' uncompressed bytes."""
    meta = pq.read_metadata(path)
    return (
        sum(
            meta.row_group(g).column(c).total_uncompressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.row_group(g).num_columns)
        )
        / MB
    )


def _append_parquet(
    df: Any,
    src_path: Path,
    root: Path,
    template: str,
    at: tuple[int, int],
    max_mb: float,
    chunks: int,
    one_row_group_per_episode: bool,
) -> tuple[int, int]:
    """LeRobot's ``append_or_create_parquet_file``: returns the file the rows went to."""
    import pandas as pd

    dst = root / template.format(chunk_index=at[0], file_index=at[1])
    if dst.exists():
        if _parquet_mb(dst) + _parquet_mb(src_path) >= max_mb:
            at = _next_file(*at, chunks)
            dst = root / template.format(chunk_index=at[0], file_index=at[1])
        else:
            df = pd.concat([pq.read_table(dst).to_pandas(), df], ignore_index=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not one_row_group_per_episode:
        df.to_parquet(dst)
        return at
    table = pa.Table.from_pandas(df, preserve_index=False)
    episode = table.column("episode_index").to_numpy()
    starts = [0, *(np.nonzero(np.diff(episode))[0] + 1).tolist(), len(episode)]
    with pq.ParquetWriter(dst, table.schema, compression="snappy", use_dictionary=True) as writer:
        for start, stop in itertools.pairwise(starts):
            writer.write_table(table.slice(start, stop - start))
    return at


def _finish(
    root: Path,
    sources: Sequence[Path],
    infos: Sequence[dict[str, Any]],
    tasks: Mapping[str, int],
    state: _State,
    data_mb: float,
    video_mb: float,
) -> None:
    """meta/tasks.parquet, meta/info.json and meta/stats.json of the whole."""
    write_tasks_parquet(root, tasks)
    info = dict(infos[0])
    info.update(
        total_episodes=state.episodes,
        total_frames=state.frames,
        total_tasks=len(tasks),
        chunks_size=state.chunks,
        data_files_size_in_mb=data_mb,
        video_files_size_in_mb=video_mb,
        splits={"train": f"0:{state.episodes}"},
    )
    (root / "meta/info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
    total: dict[str, st.Stats] | None = None
    for src in sources:
        raw = json.loads((Path(src) / "meta/stats.json").read_text())
        stats = {k: {n: np.asarray(v) for n, v in feature.items()} for k, feature in raw.items()}
        total = stats if total is None else {k: st.aggregate(total[k], stats[k]) for k in total}
    (root / "meta/stats.json").write_text(
        json.dumps({k: st.to_lists(v) for k, v in (total or {}).items()}, indent=4)
    )
