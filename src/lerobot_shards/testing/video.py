"""Episode video the way LeRobot 0.6.1 writes it: encode one episode, then stream-copy append.

Each episode is encoded on its own (libsvtav1, yuv420p, GOP 2, crf 30, preset 12) to an mp4;
LeRobot then moves it into place as a new file or concatenates it onto the camera's current file
without re-encoding. Appending here remuxes the packets with their timestamps shifted by the
current file's duration, so the decoded pixels of an episode are identical wherever it lands.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

CODEC = "libsvtav1"
PIX_FMT = "yuv420p"
GOP = 2
CRF = 30
PRESET = 12
MIN_WIDTH = 32
"""The SVT-AV1 in PyAV 15's wheels (LeRobot 0.6.1's) kills the process (SIGFPE) on frames
narrower than this."""

# SVT-AV1 prints a banner per encoder to stderr unless told otherwise (1 = errors only).
os.environ.setdefault("SVT_LOG", "1")


def encode_episode(frames: Iterable[np.ndarray], path: Path, fps: int) -> None:
    """Encode HWC uint8 RGB frames to an AV1 mp4 at ``path`` with LeRobot's default settings."""
    options = {"g": str(GOP), "crf": str(CRF), "preset": str(PRESET)}
    with av.open(str(path), "w") as out:
        stream = out.add_stream(CODEC, rate=fps, options=options)
        stream.pix_fmt = PIX_FMT
        count = 0
        for image in frames:
            if count == 0:
                if image.shape[1] < MIN_WIDTH:
                    raise ValueError(
                        f"{path}: frames {image.shape[1]} pixels wide are too narrow to encode; "
                        f"use at least {MIN_WIDTH}"
                    )
                stream.height, stream.width = image.shape[:2]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            out.mux(stream.encode(frame))
            count += 1
        if count == 0:
            raise ValueError(f"no frames to encode into {path}")
        out.mux(stream.encode(None))


def duration_s(path: Path) -> float:
    """The video stream's duration in seconds, as LeRobot measures it for ``to_timestamp``."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration / av.time_base)


def append_stream_copy(dest: Path, episode: Path) -> None:
    """Append ``episode``'s packets to the mp4 ``dest`` by remuxing (no decode, no re-encode).

    The result is written next to ``dest`` and renamed over it, so a crash leaves ``dest`` whole.
    """
    tmp = dest.with_name(dest.name + ".tmp.mp4")
    with (
        av.open(str(dest)) as first,
        av.open(str(episode)) as second,
        av.open(str(tmp), "w") as out,
    ):
        in_first = first.streams.video[0]
        in_second = second.streams.video[0]
        if in_first.codec_context.name != in_second.codec_context.name or (
            in_first.width,
            in_first.height,
        ) != (in_second.width, in_second.height):
            raise ValueError(f"cannot stream-copy {episode} onto {dest}: codec or size differ")
        stream = out.add_stream_from_template(in_first, opaque=True)
        end = Fraction(0)
        for container, source in ((first, in_first), (second, in_second)):
            offset = end
            for packet in container.demux(source):
                if packet.pts is None:  # the demuxer's final empty flush packet
                    continue
                tb = packet.time_base
                shift = round(offset / tb)
                packet.pts += shift
                if packet.dts is not None:
                    packet.dts += shift
                end = max(end, (packet.pts + (packet.duration or 0)) * tb)
                packet.stream = stream
                out.mux(packet)
    os.replace(tmp, dest)
