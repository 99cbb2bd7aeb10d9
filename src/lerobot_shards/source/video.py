"""Frames of a video file located by timestamp, as LeRobot locates them, with open decoders kept.

LeRobot's ``pyav`` path (torchvision's VideoReader) seeks to the keyframe at or before the first
query timestamp, decodes forward to the last, converts to rgb24 and picks, for each query, the
decoded frame with the nearest timestamp; it fails if that frame is not within ``tolerance_s``.
Seeking to the keyframe and decoding forward gives the same pixels as decoding from any earlier
keyframe, so a decoder that stays open and keeps decoding forward returns the same frames while
skipping the re-open and re-seek for every item. Frames are located by their actual packet
timestamps, so a small drift of v3.0's ``from_timestamp`` (an accumulated float sum) is tolerated
up to ``tolerance_s`` and anything beyond it is an error naming file, episode and camera.

Depth maps (LeRobot decodes them with PyAV whatever the backend) come as their ``gray12le``
codes, PyAV's ``to_ndarray`` as LeRobot takes them, looked up in the feature's dequantization
table (``lerobot_shards.depth``).

Open GOPs: FFmpeg's mp4 seek finds keyframes by decode time, so for a frame decoded after a
keyframe but shown before it (x264's ``open-gop`` puts some two frames early), it can land on
that keyframe, and a decoder starting there never outputs the frame: LeRobot 0.6.1 then fails
the item (``FrameTimestampError``). Here a seek that lands past the frame it was for seeks again
from further back, and returns the frame a decoder running through gives.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, BinaryIO

import av
import numpy as np
import torch

from lerobot_shards.reader.frames.rgb24 import converted
from lerobot_shards.source.layout import Source, SourceError

VIDEO_BACKENDS = ("pyav", "torchcodec")
TORCHCODEC_INSTALL_HINT = (
    "install it with `pip install lerobot-shards[torchcodec]` (it needs a torchcodec build that "
    "matches your torch version and FFmpeg libraries on the system), or use video_backend='pyav'"
)


class FrameNotFoundError(SourceError):
    """A queried timestamp has no decoded frame within tolerance."""


def _nearest(queries: np.ndarray, times: np.ndarray, tolerance_s: float, where: str) -> np.ndarray:
    """Index into ``times`` of the nearest frame per query; FrameNotFoundError beyond tolerance."""
    if len(times) == 0:
        raise FrameNotFoundError(f"{where}: no frame decoded for timestamps {queries.tolist()}")
    dist = np.abs(queries[:, None] - times[None, :])
    idx = dist.argmin(axis=1)
    best = dist[np.arange(len(queries)), idx]
    bad = best >= tolerance_s
    if bad.any():
        raise FrameNotFoundError(
            f"{where}: no frame within tolerance_s={tolerance_s} of timestamps "
            f"{queries[bad].tolist()} (nearest decoded frames at {times[idx[bad]].tolist()}; "
            f"decoded span {times.min():.6f}..{times.max():.6f} s). The video may hold fewer "
            f"frames than the episode, or its timestamps drift from the episode table."
        )
    return idx


_SEEK_MARGINS_S = (1.0, 10.0, None)
"""How far before a frame to seek again when a seek landed past it; ``None``: the file's start."""


class PyAVDecoder:
    """One open video file decoded forward on demand (the ``pyav`` backend).

    A request that starts at most ``max_forward_s`` past the last decoded frame (and not before
    the oldest kept one) is served by decoding forward; any other seeks first, like LeRobot.
    """

    def __init__(self, file: str | BinaryIO, name: str, max_forward_s: float = 2.0) -> None:
        self.name = name
        self.max_forward_s = max_forward_s
        self._file = file
        try:
            self._container = av.open(file)
        except (av.error.FFmpegError, OSError) as exc:
            _close_file(file)
            raise SourceError(f"{name}: cannot open as a video: {exc}") from exc
        if not self._container.streams.video:
            raise SourceError(f"{name}: has no video stream")
        self._stream = self._container.streams.video[0]
        self._time_base = self._stream.time_base
        start = self._stream.start_time
        self._start_s = float(start * self._time_base) if start is not None else 0.0
        self.frames_decoded = 0
        """Frames decoded so far (each costs decode time; a forward read decodes each once)."""
        self._buffer: list[tuple[float, av.VideoFrame]] = []
        self._frames = self._container.decode(self._stream)
        self._at_start = True  # no frame precedes the buffer
        self._eof = False

    def frames_at(
        self,
        timestamps: Sequence[float],
        tolerance_s: float,
        where: str,
        depth: np.ndarray | None = None,
    ) -> torch.Tensor:
        """uint8 NCHW rgb24 frames nearest to ``timestamps`` (seconds in this file); with
        ``depth`` (a depth map's dequantization table), float32 ``(N, 1, H, W)`` depth."""
        queries = np.asarray(timestamps, dtype=np.float64)
        first, last = float(queries.min()), float(queries.max())
        if not self._usable(first):
            self._seek(first)
            for margin in _SEEK_MARGINS_S:  # open GOPs: a seek may land past `first`
                self._decode_until(first, where)
                if not self._buffer or self._buffer[0][0] < first + tolerance_s:
                    break
                self._seek(0.0 if margin is None else max(first - margin, 0.0))
        self._decode_until(last, where)
        times = np.array([t for t, _ in self._buffer])
        idx = _nearest(queries, times, tolerance_s, f"{self.name} ({where})")
        if depth is None:
            frames = [converted(self._buffer[i][1], "rgb24") for i in idx]
            out = torch.stack([torch.from_numpy(f).permute(2, 0, 1) for f in frames])
        else:  # LeRobot's codes: PyAV's gray12le (H, W) uint16
            codes = [converted(self._buffer[i][1], "gray12le") for i in idx]
            out = torch.stack([torch.from_numpy(np.take(depth, c))[None] for c in codes])
        # Keep from the last frame at or before `first`: the next item usually starts there.
        keep = max(int(np.searchsorted(times, first, side="right")) - 1, 0)
        del self._buffer[:keep]
        self._at_start = self._at_start and keep == 0
        return out

    def _usable(self, first: float) -> bool:
        """Can the buffer plus forward decoding answer a request starting at ``first``?"""
        if not self._buffer:
            return self._at_start and not self._eof and first - self._start_s <= self.max_forward_s
        start_ok = self._at_start or self._buffer[0][0] <= first
        return start_ok and first - self._buffer[-1][0] <= self.max_forward_s

    def _seek(self, t: float) -> None:
        offset = max(int(t / self._time_base), 0)
        try:
            self._container.seek(offset, stream=self._stream, backward=True, any_frame=False)
        except av.error.FFmpegError as exc:
            raise SourceError(f"{self.name}: cannot seek to {t:.6f} s: {exc}") from exc
        self._buffer.clear()
        self._frames = self._container.decode(self._stream)
        self._at_start = False
        self._eof = False

    def _decode_until(self, last: float, where: str) -> None:
        while not self._eof and (not self._buffer or self._buffer[-1][0] < last):
            try:
                frame = next(self._frames)
            except StopIteration:
                self._eof = True
                break
            except av.error.FFmpegError as exc:
                raise SourceError(f"{self.name} ({where}): cannot decode: {exc}") from exc
            self.frames_decoded += 1
            if frame.pts is None:
                raise SourceError(f"{self.name} ({where}): a decoded frame has no timestamp")
            self._buffer.append((float(frame.pts * self._time_base), frame))

    def close(self) -> None:
        self._buffer.clear()
        self._container.close()
        _close_file(self._file)


class TorchCodecDecoder:
    """One open video file decoded by torchcodec, frames indexed like LeRobot's torchcodec path."""

    def __init__(self, file: str | BinaryIO, name: str) -> None:
        decoders = import_torchcodec()
        self.name = name
        self._file = file
        try:
            self._decoder = decoders.VideoDecoder(file, seek_mode="approximate")
        except (RuntimeError, ValueError) as exc:
            _close_file(file)
            raise SourceError(f"{name}: cannot open as a video: {exc}") from exc
        meta = self._decoder.metadata
        self._fps = float(meta.average_fps)
        self._num_frames = int(meta.num_frames)

    def frames_at(
        self,
        timestamps: Sequence[float],
        tolerance_s: float,
        where: str,
        depth: np.ndarray | None = None,
    ) -> torch.Tensor:
        if depth is not None:
            raise ValueError(f"{self.name}: depth maps decode with PyAV, as LeRobot's do")
        queries = np.asarray(timestamps, dtype=np.float64)
        indices = np.clip(np.round(queries * self._fps).astype(np.int64), 0, self._num_frames - 1)
        try:
            batch = self._decoder.get_frames_at(indices=indices.tolist())
        except (RuntimeError, IndexError) as exc:
            raise SourceError(f"{self.name} ({where}): cannot decode frames: {exc}") from exc
        times = batch.pts_seconds.to(torch.float64).numpy()
        idx = _nearest(queries, times, tolerance_s, f"{self.name} ({where})")
        return batch.data[torch.from_numpy(idx)]

    def close(self) -> None:
        del self._decoder
        _close_file(self._file)


def _close_file(file: str | BinaryIO) -> None:
    if not isinstance(file, str):
        file.close()


def import_torchcodec() -> Any:
    """``torchcodec.decoders``, or an ImportError that says how to get it."""
    try:
        from torchcodec import decoders
    except (ImportError, OSError, RuntimeError) as exc:
        raise ImportError(
            f"video_backend='torchcodec' needs torchcodec, which does not import here ({exc}); "
            + TORCHCODEC_INSTALL_HINT
        ) from exc
    return decoders


Decoder = PyAVDecoder | TorchCodecDecoder

_INHERITED: list[Decoder] = []
"""Decoders a forked process inherited: kept alive, never used, never closed."""


class DecoderCache:
    """A few open decoders per process, by video file: least recently used is closed first.

    Decoders never cross a fork: a process that finds the cache was filled by another (a
    DataLoader worker after fork) starts an empty one. Pickling (spawned workers) drops them.
    """

    def __init__(self, source: Source, backend: str = "pyav", max_open: int = 8) -> None:
        if backend not in VIDEO_BACKENDS:
            raise ValueError(f"video_backend must be one of {VIDEO_BACKENDS}, not {backend!r}")
        if backend == "torchcodec":
            import_torchcodec()
        self.source = source
        self.backend = backend
        self.max_open = max_open
        self._pid = os.getpid()
        self._open: OrderedDict[tuple[str, str], Decoder] = OrderedDict()

    def get(self, relative: str, backend: str | None = None) -> Decoder:
        """The open decoder of a video file (relative to the source root), opening it if
        needed; ``backend`` overrides the cache's (depth maps decode with PyAV)."""
        if self._pid != os.getpid():
            # Never close or free a decoder inherited through fork: its codec threads live only
            # in the parent, and joining them here would hang. Keep them referenced instead.
            _INHERITED.extend(self._open.values())
            self._open = OrderedDict()
            self._pid = os.getpid()
        key = (relative, backend or self.backend)
        decoder = self._open.get(key)
        if decoder is None:
            decoder = self._new(*key)
            self._open[key] = decoder
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)[1].close()
        self._open.move_to_end(key)
        return decoder

    def _new(self, relative: str, backend: str) -> Decoder:
        name = self.source.path(relative)
        local = self.source.local_path(relative)
        if local is not None and not os.path.exists(local):
            raise FileNotFoundError(name)
        try:
            file = local if local is not None else self.source.open(relative)
        except FileNotFoundError:
            raise FileNotFoundError(name) from None
        if backend == "torchcodec":
            return TorchCodecDecoder(file, name)
        return PyAVDecoder(file, name)

    def close(self) -> None:
        if self._pid == os.getpid():
            for decoder in self._open.values():
                decoder.close()
        else:
            _INHERITED.extend(self._open.values())
        self._open = OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = OrderedDict()
        return state
