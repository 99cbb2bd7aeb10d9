"""``aggregate_stats``: the stats of several datasets combined as LeRobot 0.6.1 combines them.

Expected values are computed here from the raw samples the stats describe (numpy over their
concatenation), not with the module's formulas; one test also compares with LeRobot's own
function where LeRobot is installed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from support.required import importorskip

from lerobot_shards.reader.meta.stats import aggregate_stats

GOLDEN_DIR = Path(__file__).parent / "data" / "lerobot-0.6.1"
QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}


def stats_of(samples: np.ndarray, quantiles: bool = True) -> dict[str, np.ndarray]:
    """Per-dimension stats of ``samples`` (frames x dims), shaped as LeRobot stores a vector
    feature's: population std, ``count`` of shape (1,)."""
    stats = {
        "min": samples.min(axis=0),
        "max": samples.max(axis=0),
        "mean": samples.mean(axis=0),
        "std": samples.std(axis=0),
        "count": np.array([len(samples)]),
    }
    if quantiles:
        stats |= {key: np.quantile(samples, q, axis=0) for key, q in QUANTILES.items()}
    return stats


def assert_stats_of(aggregated: dict[str, np.ndarray], samples: np.ndarray) -> None:
    """``aggregated`` has the count, mean, std, min and max of ``samples``."""
    np.testing.assert_array_equal(aggregated["count"], [len(samples)])
    np.testing.assert_allclose(aggregated["mean"], samples.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(aggregated["std"], samples.std(axis=0), rtol=1e-10)
    np.testing.assert_array_equal(aggregated["min"], samples.min(axis=0))
    np.testing.assert_array_equal(aggregated["max"], samples.max(axis=0))


def test_matches_concatenation() -> None:
    rng = np.random.default_rng(0)
    # Different sizes, centres and spreads: the std must include the spread of the means.
    a = rng.normal(-3.0, 0.5, size=(40, 4))
    b = rng.normal(5.0, 2.0, size=(7, 4))
    c = rng.uniform(0.0, 1.0, size=(100, 4))
    aggregated = aggregate_stats([{"action": stats_of(x)} for x in (a, b, c)])
    assert list(aggregated) == ["action"]
    assert_stats_of(aggregated["action"], np.concatenate([a, b, c]))
    assert aggregated["action"]["count"].shape == (1,)
    assert aggregated["action"]["mean"].shape == (4,)


def test_single_dataset_unchanged() -> None:
    samples = np.random.default_rng(1).normal(size=(30, 2))
    stats = stats_of(samples)
    aggregated = aggregate_stats([{"observation.state": stats}])["observation.state"]
    assert list(aggregated) == list(stats)
    for key, value in stats.items():
        np.testing.assert_allclose(aggregated[key], value, rtol=1e-12, err_msg=key)


def test_image_stats_keep_their_shape() -> None:
    rng = np.random.default_rng(2)
    # Pixels (as rows) x channels; LeRobot stores per-channel stats as (3, 1, 1).
    a = rng.uniform(0.0, 0.6, size=(500, 3))
    b = rng.uniform(0.3, 1.0, size=(200, 3))

    def image_stats(pixels: np.ndarray) -> dict[str, np.ndarray]:
        stats = stats_of(pixels)
        return {k: v if k == "count" else v.reshape(3, 1, 1) for k, v in stats.items()}

    key = "observation.images.top"
    aggregated = aggregate_stats([{key: image_stats(a)}, {key: image_stats(b)}])[key]
    for name, value in aggregated.items():
        assert value.shape == ((1,) if name == "count" else (3, 1, 1)), name
    flat = {k: v.reshape(-1) if k != "count" else v for k, v in aggregated.items()}
    assert_stats_of(flat, np.concatenate([a, b]))


def test_quantiles_are_count_weighted_means() -> None:
    """LeRobot does not recover the pooled quantile; it averages the datasets', by count."""
    a = np.arange(10.0).reshape(-1, 1)
    b = np.arange(100.0, 130.0).reshape(-1, 1)
    sa, sb = stats_of(a), stats_of(b)
    aggregated = aggregate_stats([{"x": sa}, {"x": sb}])["x"]
    for key in QUANTILES:
        np.testing.assert_allclose(aggregated[key], (10 * sa[key] + 30 * sb[key]) / 40)
    # E.g. the median: 103.6 rather than the pooled data's 104.5.
    assert aggregated["q50"] != pytest.approx(np.median(np.concatenate([a, b])))


def test_quantile_missing_from_a_dataset_is_dropped() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.normal(size=(20, 2)), rng.normal(size=(15, 2))
    sb = stats_of(b)
    del sb["q90"]
    sb["q75"] = np.quantile(b, 0.75, axis=0)  # only in a later dataset: left out too
    aggregated = aggregate_stats([{"x": stats_of(a)}, {"x": sb}])["x"]
    assert set(aggregated) == {"min", "max", "mean", "std", "count", "q01", "q10", "q50", "q99"}
    # Stats other than the basic ones and quantiles are not carried over either.
    sa = stats_of(a) | {"median": np.median(a, axis=0), "quirk": np.zeros(2)}
    assert "median" not in aggregate_stats([{"x": sa}])["x"]
    assert "quirk" not in aggregate_stats([{"x": sa}])["x"]


def test_feature_in_some_datasets_aggregates_over_those() -> None:
    rng = np.random.default_rng(4)
    a, b, c = (rng.normal(i, 1.0, size=(10 + 5 * i, 3)) for i in range(3))
    wrist = rng.normal(size=(12, 2))
    aggregated = aggregate_stats(
        [
            {"action": stats_of(a)},
            {"action": stats_of(b), "wrist": stats_of(wrist)},
            {"action": stats_of(c)},
        ]
    )
    assert set(aggregated) == {"action", "wrist"}
    assert_stats_of(aggregated["action"], np.concatenate([a, b, c]))
    assert_stats_of(aggregated["wrist"], wrist)


def test_no_datasets() -> None:
    assert aggregate_stats([]) == {}


def test_dtypes_and_shapes() -> None:
    """Counts stay integer; float32 stats come out float64 (count weighting), min/max keep
    their dtype: as LeRobot's output."""
    samples = np.arange(12, dtype=np.float32).reshape(6, 2)
    stats = {k: v.astype(np.float32) if k != "count" else v for k, v in stats_of(samples).items()}
    aggregated = aggregate_stats([{"x": stats}, {"x": stats}])["x"]
    assert aggregated["count"].dtype == np.int64
    np.testing.assert_array_equal(aggregated["count"], [12])
    for key in ("mean", "std", *QUANTILES):
        assert aggregated[key].dtype == np.float64, key
    assert aggregated["min"].dtype == aggregated["max"].dtype == np.float32


def test_key_maps_rename_and_drop() -> None:
    rng = np.random.default_rng(5)
    arm_a, arm_b = rng.normal(size=(20, 6)), rng.normal(2.0, 3.0, size=(9, 6))
    extra = rng.normal(size=(20, 1))
    index = rng.normal(size=(9, 1))
    aggregated = aggregate_stats(
        [
            {"observation.state": stats_of(arm_a), "gripper": stats_of(extra)},
            {"state": stats_of(arm_b), "index": stats_of(index)},
        ],
        key_maps=[{"gripper": None}, {"state": "observation.state"}],
    )
    # "gripper" dropped, "state" renamed, "index" (not named) kept.
    assert set(aggregated) == {"observation.state", "index"}
    assert_stats_of(aggregated["observation.state"], np.concatenate([arm_a, arm_b]))
    assert_stats_of(aggregated["index"], index)


def test_key_maps_leave_inputs_alone() -> None:
    stats = [{"state": stats_of(np.ones((3, 1)))}]
    aggregate_stats(stats, key_maps=[{"state": "observation.state"}])
    assert list(stats[0]) == ["state"]


def test_key_maps_errors() -> None:
    stats = {"a": stats_of(np.ones((3, 1))), "b": stats_of(np.zeros((3, 1)))}
    with pytest.raises(ValueError, match="to 'c'"):
        aggregate_stats([stats], key_maps=[{"a": "c", "b": "c"}])
    with pytest.raises(ValueError, match="2 mappings for 1 datasets"):
        aggregate_stats([stats], key_maps=[{}, {}])


@pytest.mark.parametrize(
    ("feature", "name", "value", "match"),
    [
        ("x", "mean", [0.0], "not a numpy array"),
        ("x", "mean", np.float64(0.0), "not a numpy array"),
        ("x", "mean", np.array(0.0), "0-d"),
        ("x", "count", np.array([[3]]), r"not \(1,\)"),
        ("observation.image", "mean", np.zeros(3), r"not \(3, 1, 1\)"),
    ],
)
def test_refuses_what_lerobot_refuses(feature: str, name: str, value: object, match: str) -> None:
    stats = stats_of(np.ones((3, 3))) | {name: value}
    with pytest.raises(ValueError, match=match):
        aggregate_stats([{feature: stats}])


def golden_stats(name: str) -> dict[str, dict[str, np.ndarray]]:
    """A golden dataset's ``meta/stats.json`` as ``DatasetMeta.stats`` gives it."""
    raw = json.loads((GOLDEN_DIR / name / "meta" / "stats.json").read_text())
    return {feature: {k: np.array(v) for k, v in s.items()} for feature, s in raw.items()}


def test_same_as_lerobot() -> None:
    compute_stats = importorskip(
        "lerobot.datasets.compute_stats",
        reason="LeRobot is optional; CI runs this in LeRobot's environment",
    )
    rng = np.random.default_rng(6)
    a, b, c = rng.normal(size=(25, 3)), rng.normal(4.0, 2.0, size=(8, 3)), rng.normal(size=(3, 3))
    image = {
        k: v if k == "count" else v.reshape(3, 1, 1)
        for k, v in stats_of(rng.uniform(size=(50, 3))).items()
    }
    no_q90 = {k: v for k, v in stats_of(c).items() if k != "q90"}
    float32 = {k: v.astype(np.float32) if k != "count" else v for k, v in stats_of(b).items()}
    handmade = [
        {"action": stats_of(a), "observation.images.top": image, "only_here": stats_of(a)},
        {"action": float32, "observation.images.top": image},
        {"action": no_q90},
    ]
    golden = [golden_stats("image"), golden_stats("av1_multifile")]
    key_map = {"observation.state": "state", "timestamp": None}
    renamed = [
        {key_map.get(k, k): v for k, v in s.items() if key_map.get(k, k) is not None}
        for s in golden
    ]
    cases = [
        (handmade, aggregate_stats(handmade)),
        (golden, aggregate_stats(golden)),
        (renamed, aggregate_stats(golden, key_maps=[key_map, key_map])),
    ]
    for inputs, ours in cases:
        theirs = compute_stats.aggregate_stats(inputs)
        assert set(ours) == set(theirs)
        for feature, their_stats in theirs.items():
            assert list(ours[feature]) == list(their_stats), feature
            for name, value in their_stats.items():
                mine = ours[feature][name]
                where = f"{feature}/{name}"
                assert mine.dtype == value.dtype and mine.shape == value.shape, where
                np.testing.assert_array_equal(mine, value, err_msg=where)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=1, max_value=4).flatmap(
        lambda dims: st.lists(
            hnp.arrays(
                np.float64,
                st.tuples(st.integers(min_value=1, max_value=30), st.just(dims)),
                elements=st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False),
            ),
            min_size=1,
            max_size=6,
        )
    )
)
def test_property_matches_concatenation(datasets: list[np.ndarray]) -> None:
    aggregated = aggregate_stats([{"x": stats_of(d, quantiles=False)} for d in datasets])["x"]
    pooled = np.concatenate(datasets)
    np.testing.assert_array_equal(aggregated["count"], [len(pooled)])
    np.testing.assert_array_equal(aggregated["min"], pooled.min(axis=0))
    np.testing.assert_array_equal(aggregated["max"], pooled.max(axis=0))
    np.testing.assert_allclose(aggregated["mean"], pooled.mean(axis=0), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(aggregated["std"], pooled.std(axis=0), rtol=1e-6, atol=1e-6)
