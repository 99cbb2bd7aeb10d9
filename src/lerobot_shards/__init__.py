"""lerobot-shards: per-episode tar shards of LeRobot datasets and an exact-coverage loader."""

__version__ = "0.1.0"

_LAZY = {
    "convert": "lerobot_shards.converter.run",
    "ShardedLeRobotDataset": "lerobot_shards.reader.loading.dataset",
    "DatasetRoot": "lerobot_shards.reader.meta.catalog",
    "ShardedDataLoader": "lerobot_shards.reader.loading.loader",
    "collate": "lerobot_shards.reader.batches.collate",
    "to_device": "lerobot_shards.reader.loading.device_feed",
    "DeviceFeed": "lerobot_shards.reader.loading.device_feed",
    "suggested_workers": "lerobot_shards.reader.loading.cpu",
    "SmallPoolWarning": "lerobot_shards.reader.plan.pool_budget",
    "UncheckedStateWarning": "lerobot_shards.reader.plan.state",
    "MissingStatsWarning": "lerobot_shards.validate",
}


def __getattr__(name: str):
    """Import public entry points on first use (``import lerobot_shards`` stays light)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lerobot_shards' has no attribute {name!r}")
