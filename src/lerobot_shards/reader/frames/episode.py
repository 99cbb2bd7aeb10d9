"""A resident episode: its fetched bytes split into tar members, its rows, its demuxed videos.

The manifest records each member's span inside the shard, so an episode's single ranged read
is split into members by slicing, with no tar parsing on the hot path. Everything the bytes must
agree with (the manifest, the header, the rows, the videos' frame counts) is checked here, on
admission, and every error names the shard and the episode.

Frames are decoded when drawn, from their GOP's keyframe (``decode.py`` says why), through the
stream's byte-capped frame cache (``frame_cache.py``), which keeps the GOP's other frames only
while the plan draws them soon: memory for decoded frames does not grow with the pool.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lerobot_shards.depth import DepthImage, Quantization, dequantization_table
from lerobot_shards.format import (
    FormatError,
    header_member,
    rows_member,
    video_member,
)
from lerobot_shards.items import EpisodeColumns, ItemSpec
from lerobot_shards.reader.batches.collate import typed_item
from lerobot_shards.reader.fetch.mapped import release
from lerobot_shards.reader.frames.decode import Video
from lerobot_shards.reader.frames.frame_cache import FrameCache, Key, Pending
from lerobot_shards.reader.frames.resize import Resize, resized_image
from lerobot_shards.validate import (
    TOLERANCE_S,
    check_camera,
    check_header_cameras,
    check_header_matches,
    check_rows,
    check_tar_member,
    frame_channels,
    frame_size,
    parse_header,
    row_keys,
)


def frame_nbytes(frame: torch.Tensor | av.VideoFrame) -> int:
    """What a held frame costs: an rgb24 tensor's bytes, or a decoded frame's planes (yuv420p:
    half of rgb24, so a cache of unconverted frames holds twice as many)."""
    if isinstance(frame, torch.Tensor):
        return frame.numel() * frame.element_size()
    return sum(plane.buffer_size for plane in frame.planes)


class CameraFrames:
    """One camera of a resident episode: its :class:`Video`, decoded through a shared
    :class:`~lerobot_shards.reader.frames.frame_cache.FrameCache`.

    A draw takes its frame from the cache, or decodes it (from its GOP's keyframe) and offers
    the cache the GOP's other frames that the plan draws again soon. :meth:`schedule` starts a
    draw's decode early, on a thread pool, holding its frames in the cache as placeholders;
    :meth:`take` then waits for it instead of decoding. A frame is held as an rgb24 tensor, or,
    when decoded for a batch slot, as PyAV's decoded frame, converted where it is drawn
    (``rgb24.py``). Used from the iterating thread only (the cache is not thread-safe).
    """

    def __init__(self, video: Video, camera: str) -> None:
        self.video = video
        self.camera = camera
        self.cache: FrameCache | None = None
        self.tag: Hashable = None
        self.warm: dict[int, Any] = {}
        """Frames decoded before the episode joined a stream (``warm_start.py``), by position;
        each is taken once, instead of decoding it."""

    def warm_up(self, position: int) -> None:
        """Decode frame ``position`` now, to be taken later (before :meth:`attach`)."""
        if position not in self.warm:
            self.warm.update(self.video.decode(position, (), rgb=False))

    def attach(self, cache: FrameCache, tag: Hashable) -> None:
        """Decode through ``cache``, under episode tag ``tag`` (the stream's name for it)."""
        self.cache, self.tag = cache, tag

    def key(self, position: int) -> Key:
        """The cache key of frame ``position``."""
        return (self.tag, self.camera, position)

    def schedule(self, position: int, decoder: Executor) -> None:
        """Start decoding frame ``position`` on ``decoder``, with the GOP's other frames that
        the cache will hold, unless it is held or the cache has no room for it."""
        cache, video = self.cache, self.video
        if cache.holds(self.key(position)) or position in self.warm:
            return
        pending = [Pending(position)]
        if not cache.offer(self.key(position), pending[0], video.frame_bytes):
            return
        for p in video.gop_positions(position):
            if p != position and not cache.holds(self.key(p)):
                held = Pending(p)
                if cache.offer(self.key(p), held, video.frame_bytes):
                    pending.append(held)
        future = decoder.submit(video.decode, position, [h.position for h in pending[1:]])
        for held in pending:
            held.future = future

    def take(self, position: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Frame ``position`` (uint8 HWC), from the cache or decoded; consumes one use.

        With ``out`` (a uint8 HWC tensor, such as a batch slot), the frame is written there and
        ``out`` returned: a GOP decoded for it keeps its frames unconverted until drawn.
        """
        cache, video, key = self.cache, self.video, self.key(position)
        warm = self.warm.pop(position, None) if self.warm else None
        frame = cache.take(key)
        if frame is None and warm is not None:
            frame = warm
            cache.offer(key, frame, frame_nbytes(frame))  # drawn again soon (delta_timestamps)
        elif frame is None:
            keep = [
                p
                for p in video.gop_positions(position)
                if p != position and cache.would_hold(self.key(p), video.frame_bytes)
            ]
            decoded = video.decode(position, keep, rgb=out is None)
            frame = decoded.pop(position)
            for p, other in decoded.items():
                cache.offer(self.key(p), other, frame_nbytes(other))
            cache.offer(key, frame, frame_nbytes(frame))  # drawn again soon (delta_timestamps)
        if out is None:
            if not isinstance(frame, torch.Tensor):
                frame = video.to_rgb(frame)
                cache.replace(key, frame, frame.numel())  # drawn again later: convert once
            return frame
        if isinstance(frame, torch.Tensor):
            # numpy copies on this thread; torch would wake its intra-op pool (see collate.py)
            np.copyto(out.numpy(), frame.numpy())
        else:
            video.write_rgb(frame, out)
        return out


@dataclass
class Episode:
    """One admitted episode, held until the plan evicts it."""

    index: int
    length: int
    columns: EpisodeColumns
    cameras: dict[str, CameraFrames]
    fetched: int
    """Bytes fetched (the videos' packets are read from them in place); decoded frames live in
    the stream's frame cache."""
    where: str = "episode"
    """The shard and episode, for errors."""

    def attach(self, cache: FrameCache, tag: Hashable) -> None:
        """Decode every camera through ``cache`` under episode tag ``tag``."""
        for camera in self.cameras.values():
            camera.attach(cache, tag)

    def frame_keys(self, position: int, spec: ItemSpec) -> Iterator[Key]:
        """The cache keys of the frames the item for row ``position`` shows, one per take."""
        for key, positions in spec.video_positions(position, self.length).items():
            camera = self.cameras[key]
            for p in positions.tolist():
                yield camera.key(p)

    def warm_up(self, position: int, spec: ItemSpec) -> None:
        """Decode now the frames the item for row ``position`` will show (``warm_start.py``)."""
        for key, positions in spec.video_positions(position, self.length).items():
            camera = self.cameras[key]
            for p in positions.tolist():
                camera.warm_up(p)

    def schedule(self, position: int, spec: ItemSpec, decoder: Executor) -> None:
        """Start decoding, on ``decoder``, the frames the item for row ``position`` will show."""
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

        Camera frames are ``permute`` views of the decoded HWC frames (NCHW, as items take them),
        typed for ``default_collate`` (``collate.py``), which makes the one copy, without
        transposing. ``slots[key]``, where given (a uint8 ``(T, H, W, 3)`` batch slot,
        ``transfer.BatchArena``), receives camera ``key``'s frames instead, and the item's
        frames are views of it, which collate need not copy.
        """
        frames = {}
        for key, positions in spec.video_positions(position, self.length).items():
            camera = self.cameras[key]
            slot = slots.get(spec.output_key(key)) if slots is not None else None
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
        try:
            item = spec.build(self.columns, position, frames, tasks[task_index])
        except ValueError as exc:  # an image that lies about itself (validate.decode_image)
            raise FormatError(f"{self.where} row {position}: {exc}") from exc
        # Typed for default_collate, whatever collate_fn the DataLoader was given (collate.py)
        return typed_item(item, spec.output_camera_keys)


def load_episode(
    data: bytes | memoryview,
    members: Mapping[str, tuple[int, int]],
    *,
    episode_index: int,
    length: int,
    dataset_from_index: int,
    shard: str,
    spec: ItemSpec,
    features: Mapping[str, Mapping],
    tasks: Sequence[str],
    fps: float,
    tolerance_s: float = TOLERANCE_S,
    backend: str = "pyav",
    resize: Mapping[str, Resize] | None = None,
) -> Episode:
    """Split an episode's bytes into members, parse its rows and demux its videos (no decoding).

    ``members`` maps member names to ``(offset within data, size)`` (``format.member_spans``).
    Everything is checked against the manifest's row (``episode_index``, ``length``,
    ``dataset_from_index``), the dataset's ``features``, its ``tasks`` (by task_index) and its
    ``fps`` (``tolerance_s`` for the rows' timestamps) before it is used (``validate.py``
    says why). ``resize[camera]``, where given, brings that camera's frames to one size
    (``resize.py``). Before drawing, :meth:`Episode.attach` the stream's frame cache.
    """
    where = f"{shard} (episode {episode_index})"

    def member(name: str) -> memoryview:
        if name not in members:
            raise FormatError(f"{where}: the manifest lists no member {name!r}")
        offset, size = members[name]
        if offset < 0 or offset + size > len(data):
            raise FormatError(
                f"{where}: member {name!r} spans bytes {offset}..{offset + size}, "
                f"outside the episode's {len(data)} bytes"
            )
        check_tar_member(data, offset, size, name, where)
        return memoryview(data)[offset : offset + size]

    header = parse_header(bytes(member(header_member(episode_index))), where=f"{where} header")
    listed = {"episode_index": episode_index, "length": length}
    check_header_matches(header, {**listed, "dataset_from_index": dataset_from_index}, where)
    try:
        table = pq.ParquetFile(pa.BufferReader(member(rows_member(episode_index)))).read()
    except (pa.ArrowException, OSError) as exc:
        raise FormatError(f"{where}: rows parquet does not parse: {exc}") from exc
    if table.num_rows != length:
        raise FormatError(f"{where}: rows parquet has {table.num_rows} rows, expected {length}")
    table = check_rows(table, features, header, tasks, where, fps, tolerance_s)
    check_header_cameras(header, features, where)
    sizes = {key: frame_size(features[key]) for key in spec.image_keys}
    channels = {key: frame_channels(features[key]) for key in spec.image_keys}
    unit = spec.depth_output_unit
    depth_images = {
        key: DepthImage.of(features[key], unit) for key in spec.image_keys if key in spec.depth_keys
    }
    resize = dict(resize or {})
    image_resize = {
        key: functools.partial(resized_image, resize=resize[key])
        for key in spec.image_keys
        if key in resize
    }
    columns = EpisodeColumns.from_table(
        table.select(row_keys(features)),
        spec.image_keys,
        sizes,
        image_channels=channels,
        depth_images=depth_images,
        image_resize=image_resize,
    )

    cameras: dict[str, CameraFrames] = {}
    for key in spec.video_keys:
        camera = header.cameras[key]  # the video features': check_header_cameras
        check_camera(camera, features[key], length, key, where)
        video = Video(
            member(video_member(episode_index, key)),
            length=length,
            skip_frames=camera.skip_frames,
            tail_frames=camera.tail_frames,
            camera=camera,
            backend=backend,
            where=f"{where} camera {key}",
            depth=(
                dequantization_table(Quantization.of(features[key]), unit)
                if key in spec.depth_keys
                else None
            ),
            resize=resize.get(key),
        )
        cameras[key] = CameraFrames(video, key)
    release(data)  # verified, parsed and demuxed: a mapped shard's pages go back to the kernel
    return Episode(episode_index, length, columns, cameras, len(data), where)
