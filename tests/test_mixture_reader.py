"""A mixture of converted datasets read end to end: items equal to each dataset's own items,
exact weighted counts per frame over epochs with DataLoader workers, resume and elastic resume,
datasets at different frame rates and with other key names, refusals at construction, and the
aggregated stats."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import lerobot_shards
from lerobot_shards import DatasetRoot, ShardedDataLoader, ShardedLeRobotDataset
from lerobot_shards.testing import make_dataset

CAM = "observation.images.cam_high"
WRIST = "observation.images.cam_left_wrist"
CAMERAS = {CAM: (32, 32), WRIST: (24, 32)}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Converted datasets: ``a`` (fps 10, v3.0), ``b`` (fps 20, v2.1), ``c`` (fps 10, its top
    camera named otherwise) and ``wide`` (a camera of another size)."""
    base = tmp_path_factory.mktemp("mixture")
    made = {}
    recipes = {
        "a": dict(episode_lengths=[7, 5, 9], fps=10, cameras=CAMERAS),
        "b": dict(episode_lengths=[6, 8], fps=20, cameras=CAMERAS, version="v2.1", seed=1),
        "c": dict(
            episode_lengths=[4, 3, 4, 5],
            fps=10,
            cameras={"observation.images.top": (32, 32), WRIST: (24, 32)},
            seed=2,
        ),
        "wide": dict(episode_lengths=[3, 4], fps=10, cameras={CAM: (32, 48), WRIST: (24, 32)}),
    }
    for name, recipe in recipes.items():
        source = make_dataset(base / f"{name}-src", **recipe)
        lerobot_shards.convert(str(source), str(base / name), workers=0, progress=False)
        made[name] = base / name
    return made


def ids(items) -> list[tuple[int, int]]:
    return [(int(item["dataset_index"]), int(item["index"])) for item in items]


def all_frames(ds: ShardedLeRobotDataset) -> list[tuple[int, int]]:
    """Every selected frame of every dataset of ``ds`` as (dataset_index, index)."""
    out = []
    for d, member in enumerate(ds.datasets):
        table = member.selection.table
        for start, length in zip(
            table.column("dataset_from_index").to_pylist(),
            table.column("length").to_pylist(),
            strict=True,
        ):
            out += [(d, i) for i in range(start, start + length)]
    return out


def test_items_are_each_datasets_own_items_plus_dataset_index(roots):
    delta = {"action": [0.0, 0.1], CAM: [-0.1, 0.0]}
    mixture = ShardedLeRobotDataset(
        [roots["a"], roots["b"]], delta_timestamps=delta, seed=4, buffer_size=2
    )
    own = [
        {
            int(item["index"]): item
            for item in ShardedLeRobotDataset(roots[n], delta_timestamps=delta)
        }
        for n in ("a", "b")
    ]
    items = list(mixture)
    assert sorted(ids(items)) == sorted(all_frames(mixture))  # every frame exactly once
    for item in items:
        d = int(item["dataset_index"])
        expected = own[d][int(item["index"])]
        assert set(item) == set(expected) | {"dataset_index"}
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(item[key], value), (d, key)
            else:
                assert item[key] == value, (d, key)
    # b runs at 20 fps: 0.1 s is two frames there, one frame in a
    b_item = next(i for i in items if int(i["dataset_index"]) == 1 and int(i["frame_index"]) == 3)
    assert b_item["action_is_pad"].tolist() == [False, False]
    assert mixture.datasets[1].spec.deltas["action"].tolist() == [0, 2]
    assert mixture.datasets[0].spec.deltas["action"].tolist() == [0, 1]


def test_weighted_counts_per_frame_over_epochs_with_workers(roots):
    mixture = ShardedLeRobotDataset(
        [roots["a"], roots["b"]], weights=[1, 3], seed=2, buffer_size=2, pad=False
    )
    frames = all_frames(mixture)
    per_dataset = Counter(d for d, _ in frames)
    total = len(frames)  # 35 frames: 21 of a, 14 of b
    assert mixture.samples_per_dataset.tolist() == [9, 26]  # 35 * 1/4 = 8.75, 35 * 3/4 = 26.25
    loader = ShardedDataLoader(mixture, batch_size=4, num_workers=2)
    so_far: Counter = Counter()
    for epoch in range(4):
        mixture.set_epoch(epoch)
        seen = Counter()
        for batch in loader:
            seen.update(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))
        assert sum(seen.values()) == total
        so_far.update(seen)
        for d, n in enumerate(mixture.samples_per_dataset.tolist()):
            mine = [f for f in frames if f[0] == d]
            counts = [seen[f] for f in mine]
            assert sum(counts) == n
            assert set(counts) <= {n // per_dataset[d], -(-n // per_dataset[d])}
            cumulative = [so_far[f] for f in mine]
            assert max(cumulative) - min(cumulative) <= 1, (epoch, d)


def test_same_epoch_whatever_the_workers(roots):
    def epoch(workers: int) -> Counter:
        ds = ShardedLeRobotDataset(
            [roots["a"], roots["b"]], weights=[2, 1], epoch_size=50, seed=9, pad=False
        )
        ds.set_epoch(3)
        loader = ShardedDataLoader(ds, batch_size=5, num_workers=workers)
        return Counter(
            pair
            for batch in loader
            for pair in zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)
        )

    in_process = epoch(0)
    assert sum(in_process.values()) == 50
    assert epoch(2) == in_process


def test_resume_mid_epoch_yields_the_very_batches_that_followed(roots):
    def make():
        ds = ShardedLeRobotDataset([roots["a"], roots["b"]], weights=[1, 2], seed=5, buffer_size=2)
        return ds, ShardedDataLoader(ds, batch_size=3, num_workers=2)

    _, loader = make()
    full = [ids_of(b) for b in loader]
    _, loader = make()
    it = iter(loader)
    head = [ids_of(next(it)) for _ in range(4)]
    state = loader.state_dict()
    del it
    _, loader = make()
    loader.load_state_dict(state)
    rest = [ids_of(b) for b in loader]
    assert head + rest == full


def ids_of(batch) -> list[tuple[int, int]]:
    return list(zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True))


def test_elastic_resume_of_a_mixture_completes_the_epoch(roots):
    def make():
        return ShardedLeRobotDataset(
            [roots["a"], roots["b"]], weights=[3, 1], seed=6, buffer_size=2, pad=False
        )

    ds = make()
    epoch = Counter(ids(make()))
    it = iter(ds)
    before = ids(next(it) for _ in range(13))
    state = ds.state_dict()
    resumed = make()
    resumed.num_workers = 3  # another layout: the rest is split over 3 workers
    resumed.load_state_dict(state)
    after = [
        pair for batch in DataLoader(resumed, batch_size=2, num_workers=3) for pair in ids_of(batch)
    ]
    assert Counter(before) + Counter(after) == epoch


def test_state_of_another_mixture_is_refused(roots):
    ds = ShardedLeRobotDataset([roots["a"], roots["b"]], weights=[1, 1])
    state = ds.state_dict()
    for other in (
        ShardedLeRobotDataset([roots["a"], roots["b"]], weights=[2, 1]),
        ShardedLeRobotDataset([roots["a"], DatasetRoot(roots["b"], episodes=[0])], weights=[1, 1]),
        ShardedLeRobotDataset([roots["b"], roots["a"]], weights=[1, 1]),
    ):
        with pytest.raises(ValueError, match="another dataset"):
            other.load_state_dict(state)


def test_key_map_puts_datasets_under_common_names(roots):
    mixture = ShardedLeRobotDataset(
        [roots["a"], DatasetRoot(roots["c"], key_map={"observation.images.top": CAM})],
        delta_timestamps={CAM: [-0.1, 0.0]},
        seed=1,
    )
    own_c = {
        int(i["index"]): i
        for i in ShardedLeRobotDataset(
            roots["c"], delta_timestamps={"observation.images.top": [-0.1, 0.0]}
        )
    }
    batches = list(DataLoader(mixture, batch_size=6, num_workers=0))
    assert sum(len(b["index"]) for b in batches) == mixture.num_frames
    for batch in batches:
        for row, (d, index) in enumerate(ids_of(batch)):
            if d == 1:
                expected = own_c[index]
                assert torch.equal(batch[CAM][row], expected["observation.images.top"])
                assert torch.equal(
                    batch[f"{CAM}_is_pad"][row], expected["observation.images.top_is_pad"]
                )
    assert mixture.meta.camera_keys == [CAM, WRIST]


def test_a_mixture_that_would_not_collate_is_refused_naming_dataset_and_key(roots):
    with pytest.raises(
        ValueError, match=r"dataset 1 \(.*c\) lacks \['observation.images.cam_high'\]"
    ):
        ShardedLeRobotDataset([roots["a"], roots["c"]])
    with pytest.raises(
        ValueError, match=r"key 'observation.images.cam_high' of dataset 1 .* shape \(3, 32, 48\)"
    ):
        ShardedLeRobotDataset([roots["a"], roots["wide"]])
    dropped = ShardedLeRobotDataset(
        [
            DatasetRoot(roots["a"], key_map={CAM: None}),
            DatasetRoot(roots["wide"], key_map={CAM: None}),
        ]
    )
    item = next(iter(dropped))
    assert CAM not in item and WRIST in item
    assert dropped.datasets[0].spec.video_keys == [WRIST]  # a dropped camera is not decoded
    with pytest.raises(ValueError, match="gives two of its features the same name"):
        ShardedLeRobotDataset([DatasetRoot(roots["a"], key_map={"action": "observation.state"})])
    with pytest.raises(ValueError, match=r"\['acton'\] are not its features"):
        ShardedLeRobotDataset([DatasetRoot(roots["a"], key_map={"acton": "act"})])
    with pytest.raises(ValueError, match="not features of"):
        ShardedLeRobotDataset([roots["a"], roots["c"]], delta_timestamps={CAM: [0.0]})
    with pytest.raises(ValueError, match="give each dataset of a mixture its own"):
        ShardedLeRobotDataset([roots["a"], roots["b"]], episodes=[0])
    with pytest.raises(ValueError, match="1 weights given for 2 datasets"):
        ShardedLeRobotDataset([roots["a"], roots["b"]], weights=[1])


def test_stats_aggregate_as_lerobot_and_each_datasets_meta_is_there(roots):
    """The mixture's stats against the frames themselves (numpy over both datasets' values),
    not against ``aggregate_stats``, which makes them: exact for features read frame by frame;
    camera stats (from sampled frames) over each dataset's own: counts add up, min and max
    elementwise, the mean count-weighted, the std the union's, and (LeRobot's rule) a quantile
    count-weighted where every dataset has it, left out otherwise."""
    mixture = ShardedLeRobotDataset([roots["a"], roots["b"]])
    own = [ShardedLeRobotDataset(roots[n]).meta for n in ("a", "b")]
    assert [m.fps for m in mixture.meta.datasets] == [10, 20]
    stats = mixture.meta.stats
    assert set(stats) == set(own[0].stats) | set(own[1].stats)
    items = [list(ShardedLeRobotDataset(roots[n], shuffle=False)) for n in ("a", "b")]
    quantiles = set.intersection(*({n for n in m.stats[CAM] if n.startswith("q")} for m in own))
    vectors = [k for k in stats if k not in mixture.meta.camera_keys]
    assert {"observation.state", "action"} <= set(vectors)
    for key in vectors:
        values = np.concatenate(
            [np.stack([np.atleast_1d(item[key].numpy()) for item in its]) for its in items]
        ).astype(np.float64)
        assert stats[key]["count"].tolist() == [len(values)] == [35], key
        np.testing.assert_array_equal(stats[key]["min"], values.min(axis=0), err_msg=key)
        np.testing.assert_array_equal(stats[key]["max"], values.max(axis=0), err_msg=key)
        np.testing.assert_allclose(stats[key]["mean"], values.mean(axis=0), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(stats[key]["std"], values.std(axis=0), rtol=1e-9, atol=1e-12)
    for key in mixture.meta.camera_keys:
        theirs = [m.stats[key] for m in own]
        counts = [int(t["count"][0]) for t in theirs]
        assert stats[key]["count"].tolist() == [sum(counts)], key
        np.testing.assert_array_equal(stats[key]["min"], np.minimum(*(t["min"] for t in theirs)))
        np.testing.assert_array_equal(stats[key]["max"], np.maximum(*(t["max"] for t in theirs)))

        def weighted(values, counts=counts):
            return sum(c * v for c, v in zip(counts, values, strict=True)) / sum(counts)

        mean = weighted([t["mean"] for t in theirs])
        np.testing.assert_allclose(stats[key]["mean"], mean, rtol=1e-12)
        # The population variance of the union: each one's, plus its mean's distance.
        variance = weighted([t["std"] ** 2 + (t["mean"] - mean) ** 2 for t in theirs])
        np.testing.assert_allclose(stats[key]["std"], np.sqrt(variance), rtol=1e-9)
        for name in quantiles:
            np.testing.assert_allclose(
                stats[key][name], weighted([t[name] for t in theirs]), rtol=1e-12, err_msg=name
            )
    for key in stats:  # a quantile only where every dataset has it (b, LeRobot 0.3.3's, none)
        assert set(stats[key]) == {"min", "max", "mean", "std", "count", *quantiles}, key


def test_a_checkpoint_on_two_ranks_resumes_on_one(roots, monkeypatch):
    def make():
        return ShardedLeRobotDataset(
            [roots["a"], roots["b"]], weights=[1, 2], epoch_size=40, seed=3, pad=False
        )

    epoch = Counter(ids(make()))
    assert sum(epoch.values()) == 40
    before: Counter = Counter()
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank in (0, 1):  # every rank takes 7 samples, then the job checkpoints
        monkeypatch.setenv("RANK", str(rank))
        ds = make()
        it = iter(ds)
        before.update(ids(next(it) for _ in range(7)))
        state = ds.state_dict()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    resumed = make()
    resumed.load_state_dict(state)
    after = Counter(ids(resumed))
    assert before + after == epoch
