"""decode.py and episode.CameraFrames on LeRobot 0.6.1's own AV1 files (GOP 2): GOP-level
random access is bit-identical to a plain in-order PyAV decode; through the frame cache each GOP
is decoded once when the cache has room, and what it drops is decoded again, still exact."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np
import pytest
import torch
from PIL import Image
from support.required import import_error

from lerobot_shards.reader.frames.decode import DecodeError, Video, check_backend
from lerobot_shards.reader.frames.episode import CameraFrames
from lerobot_shards.reader.frames.frame_cache import FrameCache
from lerobot_shards.reader.frames.resize import Resize

VIDEO = "av1_multifile/videos/observation.images.cam_high/chunk-000/file-000.mp4"
HAS_TORCHCODEC = import_error("torchcodec") is None


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
            gop = video.decode(int(position), video.gop_positions(int(position)))
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
    assert video.gop_positions(5) == video.gop_positions(4) == [4, 5]
    assert video.gop_positions(12) == [12]
    # Only the wanted frames come back (a keyframe alone needs one frame's decode).
    assert list(video.decode(4)) == [4] and list(video.decode(5)) == [5]
    assert sorted(video.decode(5, [4])) == [4, 5]


def test_skip_frames(mp4, reference):
    # The file holds episode 0 (12 frames) then episode 1 (1 frame): drop 12 to get episode 1.
    assert list(Video(mp4, length=1, skip_frames=12).decode(0)) == [0]
    assert torch.equal(Video(mp4, length=1, skip_frames=12).decode(0)[0], reference[12])
    # Skipping 3 starts mid-GOP: the skipped frame 2 is decoded (a reference) but left out.
    video = Video(mp4, length=10, skip_frames=3)
    assert video.gop_positions(0) == [0]
    assert torch.equal(video.decode(0)[0], reference[3])
    frames = decode_all(video, range(10))
    assert all(torch.equal(frames[p], reference[p + 3]) for p in range(10))
    with pytest.raises(ValueError, match="frame 10 outside an episode of 10"):
        video.decode(10)


def test_threads_decode_side_by_side(mp4, reference):
    """Each thread has its own codec context: concurrent GOP decodes stay exact."""
    video = Video(mp4, length=13)
    with ThreadPoolExecutor(4) as pool:
        gops = list(pool.map(video.decode, [p % 13 for p in range(52)]))
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
    """A real Video that records each decode: the wanted frame and the GOP frames kept."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.decoded: list[tuple[int, list[int]]] = []

    def decode(self, position: int, keep=(), rgb: bool = True) -> dict:
        self.decoded.append((position, sorted(keep)))
        return super().decode(position, keep, rgb)


def camera_over(
    video: Video, draws: list[list[int]], capacity: int
) -> tuple[CameraFrames, FrameCache]:
    """A camera decoding through a cache of ``capacity`` bytes told that draw ``d`` takes the
    frames ``draws[d]`` (a frame once per take)."""
    cache = FrameCache(capacity)
    camera = CameraFrames(video, "cam")
    camera.attach(cache, "episode")
    for d, positions in enumerate(draws):
        cache.expect(d, [camera.key(p) for p in positions])
    return camera, cache


def test_with_room_each_gop_is_decoded_once_and_drawn_frames_are_dropped(mp4, reference):
    video = CountingVideo(mp4, length=13)
    order = np.random.default_rng(1).permutation(13).tolist()
    frames, cache = camera_over(video, [[p] for p in order], capacity=10**9)
    held = []
    for d, p in enumerate(order):
        cache.now = d
        assert torch.equal(frames.take(p), reference[p])
        held.append(cache.nbytes)
    gops = sorted(tuple(sorted([p, *keep])) for p, keep in video.decoded)
    assert gops == [(2 * k, 2 * k + 1) for k in range(6)] + [(12,)]
    assert cache.nbytes == 0 and cache.decodes_saved == 6  # everything drawn: nothing held
    assert 0 < max(held) <= 6 * reference[0].nbytes


def test_without_room_each_draw_decodes_only_its_own_frame(mp4, reference):
    video = CountingVideo(mp4, length=13)
    order = np.random.default_rng(1).permutation(13).tolist()
    frames, cache = camera_over(video, [[p] for p in order], capacity=0)
    for d, p in enumerate(order):
        cache.now = d
        assert torch.equal(frames.take(p), reference[p])
    assert video.decoded == [(p, []) for p in order] and cache.peak_bytes == 0


def test_a_full_cache_keeps_the_frame_drawn_soonest(mp4, reference):
    # Room for one frame. Draw 0 decodes GOP {0, 1} and keeps 1 (drawn at 3); draw 1 decodes
    # {2, 3}, and 3 (drawn at 2) is sooner than 1, so 1 is dropped and decoded again at draw 3.
    video = CountingVideo(mp4, length=13)
    order = [0, 2, 3, 1]
    frames, cache = camera_over(video, [[p] for p in order], capacity=reference[0].nbytes)
    for d, p in enumerate(order):
        cache.now = d
        assert torch.equal(frames.take(p), reference[p])
    assert video.decoded == [(0, [1]), (2, [3]), (1, [])]
    assert cache.peak_bytes == reference[0].nbytes and cache.nbytes == 0


def test_camera_frames_written_into_slots_equal_pyav_s(mp4, reference):
    """Draws written into a slot leave their GOP's other frames unconverted; whichever way a
    frame is drawn later, it has PyAV's pixels, and each GOP is decoded once."""
    video = CountingVideo(mp4, length=13)
    order = np.random.default_rng(2).permutation(13).tolist()
    frames, cache = camera_over(video, [[p] for p in order], capacity=10**9)
    for i, p in enumerate(order):
        cache.now = i
        if i % 3 == 2:
            got = frames.take(p)
        else:
            slot = torch.empty_like(reference[p])
            assert frames.take(p, slot) is slot
            got = slot
        assert torch.equal(got, reference[p]), p
    assert sorted(tuple(sorted([p, *k])) for p, k in video.decoded) == [
        (2 * k, 2 * k + 1) for k in range(6)
    ] + [(12,)]
    assert cache.nbytes == 0


def test_an_unconverted_frame_drawn_several_times_is_converted_once(mp4, reference):
    video = CountingVideo(mp4, length=13)
    frames, cache = camera_over(video, [[0], [1], [1], [1]], capacity=10**9)
    frames.take(0, torch.empty_like(reference[0]))  # its GOP mate, frame 1, stays unconverted
    cache.now = 1
    first = frames.take(1)
    cache.now = 2
    second = frames.take(1)
    assert second is first and torch.equal(first, reference[1])
    cache.now = 3
    slot = torch.empty_like(reference[1])
    assert torch.equal(frames.take(1, slot), reference[1])
    assert video.decoded == [(0, [1])] and cache.nbytes == 0


def test_camera_frames_keep_a_frame_for_each_use(mp4, reference):
    # Frame 3 shown by three draws (delta_timestamps neighbours), frame 2 by none.
    video = CountingVideo(mp4, length=13)
    order = [3, 0, 3, 1, 3]
    frames, cache = camera_over(video, [[p] for p in order], capacity=10**9)
    for d, p in enumerate(order):
        cache.now = d
        assert torch.equal(frames.take(p), reference[p])
    assert video.decoded == [(3, []), (0, [1])]
    assert cache.nbytes == 0
    frames.take(3)  # one use too many: decoded again, still exact
    assert video.decoded[-1] == (3, [])


def test_decoding_ahead_holds_placeholders_within_the_cap(mp4, reference):
    """Frames scheduled on a thread count against the cap from the start; a draw waits for them
    instead of decoding, and a schedule with no room is skipped (decoded when drawn)."""
    video = CountingVideo(mp4, length=13)
    order = [0, 1, 4, 5, 8]
    frames, cache = camera_over(video, [[p] for p in order], capacity=2 * reference[0].nbytes)
    with ThreadPoolExecutor(2) as pool:
        frames.schedule(0, pool)  # GOP {0, 1}: both drawn soon, both held as placeholders
        assert cache.nbytes == 2 * reference[0].nbytes
        frames.schedule(4, pool)  # no room: frames 0 and 1 are drawn sooner
        assert cache.nbytes == 2 * reference[0].nbytes
        for d, p in enumerate(order):
            cache.now = d
            assert torch.equal(frames.take(p), reference[p])
    assert video.decoded[0] == (0, [1]) and (4, [5]) in video.decoded and len(video.decoded) == 3


@pytest.mark.skipif(HAS_TORCHCODEC, reason="torchcodec imports here")
def test_torchcodec_missing_is_a_clear_error(mp4):
    with pytest.raises(ImportError, match="torchcodec"):
        check_backend("torchcodec")
    with pytest.raises(ImportError, match="pip install"):
        Video(mp4, length=13, backend="torchcodec").decode(0)


@pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec does not import here")
def test_torchcodec_frames(mp4, reference):
    frames = decode_all(Video(mp4, length=1, skip_frames=12, backend="torchcodec"), [0])
    assert frames[0].dtype == torch.uint8 and frames[0].shape == (40, 56, 3)


@pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec does not import here")
def test_torchcodec_frames_are_resized_by_pillow(mp4):
    """A target layout's resize with the torchcodec backend: its RGB frames through Pillow's
    bilinear filter (``frames/resize.py``), the arithmetic stated for them."""
    resize = Resize(24, 40, "pad")
    native = decode_all(Video(mp4, length=13, backend="torchcodec"), range(13))
    resized = decode_all(Video(mp4, length=13, backend="torchcodec", resize=resize), range(13))
    top, left, rows, columns = resize.inner(40, 56)
    for position, frame in native.items():
        picture = Image.fromarray(frame.numpy()).resize((columns, rows), Image.BILINEAR)
        expected = np.zeros((24, 40, 3), np.uint8)
        expected[top : top + rows, left : left + columns] = np.asarray(picture)
        assert np.array_equal(resized[position].numpy(), expected), position
