"""Episodes cut mid-GOP out of one continuous long-GOP recording, converted and streamed end to end.

LeRobot encodes each episode on its own with GOP 2, so its episodes start on a keyframe; datasets
from other recorders need not: here each camera is one continuous H.264 recording (GOP 30, B-frames)
of every episode back to back, and episodes of 23, 41, 17 and 50 frames start mid-GOP (the cut
starts at the keyframe before: ``skip_frames``) and end where their last B-frames reference frames
of the next episode (kept as ``tail_frames``). Every streamed item must equal LeRobotSource's (and,
where LeRobot is installed, LeRobot's own) with ``torch.equal``, pad masks included. The same
recording with x264's open GOPs (leading B-frames that reference the GOP before) is cut from the
keyframe its frames decode from and read the same way.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from dataclasses import replace
from pathlib import Path

import av
import pytest
import torch
from support.required import importorskip

from lerobot_shards import ShardedLeRobotDataset, convert
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import EpisodeHeader, header_member, shard_path, video_member
from lerobot_shards.source import FrameNotFoundError, LeRobotSource
from lerobot_shards.testing import video as vid
from lerobot_shards.testing.factory import DEFAULT_CAMERAS, make_dataset
from lerobot_shards.validate import parse_header

LENGTHS = (23, 41, 17, 50)
FRAMES = sum(LENGTHS)
SKIP = [0, 23, 4, 21]
"""Each episode's first frame (0, 23, 64, 81) past the keyframe at or before it (every 30)."""
CAM = "observation.images.cam_high"
DELTA = {
    CAM: [-2.5, -0.1, 0.0, 0.3, 1.9],
    "observation.state": [-0.1, 0.0],
    "action": [0.0, 0.1, 2.5],
}
"""Neighbours up to 25 frames away: across every episode's ends, so LeRobot clamps and pads."""


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("long-gop") / "src"
    return make_dataset(
        root, episode_lengths=LENGTHS, encoder=vid.H264_LONG_GOP, continuous_video=True
    )


@pytest.fixture(scope="module")
def converted(recording: Path) -> Path:
    dest = recording.parent / "shards"
    convert(str(recording), str(dest), workers=0, progress=False)
    return dest


def headers(dest: Path) -> list[EpisodeHeader]:
    return [parse_header(raw) for raw in raw_headers(dest)]


def raw_headers(dest: Path) -> list[bytes]:
    out = []
    for episode in range(len(LENGTHS)):
        with tarfile.open(dest / shard_path(episode)) as tar:
            out.append(tar.extractfile(header_member(episode)).read())
    return out


def assert_same_item(got: dict, want: dict, index: int) -> None:
    assert list(got) == list(want), index
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, (index, key)
            assert torch.equal(got[key], value), (index, key)
        else:
            assert got[key] == value, (index, key)


def test_recording_is_one_long_gop_video_with_b_frames(recording: Path):
    """What the test is about: one file per camera, keyframes every 30, decode order != pts."""
    for key in DEFAULT_CAMERAS:
        files = list((recording / "videos" / key).rglob("*.mp4"))
        assert len(files) == 1
        with av.open(str(files[0])) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            packets = [(p.pts, p.is_keyframe) for p in container.demux(stream) if p.size]
        assert len(packets) == FRAMES
        assert [i for i, (_, key_frame) in enumerate(packets) if key_frame] == [0, 30, 60, 90, 120]
        pts = [p for p, _ in packets]
        assert pts != sorted(pts)  # B-frames


def test_headers_start_at_the_keyframe_before(converted: Path):
    tails = []
    for header, length, skip in zip(headers(converted), LENGTHS, SKIP, strict=True):
        assert set(header.cameras) == set(DEFAULT_CAMERAS)
        for camera in header.cameras.values():
            assert camera.skip_frames == skip
            assert camera.frames == length + skip + camera.tail_frames
            tails.append(camera.tail_frames)
    assert any(tails)  # some episodes end on B-frames referencing the next episode's frames
    for raw in raw_headers(converted):  # tail_frames is written only where a reader needs it
        for camera in json.loads(raw)["cameras"].values():
            assert camera.get("tail_frames") != 0  # absent, or not 0
    assert verify_dataset(str(converted), deep=True) == []


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"delta_timestamps": DELTA},
        {"delta_timestamps": DELTA, "return_uint8": True},
        {"delta_timestamps": DELTA, "decode_threads": 0, "frame_cache_gb": 0},
    ],
    ids=["plain", "delta", "uint8-delta", "delta-inline-uncached"],
)
def test_epoch_equals_source(recording: Path, converted: Path, options: dict):
    """A whole shuffled epoch: every index once, each item LeRobotSource's, pad masks too.
    Uncached, every frame is decoded from its GOP's keyframe on its own."""
    reader_only = ("decode_threads", "frame_cache_gb")
    source = LeRobotSource(
        str(recording), **{k: v for k, v in options.items() if k not in reader_only}
    )
    order, padded = [], 0
    for item in ShardedLeRobotDataset(converted, buffer_size=2, seed=1, **options):
        index = int(item["index"])
        assert_same_item(item, source[index], index)
        order.append(index)
        padded += int(item.get(f"{CAM}_is_pad", torch.zeros(1, dtype=torch.bool)).any())
    assert sorted(order) == list(range(FRAMES)) and order != sorted(order)
    if options:
        assert 0 < padded < FRAMES


@pytest.mark.parametrize("gops", ["closed", "open"])
def test_torchcodec_epoch_equals_source(request: pytest.FixtureRequest, gops: str):
    """The torchcodec backend decodes each camera's frames, skipped and tail ones too, by index.

    With open GOPs, LeRobot's torchcodec path (approximate seeks, as LeRobotSource's) misses
    some frames shown before a keyframe and fails the item; there the shards give PyAV's frames,
    which for this H.264 stream are torchcodec's wherever both decode (checked here too)."""
    importorskip("torchcodec", reason="torchcodec is optional")
    recording, converted = recorded(request, gops)
    options = {"delta_timestamps": DELTA, "video_backend": "torchcodec"}
    source = LeRobotSource(str(recording), **options)
    by_pyav = LeRobotSource(str(recording), delta_timestamps=DELTA)
    items = list(ShardedLeRobotDataset(converted, buffer_size=2, **options))
    assert sorted(int(item["index"]) for item in items) == list(range(FRAMES))
    failed = []
    for item in items:
        index = int(item["index"])
        try:
            expected = source[index]
        except FrameNotFoundError:
            failed.append(index)
            expected = by_pyav[index]
        else:
            if gops == "open":
                assert_same_item(by_pyav[index], expected, index)
        assert_same_item(item, expected, index)
    assert gops == "open" or not failed
    assert len(failed) < FRAMES // 4  # most items are checked against LeRobot's own way


@pytest.mark.parametrize("gops", ["closed", "open"])
def test_equals_lerobots_own(request: pytest.FixtureRequest, gops: str):
    """LeRobot's LeRobotDataset reads the recording as the shards do, item for item (its env
    runs this). With x264's open GOPs, FFmpeg's seek lands after some leading frames and LeRobot
    fails those items (FrameTimestampError); there the shards give LeRobotSource's item, whose
    frames are those of a decode through the file (``test_open_gop_source_frames_...``)."""
    importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")
    from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from lerobot.datasets.video_utils import FrameTimestampError

    recording, converted = recorded(request, gops)
    theirs = LeRobotDataset(
        f"factory/{gops}-gop", root=recording, delta_timestamps=DELTA, video_backend="pyav"
    )
    source = LeRobotSource(str(recording), delta_timestamps=DELTA)
    items = list(ShardedLeRobotDataset(converted, buffer_size=2, delta_timestamps=DELTA))
    assert sorted(int(item["index"]) for item in items) == list(range(FRAMES))
    failed = []
    for item in items:
        index = int(item["index"])
        try:
            expected = theirs[index]
        except FrameTimestampError:
            failed.append(index)
            expected = source[index]
        assert_same_item(item, expected, index)
    assert gops == "open" or not failed
    assert len(failed) < FRAMES // 4  # most items are checked against LeRobot's own


def recorded(request: pytest.FixtureRequest, gops: str) -> tuple[Path, Path]:
    """The recording with closed or open GOPs, and its shards."""
    prefix = "" if gops == "closed" else "open_"
    return (
        request.getfixturevalue(f"{prefix}recording"),
        request.getfixturevalue(f"{prefix}converted"),
    )


H264_OPEN_GOP = replace(
    vid.H264_LONG_GOP, extra=(("bf", "3"), ("x264-params", "scenecut=0:open-gop=1"))
)
"""x264's open GOPs: B-frames decoded after a keyframe but shown before it reference the GOP
before (users' own encodes; ``lerobot-edit-dataset`` re-encodes with custom options)."""


@pytest.fixture(scope="module")
def open_recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("open-gop") / "src"
    return make_dataset(root, episode_lengths=LENGTHS, encoder=H264_OPEN_GOP, continuous_video=True)


@pytest.fixture(scope="module")
def open_converted(open_recording: Path) -> Path:
    dest = open_recording.parent / "shards"
    convert(str(open_recording), str(dest), workers=0, progress=False)
    return dest


def decoded_through(recording: Path, key: str) -> list[torch.Tensor]:
    """Every frame of camera ``key``'s one video, decoded from its start to its end (CHW uint8,
    in presentation order): what any decoder running through the file shows, whichever
    keyframe a seek finds."""
    (path,) = (recording / "videos" / key).rglob("*.mp4")
    with av.open(str(path)) as container:
        frames = {f.pts: f.to_ndarray(format="rgb24") for f in container.decode(video=0)}
    return [torch.from_numpy(frames[pts]).permute(2, 0, 1) for pts in sorted(frames)]


def test_open_gop_recording_has_leading_frames(open_recording: Path):
    """What the tests below are about: frames decoded after a keyframe but shown before it."""
    for key in DEFAULT_CAMERAS:
        (path,) = (open_recording / "videos" / key).rglob("*.mp4")
        with av.open(str(path)) as container:
            packets = [(p.pts, p.is_keyframe) for p in container.demux(video=0) if p.size]
        keyframe_pts = [pts for pts, key_frame in packets if key_frame]
        leading = [
            pts
            for i, (pts, key_frame) in enumerate(packets)
            if not key_frame and pts < max(p for p, k in packets[:i] if k)
        ]
        assert len(packets) == FRAMES and len(keyframe_pts) > 2 and leading


def test_open_gops_cut_from_the_keyframe_their_frames_decode_from(open_converted: Path):
    """The converter cuts open GOPs instead of refusing them: every episode's cut starts at a
    keyframe, holds a keyframe each of its frames decodes from, and decodes in full."""
    for header in headers(open_converted):
        assert set(header.cameras) == set(DEFAULT_CAMERAS)
        for camera in header.cameras.values():
            assert camera.frames == header.length + camera.skip_frames + camera.tail_frames
    assert any(c.skip_frames for h in headers(open_converted) for c in h.cameras.values())
    assert verify_dataset(str(open_converted), deep=True) == []


def test_open_gop_source_frames_are_the_decode_through(open_recording: Path):
    """LeRobotSource, random access (seeks), shows the frames of a decode through the file."""
    source = LeRobotSource(str(open_recording), return_uint8=True)
    through = {key: decoded_through(open_recording, key) for key in DEFAULT_CAMERAS}
    order = list(range(FRAMES))
    random.Random(0).shuffle(order)
    for index in order:
        item = source[index]
        for key in DEFAULT_CAMERAS:
            assert torch.equal(item[key], through[key][index]), (index, key)


@pytest.mark.parametrize(
    "options",
    [{"delta_timestamps": DELTA}, {"decode_threads": 0, "frame_cache_gb": 0}],
    ids=["delta", "inline-uncached"],
)
def test_open_gop_epoch_equals_source(open_recording: Path, open_converted: Path, options: dict):
    """A whole shuffled epoch of the open-GOP shards: every index once, each item
    LeRobotSource's; uncached, every frame decodes on its own from its keyframe in the cut."""
    reader_only = ("decode_threads", "frame_cache_gb")
    source = LeRobotSource(
        str(open_recording), **{k: v for k, v in options.items() if k not in reader_only}
    )
    order = []
    for item in ShardedLeRobotDataset(open_converted, buffer_size=2, seed=1, **options):
        index = int(item["index"])
        assert_same_item(item, source[index], index)
        order.append(index)
    assert sorted(order) == list(range(FRAMES))


def test_cut_of_an_episode_is_its_frames(recording: Path, converted: Path):
    """Decoding a shard's mp4 and dropping skip/tail frames gives the source's frames."""
    source = LeRobotSource(str(recording), return_uint8=True)
    for header in headers(converted):
        with tarfile.open(converted / shard_path(header.episode_index)) as tar:
            data = tar.extractfile(video_member(header.episode_index, CAM)).read()
        with av.open(io.BytesIO(data)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        camera = header.cameras[CAM]
        assert len(frames) == camera.frames
        kept = frames[camera.skip_frames : camera.skip_frames + header.length]
        for k, frame in enumerate(kept):
            want = source[header.dataset_from_index + k][CAM]
            assert torch.equal(torch.from_numpy(frame).permute(2, 0, 1), want)
