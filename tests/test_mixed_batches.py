"""ShardedDataLoader's batches mix every DataLoader worker's pool (``loading/mixed.py``): each
batch holds about as many distinct episodes as uniform draws from all the episodes the rank's
workers hold, where a batch made by one worker holds only that worker's. And all else stays
exact: the batches are the items collated (their frames a view of the shared slot the workers
wrote), a state taken after any batch resumes into exactly the batches that followed, and one
taken with 3 workers resumes on 2 or 1 with every frame once. Ranks are simulated in one
process with RANK/WORLD_SIZE, as each rank would see them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.batches import assert_same_batch
from test_elastic_resume import FRAMES, as_rank, assert_exactly_once
from torch.utils.data import default_collate

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
from lerobot_shards.testing.factory import make_dataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

BATCH = 4


def dataset(root, **options) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(root, buffer_size=3, seed=7, **options)


def plain(item: dict) -> dict:
    return {
        k: v.as_subclass(torch.Tensor) if isinstance(v, torch.Tensor) else v
        for k, v in item.items()
    }


@pytest.mark.slow
def test_batches_are_the_items_collated_their_frames_a_view_of_the_workers_rows(av1):
    """Every batch equals torch's default_collate of the same items, made in process; the
    frames of a camera whose frames are channel-last views were written by both workers into
    one shared slot and reach the loop as a view of it, not a copy. Then a loop that keeps
    every batch: once every slot is held, the batches are copies, the same batches."""
    as_items = {int(i["index"]): plain(i) for i in dataset(av1, return_uint8=True)}
    loader = ShardedDataLoader(dataset(av1, return_uint8=True), batch_size=BATCH, num_workers=2)
    assert loader.mixed_batches
    for hoard in (False, True):
        indices, kept, viewed = [], [], []
        for batch in loader:
            indices += batch["index"].tolist()
            want = default_collate([as_items[i] for i in batch["index"].tolist()])
            assert_same_batch(batch, want)
            wrist = batch["observation.images.cam_left_wrist"]  # 24x32: rows without padding
            assert wrist.movedim(-3, -1).is_contiguous()
            assert not wrist.untyped_storage().is_shared()  # not torch's shared memory
            viewed.append(wrist.untyped_storage().nbytes() > 2 * wrist.nbytes)  # of a slot
            if hoard:
                kept.append(batch)
        assert sorted(indices) == list(range(FRAMES))
        assert all(viewed) if not hoard else viewed[0] and not viewed[-1]


@pytest.mark.slow
def test_every_state_of_an_epoch_with_3_workers_resumes_exactly_the_rest(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    loader = ShardedDataLoader(
        dataset(av1), batch_size=BATCH, num_workers=3, persistent_workers=True
    )
    batches, states = [], []
    for batch in loader:
        batches.append(batch["index"].tolist())
        states.append(loader.state_dict())
    indices = [i for b in batches for i in b]
    assert set(indices) == set(range(FRAMES)) and len(indices) == 3 * 25  # one padding sample
    assert all(s["mixed_batches"] and s["num_workers"] == 3 for s in states)
    for k, state in enumerate(states):
        resumed = ShardedDataLoader(dataset(av1), batch_size=BATCH, num_workers=3)
        resumed.load_state_dict(state)
        assert [b["index"].tolist() for b in resumed] == batches[k + 1 :], k


def take(root, workers: int, batches: int, world: int = 1, mixed: bool = True):
    """Each rank's first ``batches`` batches of indices through a ShardedDataLoader, and the
    state after them (the same on every rank)."""
    consumed, states = [], []
    for rank in range(world):
        with pytest.MonkeyPatch.context() as mp:
            as_rank(mp, rank, world)
            loader = ShardedDataLoader(
                dataset(root), batch_size=BATCH, num_workers=workers, mixed_batches=mixed
            )
            for n, batch in enumerate(loader, 1):
                consumed += batch["index"].tolist()
                if n == batches:
                    break
            states.append(loader.state_dict())
    assert all(state == states[0] for state in states)
    return consumed, states[0]


def rest(root, state, workers: int, world: int = 1, mixed: bool = True) -> list[list[int]]:
    streams = []
    for rank in range(world):
        with pytest.MonkeyPatch.context() as mp:
            as_rank(mp, rank, world)
            loader = ShardedDataLoader(
                dataset(root), batch_size=BATCH, num_workers=workers, mixed_batches=mixed
            )
            loader.load_state_dict(state)
            streams.append([i for b in loader for i in b["index"].tolist()])
    return streams


@pytest.mark.parametrize("new_workers", [2, 1])
def test_a_3_worker_state_resumes_on_fewer_workers_every_frame_once(av1, new_workers):
    consumed, state = take(av1, 3, batches=5)
    assert state["mixed_batches"] and state["offset"] == 5 * BATCH
    streams = rest(av1, state, new_workers)
    assert_exactly_once(consumed, streams, new_workers)


@pytest.mark.slow
def test_a_state_resumes_between_mixed_and_unmixed_batches(av1):
    """The batching is part of the state: one taken with mixed batches on 2 ranks resumes
    elastically without them on 1, and the reverse."""
    consumed, state = take(av1, 3, batches=3, world=2)
    assert_exactly_once(consumed, rest(av1, state, 3, mixed=False), 3)
    consumed, state = take(av1, 3, batches=3, world=2, mixed=False)
    assert not state["mixed_batches"]
    assert_exactly_once(consumed, rest(av1, state, 2), 2)


def test_a_state_loaded_for_other_batches_is_refused_when_the_workers_start(av1):
    _, state = take(av1, 2, batches=2)
    ds = dataset(av1)
    ds.num_workers = 2
    ds.load_state_dict(state)  # as for a plain DataLoader, whose batches do not mix
    with pytest.raises(ValueError, match="load it through the loader that iterates"):
        next(iter(ShardedDataLoader(ds, batch_size=BATCH, num_workers=2)))


def test_length_counts_the_mixed_batches(av1):
    for workers, drop_last in ((2, False), (3, False), (3, True)):
        loader = ShardedDataLoader(
            dataset(av1), batch_size=BATCH, num_workers=workers, drop_last=drop_last
        )
        batches = [len(b["index"]) for b in loader]
        assert len(loader) == len(batches), (workers, drop_last)
        assert all(n == BATCH for n in batches[:-1])
        assert drop_last == (batches[-1] == BATCH)


# ----------------------------------------------------------------------------- mixing

EPISODES = 24
MIXING_BATCH = 16


@pytest.fixture(scope="module")
def many_episodes(tmp_path_factory: pytest.TempPathFactory):
    """24 episodes of 20-30 frames, one small camera: every worker's pool holds all of its."""
    import lerobot_shards

    lengths = np.random.default_rng(3).integers(20, 31, EPISODES).tolist()
    base = tmp_path_factory.mktemp("mixing")
    source = make_dataset(
        base / "source", episode_lengths=lengths, cameras={"observation.images.cam": (32, 32)}
    )
    lerobot_shards.convert(str(source), str(base / "shards"), workers=0, progress=False)
    return base / "shards"


def distinct_per_batch(root, workers: int, mixed: bool | None) -> float:
    """Mean distinct episodes in the full batches of 3 epochs (persistent workers)."""
    options = {} if mixed is None else {"mixed_batches": mixed}
    ds = ShardedLeRobotDataset(root, seed=11)
    loader = ShardedDataLoader(
        ds, batch_size=MIXING_BATCH, num_workers=workers, persistent_workers=True, **options
    )
    counts = []
    for _ in range(3):
        for batch in loader:
            episodes = batch["episode_index"].tolist()
            if len(episodes) == MIXING_BATCH:
                counts.append(len(set(episodes)))
    return float(np.mean(counts))


@pytest.mark.parametrize("workers", [2, 3])
def test_batches_mix_every_workers_pool(many_episodes, workers):
    """Every worker holds all of its 8 or 12 episodes at once (pools of 64). Uniform draws
    from all 24 would give 24 (1 - (23/24)^16) = 11.85 distinct episodes in a batch of 16; at
    the end of each epoch the pools run dry, so a batch falls a little short of that however
    it is mixed. A batch of one worker's draws holds at most that worker's 8 or 12 episodes."""
    ideal = EPISODES * (1 - (1 - 1 / EPISODES) ** MIXING_BATCH)
    assert distinct_per_batch(many_episodes, workers, None) >= 0.9 * ideal  # the default
    assert distinct_per_batch(many_episodes, workers, False) < 0.8 * ideal  # one worker's
