"""The datasets a reader streams: one converted dataset, or the members of a mixture.

Each member is opened (its ``index.json``, manifest and metadata read, concurrently over
members) and gets its own item shape (``ItemSpec``: its fps resolves ``delta_timestamps``, its
``key_map`` renames its keys). The planner knows episodes only by *global* ids: member ``d``'s
episode ``e`` is ``offset[d] + e`` (offset 0 for the first member, so one dataset keeps its own
episode indices). The catalog turns a global id back into the member and episode to fetch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import fsspec
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.depth import DEFAULT_DEPTH_UNIT, rescale_stats
from lerobot_shards.format import MANIFEST_FILE, join, read_large
from lerobot_shards.items import ItemSpec, delta_indices
from lerobot_shards.reader.fetch.ranged import RetryingReads, read_span
from lerobot_shards.reader.frames.episode import Episode, load_episode
from lerobot_shards.reader.frames.resize import Resize
from lerobot_shards.reader.meta.embodiment import TargetLayout
from lerobot_shards.reader.meta.metadata import DatasetMeta, read_meta
from lerobot_shards.reader.meta.placement import Placement, default_name, layout_key_map
from lerobot_shards.reader.meta.selection import read_selection
from lerobot_shards.validate import check_totals, frame_size, read_index

SpanRead = Callable[..., bytes | memoryview]
"""``read(fs, span, retries=...)``: an episode span's verified bytes (``ranged.read_span``)."""
OPEN_THREADS = 32
"""Members opened at once (their small metadata files are read concurrently)."""

_INHERITED: list[fsspec.AbstractFileSystem] = []
"""Filesystems a forked process inherited from its parent: kept alive, never used, never
closed. Dropped, an s3fs instance is finalized in the child; when that happens on the child's
fsspec I/O thread (where most of a fetching worker's garbage is made), it closes the parent's
aiohttp connections, unregistering their sockets from the epoll instance parent and child
share: the parent's next read on one waits for its read timeout (15 s) before s3fs retries."""


@dataclass(frozen=True)
class DatasetRoot:
    """One dataset of a mixture, with what is its own (``ShardedLeRobotDataset([DatasetRoot(...),
    ...])``).

    Args:
        root: A local path or fsspec URL of a converted dataset.
        episodes: The episode indices to read from it; None reads all.
        storage_options: fsspec options for its filesystem; None takes the mixture's
            (``ShardedLeRobotDataset``'s ``storage_options``).
        key_map: Its keys renamed onto the mixture's common names, ``{"its key": "common
            key"}``; a key mapped to None is dropped (a dropped camera is never decoded).
            Keys not named keep their names.
        name: Under a target layout (``docs/embodiments.md``), its name in items and
            statistics; None: the last part of ``root``.
        embodiment: Under a target layout, its robot, whose mapping the layout gives; None:
            its ``robot_type``, else its name.
    """

    root: str | os.PathLike
    episodes: Sequence[int] | None = None
    storage_options: Mapping | None = None
    key_map: Mapping[str, str | None] = field(default_factory=dict)
    name: str | None = None
    embodiment: str | None = None


def as_sources(
    root: str | os.PathLike | DatasetRoot | Sequence[str | os.PathLike | DatasetRoot],
    episodes: Sequence[int] | None,
) -> tuple[list[DatasetRoot], bool]:
    """The datasets ``root`` names, and whether it is a mixture (a list, even of one)."""
    mixture = not isinstance(root, (str, os.PathLike, DatasetRoot))
    sources = list(root) if mixture else [root]
    if not sources:
        raise ValueError("a mixture needs at least one dataset")
    sources = [s if isinstance(s, DatasetRoot) else DatasetRoot(s) for s in sources]
    if episodes is not None:
        if mixture:
            raise ValueError(
                "episodes= selects one dataset's episodes: give each dataset of a mixture its "
                "own with DatasetRoot(root, episodes=...)"
            )
        sources = [dataclasses.replace(sources[0], episodes=episodes)]
    return sources, mixture


@dataclass
class ItemOptions:
    """The item options every member shares (``ShardedLeRobotDataset``'s)."""

    delta_timestamps: Mapping[str, Sequence[float]] | None
    tolerance_s: float
    return_uint8: bool
    image_transforms: Callable | None
    depth_output_unit: str = DEFAULT_DEPTH_UNIT
    delta_indices: Mapping[str, Sequence[int]] | None = None
    """Neighbours in steps (frames at the dataset's own rate), not seconds."""
    layout: TargetLayout | None = None

    def __post_init__(self) -> None:
        both = sorted(set(self.delta_timestamps or {}) & set(self.delta_indices or {}))
        if both:
            raise ValueError(f"{both} are in both delta_timestamps and delta_indices: give one")

    @property
    def steps(self) -> dict[str, int]:
        """How many neighbours each key with deltas stacks."""
        deltas = {**(self.delta_timestamps or {}), **(self.delta_indices or {})}
        return {key: len(list(values)) for key, values in deltas.items()}


class Member:
    """One opened dataset: its selection, metadata and item shape, and its filesystem (made
    anew in each process: async ones hold an event loop that does not survive a fork)."""

    def __init__(
        self,
        source: DatasetRoot,
        storage_options: Mapping | None,
        options: ItemOptions,
        dataset_index: int | None,
    ) -> None:
        self.root = str(source.root)
        self.storage_options = dict(
            source.storage_options if source.storage_options is not None else storage_options or {}
        )
        self._fs, self.path = fsspec.core.url_to_fs(self.root, **self.storage_options)
        self._fs_pid = os.getpid()
        fs = RetryingReads(self._fs)  # a flaky store fails small files too
        index = read_index(fs, self.path)  # first: it says whether this is a dataset
        where = join(self.path, MANIFEST_FILE)
        self.selection, every = read_selection(
            read_large(fs, where), where, self.path, source.episodes, self.root, index.video_keys
        )
        numbers = every.table()
        check_totals(index, numbers, self.root)
        self.meta: DatasetMeta = read_meta(fs, self.path, index, numbers, self.root, every.shard)
        self.id_span = int(every.episodes.max(initial=-1)) + 1
        """One past the largest episode index of the manifest (selected or not)."""
        if self.meta.stats is not None:  # depth maps' in the unit they are returned in
            unit = options.depth_output_unit
            self.meta.stats = rescale_stats(self.meta.stats, self.meta.features, unit)
        self.name = source.name or default_name(self.root)
        self.embodiment = source.embodiment or self.meta.robot_type or self.name
        key_map = self.own_key_map = dict(source.key_map)
        unknown = sorted(set(key_map) - set(self.meta.features) - {"task"})
        if unknown:
            raise ValueError(f"key_map of {self.root}: {unknown} are not its features")
        layout = options.layout
        if layout is not None:  # every feature onto the layout, or left out
            where = f"{self.root} (embodiment {self.embodiment!r})"
            key_map = layout_key_map(layout, self.embodiment, self.meta.features, key_map, where)
        # delta_timestamps name the items' keys: through key_map, this dataset's own features
        own_key = {key_map.get(k, k): k for k in self.meta.features if key_map.get(k, k)}
        if len(own_key) != sum(1 for k in self.meta.features if key_map.get(k, k)):
            raise ValueError(f"key_map of {self.root} gives two of its features the same name")
        self.tolerance_s = options.tolerance_s
        deltas = self._deltas(options, own_key)
        self.spec = ItemSpec(
            video_keys=[k for k in self.meta.video_keys if key_map.get(k, k) is not None],
            image_keys=list(self.meta.image_keys),
            deltas=deltas,
            return_uint8=options.return_uint8,
            image_transforms=options.image_transforms,
            key_map=key_map,
            dataset_index=dataset_index,
            depth_keys=frozenset(self.meta.depth_keys),
            depth_output_unit=options.depth_output_unit,
            uint8_images=layout is not None,
        )
        resize = None if layout is None else layout.frame_resize
        self.resize: dict[str, Resize] = {
            key: resize
            for key in self.spec.camera_keys
            if resize is not None and frame_size(self.meta.features[key]) != resize.shape[:2]
        }
        """Each camera's resize (a layout's ``image_size``; none where it is the frames')."""
        self.placement: Placement | None = None
        """Where its items go in a target layout (set when the mixture is opened)."""

    def _deltas(self, options: ItemOptions, own_key: Mapping[str, str]) -> dict[str, np.ndarray]:
        """The frame offsets of ``delta_timestamps`` (resolved at this dataset's fps) and of
        ``delta_indices``, by this dataset's own keys (``own_key``: item key to own key). A
        layout's key this dataset lacks is left to the placement (zeros, all padding)."""
        layout_keys = set() if options.layout is None else {
            *options.layout.vectors, *options.layout.cameras
        }  # fmt: skip
        out: dict[str, np.ndarray] = {}
        for name, given in (
            ("delta_timestamps", options.delta_timestamps),
            ("delta_indices", options.delta_indices),
        ):
            given = {  # a layout's key this dataset lacks: left to the placement
                k: v for k, v in dict(given or {}).items() if k in own_key or k not in layout_keys
            }
            unknown = sorted(set(given) - set(own_key))
            if unknown:
                raise ValueError(f"{name} keys {unknown} are not features of {self.root}")
            resolved = {own_key[key]: value for key, value in given.items()}
            if name == "delta_indices":
                out.update({k: np.asarray(list(v), dtype=np.int64) for k, v in resolved.items()})
                continue
            try:  # the fps is the dataset's: a delta it cannot resolve is a problem of this one
                out.update(delta_indices(resolved, self.meta.fps, self.tolerance_s))
            except ValueError as exc:
                raise ValueError(f"{self.root}: {exc}") from exc
        return out

    @property
    def is_local(self) -> bool:
        """Whether the dataset is on a local (or mounted) filesystem, not fetched remotely."""
        return isinstance(self._fs, LocalFileSystem)

    @property
    def fs(self) -> fsspec.AbstractFileSystem:
        """This process's filesystem: made anew after a fork or unpickling; an inherited one is
        kept, not dropped (``_INHERITED`` says why)."""
        if self._fs_pid != os.getpid():
            inherited = self._fs
            self._fs = fsspec.core.url_to_fs(self.root, **self.storage_options)[0]
            if inherited is not self._fs and not any(inherited is f for f in _INHERITED):
                _INHERITED.append(inherited)
            self._fs_pid = os.getpid()
        return self._fs

    def fetch(
        self, episode: int, backend: str, retries: int, read: SpanRead = read_span
    ) -> Episode:
        """Fetch, verify and demux ``episode`` (in prefetch threads); frames decode when drawn.
        ``read`` reads its verified bytes (through the node's cache: ``fetch/cached.py``)."""
        selection = self.selection
        span = selection.span(episode)
        return load_episode(
            read(self.fs, span, retries=retries),
            selection.members(episode),
            episode_index=episode,
            length=selection.length(episode),
            dataset_from_index=selection.start(episode),
            shard=span.path,
            spec=self.spec,
            features=self.meta.features,
            tasks=self.meta.task_names,
            fps=self.meta.fps,
            tolerance_s=self.tolerance_s,
            backend=backend,
            resize=self.resize,
        )


class Catalog:
    """The members a reader streams and their episodes under global ids."""

    def __init__(self, members: Sequence[Member]) -> None:
        self.members = list(members)
        spans = [m.id_span for m in self.members]
        self.offsets = np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64)
        self.episodes_of = [
            m.selection.episodes + o if o else m.selection.episodes
            for m, o in zip(self.members, self.offsets, strict=True)
        ]
        self.episodes = _joined(self.episodes_of)
        self.lengths = _joined([m.selection.lengths for m in self.members])
        self.sizes = _joined([m.selection.sizes for m in self.members])

    @classmethod
    def open(
        cls,
        sources: Sequence[DatasetRoot],
        storage_options: Mapping | None,
        options: ItemOptions,
        mixture: bool,
    ) -> Catalog:
        """Open every source, concurrently; ``mixture`` (or a target layout) adds
        ``dataset_index`` to items."""
        indexed = mixture or options.layout is not None

        def open_one(d: int) -> Member:
            return Member(sources[d], storage_options, options, d if indexed else None)

        if len(sources) == 1:
            return cls([open_one(0)])
        with ThreadPoolExecutor(min(OPEN_THREADS, len(sources))) as pool:
            return cls(list(pool.map(open_one, range(len(sources)))))

    def resolve_filesystems(self) -> None:
        """Make each member's filesystem in the calling process (the iterating one), not in
        the fetch threads."""
        for member in self.members:
            member.fs  # noqa: B018 (made on first access in a process)

    def locate(self, episode: int) -> tuple[Member, int]:
        """The member and its own episode index of global episode id ``episode``."""
        d = int(np.searchsorted(self.offsets, episode, side="right")) - 1
        return self.members[d], int(episode - self.offsets[d])

    def member_indices(self, episodes: np.ndarray) -> np.ndarray:
        """The member (its place in ``members``) of each of the global episode ids
        ``episodes``: one search for a part's episodes, not one call each."""
        return np.searchsorted(self.offsets, episodes, side="right") - 1

    def describe(self, episode: int) -> str:
        """Global episode id ``episode`` as a user knows it: ``Episode e`` (of which dataset)."""
        member, own = self.locate(episode)
        if len(self.members) == 1:
            return f"Episode {own}"
        return f"Episode {own} of dataset {self.members.index(member)} ({member.root})"

    def lengths_of(self, episodes: np.ndarray) -> np.ndarray:
        """Frames of each of the global episode ids ``episodes`` (selected ones)."""
        return self.lengths[np.searchsorted(self.episodes, episodes)]

    def cost(self, episode: int, start: int, stop: int) -> int:
        """What a piece of global episode ``episode`` costs the pool budget while resident:
        its shard bytes, fetched whole whichever rows it draws (``Selection.cost``)."""
        return int(self.sizes[np.searchsorted(self.episodes, episode)])

    def fingerprint(self, extra: object = None) -> str:
        """One member: its selection's fingerprint (so its checkpoints stay valid); several:
        a digest of every member's, in order, and of ``extra`` (what else shapes the epoch)."""
        if len(self.members) == 1 and extra is None:
            return self.members[0].selection.fingerprint
        digest = hashlib.sha256()
        for member in self.members:
            digest.update(member.selection.fingerprint.encode())
        digest.update(repr(extra).encode())
        return f"mixture:{digest.hexdigest()}"


def _joined(arrays: list[np.ndarray]) -> np.ndarray:
    """One member's array itself (no copy of a million entries), several end to end."""
    if len(arrays) == 1:
        return arrays[0]
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
