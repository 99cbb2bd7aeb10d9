"""Depth cameras as LeRobot 0.6.1 returns them: float32 ``(1, H, W)``, in millimetres or metres.

LeRobot marks a depth camera in its feature's info (``is_depth_map``: ``validate.is_depth_map``)
and stores it one of two ways:

- As video (its default): each map quantized to 12-bit codes between ``video.depth_min`` and
  ``video.depth_max`` metres, logarithmically (``video.shift``) unless ``video.use_log`` is
  false, and encoded losslessly (HEVC, ``gray12le``). Reading, it takes the decoded frame's
  12-bit plane (PyAV, whatever video backend was asked for) and dequantizes it to
  ``depth_output_unit``: ``"mm"`` (its default: whole millimetres, as float32) or ``"m"``.
- As images: 16-bit (``I;16``) or float (``F``) TIFF in the parquet, in the unit the feature's
  ``depth_unit`` names, returned as float32 and multiplied or divided by 1000 when the output
  unit differs (as stored where no ``depth_unit`` is recorded).

Image transforms skip depth maps, ``return_uint8`` leaves them float32, and their statistics,
stored in ``depth_unit``, are rescaled to the output unit on load (:func:`rescale_stats`).

Dequantizing depends on the code alone, so here it is a table over every uint16 code, made once
per quantization and unit with LeRobot's own float32 torch operations
(``lerobot.datasets.depth_utils.dequantize_depth``): a frame is then one table lookup, LeRobot's
values bit for bit, cheap enough to run in the decode threads. Nothing here imports torch until a
table is made: converting and ``verify`` read depth images without it.
"""

from __future__ import annotations

import functools
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from lerobot_shards.validate import DEPTH_UNITS, image_bytes, is_depth_map

DEFAULT_DEPTH_UNIT = "mm"
"""LeRobot's default ``depth_output_unit``."""
MM_PER_METRE = 1000.0
QMAX = (1 << 12) - 1
"""The largest 12-bit code: ``depth_max`` (LeRobot's ``DEPTH_QMAX``)."""
_UINT16_MODES = ("I;16", "I;16B", "I;16L")
"""PIL's modes of 16-bit depth images, which LeRobot reads as float32 values."""

__all__ = [
    "DEFAULT_DEPTH_UNIT",
    "DEPTH_UNITS",
    "DepthImage",
    "Quantization",
    "check_unit",
    "dequantization_table",
    "is_depth_map",
    "rescale_stats",
]


def check_unit(unit: str) -> str:
    """``unit`` if LeRobot returns depth in it, else ValueError.

    Args:
        unit: ``"mm"`` or ``"m"`` (a ``depth_output_unit``).
    """
    if unit not in DEPTH_UNITS:
        raise ValueError(f"depth_output_unit must be one of {list(DEPTH_UNITS)}, not {unit!r}")
    return unit


@dataclass(frozen=True)
class Quantization:
    """A depth video's quantization (metres), as LeRobot's ``DepthEncoderConfig`` reads it from
    the feature's info: ``video.depth_min``, ``video.depth_max``, ``video.shift``,
    ``video.use_log``, each LeRobot's default where absent or null."""

    depth_min: float = 0.01
    depth_max: float = 10.0
    shift: float = 3.5
    use_log: bool = True

    @classmethod
    def of(cls, feature: Mapping[str, Any]) -> Quantization:
        """The quantization a depth video's feature records (checked: ``validate``).

        Args:
            feature: the depth camera's entry of ``info.json``'s features.
        """
        info = feature.get("info") or {}
        names = ("depth_min", "depth_max", "shift", "use_log")
        recorded = {name: info.get(f"video.{name}") for name in names}
        return cls(**{name: value for name, value in recorded.items() if value is not None})


@functools.lru_cache(maxsize=32)
def dequantization_table(quantization: Quantization, unit: str) -> np.ndarray:
    """The depth of every uint16 code, float32: ``table[code]`` is what LeRobot's
    ``dequantize_depth`` gives that code (its torch operations, in its order, on every code at
    once; elementwise, so a code's value does not depend on the frame it is in). Read-only.

    Args:
        quantization: the depth video's quantization (``Quantization.of``).
        unit: the output unit, ``"mm"`` or ``"m"``.
    """
    import torch

    check_unit(unit)
    q = quantization
    depth_min, depth_max, shift = float(q.depth_min), float(q.depth_max), float(q.shift)
    if q.use_log:
        log_min = math.log(depth_min + shift)
        log_max = math.log(depth_max + shift)
        scale, offset = (log_max - log_min) / QMAX, log_min
    else:
        scale, offset = (depth_max - depth_min) / QMAX, depth_min
    codes = torch.from_numpy(np.arange(1 << 16, dtype=np.uint16))
    table = codes.to(dtype=torch.float32, copy=True)
    table.mul_(scale).add_(offset)
    if q.use_log:
        table.exp_().sub_(shift)
    table.clamp_(depth_min, depth_max)
    if unit == "mm":
        table.mul_(MM_PER_METRE).round_().clamp_(0.0, 65535)
    out = table.numpy()
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class DepthImage:
    """How a depth image feature's cells become LeRobot's values: decoded as float32 and
    converted from ``stored_unit`` (its ``depth_unit``; None: as stored) to ``output_unit``."""

    stored_unit: str | None
    output_unit: str = DEFAULT_DEPTH_UNIT

    @classmethod
    def of(cls, feature: Mapping[str, Any], output_unit: str) -> DepthImage:
        """How the depth image feature ``feature`` is read in ``output_unit``.

        Args:
            feature: the depth camera's entry of ``info.json``'s features.
            output_unit: ``"mm"`` or ``"m"``.
        """
        return cls((feature.get("info") or {}).get("depth_unit"), check_unit(output_unit))

    def decode(
        self, value: object, size: tuple[int, int] | None = None, allow_path: bool = True
    ) -> np.ndarray:
        """An image cell as LeRobot's float32 ``(1, H, W)`` depth in the output unit;
        ValueError for bytes that are no image or an image LeRobot does not read as depth.

        Args:
            value: the cell (LeRobot's struct of bytes and path, or the bytes).
            size: the (height, width) the features declare, checked before decoding.
            allow_path: whether a cell naming a file is read (``validate.decode_image``).
        """
        values = decode_depth_image(value, size, allow_path)
        if self.stored_unit is None or self.stored_unit == self.output_unit:
            return values
        # LeRobot's `item * MM_PER_METRE` or `item / MM_PER_METRE` on float32: one correctly
        # rounded operation per value, the same in numpy
        factor = np.float32(MM_PER_METRE)
        return values * factor if self.stored_unit == "m" else values / factor


def decode_depth_image(
    value: object, size: tuple[int, int] | None = None, allow_path: bool = True
) -> np.ndarray:
    """A depth image's cell as float32 ``(1, H, W)``, as LeRobot's ``pil_to_chw_tensor`` gives
    it: 16-bit images as their values, float (``F``) images as stored, 8-bit grayscale (``L``)
    divided by 255 (torchvision's ``ToTensor``). Any other mode raises ValueError: LeRobot
    records depth images as uint16 or float32.

    Args:
        value: the cell (LeRobot's struct of bytes and path, or the bytes).
        size: the (height, width) the features declare, checked before decoding.
        allow_path: whether a cell naming a file is read (``validate.decode_image``).
    """
    from PIL import Image  # here: a dataset without images never imports it

    data = image_bytes(value, allow_path)
    try:
        with Image.open(io.BytesIO(data)) as img:
            if size is not None and (img.height, img.width) != tuple(size):
                raise ValueError(
                    f"an image is {img.height}x{img.width}, the features say {size[0]}x{size[1]}"
                )
            if img.mode in (*_UINT16_MODES, "F"):
                values = np.array(img, dtype=np.float32)
            elif img.mode == "L":
                values = np.array(img, dtype=np.uint8).astype(np.float32) / np.float32(255)
            else:
                raise ValueError(
                    f"a depth image of PIL mode {img.mode!r}: LeRobot records depth images as "
                    "uint16 (I;16) or float32 (F)"
                )
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:  # PIL's decode errors
        raise ValueError(f"an image does not decode: {exc}") from exc
    return values[np.newaxis]


def rescale_stats(
    stats: Mapping[str, Mapping[str, np.ndarray]],
    features: Mapping[str, Mapping[str, Any]],
    output_unit: str,
) -> dict[str, dict[str, np.ndarray]]:
    """``stats`` with each depth map's in ``output_unit``, as LeRobot's
    ``rescale_depth_stats`` leaves them: every statistic but ``count`` of a depth feature whose
    ``depth_unit`` is recorded and differs multiplied by 1000 (m to mm) or 1/1000 (mm to m).

    Args:
        stats: per feature, per statistic, numpy arrays (as ``meta.stats``); not changed.
        features: ``info.json``'s features.
        output_unit: ``"mm"`` or ``"m"``.
    """
    check_unit(output_unit)
    out = {key: dict(feature_stats) for key, feature_stats in stats.items()}
    for key, feature in features.items():
        stored = (feature.get("info") or {}).get("depth_unit")
        if not is_depth_map(feature) or stored in (None, output_unit) or key not in out:
            continue
        factor = MM_PER_METRE if stored == "m" else 1.0 / MM_PER_METRE
        out[key] = {
            name: value if name == "count" else value * factor for name, value in out[key].items()
        }
    return out
