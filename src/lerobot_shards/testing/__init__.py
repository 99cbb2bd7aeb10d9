"""Realistic LeRobot test datasets written without network or lerobot: see ``make_dataset``."""

from lerobot_shards.testing.content import action_value, frame_content, state_value
from lerobot_shards.testing.factory import (
    DEFAULT_CAMERAS,
    DEFAULT_EPISODE_LENGTHS,
    TASK_NAMES,
    default_tasks,
    make_dataset,
)

__all__ = [
    "DEFAULT_CAMERAS",
    "DEFAULT_EPISODE_LENGTHS",
    "TASK_NAMES",
    "action_value",
    "default_tasks",
    "frame_content",
    "make_dataset",
    "state_value",
]
