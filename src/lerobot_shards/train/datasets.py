"""The train (and eval) datasets of a ``lerobot-shards train`` run: what LeRobot's
``make_train_eval_datasets(cfg)`` builds from the Hub, built from shards.

The settings LeRobot's factory reads from its config apply as it applies them:
``delta_timestamps`` resolved from the policy config (``resolve_delta_timestamps``, LeRobot's
own), ``--dataset.image_transforms.*``, ``--dataset.episodes``, ``--dataset.video_backend``,
``--tolerance_s``, ``--seed`` (the reader's order), uint8 frames (``return_uint8=True``, as the
factory asks; depth maps stay float32), ``--dataset.depth_output_unit`` (depth maps and their
statistics in millimetres or metres), ``--dataset.use_imagenet_stats``, and
``--dataset.eval_split``: the last
``ceil(n * eval_split)`` episodes of each task held out, as LeRobot holds them out. A setting
that cannot apply to the shards is refused, naming its flag.

With a target layout (``--layout``, a mixture across robots: ``docs/embodiments.md``), the
policy's features are the layout's (``LayoutMeta.features``) and its neighbours are the policy's
delta indices as steps at each dataset's own rate (``delta_indices``), not seconds at the first
dataset's.

LeRobot's helpers are imported where they are used: the refusals, the split and ``Shards`` are
pure, checked without LeRobot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lerobot_shards.reader.loading.dataset import ShardedLeRobotDataset
from lerobot_shards.reader.meta.catalog import DatasetRoot
from lerobot_shards.train.arguments import RefusedArgument


@dataclass(frozen=True)
class Shards:
    """What ``--shards`` and the reader's options of ``lerobot-shards train`` name: the
    converted datasets (several: a mixture, with ``weights``) and how to stream them."""

    roots: Sequence[str]
    weights: Sequence[float] | None = None
    storage_options: dict = field(default_factory=dict)
    buffer_size: int = 64
    byte_budget_gb: float | None = None
    cache: bool | None = None
    cache_dir: str | None = None
    cache_limit_gb: float | None = None
    node_affinity: bool | None = None
    layout: dict | None = None
    """The target layout (``TargetLayout.to_dict``): kept as data, so checkpoints hold it."""
    embodiments: Sequence[str] | None = None
    """Each root's embodiment under the layout (None: each dataset's ``robot_type``)."""

    def open(self, **options: Any) -> ShardedLeRobotDataset:
        """The reader over these shards, with the item ``options`` of a LeRobot dataset."""
        mixture = len(self.roots) > 1
        roots: list[Any] = list(self.roots)
        if self.embodiments is not None:
            roots = [
                DatasetRoot(root, embodiment=embodiment)
                for root, embodiment in zip(self.roots, self.embodiments, strict=True)
            ]
        return ShardedLeRobotDataset(
            roots if mixture else roots[0],
            layout=self.layout,
            weights=self.weights,
            storage_options=self.storage_options,
            buffer_size=self.buffer_size,
            byte_budget_gb=self.byte_budget_gb,
            cache=self.cache,
            cache_dir=self.cache_dir,
            cache_limit_gb=self.cache_limit_gb,
            node_affinity=self.node_affinity,
            return_uint8=True,
            **options,
        )


def check_config(cfg: Any, shards: Shards) -> None:
    """Refuse what LeRobot's config asks of its dataset that shards cannot give, naming the
    flag (a resumed ``train_config.json`` is checked too, not only the command line)."""
    data = cfg.dataset
    problems = {
        "--dataset.root": data.root is not None,
        "--dataset.revision": data.revision is not None,
        "--sample_weighting.type": getattr(cfg, "sample_weighting", None) is not None,
        # LeRobot picks these eval samples from a map-style dataset and ignores the flag for
        # any other: refused rather than evaluating on something else than asked.
        "--max_eval_samples": data.eval_split > 0 and cfg.max_eval_samples > 0,
        "--dataset.eval_split (with several --shards)": (
            data.eval_split > 0 and len(shards.roots) > 1
        ),
        "--dataset.episodes (with several --shards)": (
            data.episodes is not None and len(shards.roots) > 1
        ),
    }
    for flag, refused in problems.items():
        if refused:
            raise RefusedArgument(f"{flag} cannot apply to lerobot-shards train")


def split_by_task(
    episodes: Sequence[int], first_tasks: Sequence[str], eval_split: float
) -> tuple[list[int], list[int]]:
    """LeRobot's held-out split: per task (an episode's first task), in episode order, the last
    ``ceil(n * eval_split)`` episodes are for evaluation. Returns (train, eval), ascending."""
    by_task: dict[str, list[int]] = {}
    for episode, task in zip(episodes, first_tasks, strict=True):
        by_task.setdefault(task, []).append(episode)
    train: list[int] = []
    held_out: list[int] = []
    for group in by_task.values():
        n_eval = math.ceil(len(group) * eval_split)
        train.extend(group[: len(group) - n_eval])
        held_out.extend(group[len(group) - n_eval :])
    if not train:
        raise RefusedArgument(
            f"--dataset.eval_split={eval_split} leaves no training episode of {len(episodes)}"
        )
    return sorted(train), sorted(held_out)


def make_datasets(
    cfg: Any, shards: Shards
) -> tuple[ShardedLeRobotDataset, ShardedLeRobotDataset | None]:
    """The train dataset and, with ``--dataset.eval_split``, the eval dataset (every held-out
    frame once, unshuffled, unpadded, untransformed), as LeRobot's ``make_train_eval_datasets``
    returns them."""
    from lerobot.datasets.factory import resolve_delta_timestamps
    from lerobot.transforms import ImageTransforms

    check_config(cfg, shards)
    data = cfg.dataset
    full = shards.open(episodes=data.episodes)
    options = {
        **neighbours(resolve_delta_timestamps(cfg.trainable_config, full.meta), full, shards),
        "image_transforms": (
            ImageTransforms(data.image_transforms) if data.image_transforms.enable else None
        ),
        "tolerance_s": cfg.tolerance_s,
        "video_backend": data.video_backend,
        "depth_output_unit": data.depth_output_unit,
    }
    seed = 0 if cfg.seed is None else cfg.seed
    if data.eval_split == 0:
        train = shards.open(episodes=data.episodes, seed=seed, **options)
        held_out = None
    else:
        manifest = full.manifest
        first_tasks = [tasks[0] if tasks else "" for tasks in manifest["tasks"].to_pylist()]
        train_eps, eval_eps = split_by_task(
            manifest["episode_index"].to_pylist(), first_tasks, data.eval_split
        )
        train = shards.open(episodes=train_eps, seed=seed, **options)
        # LeRobot evaluates on untransformed frames.
        eval_options = {**options, "image_transforms": None}
        held_out = (
            shards.open(episodes=eval_eps, shuffle=False, pad=False, **eval_options)
            if eval_eps
            else None
        )
    if data.use_imagenet_stats:
        for ds in (train, held_out):
            if ds is not None:
                use_imagenet_stats(ds.meta)
    return train, held_out


def neighbours(
    delta_timestamps: dict[str, list] | None, full: ShardedLeRobotDataset, shards: Shards
) -> dict[str, Any]:
    """LeRobot's ``delta_timestamps`` (the policy's delta indices over the first dataset's
    fps); under a layout, those delta indices as ``delta_indices``: steps at each dataset's
    own rate (an action chunk of N steps whatever the fps)."""
    if shards.layout is None or delta_timestamps is None:
        return {"delta_timestamps": delta_timestamps}
    fps = full.meta.fps
    return {"delta_indices": {k: [round(t * fps) for t in v] for k, v in delta_timestamps.items()}}


def use_imagenet_stats(meta: Any) -> None:
    """ImageNet's mean and std for every camera but depth maps, as LeRobot's factory sets
    them (``--dataset.use_imagenet_stats``, on by default)."""
    from lerobot.utils.constants import IMAGENET_STATS

    if meta.stats is None:
        return
    for key in meta.camera_keys:
        if key in meta.depth_keys:
            continue
        for name, value in IMAGENET_STATS.items():
            meta.stats.setdefault(key, {})[name] = torch.tensor(value, dtype=torch.float32)
