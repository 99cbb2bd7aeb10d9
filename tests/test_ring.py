"""reader.batches.ring and reader.batches.rows, in one process as two workers and the loader:
rows written by several workers into the slot their batch was given batch as torch batches the
same items, as a view of the slot; a slot goes to another batch only once no view of it is
alive; rows that found no slot take torch's way and batch the same."""

from __future__ import annotations

import gc
import pickle
import sys
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
from support.batches import assert_same_batch
from torch.utils.data import default_collate

from lerobot_shards.reader.batches import collate as collate_module
from lerobot_shards.reader.batches.collate import rows_in_place, typed_item
from lerobot_shards.reader.batches.ring import BatchRing, RingWriter
from lerobot_shards.reader.batches.rows import (
    IN_COLUMN,
    Place,
    RowArena,
    by_column,
    from_columns,
    unpack,
)
from lerobot_shards.reader.plan.interleave import Interleave

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="shared slots need Linux (memfd and /proc)"
)

SHAPE = (6, 8, 3)  # a frame, channel-last


def items(n: int, seed: int = 0) -> list[dict]:
    """Plain items shaped as the reader's: frames are channel-first views of channel-last
    memory, one of them a float camera."""
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "cam": torch.randint(0, 256, SHAPE, dtype=torch.uint8, generator=g).permute(2, 0, 1),
            "depth": torch.rand(SHAPE, generator=g).permute(2, 0, 1),
            "state": torch.randn(4, generator=g),
            "index": torch.tensor(i + 100 * seed),
            "task": f"task {i}",
        }
        for i in range(n)
    ]


def ring(slots: int, batch_size: int) -> BatchRing:
    rows = batch_size * SHAPE[0] * SHAPE[1] * SHAPE[2]
    return BatchRing({"cam": rows, "depth": 4 * rows}, slots)


def send(value):
    """What the DataLoader does: pickle in the worker, unpickle in the loader's process."""
    return pickle.loads(ForkingPickler.dumps(value))


def make_rows(ring: BatchRing, chunk: list[dict], lanes: int, batch_size: int, base: int = 0):
    """Each lane (worker) makes its items in its own order and packs them; returns the items
    the loader receives, in row order of the one batch they fill."""
    interleave = Interleave([len(range(w, len(chunk), lanes)) for w in range(lanes)], lanes)
    received = {}
    for lane in range(lanes):
        writer = RingWriter(ring.handle)
        arena = RowArena(writer, interleave.places(lane, batch_size), base, decode_into=True)
        rows, segment = [], []
        for item in chunk[lane::lanes]:
            slots = arena.slots()
            made = dict(item)
            if slots is not None and "cam" in slots:  # as the decoder writes into its row
                slots["cam"][0].copy_(item["cam"].permute(1, 2, 0))
                made["cam"] = slots["cam"][0].permute(2, 0, 1)
            batch, row, packed = arena.pack(typed_item(made, ["cam", "depth"]))
            assert batch == 0
            rows.append(row)
            segment.append(packed)
        held, columns = send(by_column(segment))  # the lane's segment, as the worker sends it
        from_columns(held, columns)
        received.update(zip(rows, held, strict=True))
    return [received[r] for r in range(len(chunk))]


def test_rows_of_two_workers_batch_as_torch_does_and_view_the_slot():
    r = ring(slots=2, batch_size=8)
    r.assign(0)
    chunk = items(8)
    sent = make_rows(r, chunk, lanes=2, batch_size=8)
    assert type(sent[0]["cam"]) is Place and type(sent[0]["depth"]) is Place
    assert type(sent[0]["state"]) is torch.Tensor  # by value
    batch = default_collate(unpack(sent, r))
    assert_same_batch(batch, default_collate(chunk))
    for key in ("cam", "depth"):
        assert batch[key].movedim(-3, -1).is_contiguous()  # channel-last, as the reader's
        assert batch[key].untyped_storage().nbytes() == r.slot_bytes  # a view of the slot


def test_a_slot_goes_to_another_batch_only_once_no_view_of_it_is_alive():
    r = ring(slots=2, batch_size=4)
    writer = RingWriter(r.handle)
    r.assign(0)
    r.assign(1)
    r.assign(2)  # both slots are kept for pending batches: none
    assert (writer.slot_of(0), writer.slot_of(1), writer.slot_of(2)) == (0, 1, None)
    held = default_collate(unpack(make_rows(r, items(4), 2, 4), r))
    r.delivered(0)
    r.delivered(1)  # batch 1 never took a view: its slot is free at once
    r.assign(3)
    r.assign(4)
    assert (writer.slot_of(3), writer.slot_of(4)) == (1, None)  # slot 0 still viewed
    del held
    gc.collect()
    r.assign(5)
    assert writer.slot_of(5) == 0


def test_rows_without_a_slot_take_torchs_way_and_batch_the_same():
    r = ring(slots=1, batch_size=4)  # nothing assigned: batch 0 has no slot
    chunk = items(4, seed=1)
    sent = make_rows(r, chunk, lanes=2, batch_size=4)
    assert isinstance(sent[0]["cam"], torch.Tensor)  # torch's way, not a place
    batch = default_collate(unpack(sent, r))
    assert_same_batch(batch, default_collate(chunk))


def test_a_camera_is_decoded_into_its_row_once_seen_and_a_transformed_one_is_copied():
    r = ring(slots=1, batch_size=4)
    r.assign(0)
    writer = RingWriter(r.handle)
    interleave = Interleave([4], 1)
    arena = RowArena(writer, interleave.places(0, 4), 0, decode_into=True)
    chunk = items(4, seed=2)
    assert arena.slots() is None  # the camera's frames are not known yet
    arena.pack(typed_item(chunk[0], ["cam", "depth"]))
    slots = arena.slots()
    assert set(slots) == {"cam"}  # uint8 channel-last frames only: depth is float
    slots["cam"][0].copy_(chunk[1]["cam"].permute(1, 2, 0))
    in_row = dict(chunk[1], cam=slots["cam"][0].permute(2, 0, 1))
    _, row, packed = arena.pack(typed_item(in_row, ["cam", "depth"]))
    assert packed["cam"].offset == row * 6 * 8 * 3  # where it was decoded: nothing copied
    arena.slots()
    transformed = dict(chunk[2], cam=chunk[2]["cam"].clone())  # made elsewhere
    assert type(arena.pack(typed_item(transformed, ["cam", "depth"]))[2]["cam"]) is Place
    assert arena.slots() is None  # not offered again
    arena.pack(typed_item(chunk[3], ["cam", "depth"]))
    assert arena.batch_ends()


def test_a_view_of_the_row_that_is_not_its_frames_is_packed_as_what_it_is():
    """An item's frames that start where the decoder wrote them but are another view of them
    (a crop a transform made) are not taken for the row's frames."""
    r = ring(slots=1, batch_size=4)
    r.assign(0)
    writer = RingWriter(r.handle)
    arena = RowArena(writer, Interleave([4], 1).places(0, 4), 0, decode_into=True)
    chunk = items(4, seed=3)
    assert arena.slots() is None  # the camera's frames are not known yet
    arena.pack(typed_item(chunk[0], ["cam", "depth"]))
    slots = arena.slots()
    slots["cam"][0].copy_(chunk[1]["cam"].permute(1, 2, 0))
    crop = slots["cam"][0].permute(2, 0, 1)[:, :, :4]  # same first byte, fewer columns
    _, _, packed = arena.pack(typed_item(dict(chunk[1], cam=crop), ["cam", "depth"]))
    sent = packed["cam"]
    got = sent if isinstance(sent, torch.Tensor) else unpack([packed], r)[0]["cam"]
    assert tuple(got.shape) == (3, 6, 4)
    assert torch.equal(got.as_subclass(torch.Tensor), chunk[1]["cam"][:, :, :4])


def test_rows_in_place_only_for_consecutive_rows_of_one_memory(monkeypatch):
    monkeypatch.setattr(collate_module, "get_worker_info", lambda: None)
    memory = torch.arange(4 * 24, dtype=torch.uint8).view(4, 2, 4, 3)
    frames = [memory[i].permute(2, 0, 1) for i in range(4)]
    stacked = rows_in_place(frames)
    assert stacked is not None and stacked.data_ptr() == memory.data_ptr()
    assert torch.equal(stacked, torch.stack(frames))
    assert rows_in_place(frames[::-1]) is None
    assert rows_in_place([frames[0], frames[2]]) is None
    assert rows_in_place([f.clone() for f in frames]) is None


def test_a_segments_small_tensors_travel_as_columns_and_come_back_as_they_were():
    """Values of one shape and dtype in every item go as one stacked array each and come back
    equal, plain tensors, in each item's own key order; any other value goes as it was."""
    from lerobot_shards.reader.batches.collate import ByValue

    made = [
        {
            "index": torch.tensor(i),
            "state": torch.randn(4),
            "ragged": torch.zeros(i + 1),  # shapes differ: not a column
            "task": f"task {i}",
        }
        for i in range(3)
    ]

    def by_value(value):
        return value.clone().as_subclass(ByValue) if isinstance(value, torch.Tensor) else value

    packed = [{k: by_value(v) for k, v in m.items()} for m in made]
    held, columns = send(by_column(packed))
    assert sorted(columns) == ["index", "state"]
    assert all(item["index"] is IN_COLUMN for item in held)
    from_columns(held, columns)
    for item, original in zip(held, made, strict=True):
        assert list(item) == list(original)
        for key, value in original.items():
            if isinstance(value, torch.Tensor):
                assert type(item[key]) is torch.Tensor and torch.equal(item[key], value), key
            else:
                assert item[key] == value
    assert by_column(packed[:1]) == (packed[:1], {})  # one item: nothing to stack
