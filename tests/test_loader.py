"""ShardedDataLoader: checkpoints that cannot go wrong. Saved under every layout (DataLoader
workers 0-3, world size 1 and 2) and resumed under every other one, the resume is exact: the
same stream under the same layout, and every frame of the epoch exactly once otherwise. What
cannot be exact is refused, naming what to do. Ranks are simulated in one process with
RANK/WORLD_SIZE, as each rank would see them."""

from __future__ import annotations

import itertools

import pytest
import torch
from test_elastic_resume import FRAMES, as_rank, assert_exactly_once
from torch.utils.data import DataLoader

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

LAYOUTS = [(workers, world) for world in (1, 2) for workers in (0, 1, 2, 3)]
BATCH = 4
BATCHES_BEFORE = 5


def dataset(root) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(root, buffer_size=3, seed=7)


def rank_streams(monkeypatch, root, workers, world, state=None, stop_after=None):
    """Each rank's indices through a ShardedDataLoader (from ``state`` if given; the first
    ``stop_after`` batches only, if given), and each rank's state at the stop."""
    streams, states = [], []
    for rank in range(world):
        as_rank(monkeypatch, rank, world)
        loader = ShardedDataLoader(dataset(root), batch_size=BATCH, num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        taken: list[int] = []
        for n, batch in enumerate(loader, 1):
            taken += batch["index"].tolist()
            if n == stop_after:
                break
        streams.append(taken)
        states.append(loader.state_dict())
    return streams, states


@pytest.mark.parametrize(("saved_workers", "saved_world"), LAYOUTS)
def test_saved_under_any_layout_resumes_exactly_under_every_layout(
    av1, monkeypatch, saved_workers, saved_world
):
    full, _ = rank_streams(monkeypatch, av1, saved_workers, saved_world)
    before, states = rank_streams(
        monkeypatch, av1, saved_workers, saved_world, stop_after=BATCHES_BEFORE
    )
    assert all(state == states[0] for state in states)  # every rank at the same step
    state = states[0]
    assert (state["num_workers"], state["world_size"]) == (saved_workers, saved_world)
    consumed = [i for stream in before for i in stream]
    for workers, world in LAYOUTS:
        after, _ = rank_streams(monkeypatch, av1, workers, world, state=state)
        if (workers, world) == (saved_workers, saved_world):
            for rank in range(world):  # the very same stream
                assert before[rank] + after[rank] == full[rank], (workers, world, rank)
        else:
            assert_exactly_once(consumed, after, max(1, workers) * world)


def test_state_at_every_batch_resumes_the_same_stream(av1, monkeypatch):
    """Two workers, persistent, over two epochs: a state taken after any batch resumes into
    exactly the batches that followed it."""
    as_rank(monkeypatch, 0, 1)
    loader = ShardedDataLoader(
        dataset(av1), batch_size=BATCH, num_workers=2, persistent_workers=True
    )
    batches, states = [], []
    for _ in range(2):
        for batch in loader:
            batches.append(batch["index"].tolist())
            states.append(loader.state_dict())
    assert sorted(itertools.chain(*batches[: len(batches) // 2])) == list(range(FRAMES))
    for k in (0, 4, len(batches) // 2 - 1, len(batches) // 2 + 2):
        resumed = ShardedDataLoader(dataset(av1), batch_size=BATCH, num_workers=2)
        resumed.load_state_dict(states[k])
        rest = [b["index"].tolist() for b in resumed]
        epoch_end = len(batches) // 2 if k < len(batches) // 2 else len(batches)
        assert rest == batches[k + 1 : epoch_end], k


def test_a_state_loaded_behind_running_persistent_workers_is_refused(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    loader = ShardedDataLoader(
        dataset(av1), batch_size=BATCH, num_workers=1, persistent_workers=True
    )
    next(iter(loader))
    state = loader.state_dict()
    with pytest.raises(RuntimeError, match="into a new ShardedDataLoader"):
        loader.load_state_dict(state)


def test_the_reproduction_is_refused(av1, monkeypatch):
    """A plain DataLoader with 2 workers and ds.num_workers unset: after 5 batches of 4 the
    state used to be accepted, and a resume with 0, 1 or 3 workers repeated and dropped about
    17 frames. Now the state is not taken."""
    as_rank(monkeypatch, 0, 1)
    ds = dataset(av1)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=2)
    for n, _ in enumerate(loader, 1):
        if n == BATCHES_BEFORE:
            break
    with pytest.raises(ValueError, match="ShardedDataLoader"):
        ds.state_dict(num_samples=BATCHES_BEFORE * BATCH, batch_size=BATCH)


def test_workers_refuse_a_wrong_num_workers(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    ds = dataset(av1)
    ds.num_workers = 3
    with pytest.raises(ValueError, match=r"ds.num_workers is 3 but the DataLoader has 2"):
        next(iter(DataLoader(ds, batch_size=BATCH, num_workers=2)))


def test_batches_it_cannot_count_are_refused(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    loader = ShardedDataLoader(dataset(av1), batch_size=BATCH, collate_fn=len)
    with pytest.raises(TypeError, match="cannot count the samples of a int batch"):
        next(iter(loader))
    with pytest.raises(TypeError, match="takes a ShardedLeRobotDataset"):
        ShardedDataLoader(torch.utils.data.TensorDataset(torch.zeros(3)), batch_size=1)
