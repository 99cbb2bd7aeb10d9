"""Lies that agree with each other, image datasets and the other files (issue 36, sections 2
and 3): a converted dataset whose files tell the same lie everywhere they state a fact, every
checksum recomputed (``support/mutate.py``), so that no file contradicts another byte for byte.
Each is refused by the reader with a ``FormatError`` naming the dataset, the shard and the
episode, and reported by ``verify --deep``: global index ranges against each other, the rows'
columns against the features, ``frame_index`` and ``timestamp`` against the row's position and
the fps, an image dataset's images, ``meta/stats.json``, and a video in another codec or pixel
format than its header says."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from support.batches import assert_same_items
from support.mutate import Parts, black_mp4, put_together, take_apart

from lerobot_shards import MissingStatsWarning, ShardedLeRobotDataset
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import STATS_FILE, TASKS_FILE, FormatError, shard_path, video_member

CAM = "observation.images.cam_high"
ANY = "any episode"


@pytest.fixture(scope="module")
def parts(av1: Path) -> Parts:
    return take_apart(av1)


@pytest.fixture(scope="module")
def image_parts(shards) -> Parts:
    return take_apart(shards("image"))


def items(root: Path | str) -> list[dict]:
    """A whole epoch of the dataset at ``root``, read plainly (seed 1)."""
    return list(ShardedLeRobotDataset(str(root), seed=1))


def read_unchanged(root: Path, original: Path) -> None:
    """``verify --deep`` passes the dataset at ``root``, and it reads item for item, tensor for
    tensor, as the ``original`` it was put together from."""
    assert verify_dataset(str(root), deep=True) == []
    assert_same_items(items(root), items(original))


def refused(root: Path, episode: int | str | None, *match: str) -> str:
    """The reader's error over a whole epoch, naming the dataset, the shard and the episode
    (when the lie is in one) and each of ``match``; verify --deep reports a problem with each
    of ``match`` in it too."""
    with pytest.raises(FormatError) as error:
        list(ShardedLeRobotDataset(str(root)))
    message = str(error.value)
    assert str(root) in message, message
    if episode == ANY:  # the lie is in every episode: the first one fetched is named
        found = re.search(r"\(episode (\d+)\)", message)
        assert found, message
        episode = int(found[1])
    if episode is not None:
        assert f"episode {episode}" in message, message
        assert shard_path(episode) in message, message
    for text in match:
        assert text in message, message
    problems = [str(p) for p in verify_dataset(str(root), deep=True)]
    assert problems, "verify --deep passed a dataset the reader refuses"
    assert any(all(text in p for text in match) for p in problems), problems
    return message


def set_column(parts: Parts, row: int, name: str, values: list | pa.Array) -> None:
    table = parts.table(row)
    column = values if isinstance(values, pa.Array) else pa.array(values, table[name].type)
    parts.set_table(row, table.set_column(table.schema.get_field_index(name), name, column))


def move_episode(parts: Parts, row: int, start: int) -> tuple:
    """Episode ``row``'s global range moved to start at ``start`` in its header and rows;
    returns the manifest edit that moves it there too (the same lie in all three)."""
    header = parts.header(row)
    length = header["length"]
    header.update(dataset_from_index=start, dataset_to_index=start + length)
    parts.set_header(row, header)
    set_column(parts, row, "index", list(range(start, start + length)))

    def edit(rows: list[dict]) -> None:
        rows[row].update(dataset_from_index=start, dataset_to_index=start + length)

    return edit


# ---------------------------------------------------------------- global against global


def test_header_and_rows_that_both_claim_another_episodes_indices(parts, tmp_path):
    lie = parts.copy()
    move_episode(lie, 1, 0)  # the manifest still says where episode 1 is
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 1, "from index 0")


def test_manifest_header_and_rows_that_overlap_another_episode(parts, tmp_path):
    lie = parts.copy()
    start = parts.rows[1]["dataset_from_index"]  # episode 2 claims episode 1's first index
    put_together(lie, tmp_path / "d", edit_rows=move_episode(lie, 2, start))
    refused(tmp_path / "d", 2, "overlaps")


def test_a_gap_that_info_json_makes_room_for(parts, tmp_path):
    lie = parts.copy()
    lie.info["total_frames"] += 1  # room for a gap before the last episode, moved up one
    last = len(parts.rows) - 1
    start = parts.rows[last]["dataset_from_index"] + 1
    put_together(lie, tmp_path / "d", edit_rows=move_episode(lie, last, start))
    refused(tmp_path / "d", None, "gaps")


def test_ranges_past_the_sources_frames(parts, tmp_path):
    lie = parts.copy()
    last = len(parts.rows) - 1
    start = parts.rows[last]["dataset_from_index"] + 1000
    put_together(lie, tmp_path / "d", edit_rows=move_episode(lie, last, start))
    refused(tmp_path / "d", last, "past info.json")


@pytest.mark.parametrize("column", ["frame_index", "timestamp"])
def test_frame_index_or_timestamp_off_by_one_frame(parts, tmp_path, column):
    lie = parts.copy()
    table = lie.table(3)
    if column == "frame_index":
        set_column(lie, 3, column, [i + 1 for i in range(table.num_rows)])
    else:  # every row one frame later: consistent steps, the wrong clock
        set_column(lie, 3, column, [(i + 1) / 10 for i in range(table.num_rows)])
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 3, column)


def test_timestamps_within_tolerance_are_read(av1, parts, tmp_path):
    """9e-5 s late, inside the default tolerance_s of 1e-4 s (LeRobot finds the same frames):
    read as the original, but for the rows' own timestamps."""
    lie = parts.copy()
    table = lie.table(3)
    set_column(lie, 3, "timestamp", [i / 10 + 9e-5 for i in range(table.num_rows)])
    put_together(lie, tmp_path / "d")
    assert verify_dataset(str(tmp_path / "d"), deep=True) == []
    stamps = lie.table(3)["timestamp"].to_numpy()
    want = items(av1)
    for item in want:
        if int(item["episode_index"]) == parts.rows[3]["episode_index"]:
            item["timestamp"] = torch.tensor(stamps[int(item["frame_index"])])
    assert_same_items(items(tmp_path / "d"), want)


def test_timestamps_just_outside_tolerance(parts, tmp_path):
    """1.5e-4 s late: outside the default tolerance_s of 1e-4 s, far inside half a frame
    (0.05 s), so a tolerance looser than LeRobot's is caught."""
    lie = parts.copy()
    table = lie.table(3)
    set_column(lie, 3, "timestamp", [i / 10 + 1.5e-4 for i in range(table.num_rows)])
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 3, "timestamp", "tolerance_s=0.0001")


def test_empty_values_in_a_feature(parts, tmp_path):
    """An episode's ``observation.state`` emptied (every row null): a FormatError naming the
    rows' column, not a bare error while the item is built."""
    lie = parts.copy()
    table = lie.table(3)
    typ = table["observation.state"].type
    set_column(lie, 3, "observation.state", pa.nulls(table.num_rows, typ))
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 3, "observation.state", "empty values")


def test_a_nan_timestamp(parts, tmp_path):
    lie = parts.copy()
    stamps = [i / 10 for i in range(lie.table(3).num_rows)]
    stamps[-1] = float("nan")  # NaN - want > tolerance is False: it passed as on time
    set_column(lie, 3, "timestamp", stamps)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 3, "timestamp is nan")


def test_a_delta_the_lying_fps_cannot_resolve_names_the_dataset(parts, tmp_path):
    lie = parts.copy()
    lie.index["fps"] = lie.info["fps"] = 9  # 0.1 s is no multiple of 1/9
    put_together(lie, tmp_path / "d")
    with pytest.raises(ValueError, match="not multiples of 1/fps") as error:
        ShardedLeRobotDataset(str(tmp_path / "d"), delta_timestamps={"action": [0.0, 0.1]})
    assert str(tmp_path / "d") in str(error.value)
    refused(tmp_path / "d", ANY, "timestamp")  # read plainly: the rows' clock is not 9 fps


# ---------------------------------------------------------------- rows against the features


def both_features(parts: Parts, edit) -> Parts:
    lie = parts.copy()
    edit(lie.index["features"])
    edit(lie.info["features"])
    return lie


def test_a_feature_removed_from_index_and_info_that_the_rows_still_hold(parts, tmp_path):
    lie = both_features(parts, lambda features: features.pop("action"))
    lie = with_stats(lie, lambda stats: stats.pop("action"))  # and from stats.json: agreeing
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", ANY, "action", "not features")


def test_a_float_feature_typed_string_in_index_and_info(parts, tmp_path):
    def edit(features):
        features["observation.state"]["dtype"] = "string"

    put_together(both_features(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", ANY, "observation.state", "string")


@pytest.mark.parametrize(
    ("key", "dtype"), [("observation.state", "float64"), ("frame_index", "int32")]
)
def test_a_dtype_of_the_rows_kind_but_not_their_type(parts, tmp_path, key, dtype):
    """float32 rows declared float64 (int64 declared int32) in index.json and info.json: items
    are the same either way, ``ds.meta.features`` would not be the rows'."""

    def edit(features):
        features[key]["dtype"] = dtype

    put_together(both_features(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", ANY, key, dtype)


@pytest.mark.parametrize(
    ("key", "names"),
    [
        ("action", ["j0", "j1", "j2"]),  # shape (4,)
        ("timestamp", []),  # shape (1,)
        (CAM, ["height", "width"]),  # (H, W, C): one name per axis
    ],
)
def test_names_of_the_wrong_length(parts, tmp_path, key, names):
    def edit(features):
        features[key]["names"] = names

    put_together(both_features(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, key, "names")


def test_names_as_lerobot_writes_them_are_read(av1, parts, tmp_path):
    """A dict of names (LeRobot v2's ``{"motors": [...]}``) or none at all is no lie."""

    def edit(features):
        features["action"]["names"] = {"motors": ["j0", "j1", "j2", "j3"]}
        features["observation.state"]["names"] = None

    put_together(both_features(parts, edit), tmp_path / "d")
    read_unchanged(tmp_path / "d", av1)


def test_a_camera_removed_from_index_and_info_that_the_headers_still_hold(parts, tmp_path):
    lie = both_features(parts, lambda features: features.pop(CAM))
    for name in ("camera_keys", "video_keys"):
        lie.index[name] = [k for k in lie.index[name] if k != CAM]
    lie = with_stats(lie, lambda stats: stats.pop(CAM))
    put_together(lie, tmp_path / "d")
    message = refused(tmp_path / "d", ANY, CAM)  # verify: the tar holds a video of no feature
    assert "the header's cameras" in message, message


def test_index_and_info_of_other_codebase_versions(parts, tmp_path):
    lie = parts.copy()
    lie.index["codebase_version"] = "v2.1"  # info.json says v3.0
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", None, "codebase_version")


def test_a_dtype_the_reader_cannot_make(parts, tmp_path):
    def edit(features):
        features["action"]["dtype"] = "complex64"

    put_together(both_features(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, "complex64")


# ---------------------------------------------------------------- meta/stats.json


def with_stats(parts: Parts, edit) -> Parts:
    lie = parts.copy()
    stats = json.loads(lie.others[STATS_FILE])
    edit(stats)
    lie.others[STATS_FILE] = json.dumps(stats).encode()
    return lie


def test_ragged_stats(parts, tmp_path):
    def edit(stats):
        stats[CAM]["mean"] = [[[0.5]], [[0.5], [0.1]], [[0.5]]]

    put_together(with_stats(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, "stats.json", "mean", CAM)


def test_stats_of_the_wrong_length(parts, tmp_path):
    def edit(stats):
        stats["action"]["std"] = stats["action"]["std"][:3]

    put_together(with_stats(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, "stats.json", "std", "action")


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["NaN", "infinite"])
@pytest.mark.parametrize("stat", ["mean", "q01"])
def test_stats_that_are_not_finite(parts, tmp_path, value, stat):
    def edit(stats):
        stats["action"][stat][0] = value  # json writes NaN and Infinity, and reads them

    put_together(with_stats(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, "stats.json", stat, "action", "not finite")


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda stats: stats.update(gripper=stats["action"]), "['gripper'], which are not"),
        (lambda stats: stats["observation.state"].pop("q50"), "the stats of 'observation.state'"),
        (lambda stats: stats[CAM].pop("count"), "the stats of 'observation.images."),
    ],
    ids=["unknown feature", "statistic missing", "camera statistic missing"],
)
def test_stats_of_other_features_or_statistics(parts, tmp_path, edit, match):
    put_together(with_stats(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, "stats.json", match)


def test_stats_without_a_feature_are_read_with_a_warning(av1, parts, tmp_path):
    """LeRobot's add_features and its image-to-video conversion write no stats of what they
    add: LeRobot reads such a dataset (and normalizes none of those features), so it is read,
    item for item as the original, with a warning naming the features."""
    put_together(with_stats(parts, lambda stats: stats.pop("action")), tmp_path / "d")
    with pytest.warns(MissingStatsWarning, match=r"no statistics of the features \['action'\]"):
        got = items(tmp_path / "d")
    assert_same_items(got, items(av1))
    with pytest.warns(MissingStatsWarning):
        assert verify_dataset(str(tmp_path / "d"), deep=True) == []


def test_stats_without_the_cameras_quantiles_are_read(av1, parts, tmp_path):
    """LeRobot's quantile script may leave the cameras' stats as they were: no lie."""

    def edit(stats):
        for key in (CAM, "observation.images.cam_left_wrist"):
            stats[key] = {k: v for k, v in stats[key].items() if not k.startswith("q")}

    put_together(with_stats(parts, edit), tmp_path / "d")
    read_unchanged(tmp_path / "d", av1)


# ---------------------------------------------------------------- meta/tasks.parquet


def with_tasks(parts: Parts, edit) -> Parts:
    lie = parts.copy()
    tasks = pq.read_table(io.BytesIO(lie.others[TASKS_FILE])).to_pylist()
    edit(tasks)
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(tasks), out)
    lie.others[TASKS_FILE] = out.getvalue()
    return lie


def test_two_tasks_swapped(parts, tmp_path):
    """Rows of task_index 0 would be served task 1's string: not the one their header names."""

    def edit(tasks):
        tasks[0]["task"], tasks[1]["task"] = tasks[1]["task"], tasks[0]["task"]

    put_together(with_tasks(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", ANY, "not one of its header's tasks")


def test_a_task_info_json_does_not_count(parts, tmp_path):
    def edit(tasks):
        tasks.append({"task_index": len(tasks), "task": "never done"})

    put_together(with_tasks(parts, edit), tmp_path / "d")
    refused(tmp_path / "d", None, "tasks.parquet", "total_tasks")


# ---------------------------------------------------------------- videos: codec, pixel format


def encoded(codec: str, pix_fmt: str, width: int, height: int, frames: int) -> bytes:
    """An mp4 of ``frames`` grey frames in ``codec`` and ``pix_fmt``, one keyframe per two
    frames, no B-frames."""
    out = io.BytesIO()
    with av.open(out, "w", format="mp4") as container:
        stream = container.add_stream(codec, rate=10, options={"g": "2", "bf": "0"})
        stream.width, stream.height, stream.pix_fmt = width, height, pix_fmt
        for _ in range(frames):
            image = np.full((height, width, 3), 128, np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, "rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


@pytest.mark.parametrize("make", ["mpeg4", "h264"])
def test_a_video_in_another_codec(parts, tmp_path, make):
    lie = parts.copy()
    header = lie.header(2)["cameras"][CAM]
    width, height, frames = header["width"], header["height"], header["frames"]
    if make == "mpeg4":
        data = black_mp4(width, height, frames)
    else:
        data = encoded("libx264", "yuv420p", width, height, frames)
    lie.set_member(2, video_member(2, CAM), data)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 2, f"the video is {make}")


def test_a_video_in_another_pixel_format(parts, tmp_path):
    """Header and info.json say h264 (so the codec agrees); the mp4 is yuv444p, not yuv420p."""
    lie = parts.copy()
    for features in (lie.index["features"], lie.info["features"]):
        features[CAM]["info"]["video.codec"] = "h264"
    for row in range(len(lie.rows)):
        header = lie.header(row)
        header["cameras"][CAM]["codec"] = "h264"
        camera, length = header["cameras"][CAM], header["length"]
        pix_fmt = "yuv444p" if row == 2 else "yuv420p"
        data = encoded("libx264", pix_fmt, camera["width"], camera["height"], length)
        camera.update(frames=length, skip_frames=0, tail_frames=0)
        lie.set_header(row, header)
        lie.set_member(row, video_member(lie.rows[row]["episode_index"], CAM), data)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 2, "yuv444p")


def test_a_header_codec_that_contradicts_info_json(parts, tmp_path):
    lie = parts.copy()
    header = lie.header(4)
    header["cameras"][CAM]["codec"] = "h264"
    lie.set_header(4, header)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 4, "codec")


# ---------------------------------------------------------------- image datasets


def set_image(parts: Parts, row: int, position: int, cell: dict | None) -> None:
    table = parts.table(row)
    cells = table[CAM].to_pylist()
    cells[position] = cell
    set_column(parts, row, CAM, pa.array(cells, table[CAM].type))


def png(width: int, height: int, mode: str = "RGB") -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new(mode, (width, height)).save(out, format="png")
    return out.getvalue()


def test_image_parts_put_together_read_as_the_original(shards, image_parts, tmp_path):
    put_together(image_parts.copy(), tmp_path / "same")
    read_unchanged(tmp_path / "same", shards("image"))


@pytest.mark.parametrize(
    ("cell", "match"),
    [
        ({"bytes": b"\x89PNG not really" * 20, "path": None}, "does not decode"),
        ({"bytes": png(40, 56), "path": None}, "56x40"),  # width and height swapped
        ({"bytes": None, "path": "/etc/hostname"}, "names a file"),
        # the right size, one channel: LeRobot would serve it (1, 40, 56), not (3, 40, 56)
        ({"bytes": png(56, 40, "L"), "path": None}, "1-channel (PIL mode L)"),
    ],
    ids=["garbage", "wrong size", "a path", "grayscale"],
)
def test_a_lying_image(image_parts, tmp_path, cell, match):
    lie = image_parts.copy()
    set_image(lie, 3, 2, cell)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 3, match)


def test_an_empty_image(image_parts, tmp_path):
    """A row's image emptied (null: neither bytes nor a path) is an empty value of the rows'
    column, as an emptied ``observation.state`` is (the rows' check of every column)."""
    lie = image_parts.copy()
    set_image(lie, 3, 2, None)
    put_together(lie, tmp_path / "d")
    refused(tmp_path / "d", 3, CAM, "empty values")
