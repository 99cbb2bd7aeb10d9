"""Reading LeRobot datasets (codebase v3.0 and v2.1) as they are on the Hub, local or via fsspec.

``open_source(root)`` gives a :class:`Source`: metadata, the episode table, each episode's rows
and where each camera's frames are. :class:`LeRobotSource` is the map-style reference loader
whose items equal LeRobot's own ``LeRobotDataset.__getitem__``.
"""

from lerobot_shards.source.dataset import LeRobotSource
from lerobot_shards.source.layout import (
    EpisodeInfo,
    Source,
    SourceError,
    VideoSpan,
    open_source,
)
from lerobot_shards.source.video import FrameNotFoundError

__all__ = [
    "EpisodeInfo",
    "FrameNotFoundError",
    "LeRobotSource",
    "Source",
    "SourceError",
    "VideoSpan",
    "open_source",
]
