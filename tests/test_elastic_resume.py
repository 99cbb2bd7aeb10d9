"""Elastic resume of ShardedLeRobotDataset: a checkpoint taken at world size 2 (every rank at the
same step) resumes at world size 1 and 3 and with other DataLoader worker counts; what was
consumed before plus what is yielded after is every frame of the epoch exactly once (padding
aside). Ranks are simulated in one process with RANK/WORLD_SIZE, as each rank would see them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset

FRAMES = 74


def dataset(root: Path, **options) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(root, buffer_size=3, seed=5, **options)


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world_size: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world_size))


def take_direct(ds: ShardedLeRobotDataset, count: int) -> tuple[list[int], dict]:
    it = iter(ds)
    taken = [int(next(it)["index"]) for _ in range(count)]
    return taken, ds.state_dict()


def take_loader(
    ds: ShardedLeRobotDataset, num_workers: int, batch_size: int, batches: int
) -> tuple[list[int], dict]:
    ds.num_workers = num_workers
    taken: list[int] = []
    loader = DataLoader(ds, batch_size=batch_size, num_workers=num_workers)
    for batch in loader:
        taken += batch["index"].tolist()
        if len(taken) == batches * batch_size:
            break
    return taken, ds.state_dict(num_samples=len(taken), batch_size=batch_size)


def indices_of(ds: ShardedLeRobotDataset, num_workers: int = 0) -> list[int]:
    if not num_workers:
        return [int(item["index"]) for item in ds]
    ds.num_workers = num_workers
    out: list[int] = []
    for batch in DataLoader(ds, batch_size=4, num_workers=num_workers):
        out += batch["index"].tolist()
    return out


def resume_everywhere(monkeypatch, root, state, world_size, num_workers=0, **options):
    """Every new rank loads the (same) checkpoint and streams the rest of the epoch."""
    streams = []
    for rank in range(world_size):
        as_rank(monkeypatch, rank, world_size)
        ds = dataset(root, **options)
        ds.load_state_dict(state)
        streams.append(indices_of(ds, num_workers))
    return streams


def assert_exactly_once(consumed: list[int], streams: list[list[int]], parts: int) -> None:
    """Consumed plus yielded is every frame once; the only repeats are the rest's padding,
    fewer than the new parts, and every new rank yields as many samples."""
    after = [i for s in streams for i in s]
    assert not set(consumed) & set(after)
    assert set(consumed) | set(after) == set(range(FRAMES))
    assert len(set(consumed)) == len(consumed)
    assert len({len(s) for s in streams}) == 1
    assert len(after) - len(set(after)) < parts


@pytest.mark.parametrize("new_world", [1, 3])
def test_world_size_2_checkpoint_resumes_at_other_world_sizes(av1, monkeypatch, new_world):
    consumed, states = [], []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        taken, state = take_direct(dataset(av1), 13)
        consumed += taken
        states.append(state)
    assert states[0] == states[1]  # the same step on every rank: one checkpoint
    assert states[0]["world_size"] == 2 and states[0]["offset"] == 13
    streams = resume_everywhere(monkeypatch, av1, states[0], new_world)
    assert_exactly_once(consumed, streams, new_world)
    # The next epoch starts fresh under the new layout.
    as_rank(monkeypatch, 0, new_world)
    ds = dataset(av1)
    ds.load_state_dict(states[0])
    indices_of(ds)
    assert ds.state_dict()["epoch"] == 1
    nxt = [i for r in range(new_world) for i in _epoch(monkeypatch, av1, r, new_world, 1)]
    assert set(nxt) == set(range(FRAMES))


def _epoch(monkeypatch, root, rank, world_size, epoch):
    as_rank(monkeypatch, rank, world_size)
    ds = dataset(root)
    ds.set_epoch(epoch)
    return indices_of(ds)


def test_dataloader_workers_checkpoint_resumes_with_other_workers_and_ranks(av1, monkeypatch):
    """World size 2 with 2 workers per rank and batches of 4 -> 3 ranks with 1 worker, and ->
    the same 2 ranks iterating in process."""
    consumed, states = [], []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        taken, state = take_loader(dataset(av1), num_workers=2, batch_size=4, batches=3)
        consumed += taken
        states.append(state)
    assert states[0] == states[1] and states[0]["num_workers"] == 2
    streams = resume_everywhere(monkeypatch, av1, states[0], 3, num_workers=1)
    assert_exactly_once(consumed, streams, 3)
    streams = resume_everywhere(monkeypatch, av1, states[0], 2, num_workers=0)
    assert_exactly_once(consumed, streams, 2)


def test_nested_resume_mid_rest(av1, monkeypatch):
    """2 ranks -> 3 ranks, a checkpoint while the rest runs, -> 3 ranks again (the same rest
    stream goes on) and -> 1 rank (a second elastic resume): every frame once either way."""
    consumed = []
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        taken, state = take_direct(dataset(av1), 10)
        consumed += taken
    first = resume_everywhere(monkeypatch, av1, state, 3)
    middle, tails = [], []
    for rank in range(3):
        as_rank(monkeypatch, rank, 3)
        ds = dataset(av1)
        ds.load_state_dict(state)
        taken, mid_state = take_direct(ds, 6)
        assert "resumed_from" in mid_state and mid_state["offset"] == 6
        assert taken == first[rank][:6]
        middle += taken
        tails.append(first[rank][6:])
    # Same layout: each rank goes on with exactly its own rest.
    for rank in range(3):
        as_rank(monkeypatch, rank, 3)
        ds = dataset(av1)
        ds.load_state_dict(mid_state)
        assert indices_of(ds) == tails[rank]
    # Another layout: the rest of what is left, over one rank.
    (rest,) = resume_everywhere(monkeypatch, av1, mid_state, 1)
    assert_exactly_once(consumed + middle, [rest], 1)


def test_changed_settings_resume_elastically(av1, monkeypatch):
    """Another seed or pool size on the same layout re-plans the rest instead of replaying a
    stream the checkpoint never followed."""
    as_rank(monkeypatch, 0, 1)
    consumed, state = take_direct(dataset(av1), 30)
    ds = ShardedLeRobotDataset(av1, buffer_size=5, seed=9)
    ds.load_state_dict(state)
    assert_exactly_once(consumed, [indices_of(ds)], 1)


def test_same_layout_resumes_the_same_stream(av1, monkeypatch):
    as_rank(monkeypatch, 1, 2)
    full = indices_of(dataset(av1))
    consumed, state = take_direct(dataset(av1), 20)
    ds = dataset(av1)
    ds.load_state_dict(state)
    assert consumed + indices_of(ds) == full


def test_other_dataset_is_refused(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    _, state = take_direct(dataset(av1), 5)
    other = dataset(av1, episodes=[0, 1, 2])
    with pytest.raises(ValueError, match="another dataset: its manifest fingerprint"):
        other.load_state_dict(state)


def test_a_state_that_does_not_know_its_workers_is_never_taken_nor_loaded(av1, monkeypatch):
    as_rank(monkeypatch, 0, 2)
    ds = dataset(av1)  # ds.num_workers not set, never iterated here: the workers are unknown
    with pytest.raises(ValueError, match="cannot tell how many DataLoader workers"):
        ds.state_dict(num_samples=8, batch_size=4)
    state = {**dataset(av1).state_dict(), "offset": 8, "num_workers": None}  # an old version's
    for world in (2, 3):  # not even under the same world size
        as_rank(monkeypatch, 0, world)
        with pytest.raises(ValueError, match="does not record how many DataLoader workers"):
            dataset(av1).load_state_dict(state)


def test_rest_items_equal_fresh_items(av1, monkeypatch):
    """Items of a rest piece (an arbitrary subset of an episode's frames) are the same items."""
    as_rank(monkeypatch, 0, 1)
    by_index = {int(item["index"]): item for item in dataset(av1)}
    as_rank(monkeypatch, 0, 2)
    _, state = take_direct(dataset(av1), 17)
    as_rank(monkeypatch, 0, 1)
    ds = dataset(av1)
    ds.load_state_dict(state)
    for item in ds:
        want = by_index[int(item["index"])]
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(item[key], value), key
            else:
                assert item[key] == value, key


def test_endless_stream_checkpoint_across_an_epoch_boundary(av1, monkeypatch):
    """repeat=True, 2 ranks x 2 workers, batches of 4: after 9 batches per rank worker 0 is 1
    sample into epoch 1 and worker 1 still 3 short of the end of epoch 0 (19 samples per part).
    One rank resumes: the rest of epoch 0, then the rest of epoch 1, then epoch 2 fresh."""
    consumed: list[set[int]] = [set(), set()]
    for rank in range(2):
        as_rank(monkeypatch, rank, 2)
        ds = dataset(av1, repeat=True)
        ds.num_workers = 2
        batches = []
        for batch in DataLoader(ds, batch_size=4, num_workers=2):
            batches.append(batch["index"].tolist())
            if len(batches) == 9:
                break
        for worker in range(2):  # the loader takes one batch from each worker in turn
            stream = [i for b in batches[worker::2] for i in b]
            consumed[0] |= set(stream[:19])
            consumed[1] |= set(stream[19:])
        state = ds.state_dict(num_samples=36, batch_size=4)
    as_rank(monkeypatch, 0, 1)
    ds = dataset(av1, repeat=True)
    ds.load_state_dict(state)
    rests = [FRAMES - len(c) for c in consumed]
    it = iter(ds)
    after = [int(next(it)["index"]) for _ in range(sum(rests) + FRAMES)]
    spans = [after[: rests[0]], after[rests[0] : sum(rests)], after[sum(rests) :]]
    for epoch in (0, 1):
        assert not consumed[epoch] & set(spans[epoch])
        assert consumed[epoch] | set(spans[epoch]) == set(range(FRAMES))
    assert sorted(spans[2]) == list(range(FRAMES))
    assert position_of(ds.state_dict()) == (3, 0, False)


def position_of(state: dict) -> tuple[int, int, bool]:
    return state["epoch"], state["offset"], "resumed_from" in state


def as_node_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int, local: int) -> None:
    as_rank(monkeypatch, rank, world)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))


@pytest.mark.parametrize(
    ("new_world", "new_local", "new_workers", "affinity"),
    [(2, 2, 0, True), (3, 1, 1, True), (2, 1, 2, False)],
)
def test_node_affine_checkpoint_resumes_on_other_nodes(
    av1, monkeypatch, new_world, new_local, new_workers, affinity
):
    """4 ranks on 2 nodes with node affinity, 2 workers each, batches of 4 -> 1 node of 2
    ranks, 3 nodes of 1 rank, 2 nodes without affinity: every frame once."""
    consumed, states = [], []
    for rank in range(4):
        as_node_rank(monkeypatch, rank, 4, 2)
        ds = dataset(av1, node_affinity=True)
        taken, state = take_loader(ds, num_workers=2, batch_size=4, batches=2)
        consumed += taken
        states.append(state)
    assert states[0] == states[3]
    assert (states[0]["nodes"], states[0]["node_affinity"]) == (2, True)
    streams = []
    for rank in range(new_world):
        as_node_rank(monkeypatch, rank, new_world, new_local)
        ds = dataset(av1, node_affinity=affinity)
        ds.num_workers = new_workers
        ds.load_state_dict(states[0])
        streams.append(indices_of(ds, new_workers))
    assert_exactly_once(consumed, streams, new_world * max(1, new_workers))


def test_node_affine_same_layout_resumes_the_same_stream(av1, monkeypatch):
    as_node_rank(monkeypatch, 3, 4, 2)
    full = indices_of(dataset(av1, node_affinity=True))
    consumed, state = take_direct(dataset(av1, node_affinity=True), 7)
    ds = dataset(av1, node_affinity=True)
    ds.load_state_dict(state)
    assert consumed + indices_of(ds) == full


def test_a_state_without_nodes_loads_as_one_node_without_affinity(av1, monkeypatch):
    """States of earlier versions record neither nodes nor affinity: they resume the stream
    they were taken on (one node, no affinity), on any nodes when affinity is off."""
    as_rank(monkeypatch, 1, 2)
    full = indices_of(dataset(av1))
    consumed, state = take_direct(dataset(av1), 20)
    old = {k: v for k, v in state.items() if k not in ("nodes", "node_affinity")}
    for local in (2, 1):
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))
        ds = dataset(av1)
        ds.load_state_dict(old)
        assert consumed + indices_of(ds) == full
