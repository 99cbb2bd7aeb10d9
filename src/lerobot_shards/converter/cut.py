"""Cut one camera's episode out of a (multi-episode) source mp4 by stream copy.

Packets are remuxed as they are, never decoded and re-encoded, so a decoder gets bit-identical
frames. The episode's frames are found by their real presentation timestamps: LeRobot's
``from_timestamp`` is a running float sum, so the nearest packet within ``tolerance_s`` wins.

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

from lerobot_shards.format import CameraHeader
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

        If the first frame is not a keyframe, the cut starts at the keyframe before it and the
        header's ``skip_frames`` says how many leading frames to drop. The cut ends at the
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
                if pkts and (margin is None or _covers(pkts, first_s, tb, tolerance_s)):
                    break
        except av.error.FFmpegError as exc:
            raise _damaged(where, f"cannot be read around {first_s:.3f}s", exc) from exc
        picked, start, end = _locate(pkts, from_timestamp, timestamps, tb, tolerance_s, where)
        span = pkts[start:end]
        first_pts = picked[0].pts
        last_pts = picked[-1].pts
        skip = sum(1 for p in span if p.pts < first_pts)
        trailing = sum(1 for p in span if p.pts > last_pts)
        if len(span) != len(timestamps) + skip + trailing:
            raise CutError(
                f"{where}: the cut holds {len(span)} frames ({skip} leading, {trailing} after "
                f"the episode), expected {len(timestamps)} of the episode between them"
            )
        _check_closed_gops(span, tb, where)
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


def _covers(pkts: list[_Pkt], first_s: float, tb: float, tolerance_s: float) -> bool:
    """Whether the span starts early enough to hold the episode's first frame and its keyframe."""
    return min(p.pts for p in pkts) * tb <= first_s + tolerance_s and pkts[0].key


def _locate(
    pkts: list[_Pkt],
    from_timestamp: float,
    timestamps: list[float],
    tb: float,
    tolerance_s: float,
    where: str,
) -> tuple[list[_Pkt], int, int]:
    """The episode's packets (in pts order) and the decode-order span [start, end) to copy."""
    if not pkts:
        raise CutError(f"{where}: no frames at or after {from_timestamp + timestamps[0]:.6f}s")
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
    first_decoded = min(chosen)
    start = max((i for i in range(first_decoded + 1) if pkts[i].key), default=None)
    if start is None:
        raise CutError(f"{where}: no keyframe at or before the episode start {first_s:.6f}s")
    return [pkts[i] for i in chosen], start, max(chosen) + 1


def _check_closed_gops(span: list[_Pkt], tb: float, where: str) -> None:
    """Refuse open GOPs: a frame decoded after a keyframe but shown before it references the GOP
    before, and the reader decodes each GOP from its own keyframe (``reader/frames/decode.py``)."""
    key_pts = span[0].pts
    for p in span:
        if p.key:
            key_pts = p.pts
        elif p.pts < key_pts:
            raise CutError(
                f"{where}: open GOP: the frame at {p.pts * tb:.6f}s is decoded after the keyframe "
                f"at {key_pts * tb:.6f}s but shown before it; lerobot-shards needs closed GOPs "
                "(re-encode with them, e.g. libx264's open-gop=0, LeRobot's default libsvtav1)"
            )


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
