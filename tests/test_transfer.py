"""reader.transfer: batches through reused shared segments, equal to default_collate's, and a
segment reused only once both sides are done with it."""

from __future__ import annotations

import gc
import pickle
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from support.batches import assert_same_batch
from torch.utils.data import DataLoader, default_collate

from lerobot_shards import ShardedLeRobotDataset, collate
from lerobot_shards.reader import transfer

pytestmark = pytest.mark.skipif(
    transfer.worker_pool() is None, reason="shared segments need Linux (memfd and /proc)"
)


def items(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "cam": torch.randint(0, 256, (3, 6, 8), dtype=torch.uint8, generator=g)
            .permute(1, 2, 0)
            .contiguous()
            .permute(2, 0, 1),  # channel-first view of channel-last memory, as the reader's
            "state": torch.randn(4, generator=g),
            "index": torch.tensor(i + 100 * seed),
            "pad": torch.tensor([i % 2 == 0]),
            "task": f"task {i}",
        }
        for i in range(n)
    ]


def send(batch: dict) -> dict:
    """What the DataLoader does: pickle in the worker, unpickle in the main process."""
    return pickle.loads(ForkingPickler.dumps(batch))


def packed(chunk: list[dict], pool: transfer.SegmentPool) -> transfer.SharedBatch:
    columns = {}
    for key in chunk[0]:
        values = [item[key] for item in chunk]
        if key == "cam":
            values = [v.movedim(-3, -1) for v in values]
        columns[key] = values if transfer.stackable(values) else default_collate(values)
    batch = transfer.pack(columns, ["cam"], pool)
    assert batch is not None
    return batch


def test_sent_batch_equals_default_collate_and_frames_are_views():
    pool = transfer.SegmentPool()
    chunk = items(5)
    worker_side = packed(chunk, pool)
    assert_same_batch(worker_side, default_collate(chunk))  # a dict in the worker too
    main_side = send(worker_side)
    assert type(main_side) is dict
    assert_same_batch(main_side, default_collate(chunk))
    assert main_side["cam"].movedim(-3, -1).is_contiguous()
    segment = pool.segments[0]
    del worker_side
    gc.collect()
    assert not segment.free  # the main process still holds the frames
    index = main_side["index"]
    del main_side
    gc.collect()
    assert segment.free  # the index is a copy: keeping it does not keep the segment
    assert torch.equal(index, torch.arange(5))


def test_segment_is_reused_only_when_free_and_held_batches_keep_their_values():
    pool = transfer.SegmentPool(max_segments=2)
    chunks = [items(4, seed) for seed in range(4)]
    first = send(packed(chunks[0], pool))
    second = send(packed(chunks[1], pool))
    gc.collect()
    assert len(pool.segments) == 2 and not any(s.free for s in pool.segments)
    columns = {"cam": [v.movedim(-3, -1) for v in (i["cam"] for i in chunks[2])]}
    assert transfer.pack(columns, ["cam"], pool) is None  # both held: the caller goes torch's way
    del first
    gc.collect()
    third = send(packed(chunks[2], pool))  # reuses the first segment
    assert len(pool.segments) == 2
    assert_same_batch(second, default_collate(chunks[1]))
    assert_same_batch(third, default_collate(chunks[2]))
    del second, third
    gc.collect()
    assert all(s.free for s in pool.segments)


def test_a_batch_never_sent_frees_its_segment():
    pool = transfer.SegmentPool(max_segments=1)
    batch = packed(items(3), pool)
    frames = batch["cam"]
    del batch
    gc.collect()
    assert not pool.segments[0].free  # the worker still holds a view
    del frames
    gc.collect()
    assert pool.segments[0].free


def test_collate_in_a_worker_when_every_segment_is_held(monkeypatch):
    """With every segment held, collate falls back to torch's shared memory: same batch."""
    pool = transfer.SegmentPool(max_segments=1)
    monkeypatch.setattr(transfer, "worker_pool", lambda: pool)
    monkeypatch.setattr(sys.modules["lerobot_shards.reader.collate"], "get_worker_info", object)
    held = send(collate(items(2, 1)))
    gc.collect()
    assert not pool.segments[0].free
    chunk = items(3, 2)
    fallback = collate(chunk)
    assert type(fallback) is dict
    assert_same_batch(send(fallback), default_collate(chunk))
    assert_same_batch(held, default_collate(items(2, 1)))


def test_dataloader_workers_reusing_segments_deliver_every_batch_intact(av1):
    """Batches consumed one at a time (so segments are reused) equal default_collate's."""
    ds = ShardedLeRobotDataset(av1, return_uint8=True, seed=4)
    ds.num_workers = 2
    ds.set_epoch(0)
    expected = [
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        for batch in DataLoader(ds, batch_size=3, num_workers=2)
    ]
    ds.set_epoch(0)
    loader = DataLoader(ds, batch_size=3, num_workers=2, collate_fn=collate, prefetch_factor=4)
    count = through_segments = 0
    for batch, theirs in zip(loader, expected, strict=True):
        assert_same_batch(batch, theirs)
        count += 1
        # torch's way leaves the frames in shared memory of the main process's own mapping.
        cameras = [batch[key] for key in ds.meta.camera_keys]
        through_segments += not any(c.untyped_storage().is_shared() for c in cameras)
    assert count == len(expected) > 2 * transfer.MAX_SEGMENTS
    assert through_segments == count


def test_disabled_by_the_environment(monkeypatch):
    monkeypatch.setenv(transfer.DISABLE, "0")
    monkeypatch.setattr(transfer, "_pool", None)
    assert transfer.worker_pool() is None
    monkeypatch.delenv(transfer.DISABLE)
    monkeypatch.setattr(transfer, "_pool", None)
    assert transfer.worker_pool() is not None


def test_large_columns_are_views_and_small_ones_copies():
    pool = transfer.SegmentPool(max_segments=1)
    big = [torch.full((transfer.VIEW_BYTES // 4,), float(i)) for i in range(2)]
    small = [torch.tensor([i]) for i in range(2)]
    main_side = send(transfer.pack({"big": big, "small": small}, [], pool))
    assert torch.equal(main_side["big"], torch.stack(big))
    assert torch.equal(main_side["small"], torch.stack(small))
    small_kept = main_side["small"]
    big_kept = main_side["big"]
    del main_side
    gc.collect()
    assert not pool.segments[0].free  # the big column is a view: it holds the segment
    del big_kept
    gc.collect()
    assert pool.segments[0].free  # the small one was a copy
    assert torch.equal(small_kept, torch.tensor([[0], [1]]))


def test_stateful_dataloader_with_collate_resumes_through_segments(av1):
    """torchdata's StatefulDataLoader sends (batch, state) from its workers: the batch still
    arrives whole through a segment, and a resumed loader yields exactly what followed."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        ds = ShardedLeRobotDataset(av1, return_uint8=True, buffer_size=3, seed=5)
        return StatefulDataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)

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


def test_a_batch_pickled_twice_frees_its_segment_once():
    """A copy of the batch taken in the worker (copy.deepcopy pickles it) maps the segment
    itself; the batch sent after it goes as a plain copy, so the segment is never freed while
    the main process could still be using it."""
    import copy

    pool = transfer.SegmentPool(max_segments=1)
    chunk = items(3)
    batch = packed(chunk, pool)
    duplicate = copy.deepcopy(batch)
    main_side = send(batch)
    assert_same_batch(duplicate, default_collate(chunk))
    assert_same_batch(main_side, default_collate(chunk))
    del duplicate, batch
    gc.collect()
    assert pool.segments[0].free  # the copy's views are gone; the sent batch holds none
    overwriting = packed(items(3, seed=9), pool)  # the segment reused for the next batch
    assert_same_batch(main_side, default_collate(chunk))
    assert_same_batch(overwriting, default_collate(items(3, seed=9)))


def test_a_batch_from_a_worker_that_is_gone_is_a_clear_error():
    pool = transfer.SegmentPool(max_segments=1)
    batch = packed(items(2), pool)
    _, (address, *rest) = batch.__reduce__()
    gone = (2**22 + 12345, *address[1:])  # above Linux's default pid_max: no such process
    with pytest.raises(RuntimeError, match=r"worker \(pid 4206649\) .*has exited.*=0"):
        transfer._attach(gone, *rest)


def test_frames_of_different_shapes_are_not_packed():
    pool = transfer.SegmentPool(max_segments=1)
    frames = [torch.zeros(4, 6, 3, dtype=torch.uint8), torch.zeros(5, 6, 3, dtype=torch.uint8)]
    index = [torch.tensor(0), torch.tensor(1)]
    assert transfer.pack({"cam": frames, "index": index}, ["cam"], pool) is None
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
    return placed


def test_frames_written_into_their_slots_are_not_copied():
    pool = transfer.SegmentPool()
    assert pool.arena.slots() is None  # nothing to lay out before a first batch
    packed(items(4, 0), pool)  # the arena learns the batch's layout from it
    chunk = items(4, 1)
    placed = in_slots(chunk, pool, order=[0, 1, 2, 3])
    slot_memory = [item["cam"].data_ptr() for item in placed]
    batch = packed(placed, pool)
    assert [batch["cam"][i].data_ptr() for i in range(4)] == slot_memory  # no copy
    assert_same_batch(send(batch), default_collate(chunk))
    assert pool.arena.slots() is not None  # offered again for the next batch


def test_frames_out_of_their_slots_are_copied_and_the_camera_declined():
    pool = transfer.SegmentPool()
    packed(items(4, 0), pool)
    chunk = items(4, 1)
    placed = in_slots(chunk, pool, order=[1, 0, 2, 3])  # say, a wrapper reordering items
    batch = packed(placed, pool)
    assert batch["cam"].data_ptr() not in {item["cam"].data_ptr() for item in placed}
    assert_same_batch(send(batch), default_collate(chunk))
    pool.arena.slots()
    assert pool.arena.slots() is None  # not offered again: its items do not keep them


def test_a_short_batch_is_copied_and_slots_are_offered_again():
    pool = transfer.SegmentPool()
    packed(items(4, 0), pool)
    chunk = items(3, 1)  # the epoch's last batch
    placed = in_slots(chunk, pool, order=[0, 1, 2])
    batch = packed(placed, pool)
    assert_same_batch(send(batch), default_collate(chunk))
    del batch, placed
    gc.collect()
    packed(items(4, 2), pool)  # a full batch again
    in_slots(items(4, 3), pool, order=[0, 1, 2, 3])  # asserts a slot for every row


def _flip(frames: torch.Tensor) -> torch.Tensor:
    return frames.flip(-1)  # a new tensor, as image transforms return


@pytest.mark.parametrize("options", ["delta_timestamps", "image_transforms", "float"])
def test_items_written_into_slots_or_not_batch_as_default_collate(
    av1, golden_delta_timestamps, options
):
    """Several frames per camera (frames shown by several items), transformed frames and float
    frames, through 2 workers with collate: the same batches as default_collate's."""
    kwargs = {
        "delta_timestamps": {"delta_timestamps": golden_delta_timestamps, "return_uint8": True},
        "image_transforms": {"image_transforms": _flip, "return_uint8": True},
        "float": {"return_uint8": False},
    }[options]
    ds = ShardedLeRobotDataset(av1, seed=2, **kwargs)
    ds.num_workers = 2
    ds.set_epoch(0)
    expected = list(DataLoader(ds, batch_size=4, num_workers=2))
    ds.set_epoch(0)
    loader = DataLoader(ds, batch_size=4, num_workers=2, collate_fn=collate)
    got = list(loader)
    assert len(got) == len(expected) > 4
    for ours, theirs in zip(got, expected, strict=True):
        assert_same_batch(ours, theirs)
