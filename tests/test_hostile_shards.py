"""Shards from strangers: a converted dataset whose content lies (every checksum, offset and size
recomputed by ``support/mutate.py``, so only the content is wrong), one lie per case, each case
one the issue found on main. The reader refuses each with a ``FormatError`` that names the
dataset (and the shard and episode), before any large allocation, and ``verify --deep``
reports it, never crashing."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from support.batches import assert_same_items
from support.mutate import Parts, black_mp4, put_together, take_apart

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import FormatError, video_member

CAM = "observation.images.cam_high"


@pytest.fixture(scope="module")
def parts(av1: Path) -> Parts:
    return take_apart(av1)


def refused(root: Path, *match: str) -> str:
    """The reader's error over a whole epoch (each of ``match`` in it), after verify --deep
    reported the dataset broken."""
    problems = verify_dataset(str(root), deep=True)
    assert problems, "verify --deep passed a dataset the reader must refuse"
    with pytest.raises(FormatError) as error:
        list(ShardedLeRobotDataset(str(root)))
    message = str(error.value)
    assert str(root) in message, message
    for text in match:
        assert text in message, message
    return message


def test_the_unchanged_parts_put_together_read_as_the_original(av1, parts, tmp_path):
    put_together(parts.copy(), tmp_path / "same")
    assert verify_dataset(str(tmp_path / "same"), deep=True) == []
    ours = list(ShardedLeRobotDataset(str(tmp_path / "same"), seed=1))
    assert_same_items(ours, list(ShardedLeRobotDataset(str(av1), seed=1)))


def test_a_negative_tail_that_cancels_skip_frames(parts, tmp_path):
    lie = parts.copy()
    header = lie.header(2)
    header["cameras"][CAM].update(skip_frames=2, tail_frames=-2)
    lie.set_header(2, header)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", "episode 2", "tail_frames")


@pytest.mark.parametrize(("width", "height"), [(4096, 4096), (48, 32)])
def test_a_video_of_another_size_is_refused_before_decoding(parts, tmp_path, width, height):
    lie = parts.copy()
    lie.set_member(2, video_member(2, CAM), black_mp4(width, height, parts.rows[2]["length"]))
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", "episode 2", f"{height}x{width}")


def test_a_manifest_length_of_zero(parts, tmp_path):
    put_together(parts.copy(), tmp_path / "d", edit_rows=lambda rows: rows[1].update(length=0))
    refused(tmp_path / "d", "episode 1", "length")


def test_index_without_its_video_keys(parts, tmp_path):
    put_together(parts.copy(), tmp_path / "d", edit_index=lambda i: i.update(video_keys=[]))
    refused(tmp_path / "d", "video_keys")


@pytest.mark.parametrize("change", ["wider", "missing"])
def test_rows_whose_action_contradicts_the_features(parts, tmp_path, change):
    lie = parts.copy()
    table = lie.table(3)
    if change == "missing":
        table = table.drop_columns(["action"])
    else:
        wide = pa.array([[*row, 0.0] for row in table.column("action").to_pylist()])
        table = table.set_column(table.schema.get_field_index("action"), "action", wide)
    lie.set_table(3, table)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", "episode 3", "action")


def test_a_member_shorter_than_the_manifest_says(parts, tmp_path):
    def longer(rows):
        rows[4]["members"][1]["size"] += 7  # the rows parquet, inside the span still

    put_together(parts.copy(), tmp_path / "d", edit_rows=longer)
    refused(tmp_path / "d", "episode 4")


@pytest.mark.parametrize("shard", ["/etc/passwd", "../outside.tar", "s3://other/x.tar"])
def test_a_shard_path_outside_the_root(parts, tmp_path, shard):
    put_together(parts.copy(), tmp_path / "d", edit_rows=lambda rows: rows[0].update(shard=shard))
    refused(tmp_path / "d", "shard path")


@pytest.mark.parametrize(
    ("field", "value"), [("cameras", ["x"]), ("skip_frames", "2"), ("length", None)]
)
def test_headers_of_the_wrong_types(parts, tmp_path, field, value):
    lie = parts.copy()
    header = lie.header(1)
    if field == "skip_frames":
        header["cameras"][CAM]["skip_frames"] = value
    else:
        header[field] = value
    lie.set_header(1, header)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", "episode 1", field)


def test_an_unsorted_manifest(parts, tmp_path):
    put_together(parts.copy(), tmp_path / "d", edit_rows=lambda rows: rows.reverse())
    refused(tmp_path / "d", "sorted")


@pytest.mark.parametrize("task_index", [-1, 5])
def test_a_task_index_that_names_no_task(parts, tmp_path, task_index):
    lie = parts.copy()
    table = lie.table(2)
    column = pa.array([task_index] * table.num_rows, pa.int64())
    lie.set_table(
        2, table.set_column(table.schema.get_field_index("task_index"), "task_index", column)
    )
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", "episode 2", "task_index")


def test_info_json_that_contradicts_the_index(parts, tmp_path):
    lie = parts.copy()
    lie.info["features"]["action"]["shape"] = [5]
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", "info.json")


def test_a_span_of_a_terabyte(parts, tmp_path):
    def huge(rows):
        rows[0]["size"] = 10**12

    def total(index):  # the index agrees: only the shard's size gives the lie away
        index["total_bytes"] += 10**12 - parts.rows[0]["size"]

    put_together(parts.copy(), tmp_path / "d", edit_rows=huge, edit_index=total)
    refused(tmp_path / "d", "episode 0", "span")


def test_a_format_version_that_is_a_string(parts, tmp_path):
    put_together(parts.copy(), tmp_path / "d", edit_index=lambda i: i.update(format_version="1"))
    message = refused(tmp_path / "d", "format_version must be an integer")
    assert "newer" not in message
