"""Feature statistics of several datasets combined into one set, by the rules of LeRobot 0.6.1's
``lerobot.datasets.compute_stats.aggregate_stats``: a mixture of datasets is then normalised
with the stats LeRobot itself would give it (``make_pre_post_processors(cfg, dataset_stats=...)``)
without needing LeRobot installed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

FeatureStats = Mapping[str, np.ndarray]
"""One feature's statistics: stat name (``mean``, ``std``, ``min``, ``max``, ``count``,
``q01``, ...) -> numpy array, as ``DatasetMeta.stats`` gives them."""


def aggregate_stats(
    stats_list: Sequence[Mapping[str, FeatureStats]],
    key_maps: Sequence[Mapping[str, str | None]] | None = None,
) -> dict[str, dict[str, np.ndarray]]:
    """The stats of the datasets of ``stats_list`` taken together, as LeRobot aggregates them.

    The result has the union of the features; each is aggregated over the datasets that have
    it. ``key_maps[i]`` renames dataset ``i``'s features first (to put a mixture's datasets
    under common names): a feature mapped to None is dropped, one it does not name is kept.

    Raises ValueError where LeRobot does (a stat that is not a numpy array or is 0-d, a
    ``count`` not of shape (1,), a stat of a feature named ``*image*`` not of shape (3, 1, 1) or
    (1, 1, 1)), for ``key_maps`` not one per dataset, and for two features of one dataset
    mapped to the same name.
    """
    if key_maps is not None:
        if len(key_maps) != len(stats_list):
            raise ValueError(
                f"key_maps has {len(key_maps)} mappings for {len(stats_list)} datasets"
            )
        stats_list = [_rename(s, m) for s, m in zip(stats_list, key_maps, strict=True)]
    for stats in stats_list:
        for feature, feature_stats in stats.items():
            for name, value in feature_stats.items():
                _check(feature, name, value)
    features = dict.fromkeys(feature for stats in stats_list for feature in stats)
    return {f: _aggregate_feature([s[f] for s in stats_list if f in s]) for f in features}


def _rename(
    stats: Mapping[str, FeatureStats], key_map: Mapping[str, str | None]
) -> dict[str, FeatureStats]:
    """``stats`` under the names ``key_map`` gives (None: dropped; unnamed: unchanged)."""
    renamed: dict[str, FeatureStats] = {}
    for key, feature_stats in stats.items():
        name = key_map.get(key, key)
        if name is None:
            continue
        if name in renamed:
            raise ValueError(f"key_map maps two features of one dataset to {name!r}")
        renamed[name] = feature_stats
    return renamed


def _check(feature: str, name: str, value: object) -> None:
    """LeRobot's checks of one stat, so that what it would refuse is refused here too."""
    if not isinstance(value, np.ndarray):
        raise ValueError(
            f"stat {name!r} of feature {feature!r} is a {type(value).__name__}, not a numpy array"
        )
    if value.ndim == 0:
        raise ValueError(f"stat {name!r} of feature {feature!r} is 0-d; it must be at least 1-d")
    if name == "count" and value.shape != (1,):
        raise ValueError(f"count of feature {feature!r} has shape {value.shape}, not (1,)")
    if "image" in feature and name != "count" and value.shape not in ((3, 1, 1), (1, 1, 1)):
        raise ValueError(
            f"stat {name!r} of image feature {feature!r} has shape {value.shape}, "
            "not (3, 1, 1) or (1, 1, 1)"
        )


def _is_quantile(name: str) -> bool:
    """LeRobot's test for a quantile stat: ``q`` then digits (``q01``, ``q99``, ...)."""
    return name.startswith("q") and name[1:].isdigit()


def _aggregate_feature(per_dataset: Sequence[FeatureStats]) -> dict[str, np.ndarray]:
    """One feature over the datasets that have it.

    Counts add up; min/max are elementwise; the mean is count-weighted; the variance is pooled
    as a population variance: each dataset's variance plus its mean's squared distance from the
    overall mean, count-weighted. A quantile key that the first dataset has and all the others
    too is the count-weighted mean of theirs (LeRobot's approximation, not the quantile of the
    pooled data); any other quantile key, and any other stat, is left out.
    """
    counts = np.stack([s["count"] for s in per_dataset])
    total = counts.sum(axis=0)
    means = np.stack([s["mean"] for s in per_dataset])
    # One weight per dataset, broadcast over the feature's dimensions.
    weights = counts.reshape(-1, *[1] * (means.ndim - 1))

    def weighted_mean(values: np.ndarray) -> np.ndarray:
        return (values * weights).sum(axis=0) / total

    mean = weighted_mean(means)
    variances = np.stack([s["std"] ** 2 for s in per_dataset])
    aggregated = {
        "min": np.stack([s["min"] for s in per_dataset]).min(axis=0),
        "max": np.stack([s["max"] for s in per_dataset]).max(axis=0),
        "mean": mean,
        "std": np.sqrt(weighted_mean(variances + (means - mean) ** 2)),
        "count": total,
    }
    for name in per_dataset[0]:
        if _is_quantile(name) and all(name in s for s in per_dataset):
            aggregated[name] = weighted_mean(np.stack([s[name] for s in per_dataset]))
    return aggregated
