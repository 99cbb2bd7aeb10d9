"""Reading LeRobot datasets (codebase v3.0 and v2.1) as they are on the Hub, local or via fsspec.

``open_source(root)`` gives a :class:`Source`: metadata, the episode table, each episode's rows
and where each camera's frames are. :class:`LeRobotSource` is the map-style reference loader
whose items equal LeRobot's own ``LeRobotDataset.__getitem__``.

The loader and the video decoders need torch and import on first use, so the converter, which
needs only the layout, starts without torch (and runs where torch is not installed).
"""

from lerobot_shards.source.layout import (
    EpisodeInfo,
    Source,
    SourceError,
    VideoSpan,
    open_source,
)

_LAZY = {
    "LeRobotSource": "lerobot_shards.source.dataset",
    "FrameNotFoundError": "lerobot_shards.source.video",
}

__all__ = [
    "EpisodeInfo",
    "FrameNotFoundError",
    "LeRobotSource",
    "Source",
    "SourceError",
    "VideoSpan",
    "open_source",
]


def __getattr__(name: str):
    """Import the torch-backed names on first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lerobot_shards.source' has no attribute {name!r}")
