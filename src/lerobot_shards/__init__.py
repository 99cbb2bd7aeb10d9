"""lerobot-shards: per-episode tar shards of LeRobot datasets and an exact-coverage loader."""

__version__ = "0.1.0"
