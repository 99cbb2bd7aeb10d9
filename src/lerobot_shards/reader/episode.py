"""A resident episode: its fetched bytes split into tar members, its rows, its decoded frames.

The manifest records each member's span inside the shard, so an episode's single ranged read
is split into members by slicing, with no tar parsing on the hot path. Everything the bytes must
agree with (the manifest, the header, the rows, the videos) is checked here, and every error
names the shard and the episode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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
from lerobot_shards.reader.decode import decode_frames


@dataclass
class Episode:
    """One admitted episode, held until the plan evicts it."""

    index: int
    length: int
    columns: EpisodeColumns
    frames: dict[str, tuple[int, torch.Tensor]]
    """Per video camera, ``(first position, uint8 NHWC frames from that position on)``."""
    nbytes: int
    """Memory held: fetched bytes plus decoded frames."""

    def item(self, position: int, spec: ItemSpec, tasks: Sequence[str]) -> dict:
        """The item for row ``position`` of the episode, as LeRobot builds it."""
        frames = {}
        for key, positions in spec.video_positions(position, self.length).items():
            first, stack = self.frames[key]
            if len(positions) == 1:  # a view: no copy before the DataLoader's collate
                frames[key] = stack[int(positions[0]) - first].permute(2, 0, 1).unsqueeze(0)
            else:
                picked = stack.index_select(0, torch.from_numpy(positions - first))
                frames[key] = picked.permute(0, 3, 1, 2)
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
    """Split an episode's bytes into members, parse its rows and decode the frames it needs.

    ``members`` maps member names to ``(offset within data, size)`` (``format.member_spans``);
    ``rows = (start, stop)`` is the range of rows the caller will draw (default: all), which
    bounds the frames decoded into memory.
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

    frames: dict[str, tuple[int, torch.Tensor]] = {}
    nbytes = len(data)
    for key in spec.video_keys:
        camera = header.cameras.get(key)
        if camera is None:
            raise FormatError(f"{where}: header has no camera {key!r}")
        lo, hi = needed_range(spec, key, start, stop, length)
        stack = decode_frames(
            member(video_member(episode_index, key)),
            length=length,
            skip_frames=camera.skip_frames,
            start=lo,
            stop=hi,
            backend=backend,
            where=f"{where} camera {key}",
        )
        frames[key] = (lo, stack)
        nbytes += stack.numel()
    return Episode(episode_index, length, columns, frames, nbytes)
