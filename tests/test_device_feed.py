"""DeviceFeed (``lerobot_shards.to_device``): the loader's batches, in its order, on the device,
one copied ahead; a checkpoint taken while batches are in flight resumes at the first batch the
loop did not take. The CPU runs everything but the CUDA stream; the CUDA test needs a GPU."""

from __future__ import annotations

import time

import pytest
import torch
from test_elastic_resume import as_rank

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset, to_device

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

BATCH = 4


def loader(root, workers: int = 2) -> ShardedDataLoader:
    ds = ShardedLeRobotDataset(root, buffer_size=3, seed=11, return_uint8=True)
    return ShardedDataLoader(
        ds, batch_size=BATCH, num_workers=workers, persistent_workers=workers > 0
    )


def epochs(batches_of, count: int) -> list[list[dict]]:
    return [list(batches_of()) for _ in range(count)]


def assert_same_batches(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for n, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.keys() == b.keys(), n
        for key in a:
            if isinstance(a[key], torch.Tensor):
                assert a[key].device.type == b[key].device.type == "cpu"
                assert torch.equal(a[key], b[key]), (n, key)
            else:
                assert a[key] == b[key], (n, key)


def wait_for_in_flight(feed, plain: ShardedDataLoader, timeout: float = 60.0) -> None:
    """Until the loader has delivered samples the loop has not taken (a batch in flight)."""
    deadline = time.monotonic() + timeout
    while plain._delivered <= feed._consumed:
        assert time.monotonic() < deadline, "no batch went in flight"
        time.sleep(0.01)


@pytest.mark.parametrize("workers", [0, 2])
def test_same_batches_in_the_same_order(av1, monkeypatch, workers):
    as_rank(monkeypatch, 0, 1)
    plain = loader(av1, workers)
    want = epochs(lambda: iter(plain), 2)
    feed = to_device(loader(av1, workers), "cpu")
    got = epochs(lambda: iter(feed), 2)
    for g, w in zip(got, want, strict=True):
        assert_same_batches(g, w)
    assert [b["index"].tolist() for b in got[0]] != [b["index"].tolist() for b in got[1]]


@pytest.mark.parametrize("stop_after", [1, 3, 9])
def test_checkpoint_with_batches_in_flight_resumes_exactly(av1, monkeypatch, stop_after):
    """A state taken after ``stop_after`` batches while the feed holds later ones (checked)
    resumes, in a new loader, into exactly the batches that followed; over the end of the
    epoch into the next one too."""
    as_rank(monkeypatch, 0, 1)
    plain = loader(av1)
    whole = [b["index"].tolist() for _ in range(2) for b in plain]
    source = loader(av1)
    feed = to_device(source, "cpu")
    taken = []
    batches = iter(feed)
    for _ in range(stop_after):
        taken.append(next(batches)["index"].tolist())
    wait_for_in_flight(feed, source)
    state = feed.state_dict()
    batches.close()
    resumed = to_device(loader(av1), "cpu")
    resumed.load_state_dict(state)
    rest = [b["index"].tolist() for _ in range(2) for b in resumed]
    assert taken + rest[: len(whole) - len(taken)] == whole


def test_state_before_the_first_batch_is_the_epoch_start(av1, monkeypatch):
    """``iter(feed)`` begins the epoch at once: a state taken before any batch arrived resumes
    at that epoch's start, not at the previous one's."""
    as_rank(monkeypatch, 0, 1)
    plain = loader(av1)
    reference = [[b["index"].tolist() for b in plain] for _ in range(2)]
    feed = to_device(loader(av1), "cpu")
    for _ in feed:  # epoch 0
        pass
    iter(feed)
    state = feed.state_dict()
    resumed = to_device(loader(av1), "cpu")
    resumed.load_state_dict(state)
    assert [b["index"].tolist() for b in resumed] == reference[1]


def test_a_loader_error_reaches_the_loop(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)

    def broken(items):
        raise RuntimeError("collate failed")

    ds = ShardedLeRobotDataset(av1, buffer_size=3, seed=11)
    feed = to_device(ShardedDataLoader(ds, batch_size=BATCH, collate_fn=broken), "cpu")
    with pytest.raises(RuntimeError, match="collate failed"):
        next(iter(feed))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_batches_equal_the_host_batches(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    want = list(loader(av1))
    got = [
        {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for batch in to_device(loader(av1), "cuda")
    ]
    assert_same_batches(got, want)


def test_any_loader_is_fed_but_only_a_sharded_one_has_a_state(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    plain = torch.utils.data.DataLoader(ShardedLeRobotDataset(av1, seed=11), batch_size=BATCH)
    feed = to_device(plain, "cpu")
    assert sum(len(b["index"]) for b in feed) == len(plain.dataset)
    with pytest.raises(TypeError, match="ShardedDataLoader"):
        feed.state_dict()
