"""decode.py and episode.CameraFrames on LeRobot 0.6.1's own AV1 files (GOP 2): GOP-level
random access is bit-identical to a plain in-order PyAV decode, and decodes each GOP once."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np
import pytest
import torch

from lerobot_shards.reader.decode import DecodeError, Video, check_backend
from lerobot_shards.reader.episode import CameraFrames

VIDEO = "av1_multifile/videos/observation.images.cam_high/chunk-000/file-000.mp4"
HAS_TORCHCODEC = importlib.util.find_spec("torchcodec") is not None


@pytest.fixture(scope="module")
def mp4(golden_dir) -> bytes:
    return (golden_dir / VIDEO).read_bytes()


@pytest.fixture(scope="module")
def reference(golden_dir) -> torch.Tensor:
    """Every frame of the file, decoded the plain way: PyAV from the path, rgb24, NHWC."""
    with av.open(str(golden_dir / VIDEO)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return torch.from_numpy(np.stack(frames))


def decode_all(video: Video, order) -> dict[int, torch.Tensor]:
    """Every frame of ``video``, GOP by GOP, in the order the positions are asked for."""
    frames: dict[int, torch.Tensor] = {}
    for position in order:
        if position not in frames:
            gop = video.decode_gop(int(position))
            assert position in gop and not frames.keys() & gop.keys()
            frames.update(gop)
    return frames


def test_gops_in_any_order_equal_plain_pyav(mp4, reference):
    video = Video(mp4, length=13)
    for order in (range(13), range(12, -1, -1), np.random.default_rng(0).permutation(13)):
        frames = decode_all(video, order)
        assert sorted(frames) == list(range(13))
        for p, frame in frames.items():
            assert frame.dtype == torch.uint8 and frame.shape == (40, 56, 3)
            assert torch.equal(frame, reference[p])


def test_a_gop_is_a_keyframe_and_what_follows(mp4):
    # LeRobot's encoder writes GOP 2: frames 2k and 2k+1 decode together, 12 alone.
    video = Video(mp4, length=13)
    assert sorted(video.decode_gop(5)) == [4, 5]
    assert sorted(video.decode_gop(4)) == [4, 5]
    assert sorted(video.decode_gop(12)) == [12]


def test_skip_frames(mp4, reference):
    # The file holds episode 0 (12 frames) then episode 1 (1 frame): drop 12 to get episode 1.
    assert list(Video(mp4, length=1, skip_frames=12).decode_gop(0)) == [0]
    assert torch.equal(Video(mp4, length=1, skip_frames=12).decode_gop(0)[0], reference[12])
    # Skipping 3 starts mid-GOP: the skipped frame 2 is decoded (a reference) but left out.
    video = Video(mp4, length=10, skip_frames=3)
    assert list(video.decode_gop(0)) == [0]
    frames = decode_all(video, range(10))
    assert all(torch.equal(frames[p], reference[p + 3]) for p in range(10))
    with pytest.raises(ValueError, match="frame 10 outside an episode of 10"):
        video.decode_gop(10)


def test_threads_decode_side_by_side(mp4, reference):
    """Each thread has its own codec context: concurrent GOP decodes stay exact."""
    video = Video(mp4, length=13)
    with ThreadPoolExecutor(4) as pool:
        gops = list(pool.map(video.decode_gop, [p % 13 for p in range(52)]))
    assert all(torch.equal(f, reference[p]) for gop in gops for p, f in gop.items())


def test_golden_items_match(mp4, golden_dir):
    """Episode 0's frames as LeRobot 0.6.1 returned them (float32 = uint8 / 255)."""
    expected = np.load(golden_dir / "av1_multifile.items.npz")
    frames = decode_all(Video(mp4, length=13), range(12))
    for i in range(12):
        got = frames[i].permute(2, 0, 1).to(torch.float32) / 255
        assert torch.equal(got, torch.from_numpy(expected[f"{i}|observation.images.cam_high"]))


def test_wrong_frame_count_names_the_video(mp4):
    with pytest.raises(DecodeError, match=r"shard-x \(episode 7\).*holds 13 frames.*has 12"):
        Video(mp4, length=12, where="shard-x (episode 7)")
    with pytest.raises(DecodeError, match=r"holds 1 frames.*has 2"):
        Video(mp4, length=2, skip_frames=12)


def test_garbage_is_a_decode_error(mp4):
    with pytest.raises(DecodeError, match="ep-3: video does not decode"):
        Video(b"not an mp4 at all" * 10, length=1, where="ep-3")
    with pytest.raises(DecodeError, match="ep-4"):
        Video(mp4[: len(mp4) // 2], length=13, where="ep-4")


def test_unknown_backend(mp4):
    with pytest.raises(ValueError, match="unknown video_backend 'opencv'"):
        check_backend("opencv")
    with pytest.raises(ValueError, match="unknown video_backend 'opencv'"):
        Video(mp4, length=13, backend="opencv")


class CountingVideo(Video):
    """A real Video that records which GOPs it decoded."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.decoded: list[list[int]] = []

    def decode_gop(self, position: int, rgb: bool = True) -> dict:
        gop = super().decode_gop(position, rgb)
        self.decoded.append(sorted(gop))
        return gop


def test_camera_frames_decode_each_gop_once_and_drop_drawn_frames(mp4, reference):
    video = CountingVideo(mp4, length=13)
    frames = CameraFrames(video, np.ones(13, dtype=np.int64))  # each frame drawn once
    order = np.random.default_rng(1).permutation(13)
    held = []
    for p in order:
        assert torch.equal(frames.take(int(p)), reference[p])
        held.append(frames.nbytes)
    assert sorted(map(tuple, video.decoded)) == [(2 * k, 2 * k + 1) for k in range(6)] + [(12,)]
    assert frames.nbytes == 0  # everything drawn: nothing held
    assert max(held) <= 13 * reference[0].nbytes and max(held) > 0


def test_camera_frames_written_into_slots_equal_pyav_s(mp4, reference):
    """Draws written into a slot leave their GOP's other frames unconverted; whichever way a
    frame is drawn later, it has PyAV's pixels, and each GOP is decoded once."""
    video = CountingVideo(mp4, length=13)
    frames = CameraFrames(video, np.ones(13, dtype=np.int64))
    order = np.random.default_rng(2).permutation(13)
    for i, p in enumerate(order.tolist()):
        if i % 3 == 2:
            got = frames.take(p)
        else:
            slot = torch.empty_like(reference[p])
            assert frames.take(p, slot) is slot
            got = slot
        assert torch.equal(got, reference[p]), p
    assert sorted(map(tuple, video.decoded)) == [(2 * k, 2 * k + 1) for k in range(6)] + [(12,)]
    assert frames.nbytes == 0


def test_an_unconverted_frame_drawn_several_times_is_converted_once(mp4, reference):
    uses = np.ones(13, dtype=np.int64)
    uses[1] = 3
    video = CountingVideo(mp4, length=13)
    frames = CameraFrames(video, uses)
    frames.take(0, torch.empty_like(reference[0]))  # its GOP mate, frame 1, stays unconverted
    first, second = frames.take(1), frames.take(1)
    assert second is first and torch.equal(first, reference[1])
    slot = torch.empty_like(reference[1])
    assert torch.equal(frames.take(1, slot), reference[1])
    assert video.decoded == [[0, 1]] and frames.nbytes == 0


def test_camera_frames_keep_a_frame_for_each_use(mp4, reference):
    # Frame 3 shown by three draws (delta_timestamps neighbours), frame 2 by none.
    uses = np.array([1, 1, 0, 3] + [0] * 9)
    video = CountingVideo(mp4, length=13)
    frames = CameraFrames(video, uses.copy())
    for p in (3, 0, 3, 1, 3):
        assert torch.equal(frames.take(p), reference[p])
    assert video.decoded == [[2, 3], [0, 1]]
    assert frames.nbytes == 0
    frames.take(3)  # one use too many: decoded again, still exact
    assert video.decoded[-1] == [2, 3]


@pytest.mark.skipif(HAS_TORCHCODEC, reason="torchcodec is installed")
def test_torchcodec_missing_is_a_clear_error(mp4):
    with pytest.raises(ImportError, match="torchcodec"):
        check_backend("torchcodec")
    with pytest.raises(ImportError, match="pip install"):
        Video(mp4, length=13, backend="torchcodec").decode_gop(0)


@pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec is not installed")
def test_torchcodec_frames(mp4, reference):
    frames = decode_all(Video(mp4, length=1, skip_frames=12, backend="torchcodec"), [0])
    assert frames[0].dtype == torch.uint8 and frames[0].shape == (40, 56, 3)
