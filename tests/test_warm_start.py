"""warm_start: the next epoch's first draws fetched and decoded when a part ends change when
work is done, never what is yielded: whole epochs with and without it are equal, item for item
and tensor for tensor, and the warmed frames are really used. A warm-up is claimed only by the
very dataset, settings and part it was made for: another dataset of the same layout, or the same
one under other options, reads cold. ShardedDataLoader turns it on only where the process that
ends an epoch runs the next one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.required import importorskip
from test_elastic_resume import as_rank

import lerobot_shards
from lerobot_shards import DatasetRoot, ShardedLeRobotDataset
from lerobot_shards.reader.loading import stream, warm_start
from lerobot_shards.testing import content, factory


def epochs(root, warm_draws: int, count: int, golden_delta_timestamps=None):
    warm_start.discard()  # an earlier test's warm-up is no part of this reference
    ds = ShardedLeRobotDataset(
        root, buffer_size=3, seed=5, return_uint8=True, delta_timestamps=golden_delta_timestamps
    )
    ds.warm_draws = warm_draws
    out = []
    for _ in range(count):
        out.append(list(ds))
        if warm_start._current is not None:  # let the warm-up finish, as a pause would
            warm_start._current.done.result(timeout=60)
    return out


def assert_same_items(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


_REAL_CLAIM = warm_start.claim


def warmed_frames(monkeypatch) -> list[int]:
    """Records, for each stream that starts, how many warmed frames it claimed."""
    claimed: list[int] = []

    def counting_claim(*args):
        pieces = _REAL_CLAIM(*args)
        claimed.append(sum(len(c.warm) for e, _ in pieces.values() for c in e.cameras.values()))
        return pieces

    monkeypatch.setattr(stream.warm_start, "claim", counting_claim)
    return claimed


@pytest.mark.parametrize("deltas", [False, True])
def test_warmed_epochs_equal_cold_ones_and_use_the_warmed_frames(
    av1, monkeypatch, golden_delta_timestamps, deltas
):
    as_rank(monkeypatch, 0, 1)
    claimed = warmed_frames(monkeypatch)
    timestamps = golden_delta_timestamps if deltas else None
    warm = epochs(av1, 64, 3, timestamps)
    assert claimed[0] == 0 and all(n > 0 for n in claimed[1:])  # epochs 1 and 2 were warmed
    cold = epochs(av1, 0, 3, timestamps)
    for w, c in zip(warm, cold, strict=True):
        assert_same_items(w, c)
    assert [i["index"] for i in warm[1]] != [i["index"] for i in warm[2]]


def test_a_warm_up_for_another_part_is_not_used(av1, monkeypatch):
    """``set_epoch`` between epochs moves the next iteration elsewhere: the warm-up of the epoch
    that would have followed is dropped, and the epoch streamed is exactly the cold one. (Rank
    0 of 2: its part, unlike a whole epoch's, holds other episodes in each epoch.)"""
    as_rank(monkeypatch, 0, 2)
    cold = epochs(av1, 0, 3)
    ds = ShardedLeRobotDataset(av1, buffer_size=3, seed=5, return_uint8=True)
    ds.warm_draws = 64
    assert_same_items(list(ds), cold[0])  # epoch 0 ends: epoch 1 is warmed
    warm_start._current.done.result(timeout=60)
    ds.set_epoch(2)
    assert_same_items(list(ds), cold[2])


@pytest.mark.parametrize(
    ("workers", "persistent", "warm"), [(0, False, True), (2, True, True), (2, False, False)]
)
def test_the_loader_warms_up_only_where_its_processes_live_on(av1, workers, persistent, warm):
    from lerobot_shards import ShardedDataLoader

    ds = ShardedLeRobotDataset(av1)
    ShardedDataLoader(ds, batch_size=4, num_workers=workers, persistent_workers=persistent)
    assert (ds.warm_draws > 0) == warm


def _action_plus_1000(episode: int, frame: int) -> np.ndarray:
    return content.action_value(episode, frame) + np.float32(1000)


@pytest.fixture(scope="module")
def twins(tmp_path_factory) -> tuple[str, str]:
    """Two converted datasets of the same episode layout (the factory's 74 frames in 6
    episodes) whose actions and frames differ."""
    base = tmp_path_factory.mktemp("twins")
    a = factory.make_dataset(base / "a")
    with pytest.MonkeyPatch.context() as mp:  # the factory's stats follow the rows it writes
        mp.setattr(factory, "action_value", _action_plus_1000)
        b = factory.make_dataset(base / "b", content="realistic")
    out = []
    for src in (a, b):
        dest = base / f"{src.name}-shards"
        lerobot_shards.convert(str(src), str(dest), workers=0, progress=False)
        out.append(str(dest))
    return out[0], out[1]


def test_another_dataset_of_the_same_layout_does_not_claim_the_warm_up(twins, monkeypatch):
    """A's epoch 1 is warmed as its epoch 0 ends; B, read at epoch 1 in the same process (a
    validation loader beside a training one, say), yields its own items, not A's."""
    as_rank(monkeypatch, 0, 1)
    a, b = twins
    cold_a, cold_b = epochs(a, 0, 2)[1], epochs(b, 0, 2)[1]
    pairs = zip(cold_a, cold_b, strict=True)
    assert not any(torch.equal(x["action"], y["action"]) for x, y in pairs)
    assert not torch.equal(
        cold_a[0]["observation.images.cam_high"], cold_b[0]["observation.images.cam_high"]
    )
    claimed = warmed_frames(monkeypatch)
    ds_a = ShardedLeRobotDataset(a, buffer_size=3, seed=5, return_uint8=True)
    ds_a.warm_draws = 64
    list(ds_a)  # epoch 0 ends: epoch 1 is warmed
    warm_start._current.done.result(timeout=60)
    ds_b = ShardedLeRobotDataset(b, buffer_size=3, seed=5, return_uint8=True)
    ds_b.set_epoch(1)
    assert_same_items(list(ds_b), cold_b)
    assert claimed == [0, 0]


def _flip(frames: torch.Tensor) -> torch.Tensor:
    return torch.flip(frames, dims=[-1])


BASE = {"buffer_size": 3, "seed": 5, "return_uint8": True}
CHANGED_ON_THE_OBJECT = {
    "seed": {"seed": 6},
    "shuffle": {"shuffle": False},
    "buffer_size": {"buffer_size": 2},
    "byte_budget": {"byte_budget": 10**9},
    "pad": {"pad": False},
    "video_backend": {"video_backend": "torchcodec"},
}
"""The settings a dataset object reads at each iteration, each changed on the object itself
after its warm-up was made (the order's, and the decoder the warmed frames came from)."""


@pytest.mark.parametrize("setting", sorted(CHANGED_ON_THE_OBJECT))
def test_a_warm_up_is_not_claimed_after_a_setting_changes(av1, monkeypatch, setting):
    """The very dataset object whose epoch 0 warmed epoch 1, one setting changed before epoch
    1: the warm-up (same catalog, so identity alone would hand it over) is left unused, and the
    epoch is exactly what a cold reader of the new settings reads."""
    if setting == "video_backend":
        importorskip("torchcodec", reason="torchcodec is optional; CI's LeRobot env runs this")
    as_rank(monkeypatch, 0, 1)
    changed = CHANGED_ON_THE_OBJECT[setting]
    warm_start.discard()
    cold = ShardedLeRobotDataset(str(av1), **BASE)
    for name, value in changed.items():
        setattr(cold, name, value)
    cold.set_epoch(1)
    want = list(cold)
    claimed = warmed_frames(monkeypatch)
    ds = ShardedLeRobotDataset(str(av1), **BASE)
    ds.warm_draws = 64
    list(ds)  # epoch 0 ends: epoch 1 is warmed under the old setting
    warm_start._current.done.result(timeout=60)
    for name, value in changed.items():
        setattr(ds, name, value)
    assert_same_items(list(ds), want)
    assert claimed == [0, 0]


def _flip(frames: torch.Tensor) -> torch.Tensor:
    return torch.flip(frames, dims=[-1])


OPENED_WITH = {
    "delta_timestamps": {"delta_timestamps": {"action": [0.0, 0.1], "observation.state": [-0.1]}},
    "return_uint8": {"return_uint8": False},
    "image_transforms": {"image_transforms": _flip},
    "tolerance_s": {"tolerance_s": 0.02},
    "episodes": {"episodes": [0, 2, 3, 4, 5]},
    "key_map": {"root": "key_map"},
    "mixture": {"root": "mixture"},
    "weights": {"root": "mixture", "weights": [3.0, 1.0]},
}
"""Options fixed when a dataset is opened (its catalog's): another object, never the same."""


def _dataset(root: str, settings: dict) -> ShardedLeRobotDataset:
    settings = {**BASE, **settings}
    kind = settings.pop("root", None)
    if kind == "key_map":
        return ShardedLeRobotDataset(DatasetRoot(root, key_map={"action": "act"}), **settings)
    if kind == "mixture":
        return ShardedLeRobotDataset([root, root], **settings)
    return ShardedLeRobotDataset(root, **settings)


@pytest.mark.parametrize("setting", sorted(OPENED_WITH))
def test_a_dataset_opened_with_other_options_reads_its_own_items(av1, monkeypatch, setting):
    """Each option fixed when a dataset is opened that shapes an item or the order: a dataset
    opened with it does not claim the warm-up made by one opened without it (nor the other way
    round; its own catalog refuses it), and reads exactly what a cold reader of its options
    reads."""
    as_rank(monkeypatch, 0, 1)
    settings = OPENED_WITH[setting]
    if setting == "weights":
        pairs = [({"root": "mixture"}, settings), (settings, {"root": "mixture"})]
    else:
        pairs = [({}, settings), (settings, {})]
    for made, claiming in pairs:
        warm_start.discard()
        cold = _dataset(str(av1), claiming)
        cold.set_epoch(1)
        want = list(cold)
        claimed = warmed_frames(monkeypatch)
        warmer = _dataset(str(av1), made)
        warmer.warm_draws = 64
        list(warmer)  # epoch 0 ends: epoch 1 is warmed
        warm_start._current.done.result(timeout=60)
        ds = _dataset(str(av1), claiming)
        ds.set_epoch(1)
        assert_same_items(list(ds), want)
        assert claimed == [0, 0], (made, claiming)
