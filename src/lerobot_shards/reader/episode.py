"""A resident episode: its fetched bytes split into tar members, its rows, its demuxed videos.

The manifest records each member's span inside the shard, so an episode's single ranged read
is split into members by slicing, with no tar parsing on the hot path. Everything the bytes must
agree with (the manifest, the header, the rows, the videos' frame counts) is checked here, on
admission, and every error names the shard and the episode.

Frames are decoded when drawn, a GOP at a time (``decode.py`` says why). A GOP's other frames
are kept (:class:`CameraFrames`) until the draws that use them are made, then dropped: with
LeRobot's GOP 2 each frame is decoded about once and an episode holds only the frames of GOPs it
has started and not finished, never more than the frames its rows use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lerobot_shards.format import (
    EpisodeHeader,
    FormatError,
    header_member,
    rows_member,
    video_member,
)
from lerobot_shards.items import EpisodeColumns, ItemSpec
from lerobot_shards.reader.decode import Video
from lerobot_shards.reader.rgb24 import to_rgb24, write_rgb24


class CameraFrames:
    """One camera of a resident episode: its :class:`Video` and the decoded frames still to draw.

    ``uses[p]`` counts the draws still to come that show frame ``p`` (one per row, more with
    ``delta_timestamps``); a frame is decoded with its GOP on first use and dropped on last.
    :meth:`schedule` starts a GOP's decoding early, on a thread pool, for a draw that is coming;
    :meth:`take` then waits for it instead of decoding. A frame is held as an rgb24 tensor, or,
    when its GOP was decoded for a draw written into a batch slot, as PyAV's decoded frame, to be
    converted where it is drawn (``rgb24.py``).
    """

    def __init__(self, video: Video, uses: np.ndarray) -> None:
        self.video = video
        self._uses = uses
        self._frames: dict[int, Any] = {}
        self._decoding: dict[int, Future] = {}  # GOP index -> its decoding, started ahead
        self.nbytes = 0
        """Bytes of the decoded frames held, each counted as rgb24 (not counting GOPs still
        being decoded ahead)."""

    def schedule(self, position: int, decoder: Executor) -> None:
        """Start decoding the GOP holding frame ``position`` on ``decoder``, unless the frame is
        held or its GOP is already being decoded."""
        if position in self._frames:
            return
        gop = self.video.gop_of(position)
        if gop not in self._decoding:
            self._decoding[gop] = decoder.submit(self.video.decode_gop, position)

    def take(self, position: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Frame ``position`` (uint8 HWC), decoding its GOP if it is not held; counts one use.

        With ``out`` (a uint8 HWC tensor, such as a batch slot), the frame is written there and
        ``out`` returned: a GOP decoded for it keeps its frames unconverted until drawn.
        """
        frames = self._frames
        if position not in frames:
            started = self._decoding.pop(self.video.gop_of(position), None)
            if started is None:
                decoded = self.video.decode_gop(position, rgb=out is None)
            else:
                decoded = started.result()
            for p, frame in decoded.items():
                if p == position or (self._uses[p] > 0 and p not in frames):
                    frames[p] = frame
                    self.nbytes += self._bytes(frame)
        frame = frames[position]
        self._uses[position] -= 1
        if self._uses[position] <= 0:
            del frames[position]
            self.nbytes -= self._bytes(frame)
        if out is None:
            if not isinstance(frame, torch.Tensor):
                frame = to_rgb24(frame)
                if position in frames:  # drawn again later: convert once
                    frames[position] = frame
            return frame
        if isinstance(frame, torch.Tensor):
            # numpy copies on this thread; torch would wake its intra-op pool (see collate.py)
            np.copyto(out.numpy(), frame.numpy())
        else:
            write_rgb24(frame, out)
        return out

    def _bytes(self, frame: Any) -> int:
        if isinstance(frame, torch.Tensor):
            return frame.nbytes
        return frame.width * frame.height * 3


@dataclass
class Episode:
    """One admitted episode, held until the plan evicts it."""

    index: int
    length: int
    columns: EpisodeColumns
    cameras: dict[str, CameraFrames]
    fetched: int
    """Bytes fetched (the videos' packets are read from them in place)."""

    @property
    def nbytes(self) -> int:
        """Memory held now: fetched bytes plus the decoded frames not yet drawn."""
        return self.fetched + sum(c.nbytes for c in self.cameras.values())

    def schedule(self, position: int, spec: ItemSpec, decoder: Executor) -> None:
        """Start decoding, on ``decoder``, the GOPs the item for row ``position`` will show."""
        for key, positions in spec.video_positions(position, self.length).items():
            camera = self.cameras[key]
            for p in positions.tolist():
                camera.schedule(p, decoder)

    def item(
        self,
        position: int,
        spec: ItemSpec,
        tasks: Sequence[str],
        slots: Mapping[str, torch.Tensor] | None = None,
    ) -> dict:
        """The item for row ``position`` of the episode, as LeRobot builds it.

        Camera frames are ``permute`` views of the decoded HWC frames (NCHW, as items take them):
        the DataLoader's collate makes the one copy. ``slots[key]``, where given (a uint8
        ``(T, H, W, 3)`` batch slot, ``transfer.BatchArena``), receives camera ``key``'s frames
        instead, and the item's frames are views of it, which collate need not copy.
        """
        frames = {}
        for key, positions in spec.video_positions(position, self.length).items():
            camera = self.cameras[key]
            slot = slots.get(key) if slots is not None else None
            if slot is not None and slot.shape[0] == len(positions):
                for t, p in enumerate(positions.tolist()):
                    camera.take(p, slot[t])
                frames[key] = slot.permute(0, 3, 1, 2)
            elif len(positions) == 1:
                frames[key] = camera.take(int(positions[0])).permute(2, 0, 1).unsqueeze(0)
            else:
                stack = torch.stack([camera.take(int(p)) for p in positions])
                frames[key] = stack.permute(0, 3, 1, 2)
        task_index = int(self.columns.value("task_index", position))
        return spec.build(self.columns, position, frames, tasks[task_index])


def needed_range(spec: ItemSpec, key: str, start: int, stop: int, length: int) -> tuple[int, int]:
    """Frame positions ``[lo, hi)`` of camera ``key`` that items for rows ``start:stop`` use."""
    offsets = spec.deltas.get(key, np.zeros(1, dtype=np.int64))
    lo = max(0, start + min(int(offsets.min()), 0))
    hi = min(length, stop + max(int(offsets.max()), 0))
    return lo, hi


def load_episode(
    data: bytes,
    members: Mapping[str, tuple[int, int]],
    *,
    episode_index: int,
    length: int,
    shard: str,
    spec: ItemSpec,
    backend: str = "pyav",
    rows: tuple[int, int] | None = None,
) -> Episode:
    """Split an episode's bytes into members, parse its rows and demux its videos (no decoding).

    ``members`` maps member names to ``(offset within data, size)`` (``format.member_spans``);
    ``rows = (start, stop)`` is the range of rows the caller will draw (default: all): each
    decoded frame is kept until those rows' draws that show it are made.
    """
    where = f"{shard} (episode {episode_index})"
    start, stop = rows if rows is not None else (0, length)

    def member(name: str) -> memoryview:
        if name not in members:
            raise FormatError(f"{where}: the manifest lists no member {name!r}")
        offset, size = members[name]
        if offset < 0 or offset + size > len(data):
            raise FormatError(
                f"{where}: member {name!r} spans bytes {offset}..{offset + size}, "
                f"outside the episode's {len(data)} bytes"
            )
        return memoryview(data)[offset : offset + size]

    header = EpisodeHeader.from_json(
        bytes(member(header_member(episode_index))), where=f"{where} header"
    )
    if header.episode_index != episode_index or header.length != length:
        raise FormatError(
            f"{where}: header says episode {header.episode_index} of {header.length} frames, "
            f"the manifest says episode {episode_index} of {length}"
        )
    try:
        table = pq.read_table(pa.BufferReader(member(rows_member(episode_index))))
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{where}: rows parquet does not parse: {exc}") from exc
    if table.num_rows != length:
        raise FormatError(f"{where}: rows parquet has {table.num_rows} rows, expected {length}")
    columns = EpisodeColumns.from_table(table, spec.image_keys)

    cameras: dict[str, CameraFrames] = {}
    drawn = np.arange(start, stop)
    for key in spec.video_keys:
        camera = header.cameras.get(key)
        if camera is None:
            raise FormatError(f"{where}: header has no camera {key!r}")
        video = Video(
            member(video_member(episode_index, key)),
            length=length,
            skip_frames=camera.skip_frames,
            backend=backend,
            where=f"{where} camera {key}",
        )
        offsets = spec.deltas.get(key, np.zeros(1, dtype=np.int64))
        shown = np.clip(drawn[:, None] + offsets[None, :], 0, length - 1)  # as video_positions
        cameras[key] = CameraFrames(video, np.bincount(shown.ravel(), minlength=length))
    return Episode(episode_index, length, columns, cameras, len(data))
