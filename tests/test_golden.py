"""The items LeRobot itself returned, recorded: LeRobotSource and the converted shards read by
ShardedLeRobotDataset both equal them, key for key, value for value (torch.equal), task for task.

Golden data: v3.0 written and read by LeRobot 0.6.1 (tests/data/lerobot-0.6.1: recordings, and
recordings merged by its own aggregate_datasets) and v2.1 written and read by LeRobot 0.3.3
(tests/data/lerobot-0.3.3-v2.1); each folder's README says how. Values that are not tensors
(LeRobot's language columns, None where a row is empty) were recorded as JSON text and are
compared as such: the same text is the same values, keys in the same order.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from support.mutate import put_together, take_apart
from support.required import importorskip

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.source import LeRobotSource

FRAMES = {
    "av1_multifile": 74,
    "image": 74,
    "v21_video": 74,
    "v21_image": 74,
    "aggregated": 148,  # av1_multifile merged with itself by LeRobot's aggregate_datasets
    "aggregated_image": 148,
    "language": 56,
    "language_none": 56,
}
"""The golden datasets and their frames."""
DATASETS = list(FRAMES)


def expected_items(path, delta: bool) -> tuple[list[str], list[str], np.lib.npyio.NpzFile]:
    """What LeRobot returned for the golden dataset at ``path``: keys, tasks, tensors."""
    recorded = np.load(path.parent / f"{path.name}{'.delta' if delta else ''}.items.npz")
    return json.loads(str(recorded["__keys__"])), list(recorded["__tasks__"]), recorded


def delta_timestamps_of(recorded, default: dict[str, list[float]]) -> dict[str, list[float]]:
    """The delta_timestamps a delta dump was recorded with: its own (``__delta__``), or the
    default of the golden datasets that do not say."""
    return json.loads(str(recorded["__delta__"])) if "__delta__" in recorded else default


def assert_item_is_golden(item: dict, index: int, keys, tasks, recorded) -> None:
    assert list(item) == keys, f"index {index}: keys"
    assert item["task"] == tasks[index], f"index {index}: task"
    texts = json.loads(str(recorded["__json__"])) if "__json__" in recorded else []
    for key in keys:
        if key == "task":
            continue
        if key in texts:
            got = json.dumps(item[key])
            assert got == str(recorded[f"{index}|{key}"]), f"index {index}, {key}: {got}"
            continue
        expected = torch.from_numpy(recorded[f"{index}|{key}"])
        got = item[key]
        assert got.dtype == expected.dtype and got.shape == expected.shape, (index, key)
        assert torch.equal(got, expected), f"index {index}, {key}: values differ"


@pytest.mark.parametrize("delta", [False, True], ids=["plain", "delta"])
@pytest.mark.parametrize("name", DATASETS)
def test_every_index_equals_lerobot(golden_path, golden_delta_timestamps, name, delta):
    keys, tasks, recorded = expected_items(golden_path(name), delta)
    deltas = delta_timestamps_of(recorded, golden_delta_timestamps) if delta else None
    source = LeRobotSource(str(golden_path(name)), delta_timestamps=deltas)
    assert len(source) == len(tasks) == FRAMES[name]
    for index in range(len(source)):
        assert_item_is_golden(source[index], index, keys, tasks, recorded)


@pytest.mark.parametrize("delta", [False, True], ids=["plain", "delta"])
@pytest.mark.parametrize("name", DATASETS)
def test_shards_equal_lerobot(golden_path, shards, golden_delta_timestamps, name, delta):
    """A whole shuffled epoch of the converted dataset: every index once, each LeRobot's item."""
    keys, tasks, recorded = expected_items(golden_path(name), delta)
    deltas = delta_timestamps_of(recorded, golden_delta_timestamps) if delta else None
    ds = ShardedLeRobotDataset(shards(name), buffer_size=3, delta_timestamps=deltas)
    order = []
    for item in ds:
        index = int(item["index"])
        assert_item_is_golden(item, index, keys, tasks, recorded)
        order.append(index)
    assert sorted(order) == list(range(FRAMES[name])) and order != sorted(order)


def test_rows_in_another_order_are_read_in_the_features_order(av1, golden_path, tmp_path):
    """LeRobot reads the rows in the features' order, whatever the parquet's (its annotator
    appends the language columns at the end): an item's keys follow the features."""
    keys, tasks, recorded = expected_items(golden_path("av1_multifile"), False)
    parts = take_apart(av1)
    for row in range(len(parts.rows)):
        table = parts.table(row)
        parts.set_table(row, table.select(table.column_names[::-1]))
    put_together(parts, tmp_path / "reversed")
    items = list(ShardedLeRobotDataset(tmp_path / "reversed", buffer_size=3))
    assert sorted(int(item["index"]) for item in items) == list(range(74))
    for item in items:
        assert_item_is_golden(item, int(item["index"]), keys, tasks, recorded)


def test_merged_rows_are_written_fixed_and_read_as_converted_before(
    golden_path, shards, golden_delta_timestamps, tmp_path
):
    """LeRobot's merge writes the vectors as list<float>: the shards hold them as a recording
    does (fixed_size_list), and shards converted before, which hold the rows exactly as the
    source does, read the same (LeRobot's items), and pass verify --deep."""
    converted = take_apart(shards("aggregated"))
    data = pq.read_table(golden_path("aggregated") / "data/chunk-000/file-000.parquet")
    assert pa.types.is_list(data.schema.field("observation.state").type)  # LeRobot's own merge
    for row, entry in enumerate(converted.rows):
        rows = converted.table(row)
        assert rows.schema.field("observation.state").type == pa.list_(pa.float32(), 4)
        episode = data.filter(pc.equal(data["episode_index"], entry["episode_index"]))
        converted.set_table(row, episode.select(rows.column_names))  # as written before
    put_together(converted, tmp_path / "before")
    assert verify_dataset(str(tmp_path / "before"), deep=True) == []
    keys, tasks, recorded = expected_items(golden_path("aggregated"), True)
    ds = ShardedLeRobotDataset(str(tmp_path / "before"), delta_timestamps=golden_delta_timestamps)
    order = []
    for item in ds:
        order.append(int(item["index"]))
        assert_item_is_golden(item, order[-1], keys, tasks, recorded)
    assert sorted(order) == list(range(FRAMES["aggregated"]))


@pytest.mark.parametrize("name", DATASETS)
def test_random_access_order_equals_lerobot(golden_path, golden_delta_timestamps, name):
    """Open decoders seek back and jump across files and episodes without changing a frame."""
    keys, tasks, recorded = expected_items(golden_path(name), True)
    deltas = delta_timestamps_of(recorded, golden_delta_timestamps)
    source = LeRobotSource(str(golden_path(name)), delta_timestamps=deltas)
    order = list(range(len(source))) * 2
    random.Random(0).shuffle(order)
    for index in order:
        assert_item_is_golden(source[index], index, keys, tasks, recorded)


@pytest.mark.timeout(60)
def test_dataloader_workers_equal_lerobot(golden_dir, golden_delta_timestamps):
    """Forked workers open their own decoders (none shared across the fork)."""
    keys, tasks, recorded = expected_items(golden_dir / "av1_multifile", True)
    source = LeRobotSource(
        str(golden_dir / "av1_multifile"), delta_timestamps=golden_delta_timestamps
    )
    source[30]  # open decoders in the parent first
    loader = torch.utils.data.DataLoader(
        source, batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    for index, item in enumerate(loader):
        assert_item_is_golden(item, index, keys, tasks, recorded)


@pytest.mark.parametrize("name", ["av1_multifile", "image", "aggregated"])
def test_return_uint8_equals_lerobots_own(golden_path, shards, name):
    """lerobot-train's own setting, ``return_uint8=True``: video frames uint8 and image
    features float32, every value as LeRobot's LeRobotDataset returns it, from the source and
    from a whole epoch of the shards. LeRobot's environment runs this."""
    lerobot_dataset = importorskip(
        "lerobot.datasets.lerobot_dataset", reason="LeRobot is optional; CI's LeRobot env runs this"
    )
    theirs = lerobot_dataset.LeRobotDataset(
        f"golden/{name}", root=golden_path(name), video_backend="pyav", return_uint8=True
    )
    source = LeRobotSource(str(golden_path(name)), return_uint8=True)
    items = list(ShardedLeRobotDataset(shards(name), buffer_size=3, return_uint8=True))
    assert sorted(int(item["index"]) for item in items) == list(range(FRAMES[name]))
    for item in [*items, *(source[i] for i in range(FRAMES[name]))]:
        index = int(item["index"])
        expected = theirs[index]
        assert list(item) == list(expected), index
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert item[key].dtype == value.dtype, (index, key, item[key].dtype)
                assert torch.equal(item[key], value), (index, key)
            else:
                assert item[key] == value, (index, key)


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P", "1"])
def test_an_image_decodes_to_the_channels_lerobot_serves(mode):
    """An image feature's PNG decodes to the bands it stores, as LeRobot 0.6.1's
    ``pil_to_chw_tensor`` serves them (a grayscale PNG is one channel, never made RGB): the
    reader's ``decode_image`` equals it, value for value. LeRobot's environment runs this."""
    import io

    from PIL import Image

    from lerobot_shards.items import frames_to_output
    from lerobot_shards.validate import decode_image

    io_utils = importorskip(
        "lerobot.datasets.io_utils", reason="LeRobot is optional; CI's LeRobot env runs this"
    )
    pixels = np.random.default_rng(0).integers(0, 256, (6, 5, 4), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGBA").convert(mode)
    data = io.BytesIO()
    image.save(data, format="png")
    theirs = io_utils.pil_to_chw_tensor(Image.open(io.BytesIO(data.getvalue())))
    array = decode_image({"bytes": data.getvalue(), "path": None}, (6, 5), channels=len(theirs))
    ours = frames_to_output(torch.from_numpy(array).permute(2, 0, 1), False)
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
