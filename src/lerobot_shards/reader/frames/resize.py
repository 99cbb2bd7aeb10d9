"""Camera frames brought to one size as they are decoded, for mixtures across robots.

Why at decode time. A policy trained on several robots takes one image size; resizing in the
training loop would move every full-size frame through the DataLoader first. Here a video
frame is scaled by swscale as it is decoded, in the DataLoader workers: a 480x640 frame
brought to 224x224 is converted into a sixth of the pixels, and batches carry only those.

Why scale in YUV first. swscale's one pass that scales and converts to rgb24 at once takes its
generic path, which costs 3.5 times its plain conversion of the full frame (0.71 ms against
0.21 ms for a 480x640 frame to 224x168, one thread). Scaled into ``yuv422p`` at the target
size (0.28 ms: luma to the target size, chroma to half its width, more chroma than a 4:2:0
picture keeps, so small pictures stay near an RGB resize), then converted by the plain
converter (0.03 ms, written straight into the batch slot where the picture's rows are whole,
``rgb24.py``), a frame costs half the one pass.

Two policies (:class:`Resize`):

- ``pad`` (keep the aspect ratio, as openpi's ``resize_with_pad``): the frame is scaled to the
  largest size that fits, ``int(height / ratio)`` by ``int(width / ratio)`` with ``ratio =
  max(width / W, height / H)``, and placed at ``((H - h) // 2, (W - w) // 2)`` in a black
  (zero) frame of ``H x W``.
- ``stretch``: scaled to ``H x W`` whatever its aspect ratio.

Arithmetic: video frames (PyAV backend) by swscale's bilinear scaler, PyAV's default: a
``yuv420p`` frame scaled into ``yuv422p``, then converted to rgb24
(``frame.reformat(width=, height=, format="yuv422p").reformat(format="rgb24")``); a frame of
any other pixel format scaled and converted in one pass (``frame.reformat(width=, height=,
format="rgb24")``). Image features (PNG in the rows) and frames the torchcodec backend
decoded, already RGB, by Pillow's bilinear filter (``Image.resize(..., Image.BILINEAR)``).
Both scalers widen the filter when they shrink (no aliasing). A frame already of the target
size is not scaled.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from lerobot_shards.reader.frames.rgb24 import one_thread_options, to_rgb24, write_rgb24

POLICIES = ("pad", "stretch")
SCALED_IN = {"yuv420p": "yuv422p"}
"""Pixel formats whose frames are scaled in that format before their conversion to rgb24
(the module says why); any other is scaled and converted in one pass."""

_local = threading.local()  # per thread: PyAV reformatters by (source size, format, target)


@dataclass(frozen=True)
class Resize:
    """The size every frame of a camera is brought to, and how.

    Args:
        height: Rows of the resized frame.
        width: Columns of the resized frame.
        policy: ``"pad"`` (keep the aspect ratio, black bands) or ``"stretch"``.
    """

    height: int
    width: int
    policy: str = "pad"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown resize policy {self.policy!r}; expected one of {POLICIES}")
        if self.height < 1 or self.width < 1:
            raise ValueError(f"a resize needs a positive size, got {self.height}x{self.width}")

    def inner(self, height: int, width: int) -> tuple[int, int, int, int]:
        """Where a ``height x width`` frame lands: ``(top, left, rows, columns)`` of its scaled
        picture inside the resized frame (the whole frame with ``stretch``)."""
        if self.policy == "stretch":
            return 0, 0, self.height, self.width
        ratio = max(width / self.width, height / self.height)
        rows = max(1, min(self.height, int(height / ratio)))
        columns = max(1, min(self.width, int(width / ratio)))
        return (self.height - rows) // 2, (self.width - columns) // 2, rows, columns

    @property
    def shape(self) -> tuple[int, int, int]:
        """The resized frame's ``(H, W, 3)``."""
        return self.height, self.width, 3


def resized_rgb24(frame: Any, resize: Resize) -> torch.Tensor:
    """A decoded PyAV frame converted to RGB and resized: a new uint8 ``(H, W, 3)`` tensor."""
    out = torch.from_numpy(np.empty(resize.shape, dtype=np.uint8))
    write_resized_rgb24(frame, out, resize)
    return out


@dataclass(frozen=True)
class Scaled:
    """A decoded frame scaled for a resize (:func:`scaled`), not yet converted: what a frame
    cache best holds (for a 480x640 frame brought to 224x224, a fifth of its full-size
    rgb24's bytes)."""

    picture: Any
    """PyAV's frame at the picture's size: ``yuv422p``, rgb24, or the frame as decoded."""
    top: int
    left: int

    @property
    def planes(self) -> Any:
        """The picture's planes (what a frame cache counts)."""
        return self.picture.planes


def scaled(frame: Any, resize: Resize) -> Scaled:
    """``frame`` (PyAV's, as decoded) scaled to the size of its picture in the resized frame:
    a ``yuv420p`` frame into ``yuv422p``, any other into rgb24; a frame already of that size
    as it is. A :class:`Scaled` is returned as it is."""
    if isinstance(frame, Scaled):
        return frame
    top, left, rows, columns = resize.inner(frame.height, frame.width)
    if (rows, columns) != (frame.height, frame.width):
        frame = _reformatter(frame, rows, columns).reformat(
            frame,
            width=columns,
            height=rows,
            format=SCALED_IN.get(frame.format.name, "rgb24"),
            **one_thread_options(),
        )
    return Scaled(frame, top, left)


def write_resized_rgb24(frame: Any, out: torch.Tensor, resize: Resize) -> None:
    """Write ``frame`` (as decoded, or :func:`scaled`) converted to RGB and resized into
    ``out``, a C-contiguous uint8 ``(H, W, 3)`` tensor such as a batch slot (its bands, with
    ``pad``, set to zero)."""
    done = scaled(frame, resize)
    picture, top, left = done.picture, done.top, done.left
    target = out.numpy()
    if picture.format.name == "rgb24":
        _place(picture.to_ndarray(), target, top, left)
        return
    rows, columns = picture.height, picture.width
    inner = out[top : top + rows, left : left + columns]
    if inner.is_contiguous():  # whole rows (a wide frame into a square): converted in place
        _bands(target, top, left, rows, columns)
        write_rgb24(picture, inner)
    else:
        _place(to_rgb24(picture).numpy(), target, top, left)


def resized_image(image: np.ndarray, resize: Resize) -> np.ndarray:
    """An RGB ``(h, w, 3)`` uint8 array (a decoded image feature, or a frame torchcodec
    decoded) resized with Pillow's bilinear filter: a new ``(H, W, 3)`` array."""
    height, width = image.shape[:2]
    out = np.empty(resize.shape, dtype=np.uint8)
    top, left, rows, columns = resize.inner(height, width)
    if (rows, columns) == (height, width):
        scaled = image
    else:
        picture = Image.fromarray(np.ascontiguousarray(image))
        scaled = np.asarray(picture.resize((columns, rows), Image.BILINEAR))
    _place(scaled, out, top, left)
    return out


def _place(picture: np.ndarray, out: np.ndarray, top: int, left: int) -> None:
    """``picture`` at ``(top, left)`` of ``out``, the rest of ``out`` zero (numpy copies on
    this thread; torch would wake its intra-op pool)."""
    rows, columns = picture.shape[:2]
    _bands(out, top, left, rows, columns)
    np.copyto(out[top : top + rows, left : left + columns], picture)


def _bands(out: np.ndarray, top: int, left: int, rows: int, columns: int) -> None:
    """Zero ``out`` around its ``rows x columns`` picture at ``(top, left)``."""
    if (rows, columns) != out.shape[:2]:
        out[:top] = 0
        out[top + rows :] = 0
        out[top : top + rows, :left] = 0
        out[top : top + rows, left + columns :] = 0


def _reformatter(frame: Any, rows: int, columns: int) -> Any:
    """This thread's PyAV reformatter for frames of ``frame``'s kind scaled to ``rows x
    columns``: one per kind, since a reformatter reconfigures swscale whenever they change."""
    from av.video.reformatter import VideoReformatter

    reformatters = getattr(_local, "reformatters", None)
    if reformatters is None:
        reformatters = _local.reformatters = {}
    key = (frame.width, frame.height, frame.format.name, rows, columns)
    reformatter = reformatters.get(key)
    if reformatter is None:
        reformatter = reformatters[key] = VideoReformatter()
    return reformatter
