"""A decoded depth frame as LeRobot returns it: its 12-bit codes, dequantized in the decode thread.

LeRobot takes a depth frame's codes with PyAV's ``to_ndarray(format="gray12le")`` (never 8-bit
RGB) and dequantizes them with float32 torch operations. Here the decoder's own ``gray12le``
plane is read where it is (no conversion, no copy) and each code looked up in the feature's
table (``lerobot_shards.depth.dequantization_table``): LeRobot's values, in one pass over the
frame, with the GIL released (numpy's ``take``), so decode threads dequantize in parallel. A
stream in another pixel format takes PyAV's conversion to ``gray12le``, as LeRobot's does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lerobot_shards.reader.frames.rgb24 import converted

DEPTH_PIX_FMT = "gray12le"
"""The pixel format LeRobot reads depth codes in (and encodes them in by default)."""


def to_depth(frame: Any, table: np.ndarray) -> torch.Tensor:
    """A decoded PyAV frame's depth, a new float32 ``(H, W, 1)`` tensor: ``table[code]`` for
    each of its 12-bit codes.

    Args:
        frame: a decoded ``av.VideoFrame`` of a depth video.
        table: the feature's ``lerobot_shards.depth.dequantization_table``.
    """
    height, width = frame.height, frame.width
    if frame.format.name == DEPTH_PIX_FMT:
        plane = frame.planes[0]
        row = plane.line_size // 2  # uint16 per row, with the decoder's padding
        codes = np.frombuffer(plane, dtype="<u2", count=row * height).reshape(height, row)
        codes = codes[:, :width]
    else:
        codes = converted(frame, DEPTH_PIX_FMT)
    out = torch.empty((height, width, 1), dtype=torch.float32)
    np.take(table, codes, out=out.numpy()[..., 0], mode="clip")  # clip: unbuffered; codes fit
    return out
