"""Camera frames from an episode's in-memory mp4 bytes, as uint8 NCHW tensors.

Strategy: decode once, on admission. The pool draws an episode's frames in random order, so a
decoder kept open and sought per draw would redecode from the previous keyframe for almost
every draw, and a forward-only lazy decoder must keep every frame it passed anyway (the next draw
is as likely behind it as ahead). So the episode's frames are decoded in one sequential pass
(the cheapest way through a GOP-structured stream) when the episode is admitted, in the
prefetch thread pool, and kept as one contiguous uint8 tensor until the episode is evicted;
every draw is then an index. Only the frames a piece needs (its range widened by the
``delta_timestamps`` offsets) are converted to RGB and kept; all frames are decoded so that the
frame count can be checked against the episode length. The decoded bytes count against the
reader's byte budget and in its memory report (``Episode.nbytes``). Measured on a 60-frame
480x640 AV1 episode, one decoder kept open and sought per random draw versus this one pass: 31
vs 13.5 ms per frame at GOP 2 (LeRobot's default), 47.5 vs 7.2 ms at GOP 30; the cost is
memory, 0.9 MB per 480x640 frame while the episode is resident (bounded by ``buffer_size`` and
``byte_budget_gb``).

Pixel values: PyAV converts each frame to rgb24 with swscale's defaults, which is what LeRobot's
pyav backend returns, bit for bit.
"""

from __future__ import annotations

import io

import numpy as np
import torch

from lerobot_shards.format import FormatError

BACKENDS = ("pyav", "torchcodec")


class DecodeError(FormatError):
    """An episode's video does not decode, or holds a different number of frames than expected."""


def decode_frames(
    data: bytes | memoryview,
    *,
    length: int,
    skip_frames: int = 0,
    start: int = 0,
    stop: int | None = None,
    backend: str = "pyav",
    where: str = "video",
) -> torch.Tensor:
    """Frames ``start:stop`` (episode positions) of an episode's mp4, uint8 ``(N, H, W, 3)``.

    Channel-last, as the decoder's rgb24 conversion writes them: a channel-first copy would cost
    a third of the decode time; :meth:`Episode.item` hands out ``permute`` views instead.

    The mp4 holds ``skip_frames`` leading frames to drop and then exactly ``length`` frames of
    the episode; any other count is a :class:`DecodeError` naming ``where``.
    """
    stop = length if stop is None else stop
    if not 0 <= start <= stop <= length:
        raise ValueError(f"{where}: frame range {start}:{stop} outside an episode of {length}")
    if backend == "pyav":
        return _decode_pyav(data, length, skip_frames, start, stop, where)
    if backend == "torchcodec":
        return _decode_torchcodec(data, length, skip_frames, start, stop, where)
    raise ValueError(f"unknown video_backend {backend!r}; expected one of {BACKENDS}")


def check_backend(backend: str) -> None:
    """Fail early (at dataset construction) for an unknown or unavailable backend."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown video_backend {backend!r}; expected one of {BACKENDS}")
    if backend == "torchcodec":
        _torchcodec_decoder()


def _decode_pyav(
    data: bytes | memoryview, length: int, skip: int, start: int, stop: int, where: str
) -> torch.Tensor:
    import av
    from av.video.reformatter import VideoReformatter

    # One reformatter for the stream: frame.to_ndarray(format=...) builds a new swscale
    # context per frame, which costs more than the conversion for small frames (same pixels).
    reformatter = VideoReformatter()
    out: np.ndarray | None = None
    count = 0
    try:
        with av.open(io.BytesIO(data), mode="r", format="mp4") as container:
            stream = container.streams.video[0]
            stream.codec_context.thread_count = 1  # parallelism comes from threads and workers
            for frame in container.decode(stream):
                position = count - skip
                count += 1
                if not start <= position < stop:
                    continue
                rgb = reformatter.reformat(frame, format="rgb24").to_ndarray()
                if out is None:
                    out = np.empty((stop - start, *rgb.shape), dtype=np.uint8)
                out[position - start] = rgb
    except (av.error.FFmpegError, IndexError) as exc:
        raise DecodeError(f"{where}: video does not decode: {exc}") from exc
    _check_count(count - skip, length, where)
    if out is None:  # an empty range
        return torch.empty((0, 0, 0, 3), dtype=torch.uint8)
    return torch.from_numpy(out)


def _torchcodec_decoder():
    try:
        from torchcodec.decoders import VideoDecoder
    except Exception as exc:  # ImportError, or a torchcodec/FFmpeg mismatch at load time
        raise ImportError(
            "video_backend='torchcodec' needs the torchcodec package with a matching FFmpeg "
            f"(pip install 'lerobot-shards[torchcodec]'): {exc}"
        ) from exc
    return VideoDecoder


def _decode_torchcodec(
    data: bytes | memoryview, length: int, skip: int, start: int, stop: int, where: str
) -> torch.Tensor:
    decoder_cls = _torchcodec_decoder()
    try:
        decoder = decoder_cls(bytes(data), dimension_order="NHWC", seek_mode="exact")
        count = decoder.metadata.num_frames
        _check_count(count - skip, length, where)
        if start == stop:
            return torch.empty((0, 0, 0, 3), dtype=torch.uint8)
        return decoder.get_frames_in_range(skip + start, skip + stop).data
    except DecodeError:
        raise
    except (RuntimeError, ValueError) as exc:
        raise DecodeError(f"{where}: video does not decode: {exc}") from exc


def _check_count(frames: int, length: int, where: str) -> None:
    if frames != length:
        raise DecodeError(
            f"{where}: video holds {frames} frames after the skipped ones, "
            f"but the episode has {length}"
        )
