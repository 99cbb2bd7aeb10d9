"""``ShardedLeRobotDataset``: the exact-coverage streaming ``IterableDataset`` over the shards.

It ties the pure planning (``partition``, ``plan``) to the I/O (``fetch``, ``decode``,
``episode``): the selected frames are split into ``world_size x num_workers`` parts, each
DataLoader worker (or the process itself) streams its part through the episode pool, fetching
and demuxing admitted episodes ahead of time in a small thread pool, decoding each drawn frame's
GOP when it is first needed, and builds each drawn frame's item exactly as LeRobot does
(``lerobot_shards.items``).

Epochs and resume. Every ``iter(ds)`` starts the next epoch unless ``set_epoch`` or
``load_state_dict`` said which; a DataLoader's persistent workers advance their own copies, so
they see a new order each epoch. With non-persistent workers the workers are fresh copies of
``ds`` every epoch: call ``ds.set_epoch(epoch)`` before each. A state is
``{"epoch", "offset", "batch_size"}``, ``offset`` counting the samples the consumer took in that
epoch. Resuming replays only the planner (``plan_part(start=...)``): nothing skipped is
fetched or decoded.

- Iterating ``ds`` directly (or a DataLoader with ``num_workers=0``): ``ds.state_dict()``
  knows what was taken.
- A DataLoader with workers: the copies that count live in the workers, so the training loop
  says how many samples it took since the DataLoader's iterator started:
  ``ds.state_dict(num_samples=n, batch_size=b)``. ``load_state_dict`` then works out, from the
  DataLoader's round-robin over workers, what each worker had produced, and lets each worker
  take the role (part) whose batch comes next, so the resumed stream is the same sequence.
  Offsets at batch boundaries (multiples of ``batch_size``, or the end of the epoch) resume
  exactly.
- torchdata's ``StatefulDataLoader`` calls ``state_dict``/``load_state_dict`` inside each
  worker; the worker's state then carries its id, its part and its own offset.

The state format. ``state_dict()`` returns a plain dict (JSON-serialisable):

- ``epoch``, ``offset``: the consumer took ``offset`` samples of the stream that starts at
  ``epoch`` (per rank: every rank of a DDP job is at the same step, so every rank's state is the
  same and any one of them is the checkpoint). With ``repeat=True`` the offset may run past the
  end of the epoch.
- ``batch_size``: the DataLoader's, for the round-robin arithmetic over workers.
- ``world_size``, ``num_workers``: the layout that produced it (``num_workers`` 0 when the rank
  iterated in process; None when unknown: ``ds.num_workers`` was not set and the state came
  from ``state_dict(num_samples=...)``).
- ``seed``, ``shuffle``, ``buffer_size``, ``byte_budget`` (bytes or None), ``pad``, ``repeat``:
  the settings that shape the order. ``byte_budget`` is each part's pool budget for fetched
  episodes: the rank's ``byte_budget_gb`` split over the layout's DataLoader workers, less each
  worker's frame cache.
- ``fingerprint``: ``format.manifest_fingerprint`` of the selected episodes' manifest rows.
  Loading a state of another dataset or episode selection is refused with a ``ValueError``.
- ``resumed_from`` (only while the rest of an elastically resumed epoch runs): the state the
  rest was planned from; ``epoch`` is then the rest's first epoch and ``offset`` counts the
  samples taken since the resume.
- ``worker_id``, ``role``: only in a StatefulDataLoader worker's own state.

A state of only ``{"epoch", "offset", "batch_size"}`` (the first format) resumes as before,
assuming the current layout and settings. A full state whose layout and settings match the
current ones resumes the very same stream. Otherwise (another world size, another number of
DataLoader workers, another seed, pool size, budget, padding or repeat) the resume is elastic
(``elastic.py``): the frames the checkpoint consumed are found by replaying the old layout's
planner (first draws of each old part), and the rest of the epoch is split over the new layout,
every frame still exactly once, every part still yielding the same number of samples; the next
epoch starts fresh under the new layout. Byte costs in that replay come from the current
``delta_timestamps``. With DataLoader workers set ``ds.num_workers`` to the loader's
``num_workers`` before ``state_dict``/``load_state_dict``: the resume is planned in the main
process and checked against the workers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import IterableDataset, get_worker_info

from lerobot_shards.format import (
    INFO_FILE,
    MANIFEST_FILE,
    STATS_FILE,
    TASKS_FILE,
    FormatError,
    join,
    manifest_fingerprint,
    read_index,
    read_manifest,
)
from lerobot_shards.items import ItemSpec, delta_indices
from lerobot_shards.reader import transfer
from lerobot_shards.reader.allocator import tune_worker_malloc
from lerobot_shards.reader.decode import check_backend
from lerobot_shards.reader.elastic import (
    Checkpoint,
    Layout,
    Ordering,
    Part,
    Planner,
    consumed_per_worker,
)
from lerobot_shards.reader.episode import Episode, load_episode
from lerobot_shards.reader.fetch import ADMIT, EVICT, Prefetcher, Span, read_span
from lerobot_shards.reader.frame_cache import FrameCache, read_ahead
from lerobot_shards.reader.partition import part_index, samples_per_part
from lerobot_shards.reader.plan import Admit, Draws, Evict
from lerobot_shards.reader.pool_budget import PoolBudget, split_budget

GB = 10**9
DEFAULT_FRAME_CACHE_GB = 0.5
"""Decoded frames held per rank (split over its DataLoader workers) unless set otherwise."""


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


@dataclass
class _Cursor:
    """Where one iteration is in its part's stream: the next sample's epoch and offset."""

    role: int
    """Which of the rank's workers' parts this stream plays (its own unless resumed)."""
    epoch: int
    offset: int
    """Draws made in ``epoch``'s part."""
    per_epoch: int
    origin: Checkpoint | None
    """While streaming the rest of an epoch planned from an elastic resume: its checkpoint."""
    stream_epoch: int
    stream_offset: int
    """Samples since the stream began (at ``stream_epoch``, or at the rest's start)."""
    num_workers: int


def _draw_count(event: Any) -> int:
    return len(event.pieces) if type(event) is Draws else 0


def rank_and_world_size() -> tuple[int, int]:
    """From torch.distributed when initialised, else ``RANK``/``WORLD_SIZE``, else 0 and 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class ShardedLeRobotDataset(IterableDataset):
    """A converted LeRobot dataset streamed with exact coverage: every selected frame exactly
    once per epoch over all ranks and workers, items equal to ``LeRobotSource[i]``.

    ``root`` is a local path or fsspec URL of a converted dataset. ``episodes`` selects episode
    indices. At most ``buffer_size`` episodes per DataLoader worker are resident (plus a few
    prefetched). Decoded frames are held in a cache of ``frame_cache_gb`` (10**9 bytes) per rank,
    shared out over its DataLoader workers, which keeps the frames the plan draws soonest and
    decodes again what it dropped: memory for frames does not grow with pool size or episode
    length. ``byte_budget_gb`` bounds each rank's fetched (compressed) episodes, resident plus
    prefetched, *and* its frame caches: each worker's equal share pays first for a full pool
    (its ``buffer_size`` largest episodes) and the frame cache gets what is left, so a budget of
    a few hundred MB holds hundreds of compressed episodes. An episode is refused only if its
    bytes alone exceed a worker's share; a budget that holds fewer than ``buffer_size``
    median-sized episodes is warned about (:class:`SmallPoolWarning`).
    Batches in flight in the DataLoader are outside the budget. ``repeat=True`` streams epoch
    after epoch.
    ``delta_timestamps``, ``tolerance_s``, ``image_transforms``, ``return_uint8`` and
    ``video_backend`` shape items as in LeRobot. ``pad=False`` turns off the padding that gives
    every rank and worker the same number of samples (for evaluation).

    ``decode_threads``: threads per iterating process that decode the GOPs of the next
    ``decode_ahead`` draws while items are built (FFmpeg runs without the GIL, so they use
    several cores). Default: the usable cores shared out over the rank's DataLoader workers,
    none when there are no more cores than workers (all of them with ``num_workers=0``; with
    ``lerobot_shards.collate``, one worker per core measured fastest). ``0`` decodes each GOP
    when its first frame is drawn, in the iterating thread. The torchcodec backend always
    decodes that way.

    ``len(ds)`` and ``ds.padding`` count this rank's samples per epoch over ``ds.num_workers``
    DataLoader workers (set it to the DataLoader's ``num_workers``; inside a worker it is known).
    """

    prefetch_depth = 2
    """Admissions fetched and demuxed ahead of the pool."""
    decode_ahead = 16
    """Upcoming draws whose GOPs the decode threads may work on ahead of the consumer."""
    frame_lookahead = 8192
    """Draws planned ahead of the consumer so the frame cache knows which frames come soon."""
    fetch_threads = 2
    fetch_retries = 5

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        episodes: Sequence[int] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        buffer_size: int = 64,
        byte_budget_gb: float | None = None,
        frame_cache_gb: float = DEFAULT_FRAME_CACHE_GB,
        repeat: bool = False,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        return_uint8: bool = False,
        video_backend: str = "pyav",
        storage_options: dict | None = None,
        pad: bool = True,
        decode_threads: int | None = None,
    ) -> None:
        super().__init__()
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1, got {buffer_size}")
        check_backend(video_backend)
        if decode_threads is not None and decode_threads < 0:
            raise ValueError(f"decode_threads must be non-negative, got {decode_threads}")
        self.decode_threads = decode_threads
        self.root = str(root)
        self._storage_options = dict(storage_options or {})
        self._fs, self._path = fsspec.core.url_to_fs(self.root, **self._storage_options)
        self._fs_pid = os.getpid()
        index = read_index(self.fs, self._path)
        self.meta = self._read_meta(index)
        self._read_manifest(episodes)
        self.shuffle = shuffle
        self.seed = int(seed)
        self.buffer_size = int(buffer_size)
        self.byte_budget = None if byte_budget_gb is None else int(byte_budget_gb * GB)
        if frame_cache_gb < 0:
            raise ValueError(f"frame_cache_gb must be non-negative, got {frame_cache_gb}")
        self.frame_cache = int(frame_cache_gb * GB)
        self.repeat = repeat
        self.pad = pad
        self.video_backend = video_backend
        unknown = set(delta_timestamps or ()) - set(self.meta.features)
        if unknown:
            raise ValueError(f"delta_timestamps keys {sorted(unknown)} are not features of {root}")
        self.spec = ItemSpec(
            video_keys=list(self.meta.video_keys),
            image_keys=list(self.meta.image_keys),
            deltas=delta_indices(delta_timestamps, self.meta.fps, tolerance_s),
            return_uint8=return_uint8,
            image_transforms=image_transforms,
        )
        self.num_workers = 0
        self._budget(1)  # refuses an episode larger than the whole budget
        self._planner = Planner(self._episodes, self._lengths, self._cost)
        self._fingerprint: str | None = None
        self._next = (0, 0)  # (epoch, offset) the next iteration starts at
        self._current = (0, 0)  # where the current (or last) iteration started
        self._next_origin: Checkpoint | None = None  # with an elastic rest: its checkpoint
        self._current_origin: Checkpoint | None = None
        self._batch_size = 1
        self._resume_worker: dict | None = None
        self._resume_pending = False
        self._check_workers: int | None = None  # workers a loaded state was planned for
        self._cursor: _Cursor | None = None
        self._stats = {
            "peak_budget_bytes": 0,
            "peak_resident_memory": 0,
            "peak_frame_cache_bytes": 0,
            "frames_from_cache": 0,
        }

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The filesystem, made anew in each process: async ones (s3, gcs, http) hold an event
        loop that does not survive a fork into DataLoader workers."""
        if self._fs_pid != os.getpid():
            self._fs = fsspec.core.url_to_fs(self.root, **self._storage_options)[0]
            self._fs_pid = os.getpid()
        return self._fs

    # ------------------------------------------------------------------ metadata

    def _read_meta(self, index) -> DatasetMeta:
        def read_json(relative: str, required: bool) -> Any:
            path = join(self._path, relative)
            try:
                with self.fs.open(path, "rb") as f:
                    return json.load(f)
            except FileNotFoundError:
                if required:
                    raise FormatError(
                        f"{path} not found: the converted dataset is incomplete"
                    ) from None
                return None
            except ValueError as exc:
                raise FormatError(f"{path}: not JSON: {exc}") from exc

        info = read_json(INFO_FILE, True)
        features = info.get("features", index.features)
        tasks_path = join(self._path, TASKS_FILE)
        try:
            with self.fs.open(tasks_path, "rb") as f:
                table = pq.read_table(f, columns=["task_index", "task"])
        except FileNotFoundError:
            raise FormatError(
                f"{tasks_path} not found: the converted dataset is incomplete"
            ) from None
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
            features=features,
            camera_keys=list(index.camera_keys),
            video_keys=video_keys,
            image_keys=[k for k in index.camera_keys if k not in video_keys],
            stats=read_json(STATS_FILE, False),
            tasks=tasks,
            total_frames=index.total_frames,
            total_episodes=index.total_episodes,
            codebase_version=index.codebase_version,
        )

    def _read_manifest(self, episodes: Sequence[int] | None) -> None:
        table = read_manifest(self.fs, join(self._path, MANIFEST_FILE))
        all_episodes = table.column("episode_index").to_numpy()
        if episodes is None:
            rows = np.arange(len(all_episodes))
        else:
            wanted = np.unique(np.asarray(list(episodes), dtype=np.int64))
            rows = np.searchsorted(all_episodes, wanted)
            rows = np.minimum(rows, max(len(all_episodes) - 1, 0))
            missing = wanted[(len(all_episodes) == 0) | (all_episodes[rows] != wanted)]
            if len(missing):
                raise ValueError(
                    f"episodes {missing.tolist()} are not in {self.root} "
                    f"({len(all_episodes)} episodes)"
                )
        table = table.take(rows)
        self._manifest = table
        self._episodes = table.column("episode_index").to_numpy()
        self._lengths = table.column("length").to_numpy()
        self._sizes = table.column("size").to_numpy()
        self._offsets = table.column("offset").to_numpy()
        self._shards = table.column("shard").to_pylist()
        self._checksums = table.column("checksum").to_pylist()
        self._row_of = {int(e): i for i, e in enumerate(self._episodes.tolist())}

    @property
    def manifest(self) -> pa.Table:
        """The manifest rows of the selected episodes, in episode order."""
        return self._manifest

    @property
    def num_frames(self) -> int:
        """Frames of the selected episodes."""
        return int(self._lengths.sum())

    @property
    def num_episodes(self) -> int:
        """Selected episodes."""
        return len(self._episodes)

    @property
    def episodes(self) -> list[int]:
        """The selected episode indices, ascending."""
        return self._episodes.tolist()

    # ------------------------------------------------------------------ sizes

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for spawn/forkserver DataLoader workers: record the rank layout here, in the
        training process, where torch.distributed (or the environment) knows it."""
        state = dict(self.__dict__)
        state["_parent_rank_world"] = rank_and_world_size()
        return state

    def _layout(self) -> tuple[int, int, int, int]:
        """``(rank, world_size, worker_id, num_workers)`` of the calling process."""
        info = get_worker_info()
        if info is None:
            rank, world = rank_and_world_size()
            return rank, world, 0, max(1, self.num_workers)
        rank, world = self.__dict__.get("_parent_rank_world") or rank_and_world_size()
        return rank, world, info.id, info.num_workers

    def _part_samples(self, num_parts: int, pad: bool | None = None) -> list[int]:
        return samples_per_part(self.num_frames, num_parts, self.pad if pad is None else pad)

    def _rank_parts(self) -> tuple[list[int], int]:
        rank, world, _, workers = self._layout()
        parts = [part_index(rank, world, w, workers)[0] for w in range(workers)]
        return parts, world * workers

    def __len__(self) -> int:
        """Samples this rank yields per epoch, over all its DataLoader workers."""
        parts, num_parts = self._rank_parts()
        samples = self._part_samples(num_parts)
        return sum(samples[p] for p in parts)

    @property
    def padding(self) -> int:
        """How many of this rank's samples per epoch are padding (repeats of its own frames)."""
        parts, num_parts = self._rank_parts()
        real = self._part_samples(num_parts, pad=False)
        return len(self) - sum(real[p] for p in parts)

    def memory_stats(self) -> dict[str, int]:
        """What this process's iterations held: ``peak_budget_bytes``, the fetched episodes
        resident plus prefetched as the pool budget counts them; ``peak_frame_cache_bytes``,
        decoded frames held; ``peak_resident_memory``, resident fetched bytes plus decoded
        frames; and ``frames_from_cache``, frames drawn from the cache instead of decoded."""
        return dict(self._stats)

    # ------------------------------------------------------------------ epochs and state

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run epoch ``epoch``: from its start, or from the offset of a
        state loaded for that epoch and not yet iterated (so a loop may call ``set_epoch`` on
        every epoch, the resumed one included)."""
        if self._resume_pending and self._next[0] == int(epoch):
            return
        self._next = self._current = (int(epoch), 0)
        self._next_origin = self._current_origin = None
        self._resume_worker = None
        self._resume_pending = False
        self._check_workers = None
        self._cursor = None

    @property
    def fingerprint(self) -> str:
        """``manifest_fingerprint`` of the selected episodes' manifest rows."""
        if self._fingerprint is None:
            self._fingerprint = manifest_fingerprint(self._manifest)
        return self._fingerprint

    def _budget(self, workers: int) -> PoolBudget:
        """Each part's pool budget and frame cache under ``workers`` DataLoader workers per rank
        (``pool_budget.split_budget``): each worker holds its own pool and cache."""
        workers = max(1, workers)
        return split_budget(
            self.byte_budget,
            self.frame_cache,
            workers=workers,
            num_parts=self._layout()[1] * workers,
            episode_bytes=self._sizes,
            episodes=self._episodes,
            buffer_size=self.buffer_size,
        )

    def _ordering(self) -> Ordering:
        """The order settings of this process's layout (the pool budget per part)."""
        budget = self._budget(self._layout()[3]).pool
        return Ordering(self.seed, self.shuffle, self.buffer_size, budget, self.pad, self.repeat)

    def _state(
        self,
        epoch: int,
        offset: int,
        batch_size: int,
        num_workers: int | None,
        origin: Checkpoint | None,
    ) -> dict[str, Any]:
        """A state dict in the format the module docstring describes."""
        ordering = self._ordering()
        state = {
            "epoch": epoch,
            "offset": offset,
            "batch_size": batch_size,
            "world_size": self._layout()[1],
            "num_workers": num_workers,
            "seed": ordering.seed,
            "shuffle": ordering.shuffle,
            "buffer_size": ordering.buffer_size,
            "byte_budget": ordering.byte_budget,
            "pad": ordering.pad,
            "repeat": ordering.repeat,
            "fingerprint": self.fingerprint,
        }
        if origin is not None:
            state["resumed_from"] = self._checkpoint_state(origin)
        return state

    def _checkpoint_state(self, c: Checkpoint) -> dict[str, Any]:
        o = c.ordering
        state = {
            "epoch": c.epoch,
            "offset": c.offset,
            "batch_size": c.batch_size,
            "world_size": c.layout.world_size,
            "num_workers": c.layout.num_workers,
            "seed": o.seed,
            "shuffle": o.shuffle,
            "buffer_size": o.buffer_size,
            "byte_budget": o.byte_budget,
            "pad": o.pad,
            "repeat": o.repeat,
            "fingerprint": self.fingerprint,
        }
        if c.origin is not None:
            state["resumed_from"] = self._checkpoint_state(c.origin)
        return state

    def _checkpoint(self, state: Mapping[str, Any], num_workers: int) -> Checkpoint:
        """The checkpoint a full state describes (``num_workers`` stands in for an unknown)."""
        try:
            workers = state["num_workers"]
            origin = state.get("resumed_from")
            return Checkpoint(
                epoch=int(state["epoch"]),
                offset=int(state["offset"]),
                batch_size=max(1, int(state.get("batch_size") or 1)),
                layout=Layout(
                    int(state["world_size"]), num_workers if workers is None else int(workers)
                ),
                ordering=Ordering(
                    int(state["seed"]),
                    bool(state["shuffle"]),
                    int(state["buffer_size"]),
                    None if state["byte_budget"] is None else int(state["byte_budget"]),
                    bool(state["pad"]),
                    bool(state["repeat"]),
                ),
                origin=None if origin is None else self._checkpoint(origin, num_workers),
            )
        except KeyError as exc:
            raise ValueError(f"this state lacks {exc.args[0]!r}: {dict(state)}") from None

    def state_dict(
        self, num_samples: int | None = None, batch_size: int | None = None
    ) -> dict[str, Any]:
        """What the consumer has taken, in the state format of the module docstring.

        ``num_samples``: with DataLoader workers, the samples the training loop took since the
        DataLoader's iterator started (and ``batch_size`` its batch size, None counting as 1);
        set ``ds.num_workers`` to the loader's ``num_workers`` so the state records it (an
        elastic resume needs it). Without it, what this object yielded (direct iteration), or,
        inside a DataLoader worker (torchdata's StatefulDataLoader), that worker's own position.
        """
        b = self._batch_size if batch_size is None else max(1, int(batch_size))
        cursor = self._cursor
        if num_samples is not None:
            epoch, offset = self._current
            if self.num_workers > 0:
                workers = self.num_workers
            elif cursor is not None:  # the DataLoader iterated this very object
                workers = cursor.num_workers
            else:
                workers = None
            return self._state(epoch, offset + int(num_samples), b, workers, self._current_origin)
        info = get_worker_info()
        if cursor is None:
            epoch, offset = self._next
            workers = info.num_workers if info is not None else self.num_workers
            return self._state(epoch, offset, b, workers, self._next_origin)
        origin = cursor.origin
        if origin is not None and (self.repeat or cursor.offset < cursor.per_epoch):
            epoch, offset = cursor.stream_epoch, cursor.stream_offset
        else:
            origin = None
            epoch, offset = cursor.epoch, cursor.offset
            if offset >= cursor.per_epoch and (cursor.per_epoch > 0 or cursor.origin):
                epoch, offset = epoch + 1, 0
        state = self._state(epoch, offset, b, cursor.num_workers, origin)
        if info is not None:
            state.update(worker_id=info.id, role=cursor.role)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next iteration yield exactly what followed the state's position.

        A state taken under another layout (world size, DataLoader workers) or other ordering
        settings resumes elastically: the rest of its epoch, split over this layout.
        """
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if offset < 0 or epoch < 0:
            raise ValueError(f"a state needs a non-negative epoch and offset, got {dict(state)}")
        theirs = state.get("fingerprint")
        if theirs is not None and theirs != self.fingerprint:
            raise ValueError(
                f"this state was taken on another dataset: its manifest fingerprint is {theirs}, "
                f"{self.root} (with {self.num_episodes} selected episodes) has {self.fingerprint}; "
                "resume on the dataset and episode selection the checkpoint was taken on"
            )
        self._batch_size = max(1, int(state.get("batch_size") or 1))
        worker_state = "worker_id" in state
        info = get_worker_info()
        workers = info.num_workers if info is not None else max(1, self.num_workers)
        self._check_workers = None
        self._next_origin = None
        self._resume_worker = dict(state) if worker_state else None
        self._next = (epoch, offset)
        if "world_size" in state:  # a full state: the layout and settings are known
            checkpoint = self._checkpoint(state, workers)
            world = self._layout()[1]
            same = (checkpoint.layout.world_size, checkpoint.layout.workers) == (world, workers)
            if same and checkpoint.ordering == self._ordering():
                self._next_origin = checkpoint.origin
            elif worker_state:
                raise ValueError(
                    "this is a StatefulDataLoader worker's state, taken under another layout or "
                    "other settings (world size, workers, seed, shuffle, buffer, budget, pad, "
                    "repeat): elastic resume needs the rank's state, "
                    "ds.state_dict(num_samples=..., batch_size=...)"
                )
            elif state["num_workers"] is None:
                raise ValueError(
                    "this state does not record how many DataLoader workers produced it (set "
                    "ds.num_workers to the loader's num_workers before ds.state_dict), so it "
                    "cannot resume under another world size or other settings"
                )
            else:
                self._next = (self._planner.rest_epoch(checkpoint), 0)
                self._next_origin = checkpoint
            if state["num_workers"] is not None and not worker_state:
                self._check_workers = workers
        self._current, self._current_origin = self._next, self._next_origin
        self._resume_pending = True
        self._cursor = None

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[dict]:
        if get_worker_info() is not None:
            tune_worker_malloc()  # allocator.py says why
        epoch, offset = self._next
        origin = self._next_origin
        self._next = (epoch + 1, 0)
        self._current, self._current_origin = (epoch, offset), origin
        self._next_origin = None
        rank, world, worker, workers = self._layout()
        expected, self._check_workers = self._check_workers, None
        if expected is not None and expected != workers:
            raise ValueError(
                f"the state was loaded for {expected} DataLoader worker(s) per rank, but this "
                f"loader has {workers}: set ds.num_workers = {workers} before load_state_dict"
            )
        if worker == 0:  # the workers' shares are equal: one warning says it for all
            self._budget(workers).warn_if_small()
        first = part_index(rank, world, 0, workers)[0]
        num_parts = world * workers
        ordering, planner = self._ordering(), self._planner
        resume = self._resume_worker
        self._resume_worker = None
        self._resume_pending = False
        if resume is not None:
            if (resume["worker_id"], resume["num_workers"]) != (worker, workers):
                raise ValueError(
                    f"this state is DataLoader worker {resume['worker_id']}'s of "
                    f"{resume['num_workers']}, loaded into worker {worker} of {workers}: load a "
                    "StatefulDataLoader's state into a loader with the same num_workers"
                )
            role, taken = int(resume["role"]), offset
        elif workers == 1:
            role, taken = 0, offset
        else:
            per_worker = [
                planner.locate(origin, epoch, ordering, num_parts, first + w, 0)[0].num_samples
                for w in range(workers)
            ]
            consumed, nxt = consumed_per_worker(offset, per_worker, self._batch_size, self.repeat)
            role = (nxt + worker) % workers
            taken = consumed[role]
        part, k, following = planner.locate(origin, epoch, ordering, num_parts, first + role, taken)
        if origin is not None:
            self._next = (part.epoch + 1, 0)
        rest = origin if part.positions is not None else None
        recorded = workers if get_worker_info() is not None else self.num_workers
        cursor = _Cursor(role, part.epoch, k, part.num_samples, rest, epoch, taken, recorded)
        self._cursor = cursor
        return self._stream(part, following, cursor)

    def _stream(self, part: Part, following: Iterator[Part], cursor: _Cursor) -> Iterator[dict]:
        if part.num_samples == 0 or cursor.offset >= part.num_samples:
            return
        parts_of: dict[int, Part] = {}
        ordering = self._ordering()
        cache = FrameCache(self._budget(self._layout()[3]).cache)
        registered = 0  # draws whose frames the cache has been told about

        def events() -> Iterator[tuple[int, Any]]:
            nonlocal registered
            current, start = part, cursor.offset
            while True:
                parts_of[current.epoch] = current
                lengths = self._lengths[np.searchsorted(self._episodes, current.episodes)]
                for event in current.plan(ordering, self._cost, start):
                    if type(event) is Draws:
                        registered = self._expect(cache, registered, current, lengths, event)
                    yield current.epoch, event
                if not self.repeat:
                    return
                current, start = next(following), 0

        def classify(step: tuple[int, Any]) -> tuple[str | None, Any]:
            epoch, event = step
            if type(event) is Admit:
                return ADMIT, (epoch, event.piece)
            if type(event) is Evict:
                return EVICT, (epoch, event.piece)
            return None, None

        def size(key: tuple[int, int]) -> int:
            epoch, piece = key
            p = parts_of[epoch]
            return self._cost(int(p.episodes[piece]), int(p.starts[piece]), int(p.stops[piece]))

        fs = self.fs  # resolved here, in the iterating process, not in the fetch threads

        def load(key: tuple[int, int]) -> Episode:
            epoch, piece = key
            return self._load(int(parts_of[epoch].episodes[piece]), fs)

        prefetcher = Prefetcher(
            load,
            size,
            byte_budget=ordering.byte_budget,
            depth=self.prefetch_depth,
            threads=self.fetch_threads,
        )
        threads = self._decode_thread_count()
        decoder = ThreadPoolExecutor(threads, "lerobot-shards-decode") if threads else None
        arena = self._arena()
        resident: dict[tuple[int, int], Episode] = {}
        fetched = 0
        drawn = 0
        tasks, stats = self.meta.tasks, self._stats
        planned = read_ahead(events(), lambda step: _draw_count(step[1]), self.frame_lookahead)
        try:
            for (epoch, event), value in prefetcher.run(planned, classify):
                kind = type(event)
                if kind is Draws:
                    if epoch != cursor.epoch:  # the stream ran on into the next epoch
                        self._advance(cursor, parts_of, epoch)
                    part = parts_of[epoch]
                    run = [
                        (resident[(epoch, piece)], part.position(piece, frame))
                        for piece, frame in zip(
                            event.pieces.tolist(), event.frames.tolist(), strict=True
                        )
                    ]
                    # A run ends before the next eviction, so every episode it draws from is
                    # resident until it ends: decoding ahead within it never outlives a piece.
                    ahead = 0
                    for n, (episode, position) in enumerate(run):
                        cache.now = drawn
                        if decoder is not None:
                            while ahead < len(run) and ahead <= n + self.decode_ahead:
                                run[ahead][0].schedule(run[ahead][1], self.spec, decoder)
                                ahead += 1
                        slots = arena.slots() if arena is not None else None
                        item = episode.item(position, self.spec, tasks, slots)
                        drawn += 1
                        memory = fetched + cache.nbytes
                        stats["peak_resident_memory"] = max(stats["peak_resident_memory"], memory)
                        cursor.offset += 1
                        cursor.stream_offset += 1
                        yield item
                elif kind is Admit:
                    value.attach(cache, (epoch, event.piece))
                    resident[(epoch, event.piece)] = value
                    fetched += value.fetched
                    stats["peak_budget_bytes"] = max(
                        stats["peak_budget_bytes"], prefetcher.peak_bytes
                    )
                else:
                    fetched -= resident.pop((epoch, event.piece)).fetched
                    cache.forget((epoch, event.piece))
        finally:
            if decoder is not None:
                decoder.shutdown(wait=True, cancel_futures=True)
            stats["peak_budget_bytes"] = max(stats["peak_budget_bytes"], prefetcher.peak_bytes)
            stats["peak_frame_cache_bytes"] = max(stats["peak_frame_cache_bytes"], cache.peak_bytes)
            stats["frames_from_cache"] += cache.decodes_saved

    def _expect(
        self, cache: FrameCache, first: int, part: Part, lengths: np.ndarray, draws: Draws
    ) -> int:
        """Tell ``cache`` which frames each of ``draws`` (numbered from ``first``) will take;
        returns the next draw's number."""
        epoch = part.epoch
        cameras = [(key, self.spec.deltas.get(key)) for key in self.spec.video_keys]
        draw = first
        for piece, frame in zip(draws.pieces.tolist(), draws.frames.tolist(), strict=True):
            position = part.position(piece, frame)
            tag = (epoch, piece)
            keys = []
            for key, offsets in cameras:
                if offsets is None:
                    keys.append((tag, key, position))
                else:
                    shown = np.clip(position + offsets, 0, int(lengths[piece]) - 1).tolist()
                    keys += [(tag, key, p) for p in shown]
            cache.expect(draw, keys)
            draw += 1
        return draw

    def _arena(self) -> transfer.BatchArena | None:
        """In a DataLoader worker that can share segments: the batch slots ``collate`` lays out
        (``transfer.BatchArena``), which decoded frames are written into."""
        if get_worker_info() is None or self.video_backend != "pyav":
            return None
        pool = transfer.worker_pool()
        return pool.arena if pool is not None else None

    def _decode_thread_count(self) -> int:
        if self.video_backend != "pyav" or not self.spec.video_keys:
            return 0
        if self.decode_threads is not None:
            return self.decode_threads
        info = get_worker_info()
        processes = info.num_workers if info is not None else 1
        cores = (
            len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity")
            else os.cpu_count() or 1
        )
        # With a worker per core, each worker's own thread keeps its core busy: more threads
        # would only contend for it.
        return cores // processes if cores > processes else 0

    @staticmethod
    def _advance(cursor: _Cursor, parts_of: dict[int, Part], epoch: int) -> None:
        """Move the cursor to the start of ``epoch``'s part; forget parts done with."""
        current = parts_of[epoch]
        cursor.epoch, cursor.offset, cursor.per_epoch = epoch, 0, current.num_samples
        if current.positions is None:  # past the rest of an elastic resume: fresh epochs
            cursor.origin = None
        for old in [e for e in parts_of if e < epoch - 1]:
            del parts_of[old]

    def _cost(self, episode: int, start: int, stop: int) -> int:
        """What a piece costs the pool budget while resident: its episode's fetched bytes (the
        whole episode is fetched whichever rows the piece draws; decoded frames are in the
        frame cache, budgeted apart)."""
        return int(self._sizes[self._row_of[episode]])

    def _load(self, episode: int, fs: fsspec.AbstractFileSystem) -> Episode:
        """Fetch, verify and demux an episode (in prefetch threads); its frames are decoded when
        drawn."""
        row = self._row_of[episode]
        shard = self._shards[row]
        span = Span(
            episode,
            join(self._path, shard),
            int(self._offsets[row]),
            int(self._sizes[row]),
            self._checksums[row],
        )
        data = read_span(fs, span, retries=self.fetch_retries)
        base = int(self._offsets[row])
        members = {
            m["name"]: (m["offset"] - base, m["size"])
            for m in self._manifest.column("members")[row].as_py()
        }
        return load_episode(
            data,
            members,
            episode_index=episode,
            length=int(self._lengths[row]),
            shard=span.path,
            spec=self.spec,
            backend=self.video_backend,
        )

    def __repr__(self) -> str:
        return (
            f"ShardedLeRobotDataset({self.root!r}, {self.num_episodes} episodes, "
            f"{self.num_frames} frames, fps={self.meta.fps})"
        )
