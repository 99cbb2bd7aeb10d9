"""warm_start: the next epoch's first draws fetched and decoded when a part ends change when
work is done, never what is yielded: whole epochs with and without it are equal, item for item
and tensor for tensor, and the warmed frames are really used. ShardedDataLoader turns it on
only where the process that ends an epoch runs the next one."""

from __future__ import annotations

import pytest
import torch
from test_elastic_resume import as_rank

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.reader import stream, warm_start


def epochs(root, warm_draws: int, count: int, golden_delta_timestamps=None):
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


@pytest.mark.parametrize("deltas", [False, True])
def test_warmed_epochs_equal_cold_ones_and_use_the_warmed_frames(
    av1, monkeypatch, golden_delta_timestamps, deltas
):
    as_rank(monkeypatch, 0, 1)
    claimed: list[int] = []
    real_claim = warm_start.claim

    def counting_claim(part):
        pieces = real_claim(part)
        claimed.append(sum(len(c.warm) for e, _ in pieces.values() for c in e.cameras.values()))
        return pieces

    monkeypatch.setattr(stream.warm_start, "claim", counting_claim)
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
