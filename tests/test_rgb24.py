"""reader.rgb24: frames written in place have PyAV's rgb24 pixels, bit for bit, and the direct
swscale call is used only for the kinds of frame it was checked on."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lerobot_shards.reader.frames import rgb24


def golden_frames(golden_dir: Path) -> list:
    """A few decoded frames of each golden video (LeRobot's AV1, several sizes)."""
    frames = []
    for path in sorted(golden_dir.rglob("*.mp4")):
        with av.open(str(path)) as container:
            for i, frame in enumerate(container.decode(container.streams.video[0])):
                if i == 3:
                    break
                frames.append(frame)
    return frames


@pytest.fixture(autouse=True)
def fresh_verdicts(monkeypatch):
    monkeypatch.setattr(rgb24, "_verdicts", {})


def test_written_frames_equal_pyav_s_and_some_kinds_go_direct(golden_dir):
    frames = golden_frames(golden_dir)
    sizes = {(f.width, f.height) for f in frames}
    assert len(sizes) >= 2
    for frame in frames:
        out = torch.empty(frame.height, frame.width, 3, dtype=torch.uint8)
        rgb24.write_rgb24(frame, out)
        assert torch.equal(out, rgb24.to_rgb24(frame))
    # Every kind met was checked; on this system PyAV's libswscale is found and used for some.
    assert {k[:2] for k in rgb24._verdicts} == sizes
    assert any(rgb24._verdicts.values()), rgb24._verdicts


def test_a_kind_whose_rows_overrun_is_not_written_directly(golden_dir):
    """Where swscale writes past a tight frame (a width that is not a multiple of its SIMD
    block), the guard band catches it and that kind takes PyAV's path."""
    overran = set()
    for frame in golden_frames(golden_dir):
        size = frame.height * frame.width * 3
        guarded = np.full(size + 4096 + 64, 0xA5, dtype=np.uint8)
        start = -guarded.ctypes.data % 64
        rgb24._scale(frame, guarded[start:].ctypes.data)
        if (guarded[start + size :] != 0xA5).any():
            overran.add(frame.width)
            assert rgb24._check(frame) is False
    # The golden 56-pixel-wide camera overruns with the swscale of PyAV's wheels (SIMD blocks of
    # 16 pixels), so the guard is exercised here, not assumed.
    assert 56 in overran


def test_unaligned_or_library_less_destinations_still_get_pyav_s_pixels(golden_dir, monkeypatch):
    frame = golden_frames(golden_dir)[0]
    size = frame.height * frame.width * 3
    raw = torch.empty(size + 64, dtype=torch.uint8)
    offset = 1 if raw.data_ptr() % 64 == 0 else 0
    unaligned = raw[offset : offset + size].view(frame.height, frame.width, 3)
    assert unaligned.data_ptr() % 64 != 0
    rgb24.write_rgb24(frame, unaligned)
    assert torch.equal(unaligned, rgb24.to_rgb24(frame))
    monkeypatch.setattr(rgb24, "_libraries", None)  # no libswscale found
    out = torch.zeros(frame.height, frame.width, 3, dtype=torch.uint8)
    rgb24.write_rgb24(frame, out)
    assert torch.equal(out, rgb24.to_rgb24(frame))
    assert not any(rgb24._verdicts.values())


def test_a_destination_of_the_wrong_shape_is_refused(golden_dir):
    frame = golden_frames(golden_dir)[0]
    with pytest.raises(ValueError, match=f"{frame.width}x{frame.height} frame"):
        rgb24.write_rgb24(frame, torch.empty(frame.height, frame.width + 1, 3, dtype=torch.uint8))
