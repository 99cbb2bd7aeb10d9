"""Decoded frames to rgb24, as PyAV's reformat gives them, into a new tensor or a caller's buffer.

:func:`to_rgb24` is PyAV's own conversion (swscale's defaults, one thread): what LeRobot's pyav
backend returns, bit for bit. :func:`write_rgb24` puts the same pixels into memory the caller
owns, such as a batch slot in a DataLoader worker's shared segment (``transfer.BatchArena``).

Why write in place. PyAV's reformat always allocates its output, so a frame bound for a batch
was written twice (swscale's output, then the batch) into memory that was often freshly faulted
in. Here swscale writes the batch slot itself: ``sws_scale`` of the libswscale PyAV has loaded,
called through ctypes with the context PyAV's reformat amounts to for these frames (same size,
bilinear, one thread).

Checked, not assumed. The first frame of each kind (size, pixel format, colour description) and
destination alignment is converted both ways, into a buffer with a guard band behind it; the
direct call is used for that kind only if its pixels equal PyAV's and it wrote nothing past the
frame (swscale's SIMD rows may overrun widths that are not a multiple of their block). Any other
kind, or a system where the library cannot be found (not Linux, no ``/proc/self/maps``), takes
PyAV's path and one copy: the same pixels, more slowly.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any

import numpy as np
import torch

_GUARD = 4096
"""Bytes behind a check's frame that must stay untouched."""
_ALIGN = 64
"""Direct writes only to 64-byte aligned memory, as the check's buffer is: swscale may pick other
code paths for other alignments."""

_local = threading.local()  # per thread: the PyAV reformatter, swscale contexts
_verdicts: dict[tuple, bool] = {}  # kind -> direct conversion equals PyAV's
_libraries: tuple[Any, Any] | bool | None = False  # (swscale, avutil), None if unavailable


def to_rgb24(frame: Any) -> torch.Tensor:
    """A decoded PyAV video frame as a new C-contiguous uint8 ``(H, W, 3)`` tensor, PyAV's
    pixels. (PyAV 18.1.1 returns the frame's own rows, padded to its line alignment where
    ``3 * W`` is not a multiple of it: copied then, the rare case of narrow frames.)"""
    rgb = _reformatter().reformat(frame, format="rgb24", **one_thread_options())
    return torch.from_numpy(np.ascontiguousarray(rgb.to_ndarray()))


def converted(frame: Any, pix_fmt: str) -> np.ndarray:
    """PyAV's ``frame.to_ndarray(format=pix_fmt)``, converted on one swscale thread. PyAV
    18.1.1 keeps its swscale context, threads included, from one call to the next; a DataLoader
    worker forked after the parent converted a frame inherits that context without its threads,
    and hung freeing it."""
    return frame.reformat(format=pix_fmt, **one_thread_options()).to_ndarray()


def write_rgb24(frame: Any, out: torch.Tensor) -> None:
    """Write ``frame`` as rgb24 into ``out``, a C-contiguous uint8 ``(H, W, 3)`` tensor: the
    pixels :func:`to_rgb24` gives, converted in place where that is checked to be exact."""
    height, width = frame.height, frame.width
    if out.shape != (height, width, 3) or out.dtype != torch.uint8 or not out.is_contiguous():
        raise ValueError(
            f"a {width}x{height} frame needs a contiguous uint8 ({height}, {width}, 3) "
            f"destination, not {tuple(out.shape)} {out.dtype}"
        )
    aligned = out.data_ptr() % _ALIGN == 0
    kind = (width, height, frame.format.name, int(frame.colorspace), int(frame.color_range))
    direct = _verdicts.get(kind) if aligned else False
    if direct is None:
        direct = _verdicts[kind] = _check(frame)
    if direct:
        _scale(frame, out.data_ptr())
    else:  # numpy copies on this thread; torch would wake its intra-op pool
        np.copyto(out.numpy(), to_rgb24(frame).numpy())


def _check(frame: Any) -> bool:
    """Whether the direct conversion of ``frame``'s kind equals PyAV's and stays in bounds."""
    if _swscale() is None:
        return False
    size = frame.height * frame.width * 3
    raw = np.full(size + _GUARD + _ALIGN, 0xA5, dtype=np.uint8)
    start = -raw.ctypes.data % _ALIGN
    buffer = raw[start : start + size + _GUARD]
    try:
        _scale(frame, buffer.ctypes.data)
    except (OSError, RuntimeError):
        return False
    expected = to_rgb24(frame).numpy().reshape(-1)
    return bool(np.array_equal(buffer[:size], expected) and (buffer[size:] == 0xA5).all())


def _scale(frame: Any, destination: int) -> None:
    swscale, avutil = _swscale()
    width, height = frame.width, frame.height
    contexts = getattr(_local, "contexts", None)
    if contexts is None:
        contexts = _local.contexts = {}
    key = (width, height, frame.format.name)
    context = contexts.get(key)
    if context is None:
        source_format = avutil.av_get_pix_fmt(frame.format.name.encode())
        rgb24 = avutil.av_get_pix_fmt(b"rgb24")
        bilinear = 2  # SWS_BILINEAR, PyAV's default interpolation
        context = _Context(
            swscale.sws_getContext(
                width, height, source_format, width, height, rgb24, bilinear, None, None, None
            )
        )
        if not context.pointer:
            raise RuntimeError(f"sws_getContext refused a {width}x{height} {frame.format.name}")
        contexts[key] = context
    planes = frame.planes
    sources = (ctypes.c_void_p * 4)(*[p.buffer_ptr for p in planes])
    strides = (ctypes.c_int * 4)(*[p.line_size for p in planes])
    targets = (ctypes.c_void_p * 4)(destination)
    target_strides = (ctypes.c_int * 4)(width * 3)
    rows = swscale.sws_scale(context.pointer, sources, strides, 0, height, targets, target_strides)
    if rows != height:
        raise RuntimeError(f"sws_scale wrote {rows} of {height} rows")


class _Context:
    """An ``SwsContext``, freed with its thread's cache."""

    def __init__(self, pointer: int | None) -> None:
        self.pointer = pointer

    def __del__(self) -> None:
        libraries = _libraries
        if self.pointer and libraries:
            libraries[0].sws_freeContext(self.pointer)


def _swscale() -> tuple[Any, Any] | None:
    """(libswscale, libavutil) as PyAV loaded them, found in ``/proc/self/maps``; None if not."""
    global _libraries
    if _libraries is False:
        _libraries = _load_libraries()
    return _libraries  # type: ignore[return-value]


def _load_libraries() -> tuple[Any, Any] | None:
    import av.video.reformatter  # noqa: F401  (loads PyAV's libswscale and libavutil)

    paths: dict[str, str] = {}
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                name = path.rsplit("/", 1)[-1]
                for lib in ("libswscale", "libavutil"):
                    if name.startswith(lib) and ".so" in name:
                        paths.setdefault(lib, path)
    except OSError:
        return None
    if len(paths) != 2:
        return None
    try:
        swscale, avutil = ctypes.CDLL(paths["libswscale"]), ctypes.CDLL(paths["libavutil"])
        swscale.sws_getContext.restype = ctypes.c_void_p
        swscale.sws_getContext.argtypes = [ctypes.c_int] * 7 + [ctypes.c_void_p] * 3
        swscale.sws_freeContext.restype = None
        swscale.sws_freeContext.argtypes = [ctypes.c_void_p]
        swscale.sws_scale.restype = ctypes.c_int
        swscale.sws_scale.argtypes = (
            [ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_void_p] * 2
        )
        avutil.av_get_pix_fmt.restype = ctypes.c_int
        avutil.av_get_pix_fmt.argtypes = [ctypes.c_char_p]
    except (OSError, AttributeError):
        return None
    return swscale, avutil


@functools.cache
def one_thread_options() -> dict[str, int]:
    """Keywords that make PyAV's ``reformat`` use one swscale thread: ``threads=1`` where its
    signature has ``threads`` (newer PyAV); none in PyAV 15 (LeRobot 0.6.1's), whose swscale
    runs on one thread anyway."""
    from av.video.reformatter import VideoReformatter

    signature = (VideoReformatter.reformat.__doc__ or "").split("\n", 1)[0]
    return {"threads": 1} if "threads=" in signature else {}


def _reformatter():
    """This thread's PyAV reformatter: ``frame.to_ndarray(format=...)`` builds a new swscale
    context per frame, which costs more than the conversion for small frames (same pixels)."""
    reformatter = getattr(_local, "reformatter", None)
    if reformatter is None:
        from av.video.reformatter import VideoReformatter

        reformatter = _local.reformatter = VideoReformatter()
    return reformatter
