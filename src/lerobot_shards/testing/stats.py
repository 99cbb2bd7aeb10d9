"""Per-episode and aggregated feature statistics shaped the way LeRobot stores them.

LeRobot keeps ``min, max, mean, std, count`` (v2.1) plus ``q01 ... q99`` (v3.0) per feature and
episode; camera statistics are per channel with shape (3, 1, 1) in [0, 1], computed on a sample of
the episode's frames, downsampled when large. Quantiles here are exact (``numpy.quantile``) where
LeRobot approximates them with histograms, so the values differ slightly; shapes, keys and the
aggregation rule (count-weighted means, pooled variance, count-weighted quantiles) are LeRobot's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
Stats = dict[str, np.ndarray]


def sample_indices(length: int) -> np.ndarray:
    """Which frames of an episode feed the camera statistics (all of them below 100 frames)."""
    low, high, power = 100, 10_000, 0.75
    num = length if length < low else max(low, min(int(length**power), high))
    return np.round(np.linspace(0, length - 1, num)).astype(int)


class Sampler:
    """Keeps, downsampled, the frames of one episode that camera statistics look at."""

    def __init__(self, length: int) -> None:
        self.picks = set(sample_indices(length).tolist())
        self.kept: list[np.ndarray] = []

    def see(self, frame: int, image: np.ndarray) -> None:
        if frame in self.picks:
            self.kept.append(downsample(image))


def downsample(image: np.ndarray, target: int = 150, threshold: int = 300) -> np.ndarray:
    """Stride-subsample an HWC image whose larger side reaches ``threshold`` to about ``target``."""
    height, width = image.shape[:2]
    if max(height, width) < threshold:
        return image
    factor = int(max(height, width) / target)
    return image[::factor, ::factor]


def feature_stats(values: np.ndarray, quantiles: bool) -> Stats:
    """Statistics over axis 0 of an (N, ...) numeric array; scalars give shape (1,)."""
    data = np.asarray(values, dtype=np.float64)
    if data.ndim == 1:
        data = data[:, None]
    out = {
        "min": data.min(axis=0),
        "max": data.max(axis=0),
        "mean": data.mean(axis=0),
        "std": data.std(axis=0),
        "count": np.array([len(data)], dtype=np.int64),
    }
    if quantiles:
        for name, q in QUANTILES.items():
            out[name] = np.quantile(data, q, axis=0)
    return out


def image_stats(images: Sequence[np.ndarray], quantiles: bool) -> Stats:
    """Per-channel statistics, shape (3, 1, 1), of HWC uint8 frames scaled to [0, 1].

    Large frames are downsampled first; frames a ``Sampler`` kept already are, and stay as they are.
    """
    pixels = np.stack([downsample(image) for image in images]).astype(np.float64) / 255.0
    per_channel = pixels.reshape(-1, pixels.shape[-1])  # (N*H*W, C)
    out = {
        "min": per_channel.min(axis=0),
        "max": per_channel.max(axis=0),
        "mean": per_channel.mean(axis=0),
        "std": per_channel.std(axis=0),
    }
    if quantiles:
        for name, q in QUANTILES.items():
            out[name] = np.quantile(per_channel, q, axis=0)
    out = {name: value.reshape(-1, 1, 1) for name, value in out.items()}
    out["count"] = np.array([len(images)], dtype=np.int64)
    return _ordered(out)


def aggregate(a: Stats, b: Stats) -> Stats:
    """Combine two statistics of the same feature as LeRobot's ``aggregate_stats`` does."""
    means = np.stack([a["mean"], b["mean"]])
    weights = np.stack([a["count"], b["count"]]).astype(np.float64)
    while weights.ndim < means.ndim:
        weights = weights[..., None]
    total = weights.sum(axis=0)
    mean = (means * weights).sum(axis=0) / total
    variances = np.stack([a["std"], b["std"]]) ** 2
    std = np.sqrt(((variances + (means - mean) ** 2) * weights).sum(axis=0) / total)
    out = {
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
        "mean": mean,
        "std": std,
        "count": (a["count"] + b["count"]).astype(np.int64),
    }
    for name in QUANTILES:
        if name in a and name in b:
            out[name] = (np.stack([a[name], b[name]]) * weights).sum(axis=0) / total
    return _ordered(out)


def to_lists(stats: Stats) -> dict[str, list]:
    """JSON/Arrow-ready nested lists (floats, and ints for ``count``)."""
    return {
        name: value.astype(np.int64 if name == "count" else np.float64).tolist()
        for name, value in stats.items()
    }


def _ordered(stats: Stats) -> Stats:
    order = ["min", "max", "mean", "std", "count", *QUANTILES]
    return {name: stats[name] for name in order if name in stats}
