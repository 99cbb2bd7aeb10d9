"""Cut one camera's episode out of a (multi-episode) source mp4 by stream copy.

Packets are remuxed as they are, never decoded and re-encoded, so a decoder gets bit-identical
frames. The episode's frames are found by their real presentation timestamps: LeRobot's
``from_timestamp`` is a running float sum, so the nearest packet within ``tolerance_s`` wins.

Where a cut starts. Each frame decodes from the last keyframe before it (in decode order) that
is shown no later than it: its GOP's keyframe where GOPs are closed (LeRobot's AV1); with open
GOPs (x265's default, LeRobot's depth encoding; x264's ``open-gop``), a frame decoded after a
keyframe but shown before it references the GOP before and decodes from that GOP's keyframe, as
in LeRobot's decoder. A cut starts at the earliest keyframe one of its frames decodes from; the
frames before the episode in it are dropped at read (``skip_frames``), so no frame of another
episode is ever served, and the reader decodes each frame from the same keyframe
(``reader/frames/decode.py``). LeRobot encodes each episode on its own, so its episodes start at
a keyframe and their cuts hold no other frame, open GOPs or not. The first keyframe's own leading
frames (shown before it, decoded after it) are left out of the cut: they do not decode from it,
and no frame after them references them, so every frame of a cut decodes.

What a cut checks (``_check_cut``): the written mp4 holds exactly the episode's frames, its
first packets parse (FFmpeg probes them when opening it), and, with ``decode_check``, its
first frame (the keyframe it starts at) decodes, which catches a source whose codec parameters
or first keyframes are damaged. That decode is off by default: it cost about 45% of the
per-episode time on 480x640 AV1 (``docs/converter.md``) and catches damage in one frame of
each cut only. A stream copy passes the source's bytes through unchanged, so the shards decode
exactly as the source does; damage to a source that still demuxes and parses is found by
``lerobot-shards verify --deep``, which decodes every frame. A source that cannot
be opened or demuxed fails naming the episode, the camera and the file.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import BinaryIO

import av

from lerobot_shards.format import CameraHeader, decode_starts
from lerobot_shards.validate import check_stream

DEFAULT_TOLERANCE_S = 1e-4
"""LeRobot's own default tolerance between a query timestamp and a frame timestamp."""

_SEEK_MARGINS_S = (0.0, 1.0, 10.0, None)
"""How far before the episode to seek; ``None`` means the start of the file."""


IO_BUFFER = 1 << 20
"""Bytes per read/write call between FFmpeg and Python file objects (its default is 32 KB)."""


class CutError(ValueError):
    """An episode's frames cannot be cut exactly out of a source video."""


@dataclass
class Cut:
    data: bytes
    """The episode's mp4, timestamps starting at 0."""
    camera: CameraHeader


@dataclass
class _Pkt:
    packet: av.Packet
    pts: int
    dts: int
    key: bool


def cut_episode(
    file: str | BinaryIO,
    *,
    from_timestamp: float,
    timestamps: list[float],
    fps: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    where: str = "video",
) -> Cut:
    """Stream-copy the frames at ``from_timestamp + timestamps[k]`` into a new mp4.

    ``file`` is a local path or a seekable binary file (any fsspec file); only the episode's
    region and the index are read. See :meth:`SourceVideo.cut`.
    """
    with SourceVideo(file, where) as video:
        return video.cut(
            from_timestamp=from_timestamp,
            timestamps=timestamps,
            fps=fps,
            tolerance_s=tolerance_s,
            where=where,
        )


class SourceVideo:
    """A source mp4 opened once and cut episode after episode.

    Opening parses the file's index, which covers every episode in it (hundreds in a LeRobot
    v3.0 file): a worker that keeps the file open pays that once, not once per episode. Every
    cut seeks afresh, so a cut's bytes do not depend on which cuts came before it.
    """

    def __init__(self, file: str | BinaryIO, where: str = "video") -> None:
        try:
            self.container = av.open(file, mode="r", buffer_size=IO_BUFFER)
        except av.error.FFmpegError as exc:
            raise _damaged(where, "cannot be opened", exc) from exc
        if not self.container.streams.video:
            self.container.close()
            raise CutError(f"{where}: no video stream (the file is damaged or not a video)")
        self.stream = self.container.streams.video[0]
        if self.stream.time_base is None:
            self.container.close()
            raise CutError(f"{where}: video stream has no time base")

    def cut(
        self,
        *,
        from_timestamp: float,
        timestamps: list[float],
        fps: float,
        tolerance_s: float = DEFAULT_TOLERANCE_S,
        where: str = "video",
        decode_check: bool = False,
    ) -> Cut:
        """Stream-copy the frames at ``from_timestamp + timestamps[k]`` into a new mp4.

        If the first frame is not a keyframe, the cut starts at the keyframe before it (with
        open GOPs, the earliest keyframe one of its frames decodes from: the module says why)
        and the header's ``skip_frames`` says how many leading frames to drop. The cut ends at the
        episode's last frame in decode order: with B-frames, frames shown after the episode
        that its last frames reference come before them, and ``tail_frames`` says how many to
        drop at the end. ``where`` names the episode and camera in errors; ``decode_check``:
        decode the cut's first frame.
        """
        if not timestamps:
            raise CutError(f"{where}: episode has no frames")
        container, stream = self.container, self.stream
        tb = float(stream.time_base)  # seconds per tick; floats are exact enough and fast
        first_s = from_timestamp + timestamps[0]
        last_s = from_timestamp + timestamps[-1]
        try:
            for margin in _SEEK_MARGINS_S:
                pkts = _demux_span(container, stream, first_s, last_s, margin, tolerance_s)
                early = bool(pkts) and min(p.pts for p in pkts) * tb <= first_s + tolerance_s
                if not early and margin is not None:
                    continue  # the seek landed past the episode's start (open GOPs)
                if not pkts:
                    break
                starts = decode_starts([p.pts for p in pkts], [p.key for p in pkts])
                picked, start, end = _locate(
                    pkts, starts, from_timestamp, timestamps, tb, tolerance_s, where
                )
                if start is not None or margin is None:
                    break
        except av.error.FFmpegError as exc:
            raise _damaged(where, f"cannot be read around {first_s:.3f}s", exc) from exc
        if not pkts:
            raise CutError(f"{where}: no frames at or after {first_s:.6f}s")
        if start is None:
            raise CutError(
                f"{where}: no keyframe before the episode start {first_s:.6f}s that its frames "
                "decode from"
            )
        # the keyframe's own leading frames do not decode from it, and nothing after them
        # references them: left out, so that every frame of the cut decodes
        span = [pkts[i] for i in range(start, end) if starts[i] >= start]
        first_pts = picked[0].pts
        last_pts = picked[-1].pts
        skip = sum(1 for p in span if p.pts < first_pts)
        trailing = sum(1 for p in span if p.pts > last_pts)
        if len(span) != len(timestamps) + skip + trailing:
            raise CutError(
                f"{where}: the cut holds {len(span)} frames ({skip} leading, {trailing} after "
                f"the episode), expected {len(timestamps)} of the episode between them"
            )
        data = _remux(stream, span)
        cc = stream.codec_context
        camera = CameraHeader(
            codec=cc.codec.canonical_name,
            width=cc.width,
            height=cc.height,
            pix_fmt=cc.pix_fmt or "",
            fps=float(fps),
            frames=len(span),
            skip_frames=skip,
            tail_frames=trailing,
        )
        _check_cut(data, camera, where, decode_check)
        return Cut(data=data, camera=camera)

    def close(self) -> None:
        self.container.close()

    def __enter__(self) -> SourceVideo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _demux_span(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    first_s: float,
    last_s: float,
    margin: float | None,
    tolerance_s: float,
) -> list[_Pkt]:
    """Packets in decode order from a keyframe at or before ``first_s - margin`` to the episode end.

    Decode order ends the span: once a packet's dts is past the last frame, no later packet can
    be shown inside the episode, nor be a reference for one of its frames.
    """
    tb = float(stream.time_base)
    if margin is None:
        container.seek(0, stream=stream, backward=True, any_frame=False)
    else:
        target = max(0.0, first_s - margin)
        container.seek(int(target / tb), stream=stream, backward=True, any_frame=False)
    stop = last_s + tolerance_s
    pkts: list[_Pkt] = []
    for packet in container.demux(stream):
        if packet.pts is None or packet.size == 0:
            continue
        dts = packet.dts if packet.dts is not None else packet.pts
        if dts * tb > stop:
            break
        if not pkts and not packet.is_keyframe:
            continue
        pkts.append(_Pkt(packet, packet.pts, dts, bool(packet.is_keyframe)))
    return pkts


def _locate(
    pkts: list[_Pkt],
    starts: list[int],
    from_timestamp: float,
    timestamps: list[float],
    tb: float,
    tolerance_s: float,
    where: str,
) -> tuple[list[_Pkt], int | None, int]:
    """The episode's packets (in pts order) and the decode-order span [start, end) to copy
    (``starts``: each packet's keyframe, ``format.decode_starts``); ``start`` None: the demuxed
    packets begin too late to hold a keyframe every frame of the episode decodes from (demux
    from further back)."""
    by_pts = sorted(range(len(pkts)), key=lambda i: pkts[i].pts)
    first_s = from_timestamp + timestamps[0]
    i0 = min(range(len(by_pts)), key=lambda k: abs(pkts[by_pts[k]].pts * tb - first_s))
    first = pkts[by_pts[i0]]
    if abs(first.pts * tb - first_s) > tolerance_s:
        raise CutError(
            f"{where}: no frame within {tolerance_s}s of the episode start {first_s:.6f}s "
            f"(nearest at {first.pts * tb:.6f}s)"
        )
    chosen = by_pts[i0 : i0 + len(timestamps)]
    if len(chosen) < len(timestamps):
        raise CutError(
            f"{where}: the video holds {len(chosen)} frames from {first_s:.6f}s, "
            f"the episode has {len(timestamps)}"
        )
    for k, i in enumerate(chosen):
        got = (pkts[i].pts - first.pts) * tb
        want = timestamps[k] - timestamps[0]
        if abs(got - want) > tolerance_s:
            raise CutError(
                f"{where}: frame {k} is at {got:.6f}s into the episode, its row's timestamp "
                f"says {want:.6f}s (tolerance {tolerance_s}s)"
            )
    keyframes = [starts[i] for i in chosen]
    start = None if -1 in keyframes else min(keyframes)
    return [pkts[i] for i in chosen], start, max(chosen) + 1


def _remux(stream: av.video.stream.VideoStream, span: list[_Pkt]) -> bytes:
    """Write the packets to a new mp4, pts and dts shifted so the first frame shows at 0."""
    base = min(p.pts for p in span)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4", buffer_size=IO_BUFFER) as out:
        ostream = out.add_stream_from_template(stream, opaque=True)
        ostream.time_base = stream.time_base
        for p in span:
            packet = p.packet
            packet.pts = p.pts - base
            packet.dts = p.dts - base
            packet.stream = ostream
            out.mux(packet)
    return buf.getvalue()


def _check_cut(data: bytes, camera: CameraHeader, where: str, decode: bool) -> None:
    """Re-read the cut's sample table: it must hold the frames the header says; and if
    ``decode``, decode its first frame (the keyframe it starts at, on one thread: no decoder
    thread pool to start)."""
    try:
        container = av.open(io.BytesIO(data), mode="r", format="mp4")
    except av.error.FFmpegError as exc:  # opening parses the first packets
        raise _damaged(where, "holds frames that cannot be read back", exc) from exc
    with container:
        stream = container.streams.video[0]
        if stream.frames != camera.frames:
            raise CutError(
                f"{where}: the written mp4 holds {stream.frames} frames, expected {camera.frames}"
            )
        check_stream(stream.codec_context, camera, where)  # as the reader demuxes it
        if not decode:
            return
        stream.thread_count = 1
        try:
            first = next(container.decode(stream), None)
        except av.error.FFmpegError as exc:
            raise _damaged(where, "has a first frame that does not decode", exc) from exc
    if first is None:
        raise CutError(f"{where}: the source video is damaged: the episode's frames do not decode")


def _damaged(where: str, what: str, exc: av.error.FFmpegError) -> CutError:
    """The error of a source video FFmpeg cannot read (its own message names no file)."""
    return CutError(
        f"{where}: the source video is damaged or not a video: it {what} ({exc.strerror or exc})"
    )
