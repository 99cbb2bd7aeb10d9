"""Camera frames from an episode's in-memory mp4 bytes, one GOP at a time, as uint8 HWC tensors.

Why GOP-level random access. The pool draws an episode's frames in random order. A decoder kept
open and sought per draw redecodes from the previous keyframe for almost every draw and pays a
container seek each time; decoding whole episodes on admission decodes each frame once but holds
every decoded frame of every resident episode (0.9 MB per 480x640 frame) and makes the first draw
wait until every resident episode is decoded. So an episode is only *demuxed* on admission
(:class:`Video`: each packet's byte span inside the mp4 already in memory, its timestamp, and
where the keyframes are), and a draw of frame ``k`` decodes just the GOP holding ``k``: from its
keyframe up to the next one, packets fed straight to a codec context (no container, no seek).
The caller (``episode.py``) keeps that GOP's other frames until they are drawn. LeRobot writes
AV1 with GOP 2, so each frame is decoded about once, as in one sequential pass, and the first
sample waits for one GOP instead of whole episodes.

Decoders run one thread each (``thread_count = 1``): parallelism comes from the reader's
threads and the DataLoader workers, and codec threads on top of them oversubscribe the cores. A
codec context is reused between GOPs (``flush_buffers`` resets it; a new one per GOP costs more
than a small GOP's decode), one per thread and stream configuration.

Pixel values: each frame is converted to rgb24 with swscale's defaults (``rgb24.py``), which is
what LeRobot's pyav backend returns, bit for bit; the caller may take the decoded frames as they
are and convert each where it is wanted. A video given a :class:`~.resize.Resize` (a mixture's
target layout) is scaled in that same conversion (``resize.py``). Frames stay channel-last as
swscale writes them; a channel-first copy would cost a third of the decode, and ``permute``
views serve instead. A depth map's frames are its 12-bit codes dequantized in the decoding
thread (``depth.py``), decoded by PyAV whatever the backend, as LeRobot decodes them.

GOPs, open or closed. A frame decodes from the last keyframe before it (in decode order) that
is shown no later than it: with closed GOPs (LeRobot's AV1), its own GOP's keyframe. With open
GOPs (x265's default, LeRobot's depth encoding; x264's ``open-gop``), the frames decoded after a
keyframe but shown before it (its *leading* frames) may reference the GOP before, and decode
from that GOP's keyframe, as they do in LeRobot's decoder, which seeks to a keyframe before the
frame it wants; a decoder that starts at a keyframe never outputs that keyframe's leading
frames right (HEVC drops them, H.264 damages them), and no frame after them references them. So
here a *GOP* is the frames that decode from one keyframe: its own, less its leading frames, plus
the next keyframe's leading frames. Decoding frames of one feeds the decoder from its keyframe to
the last of them in decode order (into the next keyframe's packets, for open GOPs), leaving out
the keyframe's own leading frames, then drains it; every frame decoded on the way is right, and
the caller may keep them.
"""

from __future__ import annotations

import io
import threading
import time
from collections import OrderedDict
from collections.abc import Collection
from typing import Any

import numpy as np
import torch

from lerobot_shards.format import CameraHeader, FormatError, decode_starts
from lerobot_shards.reader.fetch.mapped import release
from lerobot_shards.reader.frames.depth import to_depth
from lerobot_shards.reader.frames.resize import (
    Resize,
    resized_image,
    resized_rgb24,
    scaled,
    write_resized_rgb24,
)
from lerobot_shards.reader.frames.rgb24 import to_rgb24, write_rgb24
from lerobot_shards.trace import COUNTERS
from lerobot_shards.validate import check_stream

BACKENDS = ("pyav", "torchcodec")


class DecodeError(FormatError):
    """An episode's video does not decode, or holds a different number of frames than expected."""


def check_backend(backend: str) -> None:
    """Fail early (at dataset construction) for an unknown or unavailable backend."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown video_backend {backend!r}; expected one of {BACKENDS}")
    if backend == "torchcodec":
        _torchcodec_decoder()


class Video:
    """One camera's mp4 of one episode, demuxed and ready to decode any GOP.

    Holds no decoded frames and no copy of the bytes: ``data`` (a view into the episode's fetched
    bytes) plus a few numbers per packet. The mp4 holds ``skip_frames`` leading frames to drop,
    then exactly ``length`` frames of the episode, then ``tail_frames`` to drop (references of
    the episode's last B-frames); any other count, a frame of the episode with no keyframe it
    decodes from, and a stream of another size, codec or pixel format than its header's
    ``camera`` says, is a :class:`DecodeError` naming ``where``, raised here, on admission.
    ``depth``: a depth map's dequantization table (``lerobot_shards.depth``); its frames are
    then float32 ``(H, W, 1)``, decoded by PyAV whatever ``backend`` says. With ``resize``,
    every frame it gives is resized (``resize.py``).
    """

    def __init__(
        self,
        data: bytes | memoryview,
        *,
        length: int,
        skip_frames: int = 0,
        tail_frames: int = 0,
        camera: CameraHeader | None = None,
        backend: str = "pyav",
        where: str = "video",
        depth: np.ndarray | None = None,
        resize: Resize | None = None,
    ) -> None:
        import av

        if backend not in BACKENDS:
            raise ValueError(f"unknown video_backend {backend!r}; expected one of {BACKENDS}")
        self.data = memoryview(data)
        self.length = length
        self.skip = skip_frames
        self.depth = depth
        self.backend = "pyav" if depth is not None else backend
        self.where = where
        self.resize = resize
        spans, pts, keys = [], [], []
        try:
            with av.open(io.BytesIO(self.data), mode="r", format="mp4") as container:
                stream = container.streams.video[0]
                if stream.codec_context is None:
                    raise DecodeError(f"{where}: video does not decode: no codec")
                if camera is not None:  # before any frame is decoded: no large allocation
                    try:
                        check_stream(stream.codec_context, camera, where)
                    except FormatError as exc:
                        raise DecodeError(str(exc)) from None
                self.codec = stream.codec_context.codec.name
                # one decoded frame as rgb24 (float32 depth): what the frame cache counts it as
                pixels = stream.codec_context.width * stream.codec_context.height
                self.frame_bytes = pixels * (3 if depth is None else 4)
                self.extradata = bytes(stream.codec_context.extradata or b"")
                for packet in container.demux(stream):
                    if packet.size == 0:  # the demuxer's end-of-stream marker
                        continue
                    spans.append((packet.pos, packet.size))
                    pts.append(packet.pts if packet.pts is not None else packet.dts)
                    keys.append(packet.is_keyframe)
        except (av.error.FFmpegError, IndexError) as exc:
            raise DecodeError(f"{where}: video does not decode: {exc}") from exc
        _check_count(len(spans) - skip_frames - tail_frames, length, where)
        # Resized, frames are held scaled (``resize.scaled``), converted where they are drawn:
        # at most the resized rgb24's bytes each.
        if resize is not None:
            self.frame_bytes = resize.height * resize.width * 3
        span_array = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        if span_array.size and (
            span_array.min() < 0 or (span_array[:, 0] + span_array[:, 1]).max() > len(data)
        ):
            raise DecodeError(f"{where}: video does not decode: packets outside the mp4's bytes")
        # Kept as lists: the decode threads look these up per GOP, holding the GIL.
        self._spans = span_array.tolist()
        self._pts = pts
        # Episode position of each packet (decode order): its rank in presentation order;
        # the skipped frames are at negative positions, the tail at ``length`` and beyond.
        rank = np.empty(len(pts), dtype=np.int64)
        rank[np.argsort(np.asarray(pts, dtype=np.int64), kind="stable")] = np.arange(len(pts))
        position = rank - skip_frames
        self._position = position.tolist()
        # Each packet's GOP (the keyframe it decodes from, as a packet index; the module says
        # why), each episode position's, and each GOP's last packet.
        keys[0] = True  # a cut starts at a keyframe
        self._start = decode_starts(pts, keys)
        packet_of = np.argsort(position, kind="stable")[skip_frames : skip_frames + length]
        self._packet_of = packet_of.tolist()
        self._gop_of = [self._start[i] for i in self._packet_of]
        if -1 in self._gop_of:
            p = self._gop_of.index(-1)
            raise DecodeError(
                f"{where}: frame {p} of the episode is shown before every keyframe decoded "
                "before it: it does not decode from this cut"
            )
        self._end: dict[int, int] = {}
        for g, i in zip(self._gop_of, self._packet_of, strict=True):
            self._end[g] = max(self._end.get(g, g), i)
        self._torchcodec = None
        self._torchcodec_lock = threading.Lock()

    def gop_of(self, position: int) -> int:
        """The GOP of episode frame ``position``: the packet index of the keyframe it decodes
        from."""
        if not 0 <= position < self.length:
            raise ValueError(f"{self.where}: frame {position} outside an episode of {self.length}")
        return self._gop_of[position]

    def gop_positions(self, position: int) -> list[int]:
        """The episode positions of the frames that decoding ``position``'s GOP gives right, in
        decode order: the GOP's frames, and with open GOPs the next keyframe's frames decoded
        before the GOP's last (the skipped leading frames and the tail left out)."""
        return self._gop_frames(self.gop_of(position))

    def _gop_frames(self, g: int) -> list[int]:
        """``gop_positions`` of GOP ``g``: frames after its keyframe not shown before it."""
        return [
            p
            for i in range(g, self._end[g] + 1)
            if self._start[i] >= g and 0 <= (p := self._position[i]) < self.length
        ]

    def to_rgb(self, frame: Any) -> torch.Tensor:
        """A frame :meth:`decode` gave unconverted, as the uint8 ``(H, W, 3)`` tensor it would
        have given converted (resized, with a ``resize``)."""
        return to_rgb24(frame) if self.resize is None else resized_rgb24(frame, self.resize)

    def held(self, frame: Any) -> Any:
        """A frame :meth:`decode` gives unconverted: as decoded, or scaled with a ``resize``
        (fewer bytes held, converted by :meth:`to_rgb` or :meth:`write_rgb` all the same)."""
        return frame if self.resize is None else scaled(frame, self.resize)

    def write_rgb(self, frame: Any, out: torch.Tensor) -> None:
        """Write what :meth:`to_rgb` gives for ``frame`` into ``out`` (a batch slot)."""
        if self.resize is None:
            write_rgb24(frame, out)
        else:
            write_resized_rgb24(frame, out, self.resize)

    def decode(self, position: int, keep: Collection[int] = (), rgb: bool = True) -> dict[int, Any]:
        """Frame ``position`` and the frames ``keep`` of its GOP (``gop_positions``), by episode
        position: uint8 ``(H, W, 3)`` tensors, or with ``rgb=False`` and the pyav backend,
        PyAV's frames as decoded (scaled, with a ``resize``: :meth:`held`), for ``rgb24.py`` to
        write where they are wanted; a depth
        map's: float32 ``(H, W, 1)`` in the output unit, whatever ``rgb`` says.

        Decodes from the GOP's keyframe only as far as the wanted frames need (with LeRobot's
        GOP 2, a keyframe alone costs one frame's decode). Safe to call from several threads at
        once (each has its own codec context); the GIL is released while FFmpeg decodes and
        converts, so threads decode in parallel.
        """
        g = self.gop_of(position)
        wanted = {position, *keep}
        outside = wanted - set(self.gop_positions(position))
        if outside:
            raise ValueError(
                f"{self.where}: frames {sorted(outside)} are not of frame {position}'s GOP"
            )
        started = time.perf_counter()
        if self.backend == "torchcodec":
            frames = self._decode_torchcodec(g)
            frames = {p: frames[p] for p in wanted}
        else:
            frames = self._decode_pyav(g, wanted, rgb)
        COUNTERS.add("decode_s", time.perf_counter() - started)
        COUNTERS.add("frames_decoded", len(frames))
        return frames

    def _decode_pyav(self, first: int, wanted: set[int], rgb: bool) -> dict[int, Any]:
        import av

        context = _codec_context(self.codec, self.extradata)
        # past the last wanted frame's packet, draining the decoder gives the rest
        stop = max(self._packet_of[p] for p in wanted) + 1
        # the keyframe's own leading frames are not fed: from it they decode damaged (H.264) or
        # not at all (HEVC), and no frame after them references them
        position_of = {self._pts[i]: self._position[i] for i in range(first, stop)}
        frames: dict[int, Any] = {}

        def collect(decoded: list) -> None:
            for frame in decoded:
                p = position_of.get(frame.pts)
                if p in wanted:
                    if self.depth is not None:
                        frames[p] = to_depth(frame, self.depth)
                    else:
                        frames[p] = self.to_rgb(frame) if rgb else self.held(frame)

        fed, packets = first, 0
        try:
            for fed in range(first, stop):
                if self._start[fed] < first:
                    continue
                packets += 1
                offset, size = self._spans[fed]
                packet = av.Packet(self.data[offset : offset + size])
                packet.pts = packet.dts = self._pts[fed]
                collect(context.decode(packet))
                if len(frames) == len(wanted):
                    break
            else:  # a decoder with delay: drain it
                collect(context.decode(None))
        except av.error.FFmpegError as exc:
            raise DecodeError(f"{self.where}: video does not decode: {exc}") from exc
        finally:
            context.flush_buffers()
            COUNTERS.add("packets_decoded", packets)
            spans = self._spans[first : fed + 1]  # the packets were copied: give their pages back
            release(self.data, min(o for o, _ in spans), max(o + n for o, n in spans))
        if len(frames) != len(wanted):
            missing = sorted(wanted - frames.keys())
            raise DecodeError(
                f"{self.where}: decoding packets {first}..{fed} from their keyframe did not "
                f"give frames {missing}"
            )
        return frames

    def _decode_torchcodec(self, first: int) -> dict[int, torch.Tensor]:
        positions = sorted(self._gop_frames(first))
        if not positions:
            return {}
        # frames by index in presentation order; from the GOP's earliest packet shown, its
        # keyframe's leading frames included: torchcodec then seeks to a keyframe before them,
        # and decodes the keyframe's leading frames, whose absence (a decoder starting at the
        # keyframe drops them) it does not expect
        lo = min(self._position[first : self._end[first] + 1]) + self.skip
        hi = positions[-1] + self.skip + 1
        with self._torchcodec_lock:  # one decoder per video, used by one thread at a time
            if self._torchcodec is None:
                try:
                    self._torchcodec = _torchcodec_decoder()(
                        bytes(self.data), dimension_order="NHWC", seek_mode="exact"
                    )
                except (RuntimeError, ValueError) as exc:
                    raise DecodeError(f"{self.where}: video does not decode: {exc}") from exc
            COUNTERS.add("packets_decoded", hi - lo)  # at least these
            try:
                batch = self._torchcodec.get_frames_in_range(lo, hi).data
            except (RuntimeError, ValueError) as exc:
                raise DecodeError(f"{self.where}: video does not decode: {exc}") from exc
        frames = {p: batch[p + self.skip - lo] for p in positions}
        if self.resize is not None:
            for p, frame in frames.items():
                frames[p] = torch.from_numpy(resized_image(frame.numpy(), self.resize))
        return frames


_local = threading.local()
_MAX_CONTEXTS = 8


def _codec_context(codec: str, extradata: bytes):
    """This thread's open decoder for a stream configuration (one thread, reused between GOPs)."""
    import av

    contexts = getattr(_local, "contexts", None)
    if contexts is None:
        contexts = _local.contexts = OrderedDict()
    key = (codec, extradata)
    context = contexts.get(key)
    if context is None:
        context = av.CodecContext.create(codec, "r")
        if extradata:
            context.extradata = extradata
        context.thread_count = 1
        contexts[key] = context
        if len(contexts) > _MAX_CONTEXTS:
            contexts.popitem(last=False)
    contexts.move_to_end(key)
    return context


def _torchcodec_decoder():
    try:
        from torchcodec.decoders import VideoDecoder
    except Exception as exc:  # ImportError, or a torchcodec/FFmpeg mismatch at load time
        raise ImportError(
            "video_backend='torchcodec' needs the torchcodec package with a matching FFmpeg "
            f"(pip install 'lerobot-shards[torchcodec]'): {exc}"
        ) from exc
    return VideoDecoder


def _check_count(frames: int, length: int, where: str) -> None:
    if frames != length:
        raise DecodeError(
            f"{where}: video holds {frames} frames after the skipped ones, "
            f"but the episode has {length}"
        )
