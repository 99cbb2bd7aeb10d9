"""``ShardedLeRobotDataset``: the exact-coverage streaming ``IterableDataset`` over the shards.

Thin glue. The selected frames are split into ``world_size x num_workers`` parts
(``partition``); each DataLoader worker (or the process itself) streams its part through the
episode pool (``plan``, pure), fetching and demuxing admitted episodes ahead and decoding each
drawn frame's GOP when needed (``stream``, ``fetch``, ``episode``, ``frame_cache``), and builds
each item exactly as LeRobot does (``lerobot_shards.items``). What the reader knows before any
fetch is in ``meta``; epochs, state dicts and resume (the state format) in ``state``, with
elastic resume under another layout in ``elastic``, and how a plain DataLoader's fresh
workers know the epoch in ``worker_epochs``; each worker's share of the byte budget in
``pool_budget``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import fsspec
import pyarrow as pa
import torch
from torch.utils.data import IterableDataset, get_worker_info

from lerobot_shards.depth import DEFAULT_DEPTH_UNIT, check_unit
from lerobot_shards.items import ItemSpec
from lerobot_shards.reader.batches.rows import RowArena
from lerobot_shards.reader.fetch.cache import default_cache_dir
from lerobot_shards.reader.fetch.cached import CachedReads
from lerobot_shards.reader.frames.allocator import tune_worker_malloc
from lerobot_shards.reader.frames.decode import check_backend
from lerobot_shards.reader.loading.accelerate_guard import refuse_accelerate_resharding
from lerobot_shards.reader.loading.inherited import freeze_inherited_objects
from lerobot_shards.reader.loading.mixed import Mixing, Segment, ring_writer, segments
from lerobot_shards.reader.loading.node_cache import NodeSchedule
from lerobot_shards.reader.loading.stream import StreamOptions, decode_thread_count, stream_part
from lerobot_shards.reader.loading.worker_epochs import WorkerEpochs
from lerobot_shards.reader.loading.world import World, current_world, worker_world
from lerobot_shards.reader.meta.catalog import Catalog, DatasetRoot, ItemOptions, Member, as_sources
from lerobot_shards.reader.meta.embodiment import TargetLayout
from lerobot_shards.reader.meta.layout_meta import LayoutMeta
from lerobot_shards.reader.meta.metadata import DatasetMeta, MixtureMeta
from lerobot_shards.reader.meta.placement import place_members
from lerobot_shards.reader.meta.schema import check_batchable, item_schema
from lerobot_shards.reader.meta.selection import Selection
from lerobot_shards.reader.plan.elastic import (
    Checkpoint,
    Ordering,
    Part,
    Planner,
)
from lerobot_shards.reader.plan.mixture import MixturePlan, samples_per_dataset
from lerobot_shards.reader.plan.nodes import Nodes
from lerobot_shards.reader.plan.partition import part_index, samples_per_part
from lerobot_shards.reader.plan.pool_budget import PoolBudget, split_budget
from lerobot_shards.reader.plan.state import Context, Position
from lerobot_shards.trace import TraceWriter

__all__ = [
    "DatasetMeta",
    "DatasetRoot",
    "LayoutMeta",
    "MixtureMeta",
    "ShardedLeRobotDataset",
]

GB = 10**9
DEFAULT_FRAME_CACHE_GB = 0.5
"""Decoded frames held per rank (split over its DataLoader workers) unless set otherwise."""


class ShardedLeRobotDataset(IterableDataset):
    """A converted LeRobot dataset streamed with exact coverage: every selected frame exactly
    once per epoch over all ranks and workers, items equal to LeRobot's ``LeRobotDataset[i]``.

    Each new iteration runs the next epoch (``set_epoch`` sets it); the order is a pure
    function of the seed, the epoch and the layout (ranks, DataLoader workers). Each DataLoader
    worker streams its part of the epoch through a pool of ``buffer_size`` episodes, drawing
    from them uniformly. ``len(ds)`` and ``ds.padding`` count this rank's samples per epoch over
    ``ds.num_workers`` DataLoader workers (:class:`ShardedDataLoader` sets it; inside a worker
    it is known). Epochs, ``state_dict``/``load_state_dict`` and the state format:
    ``reader/plan/state.py``.

    Memory: at most ``buffer_size`` episodes per worker are resident (plus a few prefetched),
    and decoded frames wait in a cache of ``frame_cache_gb`` per rank that keeps the frames the
    plan draws soonest, so memory for frames does not grow with pool size or episode length.
    ``byte_budget_gb`` bounds a rank's fetched episodes *and* its frame caches: each worker's
    equal share pays first for a full pool (its ``buffer_size`` largest episodes) and the frame
    cache gets what is left. Batches in flight in the DataLoader are outside the budget
    (``docs/streaming.md`` says what else, and by how much).

    Args:
        root: A local path or fsspec URL of a converted dataset. A list of them (paths, URLs or
            :class:`DatasetRoot`, which carries a dataset's own episodes, storage options and
            ``key_map``) is a *mixture*: items are each dataset's items plus ``dataset_index``,
            and ``ds.meta`` is a :class:`MixtureMeta`. A mixture whose items would not batch
            together is refused here.
        weights: A mixture's weights, one per dataset: each dataset's share of an epoch's
            samples, exact per frame to floor/ceil and rotating over epochs
            (``reader/plan/mixture.py``). None: every frame once.
        epoch_size: A mixture's samples per epoch; None: its total frames.
        episodes: The episode indices to read (of a single dataset; a mixture's datasets take
            theirs from their :class:`DatasetRoot`). None: all.
        shuffle: Shuffle each epoch (episodes and the frames within them); False: episodes in
            order, frames ascending.
        seed: The seed of every epoch's order (non-negative).
        buffer_size: Episodes resident in *each DataLoader worker's* pool (the process's own
            with no workers): a batch of 32 from a pool of 64 mixes about 25 episodes.
        byte_budget_gb: GB (10**9 bytes) for *each rank* (training process), split equally over
            its DataLoader workers: its fetched (compressed) episodes, resident and prefetched,
            and its frame caches. An episode larger than a worker's share is refused; a budget
            that holds fewer than ``buffer_size`` typical episodes warns
            (:class:`SmallPoolWarning`). None: no limit.
        frame_cache_gb: GB of decoded frames held for *each rank*, split over its DataLoader
            workers (within ``byte_budget_gb`` when one is given).
        repeat: Stream epoch after epoch in one iteration.
        delta_timestamps: Neighbours to stack per key, in seconds (multiples of 1/fps), as
            LeRobot's: ``{"action": [0.0, 0.1]}`` adds ``action`` of the next frame and an
            ``action_is_pad`` mask.
        delta_indices: Neighbours in steps (frames at each dataset's own rate), as
            ``delta_timestamps`` gives them in seconds, with the same ``_is_pad`` masks:
            ``{"action": range(50)}`` is a chunk of 50 steps whatever the fps.
        layout: A target layout (a :class:`TargetLayout`, its dict, or a JSON/YAML file) every
            dataset's items are mapped into, for mixtures across robots
            (``docs/embodiments.md``): vectors padded into slots with masks, cameras into slots
            (zero images where a dataset has none), frames resized as they are decoded, each
            dataset normalised with its own statistics, and the names of each item's dataset
            and embodiment; ``ds.meta`` is then a ``LayoutMeta``. None: each dataset's own
            items.
        tolerance_s: How far (seconds) a ``delta_timestamps`` value may be from a multiple of
            1/fps, and a row's timestamp from ``frame_index / fps``, as LeRobot's.
        image_transforms: A callable applied to each camera frame of an item, as LeRobot's.
        return_uint8: False (default, as ``LeRobotDataset``): camera frames float32 in [0, 1],
            so items equal LeRobot's. True: video frames stay uint8 (4x fewer bytes through the
            DataLoader and to the GPU; normalise there), as LeRobot's own trainer asks for and
            ``lerobot-shards train`` passes. Image features are float32 either way, as in
            LeRobot.
            Depth cameras (``meta.depth_keys``) are float32 ``(1, H, W)`` whatever it says, and
            ``image_transforms`` skip them, as in LeRobot.
        video_backend: ``"pyav"`` (its wheels bundle FFmpeg) or ``"torchcodec"`` (needs FFmpeg's
            shared libraries), as LeRobot's.
        depth_output_unit: Depth cameras' unit, as LeRobot's: ``"mm"`` (default; whole
            millimetres, as float32) or ``"m"``; ``meta.stats`` gives their statistics in it
            (``lerobot_shards.depth``).
        storage_options: fsspec options for the root(s) (an endpoint, credentials: MinIO, R2,
            ...); a :class:`DatasetRoot`'s own take precedence.
        pad: Give every rank and worker the same number of samples by repeating a few frames
            (``ds.padding``); False for evaluation, where each frame counts once.
        decode_threads: Threads per iterating process that decode the GOPs of the next
            ``decode_ahead`` draws while items are built (FFmpeg runs without the GIL). None:
            the physical cores shared out over the rank's DataLoader workers, none when there
            are no more cores than workers (with ``lerobot_shards.collate``, one worker per
            core measured fastest: :func:`suggested_workers`). 0: decode each GOP when its first
            frame is drawn, in the iterating thread (as the torchcodec backend always does).
        trace_dir: A local folder where each iterating process appends where its time goes
            (fetching, decoding, waiting), for ``lerobot-shards stream --report``
            (``trace.py``). None: no trace.
        cache: The node-local disk cache of fetched episodes, shared by every rank, worker and
            job on the node, so later epochs do not download again (``docs/caching.md``). None:
            remote roots (object storage, HTTP, the Hub) are cached, and any root when
            ``cache_dir`` is given; True: any root (a shared filesystem's too); False: none.
        cache_dir: The cache folder, on a local disk of the node (one on a network filesystem
            is warned about). None: ``$LEROBOT_SHARDS_CACHE_DIR``, else the user's cache folder
            (``~/.cache/lerobot-shards``).
        cache_limit_gb: Most GB the cache holds; None: the folder's last limit, else half of
            the disk's free space plus what the cache holds, never the last 5% of the disk (at
            most 1 GiB).
        node_affinity: With ranks on several nodes, each node reads the same episodes every
            epoch, shuffled over its ranks and workers, so its cache keeps its own share; every
            frame is still read once per epoch over all ranks (``split_nodes`` in
            ``reader/plan/partition.py``). Nodes may hold unequal numbers of ranks; the ranks
            agree on them as ``loading/world.py`` says (exchanged over ``torch.distributed``
            when it is initialised). None: on when a cache is in use on more than one node,
            unless an explicit ``cache_limit_gb`` holds the whole dataset (the choice is the
            same on every rank). A reader without a cache or node affinity never needs to
            know the nodes.
    """

    prefetch_depth = 2
    """Admissions fetched and demuxed ahead of the pool."""
    decode_ahead = 16
    """Upcoming draws whose GOPs the decode threads may work on ahead of the consumer."""
    frame_lookahead = 8192
    """Draws planned ahead of the consumer so the frame cache knows which frames come soon."""
    fetch_threads = 2
    """Threads fetching and demuxing admitted episodes."""
    fetch_retries = 5
    """Attempts at an episode's ranged read before it fails (transient errors back off)."""
    warm_draws = 0
    """Draws of the next epoch fetched and decoded ahead when an iterating process's part ends
    (``warm_start.py``; 0: none). :class:`ShardedDataLoader` sets it when its workers persist
    (or it has none): fresh workers exit at the epoch's end, and a warm-up would be lost."""

    def __init__(
        self,
        root: str | os.PathLike | Sequence[str | os.PathLike | DatasetRoot],
        *,
        weights: Sequence[float] | None = None,
        epoch_size: int | None = None,
        episodes: Sequence[int] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        buffer_size: int = 64,
        byte_budget_gb: float | None = None,
        frame_cache_gb: float = DEFAULT_FRAME_CACHE_GB,
        repeat: bool = False,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        delta_indices: Mapping[str, Sequence[int]] | None = None,
        layout: TargetLayout | Mapping[str, Any] | str | os.PathLike | None = None,
        tolerance_s: float = 1e-4,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        return_uint8: bool = False,
        video_backend: str = "pyav",
        depth_output_unit: str = DEFAULT_DEPTH_UNIT,
        storage_options: dict | None = None,
        pad: bool = True,
        decode_threads: int | None = None,
        trace_dir: str | os.PathLike | None = None,
        cache: bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        cache_limit_gb: float | None = None,
        node_affinity: bool | None = None,
    ) -> None:
        super().__init__()
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be at least 1, got {buffer_size}")
        check_backend(video_backend)
        if decode_threads is not None and decode_threads < 0:
            raise ValueError(f"decode_threads must be non-negative, got {decode_threads}")
        self.decode_threads = decode_threads
        self.trace_dir = None if trace_dir is None else os.fspath(trace_dir)
        sources, self.is_mixture = as_sources(root, episodes)
        if not self.is_mixture and (weights is not None or epoch_size is not None):
            raise ValueError("weights and epoch_size are for a mixture (a list of roots)")
        self.root = [str(s.root) for s in sources] if self.is_mixture else str(sources[0].root)
        """The root as given; of a mixture, the list of roots."""
        self._storage_options = dict(storage_options or {})
        self.layout = None if layout is None else TargetLayout.of(layout)
        """The target layout items are mapped into (None: each dataset's own items)."""
        options = ItemOptions(
            delta_timestamps,
            tolerance_s,
            return_uint8,
            image_transforms,
            depth_output_unit=check_unit(depth_output_unit),
            delta_indices=delta_indices,
            layout=self.layout,
        )
        self.catalog: Catalog = Catalog.open(
            sources, self._storage_options, options, self.is_mixture
        )
        """The opened datasets and their episodes under global ids."""
        members = self.catalog.members
        self.meta: DatasetMeta | MixtureMeta
        """The dataset's metadata, as LeRobot's ``LeRobotDatasetMetadata`` gives it (a
        mixture's: :class:`MixtureMeta`; under a target layout: ``LayoutMeta``)."""
        self.item_cameras: dict[str, tuple[str, tuple[int, ...]]]
        """Each camera key of the items, its ``(dtype, shape)``: what a batch's frames take (a
        target layout's slots, whichever datasets fill them)."""
        self.meta, self.item_cameras = self._open_meta(members, options)
        self.shuffle = shuffle
        if int(seed) < 0:  # numpy's generators would refuse it only at the first iteration
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.seed = int(seed)
        self.buffer_size = int(buffer_size)
        self.byte_budget = None if byte_budget_gb is None else int(byte_budget_gb * GB)
        if frame_cache_gb < 0:
            raise ValueError(f"frame_cache_gb must be non-negative, got {frame_cache_gb}")
        self.frame_cache = int(frame_cache_gb * GB)
        self.repeat = repeat
        self.pad = pad
        self.video_backend = video_backend
        self.num_workers = 0
        self._node_affinity_arg = node_affinity
        self._node_affinity: bool | None = None
        self._budget(1, world_size=1)  # refuses an episode larger than the whole budget
        cat = self.catalog
        frames = [int(m.selection.lengths.sum()) for m in members]
        self.samples_per_dataset = samples_per_dataset(frames, weights, epoch_size)
        """Samples each dataset contributes to an epoch."""
        epoch_units = None
        if self.samples_per_dataset.tolist() != frames:
            plan = MixturePlan(
                cat.episodes_of,
                [m.selection.lengths for m in members],
                self.samples_per_dataset,
                seed=self.seed,
                shuffle=shuffle,
            )
            epoch_units = plan.units
        self._planner = Planner(cat.episodes, cat.lengths, cat.cost, epoch_units)
        if cache is None:  # a folder given, or a root fetched from elsewhere
            cache = cache_dir is not None or any(not m.is_local for m in members)
        self.cache: CachedReads | None = None
        """The node-local episode cache this dataset reads through (None: uncached)."""
        if cache:
            limit = None if cache_limit_gb is None else int(cache_limit_gb * GB)
            self.cache = CachedReads(cache_dir or default_cache_dir(), limit)
        weighting = None if epoch_units is None else self.samples_per_dataset.tolist()
        self._fingerprint: str | list[int] | None = weighting
        """The fingerprint, or until first asked for, what it is made of beside the catalog."""
        self._position = Position()
        self._worker_epochs = WorkerEpochs()
        """What fresh DataLoader workers share with this dataset (``worker_epochs`` says why)."""
        self._stats = {
            "peak_budget_bytes": 0,
            "peak_resident_memory": 0,
            "peak_frame_cache_bytes": 0,
            "frames_from_cache": 0,
        }

    def _open_meta(
        self, members: Sequence[Member], options: ItemOptions
    ) -> tuple[DatasetMeta | MixtureMeta, dict[str, tuple[str, tuple[int, ...]]]]:
        """The reader's metadata and its items' cameras; a mixture whose items would not batch
        is refused here."""
        schemas = [item_schema(m.meta.features, m.spec) for m in members]
        cameras = members[0].spec.output_camera_keys
        if self.layout is not None:
            placements = place_members(self.layout, members, options.steps, options.return_uint8)
            for member, placement in zip(members, placements, strict=True):
                member.placement = placement
            schemas = [p.schema(s) for s, p in zip(schemas, placements, strict=True)]
            cameras = list(self.layout.cameras)
        item_cameras = {key: schemas[0][key] for key in cameras if key in schemas[0]}
        if self.layout is not None:
            check_batchable(schemas, [m.root for m in members])
            return LayoutMeta([m.meta for m in members], placements, self.layout), item_cameras
        if not self.is_mixture:
            return members[0].meta, item_cameras
        check_batchable(schemas, [m.root for m in members])
        meta = MixtureMeta([m.meta for m in members], [m.spec.key_map for m in members])
        return meta, item_cameras

    @property
    def datasets(self) -> list[Member]:
        """The opened datasets (one, or a mixture's in order): each one's ``root``, ``meta``,
        ``selection`` and item ``spec``."""
        return self.catalog.members

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The (first) dataset's filesystem, made anew in each process."""
        return self.catalog.members[0].fs

    @property
    def selection(self) -> Selection:
        """The (first) dataset's selected manifest rows."""
        return self.catalog.members[0].selection

    @property
    def spec(self) -> ItemSpec:
        """How the (first) dataset's items are shaped."""
        return self.catalog.members[0].spec

    @property
    def manifest(self) -> pa.Table:
        """The manifest rows of the selected episodes, in episode order (of the first dataset
        of a mixture: each one's is ``ds.datasets[d].selection.table``), made from what the
        dataset keeps on each call (``reader/meta/selection.py``)."""
        return self.selection.table

    @property
    def num_frames(self) -> int:
        """Frames of the selected episodes (of every dataset of a mixture)."""
        return int(self.catalog.lengths.sum())

    @property
    def epoch_samples(self) -> int:
        """Samples per epoch over all ranks, padding aside: ``num_frames`` unless a mixture's
        ``weights`` or ``epoch_size`` say otherwise."""
        return int(self.samples_per_dataset.sum())

    @property
    def num_episodes(self) -> int:
        """Selected episodes (of every dataset of a mixture)."""
        return len(self.catalog.episodes)

    @property
    def episodes(self) -> list[int]:
        """The selected episode indices, ascending (of the first dataset of a mixture)."""
        return self.selection.episodes.tolist()

    @property
    def fingerprint(self) -> str:
        """``manifest_fingerprint`` of the selected episodes' manifest rows; of a mixture, a
        digest of every dataset's and of the samples each contributes per epoch. Made when
        first asked for (a state to save or load), not when the dataset is opened."""
        if not isinstance(self._fingerprint, str):
            self._fingerprint = self.catalog.fingerprint(self._fingerprint)
        return self._fingerprint

    @property
    def node_affinity(self) -> bool:
        """Whether each node reads the same episodes every epoch (the argument, or what
        :meth:`_resolve_node_affinity` decides, once)."""
        if self._node_affinity is None:
            self._node_affinity = self._resolve_node_affinity()
        return self._node_affinity

    def _resolve_node_affinity(self) -> bool:
        """``node_affinity`` as given; None (auto): a cache in use on more than one node that
        an explicit limit does not make large enough for the whole dataset."""
        if self._node_affinity_arg is not None:
            return bool(self._node_affinity_arg)
        if self.cache is None:
            return False
        limit = self.cache.limit_bytes
        if limit is not None and limit >= int(self.catalog.sizes.sum()):
            return False
        why = (
            "node_affinity=None (on with a cache on several nodes; pass node_affinity=False, "
            "--no-node-affinity, to do without)"
        )
        return self._world().require_nodes(why).count > 1

    def __len__(self) -> int:
        """Samples this rank yields per epoch, over all its DataLoader workers."""
        return sum(self._rank_samples(self.pad))

    @property
    def padding(self) -> int:
        """How many of this rank's samples per epoch are padding (repeats of its own frames)."""
        return len(self) - sum(self._rank_samples(False))

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
        self._position.set_epoch(epoch)
        self._worker_epochs.moved_here()
        if get_worker_info() is None:  # settled before any DataLoader worker starts from here
            self._world()

    def begin_epoch(self) -> None:
        """Record that DataLoader workers began iterating from this dataset's next position
        (the next epoch, or the rest of a loaded state), so that ``state_dict(num_samples=...)``
        counts from there. :class:`ShardedDataLoader` calls it; a loop with its own DataLoader
        that takes states calls it after each ``iter(loader)`` (or ``set_epoch`` before)."""
        self._position.begin_elsewhere()
        self._worker_epochs.moved_here()

    def state_dict(
        self,
        num_samples: int | None = None,
        batch_size: int | None = None,
        *,
        mixed_batches: bool = False,
    ) -> dict[str, Any]:
        """What the consumer has taken, in the state format of ``reader/plan/state.py``.

        ``num_samples``: with DataLoader workers, the samples the training loop took since the
        DataLoader's iterator started (and ``batch_size`` its batch size, None counting as 1);
        set ``ds.num_workers`` to the loader's ``num_workers`` so the state records it (an
        elastic resume needs it). Without it, what this object yielded (direct iteration), or,
        inside a DataLoader worker (torchdata's StatefulDataLoader), that worker's own position.
        ``mixed_batches``: the batches took every worker's samples in turn (what a
        :class:`ShardedDataLoader` that mixes says; a plain DataLoader's batches do not).
        """
        ctx = self._context(mixed_batches)
        if num_samples is not None and not ctx.in_worker:
            self._worker_epochs.check_state()
        return self._position.state(
            ctx, self.fingerprint, num_samples, batch_size, self.num_workers
        )

    def load_state_dict(self, state: Mapping[str, Any], *, mixed_batches: bool = False) -> None:
        """Make the next iteration yield exactly what followed the state's position.

        A state taken under another layout (world size, DataLoader workers) or other ordering
        settings resumes elastically: the rest of its epoch, split over this layout.
        ``mixed_batches``: the next iteration's batches take every worker's samples in turn
        (a :class:`ShardedDataLoader` that mixes passes it; load through it).
        """
        where = f"{self.root} (with {self.num_episodes} selected episodes)"
        ctx = self._context(mixed_batches)
        first = part_index(self._world().rank, ctx.world_size, 0, ctx.workers)[0]
        self._position.load(state, ctx, self.fingerprint, self._planner, where, first)
        self._worker_epochs.moved_here()

    # ------------------------------------------------------------------ iteration

    def __iter__(self) -> Iterator[dict]:
        return self._iterate(None)

    def segments(self, mixing: Mixing) -> Iterator[Segment]:
        """In a :class:`ShardedDataLoader`'s DataLoader worker whose batches mix every worker's
        samples: this worker's rows of each batch (``reader/loading/mixed.py``)."""
        if get_worker_info() is None:
            raise RuntimeError("segments of mixed batches are made in DataLoader workers")
        return self._iterate(mixing)

    def _iterate(self, mixing: Mixing | None) -> Iterator[Any]:
        """This process's stream: items, or with ``mixing``, its segments of mixed batches."""
        in_worker = get_worker_info() is not None
        if in_worker:
            tune_worker_malloc()  # allocator.py says why
            freeze_inherited_objects()  # inherited.py says why
        ctx = self._context(mixing is not None)
        refuse_accelerate_resharding(ctx.world_size)
        if in_worker and self.num_workers not in (0, ctx.workers):
            raise ValueError(
                f"ds.num_workers is {self.num_workers} but the DataLoader has {ctx.workers} "
                f"workers: set ds.num_workers = {ctx.workers}, or use "
                "lerobot_shards.ShardedDataLoader, which sets it"
            )
        if not in_worker:
            self._worker_epochs.moved_here()  # this iteration advances what fresh workers copy
        elif self._worker_epochs.fresh:  # skip what earlier iterations of fresh workers ran
            info = get_worker_info()
            token = info.seed - info.id  # the DataLoader's base seed, drawn for each iteration
            for _ in range(self._worker_epochs.catch_up(info.id, token)):
                self._position.begin_elsewhere()
        rank = self._world().rank
        budget = self._budget(ctx.workers)
        if ctx.worker == 0:  # the workers' shares are equal: one warning says it for all
            budget.warn_if_small()
        first = part_index(rank, ctx.world_size, 0, ctx.workers)[0]
        recorded = ctx.workers if in_worker else self.num_workers
        part, following, cursor = self._position.start(ctx, self._planner, first, recorded)
        options = StreamOptions(
            backend=self.video_backend,
            decode_threads=self._decode_threads(ctx.workers if in_worker else 1),
            decode_ahead=self.decode_ahead,
            frame_lookahead=self.frame_lookahead,
            prefetch_depth=self.prefetch_depth,
            fetch_threads=self.fetch_threads,
            fetch_retries=self.fetch_retries,
            shared_batches=in_worker and self.video_backend == "pyav",
            warm_draws=0 if ctx.ordering.repeat else self.warm_draws,
        )
        planner, ordering, nodes = self._planner, ctx.ordering, ctx.nodes
        num_parts, index = ctx.world_size * ctx.workers, first + ctx.worker

        def next_part() -> Part:  # the next epoch's fresh part, as the next iteration plans it
            return planner.fresh_part(ordering, num_parts, part.epoch + 1, index, nodes)

        self.catalog.resolve_filesystems()
        node = None
        if self.cache is not None:
            node = self._node_schedule(ctx, cursor.origin, (part.epoch, cursor.offset))
        trace = None
        if self.trace_dir is not None:
            trace = TraceWriter(self.trace_dir, f"rank {rank} worker {ctx.worker}")
        arena = None
        if mixing is not None:
            interleave = cursor.interleave
            if interleave is None:
                raise RuntimeError("mixed batches need two DataLoader workers or more")
            writer = ring_writer(mixing.ring)
            arena = RowArena(
                writer,
                interleave.places(ctx.worker, mixing.batch_size),
                0 if writer is None else writer.base(),
                decode_into=options.shared_batches,
            )
        items = stream_part(
            part,
            following,
            cursor,
            ordering=cursor.ordering,
            next_ordering=ordering,
            catalog=self.catalog,
            cache_bytes=budget.cache,
            options=options,
            stats=self._stats,
            trace=trace,
            next_part=next_part,
            node=node,
            place=None if arena is None else arena.slots,
        )
        if mixing is None:
            return items
        return segments(items, arena, interleave, mixing.batch_size)

    def fill_cache(
        self,
        epoch: int | None = None,
        threads: int = 8,
        progress: bool = True,
        world: World | None = None,
        state: Mapping[str, Any] | None = None,
    ) -> tuple[int, int]:
        """Download ahead, into the cache, what this process's node reads first: every rank
        and DataLoader worker of the node (``ds.num_workers`` of them per rank), soonest
        first, as far as the cache admits it, up to the end of the epoch. Run it once per node
        before training (``lerobot-shards cache fill``) so the first epoch reads locally.

        Args:
            epoch: a fresh epoch to fill from its start; None: what the next iteration reads
                (``set_epoch``'s epoch, or the rest of a state loaded with
                ``load_state_dict``).
            threads: downloads at once.
            progress: show a progress bar.
            world: the job's ranks and nodes, and which of them this process fills for (a
                process outside the job, as ``cache fill`` is); default: this process's.
            state: a state the job resumes from (``load_state_dict``'s): the rest of its epoch
                is filled, as a loader that batches as the state's did resumes it.

        Returns:
            ``(episodes, bytes)`` read through the cache.
        """
        if self.cache is None:
            raise ValueError("fill_cache needs a cache: pass cache=True or a cache_dir")
        if world is not None:
            self._known_world = (world, True)
            self._node_affinity = None  # decided again, for that world
        # the job resumes through a loader that batches as the one that took the state did
        mixed = state is not None and bool(state.get("mixed_batches", False))
        if state is not None:
            self.load_state_dict(state, mixed_batches=mixed)
        elif epoch is not None:
            self.set_epoch(epoch)
        ctx = self._context(mixed)
        first = part_index(self._world().rank, ctx.world_size, 0, ctx.workers)[0]
        position = copy.deepcopy(self._position)  # where the job starts; this one stays
        part, _, cursor = position.start(ctx, self._planner, first, ctx.workers)
        schedule = self._node_schedule(ctx, cursor.origin, (part.epoch, cursor.offset))
        return schedule.fill(part.epoch, threads, progress)

    def _node_schedule(
        self, ctx: Context, origin: Checkpoint | None = None, start: tuple[int, int] = (0, 0)
    ) -> NodeSchedule:
        """When each entry is read on this rank's node (every rank and worker of it), for a
        stream that starts at ``start`` (``(epoch, draws)``) of the rest planned from
        ``origin`` (or of fresh epochs)."""
        on_node = self._world().node_parts(ctx.workers)
        parts = ctx.world_size * ctx.workers
        return NodeSchedule(
            self.cache,
            self._planner,
            ctx.ordering,
            parts,
            ctx.nodes,
            on_node,
            self.catalog,
            origin=origin,
            start=start,
        )

    # ------------------------------------------------------------------ layout and budget

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for spawn/forkserver DataLoader workers: the world is settled here, in the
        training process, where torch.distributed (or the environment) knows it."""
        state = dict(self.__dict__)
        world = self._world()
        refuse_accelerate_resharding(world.world_size)
        state["_known_world"] = (world, True)
        state["_node_affinity"] = self.node_affinity
        return state

    def _world(self) -> World:
        """This process's :class:`World` (``world.py``): settled in the training process at
        the first call that needs it (again if a process group appeared since); a DataLoader
        worker's is the one its training process settled before the worker started."""
        known = self.__dict__.get("_known_world")
        if get_worker_info() is not None:
            return known[0] if known is not None else worker_world()
        grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
        if known is None or (grouped and not known[1]):
            known = (current_world(need_nodes=self._needs_nodes()), grouped)
            self._known_world = known
        return known[0]

    def _needs_nodes(self) -> bool:
        """Whether the nodes matter here: for node affinity, or for what a cache keeps."""
        return self.cache is not None or bool(self._node_affinity_arg)

    def _order_nodes(self, world: World) -> Nodes:
        """The nodes a fresh epoch is shared out over: the ranks' with node affinity, else one."""
        if self.node_affinity:
            return world.require_nodes("node_affinity=True")
        return Nodes.one(world.world_size)

    def _workers(self) -> tuple[int, int]:
        """``(worker_id, num_workers)`` of the calling process (``num_workers`` at least 1)."""
        info = get_worker_info()
        if info is None:
            return 0, max(1, self.num_workers)
        return info.id, info.num_workers

    def _rank_samples(self, pad: bool) -> list[int]:
        """Samples each of this rank's parts yields per epoch (``pad``: with padding)."""
        world, (_, workers) = self._world(), self._workers()
        num_parts = world.world_size * workers
        groups = None
        if not pad and self.node_affinity:  # padded parts are equal whatever the nodes
            groups = self._order_nodes(world).part_groups(workers)
        samples = samples_per_part(self.epoch_samples, num_parts, pad, groups)
        first = part_index(world.rank, world.world_size, 0, workers)[0]
        return samples[first : first + workers]

    def _budget(self, workers: int, world_size: int | None = None) -> PoolBudget:
        """Each part's pool budget and frame cache under ``workers`` DataLoader workers per rank
        (``pool_budget.split_budget``): each worker holds its own pool and cache."""
        workers = max(1, workers)
        if world_size is None:
            world_size = self._world().world_size
        return split_budget(
            self.byte_budget,
            self.frame_cache,
            workers=workers,
            num_parts=world_size * workers,
            episode_bytes=self.catalog.sizes,
            episodes=self.catalog.episodes,
            buffer_size=self.buffer_size,
            name=self.catalog.describe,
        )

    def _context(self, mixed_batches: bool = False) -> Context:
        """This process's layout and order settings, what states are taken and loaded against
        (``mixed_batches``: by a loader whose batches take every worker's samples in turn)."""
        world, (worker, workers) = self._world(), self._workers()
        budget = self._budget(workers).pool
        ordering = Ordering(
            self.seed,
            self.shuffle,
            self.buffer_size,
            budget,
            self.pad,
            self.repeat,
            self.node_affinity,
        )
        in_worker = get_worker_info() is not None
        nodes = self._order_nodes(world)
        return Context(world.world_size, worker, workers, in_worker, ordering, nodes, mixed_batches)

    def _decode_threads(self, processes: int) -> int:
        if self.video_backend != "pyav" or not any(m.spec.video_keys for m in self.datasets):
            return 0
        return decode_thread_count(self.decode_threads, processes)

    def __repr__(self) -> str:
        if self.is_mixture:
            return (
                f"ShardedLeRobotDataset({len(self.datasets)} datasets, {self.num_episodes} "
                f"episodes, {self.num_frames} frames, {self.epoch_samples} samples per epoch)"
            )
        return (
            f"ShardedLeRobotDataset({self.root!r}, {self.num_episodes} episodes, "
            f"{self.num_frames} frames, fps={self.meta.fps})"
        )
