"""Each new iteration of a DataLoader runs the next epoch, with fresh workers too.

A plain ``torch.utils.data.DataLoader`` with non-persistent workers starts new workers, copies
of the main process's dataset, for every ``iter(loader)``; they used to run epoch 0 every time.
They now run epochs 0, 1, 2, ... (``reader/loading/worker_epochs.py``), each every frame
exactly once, in the very order that ``set_epoch(e)`` or a ShardedDataLoader gives. The shared
record's arithmetic is checked apart, over any interleaving of the workers' starts."""

from __future__ import annotations

import copy
import json
import os
import pickle
import signal
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
from lerobot_shards.reader.loading.worker_epochs import claim, epochs_before

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

FRAMES = 74
BATCH = 5
WORKERS = 2


DATASET_OPTIONS = {"buffer_size": 3, "seed": 3}
PLAIN_LOADER_EPOCHS = Path(__file__).parent / "support" / "plain_loader_epochs.py"


def dataset(root) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(root, **DATASET_OPTIONS)


def order(loader) -> list[int]:
    out: list[int] = []
    for batch in loader:
        out += batch["index"].tolist()
    return out


_orders: dict[tuple, list[int]] = {}


def epoch_order(root, epoch: int, workers: int = WORKERS) -> list[int]:
    """Epoch ``epoch`` through fresh workers told it by ``set_epoch`` (as before the fix)."""
    if (root, epoch, workers) not in _orders:
        ds = dataset(root)
        ds.set_epoch(epoch)
        _orders[root, epoch, workers] = order(DataLoader(ds, batch_size=BATCH, num_workers=workers))
    return _orders[root, epoch, workers]


def assert_exact(ds: ShardedLeRobotDataset, stream: list[int], workers: int = WORKERS) -> None:
    """Every frame exactly once; the padding repeats frames of the epoch."""
    ds.num_workers = workers
    assert len(stream) == len(ds) == FRAMES + ds.padding
    assert sorted(set(stream)) == list(range(FRAMES))


@pytest.fixture(scope="module")
def reference(av1) -> list[list[int]]:
    """Epochs 0-2 through a ShardedDataLoader (which told its dataset the epoch before too),
    its batches each one worker's, as a plain DataLoader's are."""
    loader = ShardedDataLoader(
        dataset(av1), batch_size=BATCH, num_workers=WORKERS, mixed_batches=False
    )
    return [order(loader) for _ in range(3)]


def fresh_process_orders(root, start: str, epochs: int) -> list[list[int]]:
    """``epochs`` iterations of a plain DataLoader over ``dataset(root)``, its fresh workers
    started by ``start``, in a process of its own (``support/plain_loader_epochs.py`` says
    why); killed, and the test failed, if it hangs."""
    options = json.dumps(DATASET_OPTIONS)
    args = [str(root), start, str(epochs), str(BATCH), str(WORKERS), options]
    proc = subprocess.Popen(
        [sys.executable, str(PLAIN_LOADER_EPOCHS), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its workers too are killed if it hangs
    )
    try:
        stdout, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate()
        pytest.fail(f"the DataLoader hung:\n{stderr.decode()[-3000:]}")
    assert proc.returncode == 0, stderr.decode()[-3000:]
    return json.loads(stdout.decode().strip().splitlines()[-1])


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_plain_dataloader_runs_the_next_epoch_each_iteration(av1, reference, start):
    """Three iterations of one plain DataLoader, its fresh workers forked (the Linux default:
    the dataset copied without pickling) or from a forkserver, run epochs 0, 1 and 2."""
    ds = dataset(av1)
    orders = fresh_process_orders(av1, start, 3)
    for stream in orders:
        assert_exact(ds, stream)
    assert orders == reference
    assert len({tuple(o) for o in orders}) == 3
    assert reference[1] == epoch_order(av1, 1)


def test_set_epoch_wins_and_the_next_iteration_follows_it(av1):
    ds = dataset(av1)
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    order(loader)
    ds.set_epoch(5)
    assert order(loader) == epoch_order(av1, 5)
    assert order(loader) == epoch_order(av1, 6)
    ds.set_epoch(5)  # the loop that sets every epoch, again
    assert order(loader) == epoch_order(av1, 5)


@pytest.mark.parametrize("sharded", [False, True])
def test_persistent_workers_unchanged(av1, reference, sharded):
    cls = partial(ShardedDataLoader, mixed_batches=False) if sharded else DataLoader
    loader = cls(dataset(av1), batch_size=BATCH, num_workers=WORKERS, persistent_workers=True)
    assert [order(loader) for _ in range(3)] == reference


def test_in_process_iterations_and_other_worker_counts_continue_the_count(av1):
    """The epochs run on over an iteration in process and over loaders with other numbers of
    workers, every iteration still exact."""
    ds = dataset(av1)
    first = [int(item["index"]) for item in ds]  # epoch 0, in process
    assert sorted(first) == list(range(FRAMES))
    plan = [(1, 2), (2, 3), (3, 2), (4, 1), (5, 3)]
    for epoch, workers in plan:
        stream = order(DataLoader(ds, batch_size=BATCH, num_workers=workers))
        assert stream == epoch_order(av1, epoch, workers), (epoch, workers)
        assert_exact(ds, stream, workers)
        ds.num_workers = 0


def test_a_state_of_workers_past_the_position_is_refused(av1, reference):
    """With a plain DataLoader, ``ds.state_dict(num_samples=...)`` counts from where the main
    process last set the position: after two iterations it no longer knows the epoch."""
    ds = dataset(av1)
    ds.num_workers = WORKERS
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    order(loader)
    assert ds.state_dict(num_samples=BATCH, batch_size=BATCH)["epoch"] == 0
    next(iter(loader))
    with pytest.raises(ValueError, match=r"began 2 iterations .* ds.set_epoch"):
        ds.state_dict(num_samples=BATCH, batch_size=BATCH)
    # begin_epoch after each iter(loader) keeps it in step, as ShardedDataLoader does.
    ds = dataset(av1)
    ds.num_workers = WORKERS
    loader = DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)
    for epoch in range(3):
        batches = iter(loader)
        ds.begin_epoch()
        taken = next(batches)["index"].tolist()
        assert taken == reference[epoch][:BATCH]
        state = ds.state_dict(num_samples=BATCH, batch_size=BATCH)
        assert (state["epoch"], state["offset"]) == (epoch, BATCH)
        del batches


def test_copies_are_independent_datasets(av1):
    ds = dataset(av1)
    order(DataLoader(ds, batch_size=BATCH, num_workers=WORKERS))
    twin = copy.deepcopy(ds)
    again = pickle.loads(pickle.dumps(ds))
    assert order(DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)) == epoch_order(av1, 1)
    for other in (twin, again):  # their own record: they count their own iterations
        assert order(DataLoader(other, batch_size=BATCH, num_workers=WORKERS)) == (
            epoch_order(av1, 0)
        )


# ------------------------------------------------------------------ the record, pure


iterations = st.lists(
    st.tuples(
        st.integers(1, 4),  # workers
        st.randoms(use_true_random=False),  # their start order
        st.booleans(),  # worker 0 dies before it writes
        st.integers(0, 3),  # the main process changes its position: 0 no, else at this start
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(iterations, st.booleans())
def test_workers_of_an_iteration_agree_and_count_the_epochs(plan, unique_tokens):
    """Any interleaving of sibling starts, a main-side change at any point of an iteration (as
    ShardedDataLoader's begin_epoch after its workers started): the workers of an iteration
    always skip the same number of epochs; with distinct base seeds, exactly the iterations
    whose worker 0 wrote since the copied position was set."""
    word, generation, expected = 0, 0, 0
    for n, (workers, rng, dies, change_at) in enumerate(plan):
        token = n if unique_tokens else rng.choice([7, 8])
        mine = generation  # what the workers copied at their start
        starts = list(range(workers))
        rng.shuffle(starts)
        skips = []
        for i, worker in enumerate(starts):
            if change_at and i == change_at - 1:
                generation += 1
            if worker == 0:
                if dies:
                    continue
                skip, word = claim(word, mine, token)
            else:
                skip = epochs_before(word, mine, token)
            skips.append(skip)
        if change_at and change_at > len(starts):
            generation += 1
        assert len(set(skips)) <= 1, skips
        if unique_tokens:
            assert all(skip == expected for skip in skips), (skips, expected)
        else:
            assert all(skip <= expected for skip in skips)
        expected = 0 if generation != mine else expected + (not dies)


def test_torch_base_seed_is_shared_by_an_iterations_workers():
    """The record's token: ``info.seed - info.id``, equal over one iteration's workers."""
    loader = DataLoader(_Seeds(), batch_size=None, num_workers=3)
    seeds = [set(loader) for _ in range(2)]
    assert all(len(s) == 1 for s in seeds) and seeds[0] != seeds[1]


class _Seeds(torch.utils.data.IterableDataset):
    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        yield info.seed - info.id
