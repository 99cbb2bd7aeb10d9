"""decode.py on LeRobot 0.6.1's own AV1 files: bit-identical to a plain PyAV decode."""

from __future__ import annotations

import importlib.util

import av
import numpy as np
import pytest
import torch

from lerobot_shards.reader.decode import DecodeError, check_backend, decode_frames

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


def test_whole_file_equals_plain_pyav(mp4, reference):
    frames = decode_frames(mp4, length=len(reference))
    assert frames.dtype == torch.uint8 and frames.is_contiguous()
    assert frames.shape == (13, 40, 56, 3)
    assert torch.equal(frames, reference)


def test_skip_and_range(mp4, reference):
    # The file holds episode 0 (12 frames) then episode 1 (1 frame): drop 12 to get episode 1.
    assert torch.equal(decode_frames(mp4, length=1, skip_frames=12), reference[12:])
    assert torch.equal(decode_frames(mp4, length=13, start=3, stop=9), reference[3:9])
    assert decode_frames(mp4, length=13, start=5, stop=5).shape[0] == 0


def test_golden_items_match(mp4, golden_dir):
    """Episode 0's frames as LeRobot 0.6.1 returned them (float32 = uint8 / 255)."""
    expected = np.load(golden_dir / "av1_multifile.items.npz")
    frames = decode_frames(mp4, length=13, stop=12)
    for i in range(12):
        got = frames[i].permute(2, 0, 1).to(torch.float32) / 255
        assert torch.equal(got, torch.from_numpy(expected[f"{i}|observation.images.cam_high"]))


def test_wrong_frame_count_names_the_video(mp4):
    with pytest.raises(DecodeError, match=r"shard-x \(episode 7\).*holds 13 frames.*has 12"):
        decode_frames(mp4, length=12, where="shard-x (episode 7)")
    with pytest.raises(DecodeError, match=r"holds 1 frames.*has 2"):
        decode_frames(mp4, length=2, skip_frames=12)


def test_garbage_is_a_decode_error(mp4):
    with pytest.raises(DecodeError, match="ep-3: video does not decode"):
        decode_frames(b"not an mp4 at all" * 10, length=1, where="ep-3")
    with pytest.raises(DecodeError, match="ep-4"):
        decode_frames(mp4[: len(mp4) // 2], length=13, where="ep-4")


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown video_backend 'opencv'"):
        check_backend("opencv")


@pytest.mark.skipif(HAS_TORCHCODEC, reason="torchcodec is installed")
def test_torchcodec_missing_is_a_clear_error(mp4):
    with pytest.raises(ImportError, match="torchcodec"):
        check_backend("torchcodec")
    with pytest.raises(ImportError, match="pip install"):
        decode_frames(mp4, length=13, backend="torchcodec")


@pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec is not installed")
def test_torchcodec_frames(mp4, reference):
    frames = decode_frames(mp4, length=1, skip_frames=12, backend="torchcodec")
    assert frames.dtype == torch.uint8 and frames.shape == (1, 40, 56, 3)
