"""reader.transfer and reader.collate in a DataLoader worker: batched tensors through reused
shared segments, equal to torch's own batches, a segment reused only once both sides are done
with it, and frames decoded into their batch slots never copied."""

from __future__ import annotations

import copy
import gc
import pickle
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from support.batches import assert_same_batch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.reader.batches import collate as collate_module
from lerobot_shards.reader.batches import transfer
from lerobot_shards.reader.batches.collate import typed_item

# Skipped on the platform, never on what transfer.worker_pool() returns: on Linux the pool must
# exist (test_disabled_by_the_environment), and a None pool fails these tests, not hides them.
pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="shared segments need Linux (memfd and /proc)"
)


def items(n: int, seed: int = 0) -> list[dict]:
    """Plain items shaped as the reader's: frames are channel-first views of channel-last memory."""
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "cam": torch.randint(0, 256, (3, 6, 8), dtype=torch.uint8, generator=g)
            .permute(1, 2, 0)
            .contiguous()
            .permute(2, 0, 1),
            "state": torch.randn(4, generator=g),
            "index": torch.tensor(i + 100 * seed),
            "pad": torch.tensor([i % 2 == 0]),
            "task": f"task {i}",
        }
        for i in range(n)
    ]


def typed(chunk: list[dict]) -> list[dict]:
    return [typed_item(item, ["cam"]) for item in chunk]


def send(batch):
    """What the DataLoader does: pickle in the worker, unpickle in the main process."""
    return pickle.loads(ForkingPickler.dumps(batch))


@pytest.fixture
def worker(monkeypatch):
    """This process as a DataLoader worker with a pool of its own; returns a pool maker."""
    monkeypatch.setattr(collate_module, "get_worker_info", object)

    def use(max_segments: int = transfer.MAX_SEGMENTS) -> transfer.SegmentPool:
        pool = transfer.SegmentPool(max_segments)
        monkeypatch.setattr(transfer, "worker_pool", lambda: pool)
        return pool

    return use


def test_sent_batch_equals_torchs_and_frames_are_views(worker):
    pool = worker()
    chunk = items(5)
    worker_side = default_collate(typed(chunk))
    assert type(worker_side["cam"]) is transfer.SharedTensor
    main_side = send(worker_side)
    assert_same_batch(main_side, default_collate(chunk))  # torch's own batch of plain items
    assert main_side["cam"].movedim(-3, -1).is_contiguous()  # no transposing copy
    assert not main_side["cam"].untyped_storage().is_shared()  # not torch's shared memory
    segment = pool.segments[0]
    assert len(pool.segments) == 1  # the small columns went by value
    del worker_side
    gc.collect()
    assert not segment.free  # the main process still holds the frames
    index = main_side["index"]
    del main_side
    gc.collect()
    assert segment.free  # the index came by value: keeping it does not keep the segment
    assert torch.equal(index, torch.arange(5))


def test_the_main_process_sees_the_workers_memory():
    """The main side's frames view the very segment the worker wrote: nothing copied between."""
    pool = transfer.SegmentPool(max_segments=1)
    lease = transfer._Lease.acquire(pool, (2, 6, 8, 3), torch.uint8)
    lease.tensor.zero_()
    main_side = send(transfer._shared(lease, 2, frames=True))
    lease.tensor[1, 2, 3, 0] = 77
    assert main_side.shape == (2, 3, 6, 8) and main_side[1, 0, 2, 3] == 77


def test_segment_is_reused_only_when_free_and_held_batches_keep_their_values(worker):
    pool = worker(max_segments=2)
    chunks = [items(4, seed) for seed in range(4)]
    first = send(default_collate(typed(chunks[0])))
    second = send(default_collate(typed(chunks[1])))
    gc.collect()
    assert len(pool.segments) == 2 and not any(s.free for s in pool.segments)
    frames = [item["cam"].movedim(-3, -1) for item in chunks[2]]
    assert transfer.share_stacked(frames, frames=True) is None  # both held
    fallback = default_collate(typed(chunks[2]))  # then torch's shared memory: same batch
    assert fallback["cam"].untyped_storage().is_shared()
    assert_same_batch(send(fallback), default_collate(chunks[2]))
    del first
    gc.collect()
    third = send(default_collate(typed(chunks[3])))  # reuses the first segment
    assert len(pool.segments) == 2
    assert_same_batch(second, default_collate(chunks[1]))
    assert_same_batch(third, default_collate(chunks[3]))
    del second, third
    gc.collect()
    assert all(s.free for s in pool.segments)


def test_a_batch_never_sent_frees_its_segment(worker):
    pool = worker(max_segments=1)
    batch = default_collate(typed(items(3)))
    frames = batch["cam"]
    del batch
    gc.collect()
    assert not pool.segments[0].free  # the worker still holds a view
    del frames
    gc.collect()
    assert pool.segments[0].free


def torch_collate(batch: list[dict]) -> dict:
    """torch's own batch of the same items as plain tensors: the reference."""
    return default_collate([{k: plain(v) for k, v in item.items()} for item in batch])


def plain(value):
    return value.as_subclass(torch.Tensor) if isinstance(value, torch.Tensor) else value


def test_dataloader_workers_reusing_segments_deliver_every_batch_intact(av1):
    """Batches consumed one at a time (so segments are reused) equal torch's own batches."""
    ds = ShardedLeRobotDataset(av1, return_uint8=True, seed=4)
    ds.num_workers = 2
    ds.set_epoch(0)
    expected = list(DataLoader(ds, batch_size=2, num_workers=2, collate_fn=torch_collate))
    ds.set_epoch(0)
    loader = DataLoader(ds, batch_size=2, num_workers=2, prefetch_factor=4)
    count = through_segments = 0
    for batch, theirs in zip(loader, expected, strict=True):
        assert_same_batch(batch, theirs)
        count += 1
        cameras = [batch[key] for key in ds.meta.camera_keys]
        through_segments += not any(c.untyped_storage().is_shared() for c in cameras)
    per_worker = count // 2 * len(ds.meta.camera_keys)  # segments a worker would need
    assert count == len(expected) and per_worker > transfer.MAX_SEGMENTS  # so some were reused
    assert through_segments == count


def test_disabled_by_the_environment(monkeypatch):
    monkeypatch.setenv(transfer.DISABLE, "0")
    monkeypatch.setattr(transfer, "_pool", None)
    assert transfer.worker_pool() is None
    monkeypatch.delenv(transfer.DISABLE)
    monkeypatch.setattr(transfer, "_pool", None)
    assert transfer.worker_pool() is not None


def test_large_columns_go_through_segments_and_small_ones_by_value(worker):
    pool = worker(max_segments=1)
    big = [torch.full((transfer.VIEW_BYTES // 4,), float(i)) for i in range(2)]
    chunk = [{"big": b, "small": torch.tensor([i])} for i, b in enumerate(big)]
    main_side = send(default_collate([typed_item(item, []) for item in chunk]))
    assert_same_batch(main_side, default_collate(chunk))
    small_kept = main_side["small"]
    big_kept = main_side["big"]
    del main_side
    gc.collect()
    assert len(pool.segments) == 1 and not pool.segments[0].free  # the big column is a view
    del big_kept
    gc.collect()
    assert pool.segments[0].free  # the small one came by value
    assert torch.equal(small_kept, torch.tensor([[0], [1]]))


def test_stateful_dataloader_resumes_through_segments(av1):
    """torchdata's StatefulDataLoader sends (batch, state) from its workers: the batch still
    arrives through segments, and a resumed loader yields exactly what followed."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        ds = ShardedLeRobotDataset(av1, return_uint8=True, buffer_size=3, seed=5)
        return StatefulDataLoader(ds, batch_size=4, num_workers=2)

    full = [b["index"].tolist() for b in loader()]
    first, taken = loader(), []
    for batch in first:
        cameras = [batch[key] for key in first.dataset.meta.camera_keys]
        assert not any(c.untyped_storage().is_shared() for c in cameras)  # through a segment
        taken.append(batch["index"].tolist())
        if len(taken) == 5:
            state = first.state_dict()
            break
    assert taken == full[:5]
    second = loader()
    second.load_state_dict(state)
    assert [b["index"].tolist() for b in second] == full[5:]


def test_a_batch_pickled_twice_frees_its_segment_once(worker):
    """A batch pickled once more in the worker maps the segment itself; the batch sent after it
    goes as a plain copy, so the segment is never freed while the main process could still be
    using it. A deep copy is a plain copy."""
    pool = worker(max_segments=1)
    chunk = items(3)
    batch = default_collate(typed(chunk))
    duplicate = pickle.loads(pickle.dumps(batch))
    deep = copy.deepcopy(batch)
    assert type(deep["cam"]) is torch.Tensor and not deep["cam"].untyped_storage().is_shared()
    main_side = send(batch)
    assert_same_batch(duplicate, default_collate(chunk))
    assert_same_batch(deep, default_collate(chunk))
    assert_same_batch(main_side, default_collate(chunk))
    del duplicate, batch
    gc.collect()
    assert pool.segments[0].free  # the copy's views are gone; the sent batch holds none
    overwriting = send(default_collate(typed(items(3, seed=9))))  # the segment reused
    assert_same_batch(main_side, default_collate(chunk))
    assert_same_batch(overwriting, default_collate(items(3, seed=9)))


def test_a_batch_from_a_worker_that_is_gone_is_a_clear_error(worker):
    worker(max_segments=1)
    frames = default_collate(typed(items(2)))["cam"]
    _, (address, *rest) = frames.__reduce_ex__(2)
    gone = (2**22 + 12345, *address[1:])  # above Linux's default pid_max: no such process
    with pytest.raises(RuntimeError, match=r"worker \(pid 4206649\) .*has exited.*=0"):
        transfer._attach(gone, *rest)


def test_frames_of_different_shapes_are_batched_as_torch_does(worker):
    pool = worker(max_segments=1)
    chunk = items(2)
    chunk[1]["cam"] = chunk[1]["cam"][:, :5]  # one row less
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):
        default_collate(typed(chunk))
    assert not pool.segments  # nothing was acquired


def in_slots(chunk: list[dict], pool: transfer.SegmentPool, order: list[int]) -> list[dict]:
    """What the reader does in a worker: each item's frame written into the slot the arena
    gives its row (``order[row]`` is the item written there), the item holding a view of it."""
    placed = [dict(item) for item in chunk]
    for row in range(len(chunk)):
        slots = pool.arena.slots()
        assert slots is not None and slots["cam"].shape == (1, 6, 8, 3)
        slots["cam"][0].copy_(chunk[order[row]]["cam"].movedim(-3, -1))
        placed[order[row]]["cam"] = slots["cam"].permute(0, 3, 1, 2).squeeze(0)
    return typed(placed)


def test_frames_written_into_their_slots_are_not_copied(worker):
    pool = worker()
    assert pool.arena.slots() is None  # nothing to lay out before a first batch
    default_collate(typed(items(4, 0)))  # the arena learns the camera's batch from it
    chunk = items(4, 1)
    placed = in_slots(chunk, pool, order=[0, 1, 2, 3])
    slot_memory = [item["cam"].data_ptr() for item in placed]
    batch = default_collate(placed)
    assert [batch["cam"][i].data_ptr() for i in range(4)] == slot_memory  # no copy
    assert_same_batch(send(batch), default_collate(chunk))
    assert pool.arena.slots() is not None  # offered again for the next batch


def test_frames_out_of_their_slots_are_copied_and_the_camera_declined(worker):
    pool = worker()
    default_collate(typed(items(4, 0)))
    chunk = items(4, 1)
    placed = in_slots(chunk, pool, order=[1, 0, 2, 3])  # say, a wrapper reordering items
    batch = default_collate(placed)
    assert batch["cam"].data_ptr() not in {item["cam"].data_ptr() for item in placed}
    assert_same_batch(send(batch), default_collate(chunk))
    assert pool.arena.slots() is None  # not offered again: its items do not keep them


def test_a_short_batch_views_its_rows_and_slots_are_offered_again(worker):
    pool = worker()
    default_collate(typed(items(4, 0)))
    chunk = items(3, 1)  # the epoch's last batch
    placed = in_slots(chunk, pool, order=[0, 1, 2])
    batch = default_collate(placed)
    assert batch["cam"].data_ptr() == placed[0]["cam"].data_ptr()  # its rows, not a copy
    assert_same_batch(send(batch), default_collate(chunk))
    del batch, placed
    gc.collect()
    in_slots(items(4, 3), pool, order=[0, 1, 2, 3])  # asserts a slot for every row


def _flip(frames: torch.Tensor) -> torch.Tensor:
    return frames.flip(-1)  # a new tensor, as image transforms return


def lerobot_style_collate(batch: list[dict]) -> dict:
    """As LeRobot's ``lerobot_collate_fn``: new plain dicts, then ``default_collate``."""
    return default_collate([dict(item) for item in batch])


@pytest.mark.parametrize("options", ["delta_timestamps", "image_transforms", "float", "lerobot"])
def test_items_written_into_slots_or_not_batch_as_torch_does(av1, golden_delta_timestamps, options):
    """Several frames per camera (frames shown by several items), transformed frames, float
    frames, and a collate_fn of LeRobot's kind, through 2 workers: torch's own batches."""
    kwargs = {
        "delta_timestamps": {"delta_timestamps": golden_delta_timestamps, "return_uint8": True},
        "image_transforms": {"image_transforms": _flip, "return_uint8": True},
        "float": {"return_uint8": False},
        "lerobot": {"return_uint8": True},
    }[options]
    collate_fn = lerobot_style_collate if options == "lerobot" else None
    ds = ShardedLeRobotDataset(av1, seed=2, **kwargs)
    ds.num_workers = 2
    ds.set_epoch(0)
    expected = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=torch_collate))
    ds.set_epoch(0)
    got = list(DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate_fn))
    assert len(got) == len(expected) > 4
    for ours, theirs in zip(got, expected, strict=True):
        assert_same_batch(ours, theirs)
