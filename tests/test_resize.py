"""Frames brought to one size as they are decoded (``reader/frames/resize.py``): the pad
policy's geometry (openpi's ``resize_with_pad``) as properties, and a video's frames resized
the same whichever way they reach an item (converted in a decode thread, or written into a
batch slot that held other bytes), equal to PyAV's own ``reformat`` of the same frames (the
same swscale arithmetic, so equal bit for bit: a ``yuv420p`` frame scaled into ``yuv422p``, then
converted to rgb24); images by Pillow's bilinear filter."""

from __future__ import annotations

import io
import json

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from lerobot_shards.reader.frames.decode import Video
from lerobot_shards.reader.frames.resize import Resize, resized_image
from lerobot_shards.reader.frames.rgb24 import one_thread_options

sizes = st.integers(1, 700)


@given(height=sizes, width=sizes, target_height=sizes, target_width=sizes)
def test_pad_keeps_the_aspect_ratio_fills_one_side_and_centres(
    height, width, target_height, target_width
):
    top, left, rows, columns = Resize(target_height, target_width, "pad").inner(height, width)
    ratio = max(width / target_width, height / target_height)
    assert 1 <= rows <= target_height and 1 <= columns <= target_width
    assert abs(rows - height / ratio) < 1 and abs(columns - width / ratio) < 1  # the aspect
    assert target_height - rows < 2 or target_width - columns < 2  # the limiting side filled
    assert (top, left) == ((target_height - rows) // 2, (target_width - columns) // 2)
    stretched = Resize(target_height, target_width, "stretch").inner(height, width)
    assert stretched == (0, 0, target_height, target_width)


def test_a_resize_is_checked():
    with pytest.raises(ValueError, match="unknown resize policy 'crop'"):
        Resize(4, 4, "crop")
    with pytest.raises(ValueError, match="positive size"):
        Resize(0, 4)


@pytest.mark.parametrize("policy", ["pad", "stretch"])
def test_images_are_resized_by_pillow_into_black_bands(policy):
    image = np.random.default_rng(0).integers(0, 256, (30, 50, 3), dtype=np.uint8)
    resize = Resize(32, 32, policy)
    out = resized_image(image, resize)
    top, left, rows, columns = resize.inner(30, 50)
    expected = np.zeros((32, 32, 3), np.uint8)
    picture = Image.fromarray(image).resize((columns, rows), Image.BILINEAR)
    expected[top : top + rows, left : left + columns] = np.asarray(picture)
    assert np.array_equal(out, expected)
    if policy == "pad":
        assert (rows, columns, top, left) == (19, 32, 6, 0)


@pytest.fixture(scope="module")
def episode_video(av1) -> tuple[bytes, int]:
    """Episode 2 (30 frames) of the golden dataset's 40x56 camera: its mp4 member's bytes,
    read from the shards by hand, and its length."""
    row = next(
        r for r in pq.read_table(av1 / "manifest.parquet").to_pylist() if r["episode_index"] == 2
    )
    data = (av1 / row["shard"]).read_bytes()
    members = {m["name"]: m for m in row["members"]}
    header = members["episode-000002.json"]
    camera = json.loads(data[header["offset"] : header["offset"] + header["size"]])["cameras"]
    assert camera["observation.images.cam_high"].get("skip_frames", 0) == 0
    mp4 = members["episode-000002.observation.images.cam_high.mp4"]
    return data[mp4["offset"] : mp4["offset"] + mp4["size"]], row["length"]


def swscale_resized(frame: av.VideoFrame, rows: int, columns: int) -> np.ndarray:
    """The stated arithmetic, by PyAV's own ``reformat``: a ``yuv420p`` frame scaled bilinear
    into ``yuv422p`` then converted to rgb24; any other format scaled and converted at once."""
    threads = one_thread_options()
    if frame.format.name == "yuv420p" and (rows, columns) != (frame.height, frame.width):
        frame = frame.reformat(width=columns, height=rows, format="yuv422p", **threads)
        return frame.reformat(format="rgb24", **threads).to_ndarray()
    return frame.reformat(width=columns, height=rows, format="rgb24", **threads).to_ndarray()


@pytest.mark.parametrize(
    "resize", [Resize(24, 40, "pad"), Resize(64, 48, "pad"), Resize(20, 20, "stretch")]
)
def test_a_videos_frames_are_resized_alike_whichever_way_they_reach_an_item(episode_video, resize):
    data, length = episode_video
    video = Video(data, length=length, resize=resize)
    assert video.frame_bytes == resize.height * resize.width * 3
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(video=0))
    top, left, rows, columns = resize.inner(40, 56)
    for position in (0, 7, length - 1):
        picture = swscale_resized(frames[position], rows, columns)
        expected = np.zeros(resize.shape, np.uint8)
        expected[top : top + rows, left : left + columns] = picture
        converted = video.decode(position)[position]  # as a decode thread gives it
        assert converted.shape == resize.shape and np.array_equal(converted.numpy(), expected)
        slot = torch.full(resize.shape, 0xA5, dtype=torch.uint8)  # a batch slot, reused
        video.write_rgb(video.decode(position, rgb=False)[position], slot)
        assert np.array_equal(slot.numpy(), expected)
        assert np.array_equal(video.to_rgb(video.decode(position, rgb=False)[position]), expected)
