"""A mixture's metadata under a target layout: the layout's features (what a policy's inputs
and outputs are made from) and statistics kept per dataset, in the layout's slots.

LeRobot aggregates a mixture's statistics feature by feature, which is wrong when one dataset's
``action`` dim 3 is a gripper and another's an elbow. Here each dataset's own statistics are
kept, placed in its slots (``stats_by_dataset``; ``Placement.slot_stats``), and ``stats`` (what
LeRobot's one normaliser reads) is, per vector key:

- normalised in the reader (the layout's ``normalize``): the identity of every LeRobot
  normalisation (mean 0, std 1, min and q01/q10 -1, max and q90/q99 1), so LeRobot's
  normaliser leaves the reader's values, and the padded zeros, as they are;
- not normalised: each slot dim pooled, by LeRobot's rules (count-weighted mean, pooled
  variance, count-weighted quantiles), over the datasets with a real value there; a dim none
  has holds the identity.

Cameras and the index columns are aggregated as LeRobot aggregates them, per slot over the
datasets that fill it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lerobot_shards.reader.meta.embodiment import TargetLayout
from lerobot_shards.reader.meta.metadata import DatasetMeta, MixtureMeta
from lerobot_shards.reader.meta.placement import INDEX_COLUMNS, Placement, identity
from lerobot_shards.reader.meta.stats import aggregate_stats

CAMERA_NAMES = ["height", "width", "channels"]


class LayoutMeta(MixtureMeta):
    """A :class:`MixtureMeta` whose features are the layout's: each vector key float32 of its
    slot's width, each camera slot a video feature of the slot's size (``(H, W, 3)``), and the
    index columns. ``stats_by_dataset`` keeps each dataset's statistics in its slots (by name);
    ``dataset_names``, ``embodiments`` (each dataset's) and ``embodiment_names`` (the distinct
    ones, ``embodiment_index`` numbers them) say which is which."""

    def __init__(
        self,
        datasets: Sequence[DatasetMeta],
        placements: Sequence[Placement],
        layout: TargetLayout,
    ) -> None:
        self.layout = layout
        self.placements = list(placements)
        super().__init__(datasets, [p.key_map for p in self.placements])
        first = self.placements[0]
        features: dict[str, Any] = {}
        for slot in layout.cameras:
            height, width = first.slot_shapes[slot]
            features[slot] = {"dtype": "video", "shape": (height, width, 3), "names": CAMERA_NAMES}
        for key, vector in layout.vectors.items():
            names = list(vector.names) if vector.names is not None else None
            features[key] = {"dtype": "float32", "shape": (vector.width,), "names": names}
        own = self.datasets[0].features
        features.update({k: ft for k, ft in own.items() if k in INDEX_COLUMNS})
        self.features = features
        self.video_keys = list(layout.cameras)
        self.image_keys = []
        self.camera_keys = list(layout.cameras)
        self.depth_keys = []
        self.dataset_names = [p.name for p in self.placements]
        self.embodiments = [p.embodiment for p in self.placements]
        """Each dataset's embodiment, in the mixture's order."""
        self.embodiment_names = list(dict.fromkeys(self.embodiments))
        """The distinct embodiments: ``embodiment_index`` is a position in this list."""
        self.stats_by_dataset = {p.name: p.slot_stats() for p in self.placements}
        """Each dataset's vector statistics in its slots, by its name (``Placement.slot_stats``:
        padded dims hold the identity); what un-normalises one robot's actions."""

    def _combined_stats(self) -> dict[str, dict[str, Any]] | None:
        layout, placements = self.layout, self.placements
        with_stats = [(d, p) for d, p in zip(self.datasets, placements, strict=True) if d.stats]
        if not with_stats:
            return None
        maps = [  # cameras onto their slots and the index columns; vectors apart (below)
            {k: (None if v in layout.vectors else v) for k, v in p.key_map.items()}
            for _, p in with_stats
        ]
        stats = aggregate_stats([d.stats for d, _ in with_stats], maps)
        total = np.array([sum(d.total_frames for d, _ in with_stats)], dtype=np.int64)
        for key, vector in layout.vectors.items():
            if layout.normalization(key) is not None:
                stats[key] = identity_stats(vector.width, total)
            else:
                slotted = [(p.slot_stats().get(key), p) for _, p in with_stats]
                stats[key] = pooled_stats(
                    [(s, _mask(p, key)) for s, p in slotted if s is not None], vector.width
                )
        return stats

    def __repr__(self) -> str:
        return (
            f"LayoutMeta({len(self.datasets)} datasets of {len(self.embodiment_names)} "
            f"embodiments, {self.total_frames} frames, cameras={self.camera_keys}, "
            f"vectors={list(self.layout.vectors)})"
        )


def _mask(placement: Placement, key: str) -> np.ndarray:
    return next(v.mask for v in placement.vectors if v.key == key)


STATS = ("min", "max", "mean", "std", "q01", "q10", "q50", "q90", "q99")


def identity_stats(width: int, count: np.ndarray) -> dict[str, np.ndarray]:
    """Statistics under which every LeRobot normalisation is the identity."""
    out = {stat: np.full(width, identity(stat)) for stat in STATS}
    out["count"] = count
    return out


def pooled_stats(
    per_dataset: Sequence[tuple[dict[str, np.ndarray], np.ndarray]], width: int
) -> dict[str, np.ndarray]:
    """Each slot dim's statistics pooled over the datasets with a real value there
    (``per_dataset``: each one's slot statistics and mask), by LeRobot's aggregation rules;
    a dim none has holds the identity. ``count`` is the frames of those datasets (the most
    of any dim)."""
    if not per_dataset:
        return identity_stats(width, np.array([0], dtype=np.int64))
    counts = np.stack([s["count"].reshape(()) * m for s, m in per_dataset]).astype(np.float64)
    total = counts.sum(axis=0)
    real = total > 0
    safe = np.where(real, total, 1.0)

    def pooled(values: np.ndarray) -> np.ndarray:
        return (values * counts).sum(axis=0) / safe

    means = np.stack([s["mean"] for s, _ in per_dataset])
    mean = pooled(means)
    variance = pooled(np.stack([s["std"] ** 2 for s, _ in per_dataset]) + (means - mean) ** 2)
    low = np.stack([np.where(m, s["min"], np.inf) for s, m in per_dataset])
    high = np.stack([np.where(m, s["max"], -np.inf) for s, m in per_dataset])
    out = {
        "min": low.min(axis=0),
        "max": high.max(axis=0),
        "mean": mean,
        "std": np.sqrt(variance),
        "count": np.array([int(total.max())], dtype=np.int64),
    }
    for stat in ("q01", "q10", "q50", "q90", "q99"):
        if all(stat in s for s, _ in per_dataset):
            out[stat] = pooled(np.stack([s[stat] for s, _ in per_dataset]))
    for stat, values in out.items():
        if stat != "count":
            values[~real] = identity(stat)
    return out
