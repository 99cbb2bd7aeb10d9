"""Episode video the way LeRobot 0.6.1 writes it: encode one episode, then stream-copy append.

Each episode is encoded on its own (libsvtav1, yuv420p, GOP 2, crf 30, preset 12) to an mp4;
LeRobot then moves it into place as a new file or concatenates it onto the camera's current file
without re-encoding (``concatenate``, which its ``aggregate_datasets`` uses on whole files too),
so the decoded pixels of an episode are identical wherever it lands.

Other :class:`Encoder` settings (a long GOP, B-frames) serve tests of what LeRobot does not write
itself but datasets made by other recorders hold: episodes that start mid-GOP.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
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


@contextmanager
def scheduling_kept() -> Iterator[None]:
    """The calling thread's CPU scheduling put back as it was when the block ends.

    SVT-AV1 (4.1 and 4.3, in PyAV 18.1.0's and 18.1.1's wheels) switches the thread that
    opens an encoder to real-time scheduling (``SCHED_FIFO``, priority 99) wherever it may, as
    root does. Every process started from that thread afterwards inherits it (DataLoader
    workers, ``torchrun``, a forkserver): on a 2-core machine two such processes busy in the
    kernel starved its own threads, and a DDP epoch hung reaping its DataLoader workers."""
    if not hasattr(os, "sched_getscheduler"):  # not Linux
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0)) != (policy, param):
            os.sched_setscheduler(0, policy, param)


_CAP_SYS_NICE = 23
_PR_CAPBSET_DROP = 24
_CAPABILITY_VERSION_3 = 0x20080522


def forbid_realtime_scheduling() -> bool:
    """Take from this thread, and every thread and process it starts, the capability to make
    itself real-time (``CAP_SYS_NICE``); True where it was taken (Linux).

    For a process that encodes AV1 as root and then starts others, as a test session does: with
    it gone, SVT-AV1's switch to real-time scheduling (:func:`scheduling_kept`) fails quietly
    and the encoder runs as before. Irreversible, so never done by the library itself."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return False

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint32) for name in ("effective", "permitted", "inheritable")]

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = Header(_CAPABILITY_VERSION_3, 0), (Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    bit = 1 << _CAP_SYS_NICE
    if not data[0].permitted & bit:
        return True  # not root, or already taken
    # the bounding set first (that needs CAP_SETPCAP, still held): processes this one execs
    # would otherwise get the capability back, as root's do
    libc.prctl(_PR_CAPBSET_DROP, _CAP_SYS_NICE, 0, 0, 0)
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & ~bit)
    return libc.capset(ctypes.byref(header), data) == 0


@dataclass(frozen=True)
class Encoder:
    """Encoder settings; the defaults are LeRobot's. ``extra`` holds further FFmpeg options."""

    codec: str = CODEC
    gop: int = GOP
    crf: int = CRF
    preset: int | str = PRESET
    extra: tuple[tuple[str, str], ...] = ()

    def options(self) -> dict[str, str]:
        base = {"g": str(self.gop), "crf": str(self.crf), "preset": str(self.preset)}
        return {**base, **dict(self.extra)}


LEROBOT = Encoder()
H264_LONG_GOP = Encoder(
    "libx264",
    gop=30,
    crf=23,
    preset="medium",
    # 3 B-frames (pyramid): decode order differs from presentation order. No scene-cut
    # keyframes and closed GOPs: a keyframe exactly every 30 frames.
    extra=(("bf", "3"), ("x264-params", "scenecut=0:open-gop=0")),
)
"""H.264 with GOP 30 and B-frames: LeRobot never writes it, other recorders do."""


class Recorder:
    """An mp4 encoded frame by frame, finished (encoder drained) when the ``with`` block ends."""

    def __init__(self, path: Path, fps: int, encoder: Encoder = LEROBOT) -> None:
        self.path, self.encoder = path, encoder
        self._kept = ExitStack()
        self._kept.enter_context(scheduling_kept())  # (the encoder may change it)
        self.out = av.open(str(path), "w")
        self.stream = self.out.add_stream(encoder.codec, rate=fps, options=encoder.options())
        self.stream.pix_fmt = PIX_FMT
        self.count = 0

    def write(self, frames: Iterable[np.ndarray]) -> None:
        """Encode HWC uint8 RGB frames."""
        for image in frames:
            if self.count == 0:
                if self.encoder.codec == "libsvtav1" and image.shape[1] < MIN_WIDTH:
                    raise ValueError(
                        f"{self.path}: frames {image.shape[1]} pixels wide are too narrow to "
                        f"encode; use at least {MIN_WIDTH}"
                    )
                self.stream.height, self.stream.width = image.shape[:2]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
            self.out.mux(self.stream.encode(frame))
            self.count += 1

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        try:
            if exc_type is None:
                if self.count == 0:
                    raise ValueError(f"no frames to encode into {self.path}")
                self.out.mux(self.stream.encode(None))
        finally:
            try:
                self.out.close()
            finally:
                self._kept.close()


def encode_episode(
    frames: Iterable[np.ndarray], path: Path, fps: int, encoder: Encoder = LEROBOT
) -> None:
    """Encode HWC uint8 RGB frames to an mp4 at ``path`` (LeRobot's settings by default)."""
    with Recorder(path, fps, encoder) as recorder:
        recorder.write(frames)


def duration_s(path: Path) -> float:
    """The video stream's duration in seconds, as LeRobot measures it for ``to_timestamp``."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration / av.time_base)


def concatenate(inputs: Sequence[Path], output: Path) -> None:
    """LeRobot's ``concatenate_video_files``: the ``inputs`` one after the other by FFmpeg's
    concat demuxer, every packet stream-copied (time base kept), ``movflags=faststart``.

    Each input starts where the one before ends (its duration), so appending episodes one at a
    time, as LeRobot does, or all at once gives the same timestamps. The result is written
    aside and moved over ``output`` (which may be an input), so a crash leaves it whole.
    """
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".concat-") as scratch:
        listing = Path(scratch) / "inputs.ffconcat"
        lines = ["ffconcat version 1.0", *(f"file '{Path(p).resolve()}'" for p in inputs)]
        listing.write_text("\n".join(lines) + "\n")
        tmp = Path(scratch) / "out.mp4"
        with (
            av.open(str(listing), "r", format="concat", options={"safe": "0"}) as src,
            av.open(str(tmp), "w", options={"movflags": "faststart"}) as out,
        ):
            streams = {}
            for stream in src.streams:
                if stream.type in ("video", "audio", "subtitle"):
                    streams[stream.index] = out.add_stream_from_template(stream, opaque=True)
                    streams[stream.index].time_base = stream.time_base
            for packet in src.demux():
                if packet.stream.index not in streams or packet.dts is None:
                    continue
                packet.stream = streams[packet.stream.index]
                out.mux(packet)
        os.replace(tmp, output)
