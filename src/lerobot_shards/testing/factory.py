"""Write LeRobot datasets (v3.0 or v2.1) exactly in LeRobot 0.6.1's layout, with no network.

Tests, benchmarks and the demo need LeRobot data of any shape without downloading it or
installing lerobot. ``make_dataset`` writes it with pyarrow and PyAV following the recorder's own
rules (``LeRobotDataset.save_episode`` then ``finalize``):

- v3.0: rows appended to ``data/chunk-XXX/file-XXX.parquet`` as one row group per episode, a new
  file once the current one would pass ``data_files_size_in_mb`` (LeRobot's estimate: current size
  plus average bytes per row times the new episode's rows); each camera's episode encoded on its
  own, then moved in as a new ``videos/<camera>/chunk-XXX/file-XXX.mp4`` when current size plus
  episode size reaches ``video_files_size_in_mb``, else appended by stream copy; a new chunk
  folder after ``chunks_size`` files; ``from_timestamp``/``to_timestamp`` accumulated as float
  sums of the episode durations, as LeRobot does; ``meta/episodes`` with every column LeRobot
  writes (buffered ten episodes per row group), ``meta/tasks.parquet`` with pandas index
  metadata, ``meta/info.json`` and ``meta/stats.json``.
- v2.1: one parquet and one mp4 per camera per episode, ``meta/episodes.jsonl``,
  ``meta/tasks.jsonl``, ``meta/episodes_stats.jsonl`` and ``meta/info.json``.

Two options go beyond what LeRobot writes, for datasets from other recorders: ``encoder`` (say a
long GOP with B-frames) and ``continuous_video`` (v3.0: each camera one recording of every
episode back to back, so episodes start mid-GOP).

Frame content and tabular values are pure functions of the indices (see ``content``), so the
same arguments give the same items in both versions.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from lerobot_shards.testing import stats as st
from lerobot_shards.testing import video as vid
from lerobot_shards.testing.content import CONTENTS, action_value, frame_content, state_value

DEFAULT_CAMERAS: dict[str, tuple[int, int]] = {
    "observation.images.cam_high": (40, 56),
    "observation.images.cam_left_wrist": (24, 32),
}
DEFAULT_EPISODE_LENGTHS = (12, 1, 30, 9, 17, 5)
# Small enough that the default dataset spreads over several files, with data and video files
# (and the two cameras) rolling over at different episodes.
DEFAULT_DATA_FILES_SIZE_IN_MB = 0.006
DEFAULT_VIDEO_FILES_SIZE_IN_MB = 0.004
TASK_NAMES = ("stack the blocks", "push the T", "fold the towel", "open the lid")
_TASK_PATTERN = (0, 1, 0, 2, 1, 3)  # the golden recording's: one task shared by episodes 0 and 2
ROBOT_TYPE = "factory_arm"
JOINTS = ["j0", "j1", "j2", "j3"]
METADATA_BUFFER_SIZE = 10  # episodes per row group of meta/episodes, as LeRobot buffers them
MB = 1024**2

V30_DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V30_VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
V30_EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def default_tasks(num_episodes: int) -> list[str]:
    """Task per episode: the golden pattern, repeated (several tasks, one shared by two)."""
    return [TASK_NAMES[_TASK_PATTERN[i % len(_TASK_PATTERN)]] for i in range(num_episodes)]


def make_dataset(
    root: str | os.PathLike,
    *,
    version: str = "v3.0",
    episode_lengths: Sequence[int] = DEFAULT_EPISODE_LENGTHS,
    cameras: Mapping[str, tuple[int, int]] = DEFAULT_CAMERAS,
    video: bool = True,
    fps: int = 10,
    tasks: Sequence[str] | None = None,
    data_files_size_in_mb: float = DEFAULT_DATA_FILES_SIZE_IN_MB,
    video_files_size_in_mb: float = DEFAULT_VIDEO_FILES_SIZE_IN_MB,
    chunks_size: int = 1000,
    content: str = "blocks",
    seed: int = 0,
    video_variants: int | None = None,
    encoder: vid.Encoder = vid.LEROBOT,
    continuous_video: bool = False,
    state_names: Sequence[str] = JOINTS,
    action_names: Sequence[str] = JOINTS,
    robot_type: str = ROBOT_TYPE,
) -> Path:
    """Write a LeRobot dataset at ``root`` (which must not exist or be empty) and return its path.

    ``cameras`` maps feature keys to (height, width); ``video=False`` stores them as PNG images in
    the parquet instead. ``tasks`` gives one task string per episode. Frames are
    ``frame_content(episode, frame, height, width, content, seed)``; ``observation.state`` is
    ``state_value(episode, frame, dims)`` and ``action`` is ``action_value(episode, frame,
    dims)`` (the state minus 0.25), ``dims`` the length of ``state_names`` and
    ``action_names`` (the features' ``names``; 4 joints by default). ``robot_type`` goes into
    ``info.json``: robots of other shapes for mixtures across embodiments.

    ``video_variants=k`` (v3.0; for benchmarks, where encoding hundreds of long episodes would
    take hours): episodes of equal length and equal ``episode % k`` share one encoding per
    camera, showing the frames of the first of them (and their statistics say so). Sizes and
    decoding costs stay those of distinct recordings; frames no longer follow ``episode``.

    ``encoder`` sets codec, GOP and options (LeRobot's by default). ``continuous_video=True``
    (v3.0) records each camera as one continuous video, every episode's frames encoded back to
    back by one encoder into ``file-000.mp4``, ``from_timestamp`` the running float sum of the
    episodes' durations: with a GOP longer than an episode, most episodes start mid-GOP and
    end inside one, which LeRobot's per-episode encoding never does.
    """
    root = Path(root)
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise FileExistsError(f"{root}: refusing to write a dataset into a non-empty path")
    if version not in ("v3.0", "v2.1"):
        raise ValueError(f"unknown LeRobot version {version!r}; expected v3.0 or v2.1")
    if video_variants is not None and (video_variants < 1 or version != "v3.0"):
        raise ValueError(f"video_variants must be a positive int with v3.0, got {video_variants}")
    if continuous_video and (version != "v3.0" or not video or video_variants is not None):
        raise ValueError("continuous_video needs v3.0 video, without video_variants")
    if content not in CONTENTS:
        raise ValueError(f"unknown frame content {content!r}; expected one of {CONTENTS}")
    lengths = [int(n) for n in episode_lengths]
    if not lengths or min(lengths) < 1:
        raise ValueError(f"episode_lengths must be non-empty and positive, got {lengths}")
    sizes = {key: (int(h), int(w)) for key, (h, w) in cameras.items()}
    for key, (h, w) in sizes.items():
        if video and (h < 8 or w < 8 or h % 2 or w % 2):
            raise ValueError(f"camera {key}: video needs even sizes of at least 8, got {h}x{w}")
    tasks = list(tasks) if tasks is not None else default_tasks(len(lengths))
    if len(tasks) != len(lengths):
        raise ValueError(f"{len(tasks)} tasks given for {len(lengths)} episodes")
    task_index: dict[str, int] = {}
    for task in tasks:
        task_index.setdefault(task, len(task_index))  # numbered in order of first use
    spec = _Spec(
        root=root,
        version=version,
        lengths=lengths,
        starts=[0, *np.cumsum(lengths).tolist()],
        cameras=sizes,
        video=bool(video),
        fps=int(fps),
        tasks=tasks,
        task_index=task_index,
        data_mb=float(data_files_size_in_mb),
        video_mb=float(video_files_size_in_mb),
        chunks_size=int(chunks_size),
        content=content,
        seed=int(seed),
        video_variants=video_variants,
        encoder=encoder,
        continuous_video=bool(continuous_video),
        state_names=[str(n) for n in state_names],
        action_names=[str(n) for n in action_names],
        robot_type=str(robot_type),
    )
    if not spec.state_names or not spec.action_names:
        raise ValueError("state_names and action_names need at least one name each")
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".factory-") as scratch:
        if version == "v3.0":
            _write_v30(spec, Path(scratch))
        else:
            _write_v21(spec)
    return root


@dataclass(frozen=True)
class _Spec:
    """Validated arguments plus what follows from them."""

    root: Path
    version: str
    lengths: list[int]
    starts: list[int]
    """Global index of each episode's first frame, then the total frame count."""
    cameras: dict[str, tuple[int, int]]
    video: bool
    fps: int
    tasks: list[str]
    """Task of each episode."""
    task_index: dict[str, int]
    data_mb: float
    video_mb: float
    chunks_size: int
    content: str
    seed: int
    video_variants: int | None
    encoder: vid.Encoder
    continuous_video: bool
    state_names: list[str]
    action_names: list[str]
    robot_type: str

    def frames(self, episode: int, camera: str, sampler: st.Sampler) -> Iterator[np.ndarray]:
        """The camera's frames for this episode, showing each to ``sampler`` for statistics."""
        height, width = self.cameras[camera]
        for frame in range(self.lengths[episode]):
            image = frame_content(episode, frame, height, width, self.content, self.seed)
            sampler.see(frame, image)
            yield image


# ----------------------------------------------------------------------------- features, rows


def _features(spec: _Spec) -> dict[str, dict]:
    """info.json ``features`` in LeRobot's order: cameras, state, action, then the index columns."""
    features: dict[str, dict] = {}
    for key, (h, w) in spec.cameras.items():
        features[key] = {
            "dtype": "video" if spec.video else "image",
            "shape": [h, w, 3],
            "names": ["height", "width", "channels"],
        }
    for key, names in (("observation.state", spec.state_names), ("action", spec.action_names)):
        features[key] = {"dtype": "float32", "shape": [len(names)], "names": list(names)}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for key in ("frame_index", "episode_index", "index", "task_index"):
        features[key] = {"dtype": "int64", "shape": [1], "names": None}
    return features


def _row_schema(spec: _Spec, fingerprint: str) -> pa.Schema:
    """Arrow schema of the data parquet with the ``huggingface`` metadata ``datasets`` writes."""
    list_type = "List" if spec.version == "v3.0" else "Sequence"  # datasets 4 vs 3
    fields, hf = [], {}
    for key, ft in _features(spec).items():
        if ft["dtype"] == "video":
            continue
        if ft["dtype"] == "image":
            fields.append(pa.field(key, pa.struct([("bytes", pa.binary()), ("path", pa.string())])))
            hf[key] = {"_type": "Image"}
        elif ft["shape"] == [1]:
            fields.append(pa.field(key, pa.from_numpy_dtype(np.dtype(ft["dtype"]))))
            hf[key] = {"dtype": ft["dtype"], "_type": "Value"}
        else:
            fields.append(pa.field(key, pa.list_(pa.float32(), ft["shape"][0])))
            value = {"dtype": ft["dtype"], "_type": "Value"}
            hf[key] = {"feature": value, "length": ft["shape"][0], "_type": list_type}
    meta = {"info": {"features": hf}, "fingerprint": fingerprint}
    return pa.schema(fields, metadata={"huggingface": json.dumps(meta)})


def _png(image: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="png", compress_level=6)  # LeRobot's image level
    return buf.getvalue()


def _rows(
    spec: _Spec, episode: int, schema: pa.Schema, samplers: Mapping[str, st.Sampler]
) -> pa.Table:
    """The episode's rows: images (if any), state, action, timestamp and the index columns."""
    n = spec.lengths[episode]
    frames = np.arange(n)
    columns: dict[str, Any] = {}
    if not spec.video:
        for key in spec.cameras:
            columns[key] = [
                {"bytes": _png(image), "path": f"frame-{i:06d}.png"}
                for i, image in enumerate(spec.frames(episode, key, samplers[key]))
            ]
    state_dims, action_dims = len(spec.state_names), len(spec.action_names)
    state = np.stack([state_value(episode, f, state_dims) for f in frames])
    action = np.stack([action_value(episode, f, action_dims) for f in frames])
    columns["observation.state"] = pa.FixedSizeListArray.from_arrays(
        pa.array(state.ravel()), state_dims
    )
    columns["action"] = pa.FixedSizeListArray.from_arrays(pa.array(action.ravel()), action_dims)
    columns["timestamp"] = np.array([f / spec.fps for f in frames], dtype=np.float32)
    columns["frame_index"] = frames.astype(np.int64)
    columns["episode_index"] = np.full(n, episode, dtype=np.int64)
    start = spec.starts[episode]
    columns["index"] = np.arange(start, start + n, dtype=np.int64)
    columns["task_index"] = np.full(n, spec.task_index[spec.tasks[episode]], dtype=np.int64)
    return pa.table([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def _episode_stats(
    spec: _Spec, rows: pa.Table, samplers: Mapping[str, st.Sampler]
) -> dict[str, st.Stats]:
    """Per-feature statistics of one episode, in feature order (v2.1 keeps no quantiles)."""
    quantiles = spec.version == "v3.0"
    out: dict[str, st.Stats] = {}
    for key, ft in _features(spec).items():
        if ft["dtype"] in ("video", "image"):
            out[key] = st.image_stats(samplers[key].kept, quantiles)
        else:
            column = rows.column(key).combine_chunks()
            values = (
                np.asarray(column.flatten()).reshape(len(rows), -1)
                if pa.types.is_fixed_size_list(column.type)
                else np.asarray(column)
            )
            out[key] = st.feature_stats(values, quantiles)
    return out


def _fingerprint(spec: _Spec, name: str) -> str:
    return hashlib.sha256(f"{spec.seed}:{name}".encode()).hexdigest()[:16]


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=4, ensure_ascii=False)


def _write_jsonl(path: Path, rows: Sequence[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


def _probe_video(path: Path) -> dict[str, Any]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return {
            "video.height": stream.height,
            "video.width": stream.width,
            "video.codec": stream.codec_context.codec.canonical_name,
            "video.pix_fmt": stream.codec_context.pix_fmt,
            "video.fps": int(stream.base_rate),
            "video.channels": 3,
            "has_audio": len(container.streams.audio) > 0,
        }


def _next_file(chunk: int, file: int, chunks_size: int) -> tuple[int, int]:
    """LeRobot's ``update_chunk_file_indices``: a new chunk folder after ``chunks_size`` files."""
    return (chunk + 1, 0) if file == chunks_size - 1 else (chunk, file + 1)


# ----------------------------------------------------------------------------- v3.0


class _DataFiles:
    """data/chunk-XXX/file-XXX.parquet: one row group per episode, size-based rollover."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        self.writer: pq.ParquetWriter | None = None
        self.chunk = self.file = 0
        self.file_start = 0

    def path(self) -> Path:
        return self.spec.root / V30_DATA_PATH.format(chunk_index=self.chunk, file_index=self.file)

    def write(self, episode: int, rows: pa.Table) -> dict[str, int]:
        spec = self.spec
        start, n = spec.starts[episode], spec.lengths[episode]
        if self.writer is not None:
            size = os.path.getsize(self.path()) / MB
            in_file = start - self.file_start
            per_row = size / in_file if in_file > 0 else 0.0
            if size + per_row * n >= spec.data_mb:
                self.close()
                self.chunk, self.file = _next_file(self.chunk, self.file, spec.chunks_size)
                self.file_start = start
        if self.writer is None:
            self.path().parent.mkdir(parents=True, exist_ok=True)
            fingerprint = _fingerprint(spec, f"data/{self.chunk}/{self.file}")
            schema = _row_schema(spec, fingerprint)
            self.writer = pq.ParquetWriter(self.path(), schema, compression="snappy")
        self.writer.write_table(rows.replace_schema_metadata(self.writer.schema.metadata))
        return {
            "data/chunk_index": self.chunk,
            "data/file_index": self.file,
            "dataset_from_index": start,
            "dataset_to_index": start + n,
        }

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class _VideoFiles:
    """videos/<camera>/chunk-XXX/file-XXX.mp4: episodes appended by stream copy, size rollover.

    Appended episodes wait in ``pending`` and go into the file in one pass when it is closed or
    its exact size is needed (the same file: each input starts where the one before ends):
    rewriting the file for every episode, as LeRobot does, made a dataset of thousands of
    episodes take hours. The file's size is at most its size on disk
    plus the pending episodes' files (which each carry their own headers), so whenever that
    bound is under the limit LeRobot's rollover rule cannot fire, and near it the file is
    written and measured.
    """

    def __init__(self, spec: _Spec, key: str) -> None:
        self.spec, self.key = spec, key
        self.chunk = self.file = 0
        self.to_timestamp: float | None = None  # None until the first episode is in
        self.pending: list[Path] = []
        self.pending_bytes = 0

    def path(self) -> Path:
        return self.spec.root / V30_VIDEO_PATH.format(
            video_key=self.key, chunk_index=self.chunk, file_index=self.file
        )

    def add(self, episode_mp4: Path) -> dict[str, Any]:
        duration = vid.duration_s(episode_mp4)
        nbytes = os.path.getsize(episode_mp4)
        size = nbytes / MB
        if self.to_timestamp is not None:
            bound = (os.path.getsize(self.path()) + self.pending_bytes) / MB
            if bound + size >= self.spec.video_mb:
                self.flush()
        if self.to_timestamp is None:
            start = 0.0
            self.path().parent.mkdir(parents=True, exist_ok=True)
            shutil.move(episode_mp4, self.path())
        elif os.path.getsize(self.path()) / MB + size >= self.spec.video_mb:
            start = 0.0
            self.chunk, self.file = _next_file(self.chunk, self.file, self.spec.chunks_size)
            self.path().parent.mkdir(parents=True, exist_ok=True)
            shutil.move(episode_mp4, self.path())
        else:
            start = self.to_timestamp
            self.pending.append(episode_mp4)
            self.pending_bytes += nbytes
        self.to_timestamp = start + duration  # LeRobot's accumulated float sum
        prefix = f"videos/{self.key}"
        return {
            f"{prefix}/chunk_index": self.chunk,
            f"{prefix}/file_index": self.file,
            f"{prefix}/from_timestamp": start,
            f"{prefix}/to_timestamp": self.to_timestamp,
        }

    def flush(self) -> None:
        """Write the pending episodes into the current file."""
        if self.pending:
            vid.concatenate([self.path(), *self.pending], self.path())
            for episode_mp4 in self.pending:
                episode_mp4.unlink()
        self.pending, self.pending_bytes = [], 0


class _Recording:
    """videos/<camera>/chunk-000/file-000.mp4 as one continuous recording (``continuous_video``):
    one encoder writes every episode's frames back to back, so GOPs run across episodes."""

    def __init__(self, spec: _Spec, key: str, stack: ExitStack) -> None:
        self.key = key
        path = spec.root / V30_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.recorder = stack.enter_context(vid.Recorder(path, spec.fps, spec.encoder))
        self.fps = spec.fps
        self.to_timestamp = 0.0

    def add(self, frames: Iterator[np.ndarray], length: int) -> dict[str, Any]:
        start = self.to_timestamp
        self.recorder.write(frames)
        self.to_timestamp = start + length / self.fps  # a float sum, as LeRobot keeps it
        prefix = f"videos/{self.key}"
        return {
            f"{prefix}/chunk_index": 0,
            f"{prefix}/file_index": 0,
            f"{prefix}/from_timestamp": start,
            f"{prefix}/to_timestamp": self.to_timestamp,
        }


class _EpisodeFiles:
    """meta/episodes/chunk-XXX/file-XXX.parquet, buffered and rolled over as LeRobot does."""

    def __init__(self, spec: _Spec) -> None:
        self.spec = spec
        self.buffer: list[dict[str, Any]] = []
        self.writer: pq.ParquetWriter | None = None
        self.writer_path: Path | None = None
        self.latest: dict[str, Any] | None = None

    def add(self, record: dict[str, Any]) -> None:
        if self.latest is None:
            chunk, file = 0, 0
        else:
            chunk = self.latest["meta/episodes/chunk_index"]
            file = self.latest["meta/episodes/file_index"]
            path = self.spec.root / V30_EPISODES_PATH.format(chunk_index=chunk, file_index=file)
            if path.exists():
                size = os.path.getsize(path) / MB
                # LeRobot divides by the latest episode *index* here, not by a row count.
                latest_index = self.latest["episode_index"]
                per_episode = size / latest_index if latest_index > 0 else 0.0
                if size + per_episode * record["length"] >= self.spec.data_mb:
                    self.flush()
                    chunk, file = _next_file(chunk, file, self.spec.chunks_size)
                    self.close()
        record["meta/episodes/chunk_index"] = chunk
        record["meta/episodes/file_index"] = file
        self.buffer.append(record)
        self.latest = record
        if len(self.buffer) >= METADATA_BUFFER_SIZE:
            self.flush()

    def flush(self) -> None:
        if not self.buffer:
            return
        table = pa.Table.from_pylist(self.buffer)
        if self.writer is None:
            first = self.buffer[0]
            self.writer_path = self.spec.root / V30_EPISODES_PATH.format(
                chunk_index=first["meta/episodes/chunk_index"],
                file_index=first["meta/episodes/file_index"],
            )
            self.writer_path.parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.writer_path, table.schema, compression="snappy")
        self.writer.write_table(table)
        self.buffer.clear()

    def close(self) -> None:
        self.flush()
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _flat_stats(stats: Mapping[str, st.Stats]) -> dict[str, list]:
    return {
        f"stats/{key}/{name}": value
        for key, feature in stats.items()
        for name, value in st.to_lists(feature).items()
    }


def _samplers(spec: _Spec, episode: int) -> dict[str, st.Sampler]:
    return {key: st.Sampler(spec.lengths[episode]) for key in spec.cameras}


class _Encodings:
    """Each episode's camera video, encoded, or with ``video_variants`` copied from an earlier
    episode of the same length and variant (with what that one's sampler kept for statistics)."""

    def __init__(self, spec: _Spec, scratch: Path) -> None:
        self.spec, self.scratch = spec, scratch
        self.made: dict[tuple[str, int, int], tuple[Path, st.Sampler]] = {}

    def write(self, episode: int, camera: str, sampler: st.Sampler, dest: Path) -> None:
        spec = self.spec
        if spec.video_variants is None:
            vid.encode_episode(spec.frames(episode, camera, sampler), dest, spec.fps, spec.encoder)
            return
        variant = (camera, spec.lengths[episode], episode % spec.video_variants)
        if variant in self.made:
            path, first = self.made[variant]
            sampler.kept = list(first.kept)  # equal lengths: the same frames picked
            shutil.copyfile(path, dest)
            return
        vid.encode_episode(spec.frames(episode, camera, sampler), dest, spec.fps, spec.encoder)
        kept = self.scratch / f"variant-{len(self.made)}.mp4"
        shutil.copyfile(dest, kept)
        self.made[variant] = (kept, sampler)


def _write_v30(spec: _Spec, scratch: Path) -> None:
    with ExitStack() as stack:  # continuous recordings are finished when it closes
        recordings = {
            key: _Recording(spec, key, stack) for key in spec.cameras if spec.continuous_video
        }
        total = _write_v30_episodes(spec, scratch, recordings)
    _write_v30_meta(spec, total)


def _write_v30_episodes(
    spec: _Spec, scratch: Path, recordings: Mapping[str, _Recording]
) -> dict[str, st.Stats]:
    """Rows, videos and meta/episodes of every episode; returns the dataset's statistics."""
    schema = _row_schema(spec, fingerprint="")
    data = _DataFiles(spec)
    videos = {} if recordings or not spec.video else {k: _VideoFiles(spec, k) for k in spec.cameras}
    episodes = _EpisodeFiles(spec)
    encodings = _Encodings(spec, scratch)
    total: dict[str, st.Stats] | None = None
    for episode in range(len(spec.lengths)):
        record: dict[str, Any] = {
            "episode_index": episode,
            "tasks": [spec.tasks[episode]],
            "length": spec.lengths[episode],
        }
        samplers = _samplers(spec, episode)
        rows = _rows(spec, episode, schema, samplers)
        record.update(data.write(episode, rows))
        for key, recording in recordings.items():
            frames = spec.frames(episode, key, samplers[key])
            record.update(recording.add(frames, spec.lengths[episode]))
        for key, files in videos.items():
            tmp = scratch / f"{key}_{episode:06d}.mp4"
            encodings.write(episode, key, samplers[key], tmp)
            record.update(files.add(tmp))
        ep_stats = _episode_stats(spec, rows, samplers)
        record.update(_flat_stats(ep_stats))
        episodes.add(record)
        total = (
            ep_stats
            if total is None
            else {key: st.aggregate(total[key], ep_stats[key]) for key in ep_stats}
        )
    data.close()
    episodes.close()
    for files in videos.values():
        files.flush()
    return total


def _write_v30_meta(spec: _Spec, total: dict[str, st.Stats]) -> None:
    """meta/info.json, meta/stats.json and meta/tasks.parquet, once the videos are written."""
    features = _features(spec)
    for key in spec.cameras if spec.video else ():
        first = spec.root / V30_VIDEO_PATH.format(video_key=key, chunk_index=0, file_index=0)
        features[key]["info"] = {
            **_probe_video(first),
            "video.g": spec.encoder.gop,
            "video.crf": spec.encoder.crf,
            "video.preset": spec.encoder.preset,
            "video.fast_decode": 0,
            "video.video_backend": "pyav",
            "video.extra_options": dict(spec.encoder.extra),
            "is_depth_map": False,
        }
    write_tasks_parquet(spec.root, spec.task_index)
    _write_json(spec.root / "meta/stats.json", {k: st.to_lists(v) for k, v in total.items()})
    _write_json(
        spec.root / "meta/info.json",
        {
            "codebase_version": "v3.0",
            "fps": spec.fps,
            "features": features,
            "total_episodes": len(spec.lengths),
            "total_frames": spec.starts[-1],
            "total_tasks": len(spec.task_index),
            "chunks_size": spec.chunks_size,
            "data_files_size_in_mb": spec.data_mb,
            "video_files_size_in_mb": spec.video_mb,
            "data_path": V30_DATA_PATH,
            "video_path": V30_VIDEO_PATH if spec.video else None,
            "robot_type": spec.robot_type,
            "splits": {"train": f"0:{len(spec.lengths)}"},
        },
    )


def write_tasks_parquet(root: Path, task_index: Mapping[str, int]) -> None:
    """meta/tasks.parquet as pandas 2's ``DataFrame.to_parquet`` (LeRobot 0.6.1's) writes it:
    task strings as the index."""
    tasks = sorted(task_index, key=task_index.__getitem__)
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [
            {
                "name": None,
                "field_name": None,
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": {"encoding": "UTF-8"},
            }
        ],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": "task",
                "field_name": "task",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "attributes": {},
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.3.3",
    }
    schema = pa.schema(
        [("task_index", pa.int64()), ("task", pa.string())],
        metadata={"pandas": json.dumps(pandas_meta)},
    )
    table = pa.table(
        [pa.array([task_index[t] for t in tasks], pa.int64()), pa.array(tasks, pa.string())],
        schema=schema,
    )
    pq.write_table(table, root / "meta/tasks.parquet", compression="snappy")


# ----------------------------------------------------------------------------- v2.1


def _write_v21(spec: _Spec) -> None:
    features = _features(spec)
    episodes_rows, stats_rows = [], []
    for episode in range(len(spec.lengths)):
        chunk = episode // spec.chunks_size
        path = spec.root / V21_DATA_PATH.format(episode_chunk=chunk, episode_index=episode)
        path.parent.mkdir(parents=True, exist_ok=True)
        schema = _row_schema(spec, _fingerprint(spec, path.name))
        samplers = _samplers(spec, episode)
        rows = _rows(spec, episode, schema, samplers)
        pq.write_table(rows, path, compression="snappy")
        if spec.video:
            for key in spec.cameras:
                mp4 = spec.root / V21_VIDEO_PATH.format(
                    episode_chunk=chunk, video_key=key, episode_index=episode
                )
                mp4.parent.mkdir(parents=True, exist_ok=True)
                frames = spec.frames(episode, key, samplers[key])
                vid.encode_episode(frames, mp4, spec.fps, spec.encoder)
        ep_stats = _episode_stats(spec, rows, samplers)
        episodes_rows.append(
            {"episode_index": episode, "tasks": [spec.tasks[episode]], "length": len(rows)}
        )
        stats_rows.append(
            {"episode_index": episode, "stats": {k: st.to_lists(v) for k, v in ep_stats.items()}}
        )
    for key in spec.cameras if spec.video else ():
        first = spec.root / V21_VIDEO_PATH.format(episode_chunk=0, video_key=key, episode_index=0)
        probed = _probe_video(first)
        features[key]["info"] = {
            "video.height": probed["video.height"],
            "video.width": probed["video.width"],
            "video.codec": probed["video.codec"],
            "video.pix_fmt": probed["video.pix_fmt"],
            "video.is_depth_map": False,
            "video.fps": probed["video.fps"],
            "video.channels": probed["video.channels"],
            "has_audio": probed["has_audio"],
        }
    tasks = sorted(spec.task_index, key=spec.task_index.__getitem__)
    _write_jsonl(
        spec.root / "meta/tasks.jsonl",
        [{"task_index": spec.task_index[t], "task": t} for t in tasks],
    )
    _write_jsonl(spec.root / "meta/episodes.jsonl", episodes_rows)
    _write_jsonl(spec.root / "meta/episodes_stats.jsonl", stats_rows)
    num = len(spec.lengths)
    _write_json(
        spec.root / "meta/info.json",
        {
            "codebase_version": "v2.1",
            "robot_type": spec.robot_type,
            "total_episodes": num,
            "total_frames": spec.starts[-1],
            "total_tasks": len(spec.task_index),
            "total_videos": num * len(spec.cameras) if spec.video else 0,
            "total_chunks": math.ceil(num / spec.chunks_size),
            "chunks_size": spec.chunks_size,
            "fps": spec.fps,
            "splits": {"train": f"0:{num}"},
            "data_path": V21_DATA_PATH,
            "video_path": V21_VIDEO_PATH if spec.video else None,
            "features": features,
        },
    )
