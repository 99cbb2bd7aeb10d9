"""``LeRobotSource``: the map-style reference loader, item for item LeRobot's own.

``source[i]`` equals ``lerobot.datasets.LeRobotDataset(...)[i]`` (LeRobot 0.6.1, same video
backend): the streaming reader is tested against it and benchmarked against it, so it keeps its
decoders and the last few episodes' rows open between items, as a fast map-style loader would.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from lerobot_shards.items import EpisodeColumns, ItemSpec, delta_indices
from lerobot_shards.source.layout import EpisodeInfo, Source, SourceError, open_source
from lerobot_shards.source.video import DecoderCache
from lerobot_shards.validate import canonical_rows, row_keys


class LeRobotSource(Dataset):
    """A LeRobot dataset (v3.0 or v2.1, local or any fsspec URL) as a map-style torch Dataset.

    ``delta_timestamps`` (seconds, multiples of 1/fps), ``tolerance_s``, ``image_transforms``
    and ``video_backend`` mean what they mean in LeRobot; ``return_uint8`` keeps video frames
    uint8 instead of float32 in [0, 1] (image features stay float32, as LeRobot returns them).
    Metadata mirrors ``LeRobotDataset.meta``.
    """

    def __init__(
        self,
        root: str,
        *,
        delta_timestamps: Mapping[str, Sequence[float]] | None = None,
        tolerance_s: float = 1e-4,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        return_uint8: bool = False,
        video_backend: str = "pyav",
        storage_options: dict | None = None,
        episode_cache_size: int = 4,
    ) -> None:
        self.source: Source = open_source(root, storage_options)
        self.root = root
        self.tolerance_s = tolerance_s
        self.video_backend = video_backend
        self.delta_timestamps = dict(delta_timestamps) if delta_timestamps else None
        unknown = set(self.delta_timestamps or ()) - set(self.features)
        if unknown:
            raise ValueError(f"delta_timestamps keys {sorted(unknown)} are not features of {root}")
        self.spec = ItemSpec(
            video_keys=list(self.source.video_keys),
            image_keys=list(self.source.image_keys),
            deltas=delta_indices(self.delta_timestamps, self.fps, tolerance_s),
            return_uint8=return_uint8,
            image_transforms=image_transforms,
        )
        self._decoders = DecoderCache(self.source, video_backend)
        self._starts = np.cumsum([0] + [ep.length for ep in self.episodes])
        self._columns: OrderedDict[int, EpisodeColumns] = OrderedDict()
        self._episode_cache_size = episode_cache_size

    # ------------------------------------------------------------ metadata (LeRobot's .meta)

    @property
    def meta(self) -> LeRobotSource:
        """LeRobot code reads metadata from ``dataset.meta``; here it is the dataset itself."""
        return self

    @property
    def fps(self) -> float:
        return self.source.fps

    @property
    def features(self) -> dict[str, Any]:
        return self.source.features

    @property
    def camera_keys(self) -> list[str]:
        return self.source.camera_keys

    @property
    def video_keys(self) -> list[str]:
        return self.source.video_keys

    @property
    def image_keys(self) -> list[str]:
        return self.source.image_keys

    @property
    def tasks(self) -> list[str]:
        return self.source.tasks

    @property
    def stats(self) -> dict[str, Any] | None:
        return self.source.stats

    @property
    def episodes(self) -> list[EpisodeInfo]:
        return self.source.episodes

    @property
    def total_frames(self) -> int:
        return self.source.total_frames

    @property
    def total_episodes(self) -> int:
        return len(self.source.episodes)

    @property
    def num_frames(self) -> int:
        return self.total_frames

    @property
    def num_episodes(self) -> int:
        return self.total_episodes

    # ------------------------------------------------------------ items

    def __len__(self) -> int:
        return self.total_frames

    def locate(self, index: int) -> tuple[EpisodeInfo, int]:
        """The episode holding global frame ``index`` and the frame's position in it."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} frames")
        index %= len(self)
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return self.episodes[k], index - int(self._starts[k])

    def __getitem__(self, index: int) -> dict[str, Any]:
        ep, position = self.locate(int(index))
        columns = self._episode_columns(ep)
        frames = {
            key: self._frames(ep, key, columns, positions)
            for key, positions in self.spec.video_positions(position, ep.length).items()
        }
        task_index = int(columns.value("task_index", position))
        return self.spec.build(columns, position, frames, self.tasks[task_index])

    def _episode_columns(self, ep: EpisodeInfo) -> EpisodeColumns:
        columns = self._columns.get(ep.episode_index)
        if columns is None:
            table = self.source.read_rows(ep.episode_index)
            where = f"{self.source.path(ep.data_path)} (episode {ep.episode_index})"
            table = canonical_rows(table, self.features, where)  # as LeRobot casts them
            present = [k for k in row_keys(self.source.features) if k in table.column_names]
            columns = EpisodeColumns.from_table(table.select(present), self.spec.image_keys)
            self._columns[ep.episode_index] = columns
            while len(self._columns) > self._episode_cache_size:
                self._columns.popitem(last=False)
        self._columns.move_to_end(ep.episode_index)
        return columns

    def _frames(
        self, ep: EpisodeInfo, key: str, columns: EpisodeColumns, positions: np.ndarray
    ) -> torch.Tensor:
        """uint8 NCHW frames of camera ``key`` at the rows ``positions`` of episode ``ep``."""
        span = ep.videos[key]
        # LeRobot: the row's float32 timestamp as a Python float, plus the episode's start.
        row_ts = columns.value("timestamp", positions).tolist()
        query = [span.from_timestamp + float(t) for t in row_ts]
        where = f"episode {ep.episode_index}, camera {key}"
        try:
            decoder = self._decoders.get(span.path)
        except FileNotFoundError as exc:
            raise SourceError(f"{exc}: video file not found ({where})") from None
        return decoder.frames_at(query, self.tolerance_s, where)

    def close(self) -> None:
        """Close the open video decoders (they reopen on the next item)."""
        self._decoders.close()

    def __repr__(self) -> str:
        return (
            f"LeRobotSource({self.root!r}, {self.source.codebase_version}, "
            f"{self.total_episodes} episodes, {self.total_frames} frames, fps={self.fps})"
        )
