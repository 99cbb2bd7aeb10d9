"""What an item is: LeRobot's ``LeRobotDataset.__getitem__`` semantics, shared by every loader.

Both the map-style ``LeRobotSource`` (the reference) and the streaming reader build items here,
from an episode's rows and the decoded camera frames, so they cannot drift apart. Nothing in
this module does I/O.

LeRobot 0.6.1 builds an item as: the parquet row converted by ``torch.tensor`` (so floats become
float32, ints int64, scalars 0-dim), with ``delta_timestamps`` the neighbours' rows stacked and
clamped to the episode plus ``<key>_is_pad`` masks, the camera frames put *first*, image
transforms applied to every camera key but depth maps, and ``task`` appended last. Depth maps
are float32 in the output unit whatever ``return_uint8`` says (``lerobot_shards.depth``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import torch

from lerobot_shards.arrow import as_numpy
from lerobot_shards.depth import DepthImage
from lerobot_shards.language import LANGUAGE_COLUMNS, LanguageColumn
from lerobot_shards.validate import decode_image


def delta_indices(
    delta_timestamps: Mapping[str, Sequence[float]] | None, fps: float, tolerance_s: float = 1e-4
) -> dict[str, np.ndarray]:
    """Frame offsets per ``delta_timestamps`` key; each delta must be a multiple of 1/fps."""
    if not delta_timestamps:
        return {}
    out = {}
    for key, deltas in delta_timestamps.items():
        arr = np.asarray(list(deltas), dtype=np.float64)
        offsets = np.round(arr * fps)
        bad = np.abs(arr - offsets / fps) > tolerance_s
        if bad.any():
            raise ValueError(
                f"delta_timestamps[{key!r}] = {list(deltas)} are not multiples of 1/fps "
                f"(fps={fps}) within tolerance_s={tolerance_s}"
            )
        out[key] = offsets.astype(np.int64)
    return out


def query_positions(
    position: int, length: int, deltas: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, torch.Tensor]]:
    """Row positions (within the episode) to read for each delta key, clamped, and the pad masks."""
    queries: dict[str, np.ndarray] = {}
    pads: dict[str, torch.Tensor] = {}
    for key, offsets in deltas.items():
        raw = position + offsets
        queries[key] = np.clip(raw, 0, length - 1)
        pads[f"{key}_is_pad"] = torch.from_numpy((raw < 0) | (raw >= length))
    return queries, pads


@dataclass
class EpisodeColumns:
    """An episode's rows as tensors, converted once, indexed per item.

    ``tensors`` holds numeric columns stacked over rows (dtype as ``torch.tensor`` of the
    Python value gives: float32, int64 or bool). ``images`` holds image features, decoded
    lazily to CHW uint8 tensors (depth images, ``depth_images``: float32 ``(1, H, W)`` as LeRobot
    returns them). ``language`` holds LeRobot's language columns, whose values are made per item
    (``language.py``). ``others`` keeps any other column as Python values.
    """

    names: list[str]
    tensors: dict[str, torch.Tensor]
    images: dict[str, list]
    others: dict[str, list]
    length: int
    language: dict[str, LanguageColumn] = field(default_factory=dict)
    image_sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per image feature, its (height, width): a decoded image of another size is refused
    (shards; a LeRobot source leaves it empty)."""
    image_channels: dict[str, int] = field(default_factory=dict)
    """Per image feature, its channels: an image of other bands is refused (shards; a LeRobot
    source leaves it empty)."""
    depth_images: dict[str, DepthImage] = field(default_factory=dict)
    """The image features that are depth maps, and how their cells become depth."""
    image_resize: dict[str, Callable[[np.ndarray], np.ndarray]] = field(default_factory=dict)
    """Per image feature, what resizes its decoded HWC images (a mixture's target layout)."""

    @classmethod
    def from_table(
        cls,
        table: pa.Table,
        image_keys: Sequence[str] = (),
        image_sizes: Mapping[str, tuple[int, int]] | None = None,
        *,
        image_channels: Mapping[str, int] | None = None,
        depth_images: Mapping[str, DepthImage] | None = None,
        image_resize: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
    ) -> EpisodeColumns:
        tensors: dict[str, torch.Tensor] = {}
        images: dict[str, list] = {}
        others: dict[str, list] = {}
        language: dict[str, LanguageColumn] = {}
        for name in table.column_names:
            column = table.column(name)
            if name in image_keys:
                images[name] = column.to_pylist()
                continue
            if name in LANGUAGE_COLUMNS:
                language[name] = LanguageColumn(column, name)
                continue
            array = _column_to_numpy(column)
            if array is None:
                others[name] = column.to_pylist()
            else:
                tensors[name] = torch.from_numpy(array)
        sizes = dict(image_sizes or {})
        channels = dict(image_channels or {})
        depth = dict(depth_images or {})
        resize = dict(image_resize or {})
        return cls(
            list(table.column_names),
            tensors,
            images,
            others,
            table.num_rows,
            language,
            sizes,
            channels,
            depth,
            resize,
        )

    def value(self, name: str, positions: int | np.ndarray) -> object:
        """The column at one row position (0-dim / per-row shape) or stacked over several."""
        if name in self.tensors:
            col = self.tensors[name]
            if isinstance(positions, np.ndarray):
                return col[torch.from_numpy(positions)]
            return col[positions]
        if name in self.images:
            if isinstance(positions, np.ndarray):
                return torch.stack([self._image(name, int(p)) for p in positions])
            return self._image(name, positions)
        if name in self.language:
            column = self.language[name]
            if isinstance(positions, np.ndarray):
                return [column.value(int(p)) for p in positions]
            return column.value(positions)
        col = self.others[name]
        if isinstance(positions, np.ndarray):
            return [col[int(p)] for p in positions]
        return col[positions]

    def _image(self, name: str, position: int) -> torch.Tensor:
        cell = self.images[name][position]
        if not isinstance(cell, torch.Tensor):
            size = self.image_sizes.get(name)
            depth = self.depth_images.get(name)
            if depth is not None:
                cell = torch.from_numpy(depth.decode(cell, size, allow_path=size is None))
            else:
                channels = self.image_channels.get(name)
                array = decode_image(cell, size, allow_path=size is None, channels=channels)
                if name in self.image_resize:
                    array = self.image_resize[name](array)
                cell = torch.from_numpy(array).permute(2, 0, 1).contiguous()
            self.images[name][position] = cell
        return cell


def _column_to_numpy(column: pa.ChunkedArray) -> np.ndarray | None:
    """Numeric (possibly fixed-size-list) column to a numpy array with LeRobot's tensor dtypes."""
    typ = column.type
    shape: list[int] = []
    while pa.types.is_fixed_size_list(typ):
        shape.append(typ.list_size)
        typ = typ.value_type
    if pa.types.is_floating(typ):
        dtype = np.float32  # torch.tensor(python float) -> float32
    elif pa.types.is_integer(typ):
        dtype = np.int64
    elif pa.types.is_boolean(typ):
        dtype = np.bool_
    elif pa.types.is_list(typ) or pa.types.is_large_list(typ):
        return None
    else:
        return None
    flat = column.combine_chunks()
    for _ in shape:
        flat = flat.flatten()
    values = as_numpy(flat, zero_copy_only=False).astype(dtype)  # a writable copy for torch
    return np.ascontiguousarray(values.reshape([len(column), *shape]))


def frames_to_output(frames_uint8: torch.Tensor, return_uint8: bool) -> torch.Tensor:
    """LeRobot's conversion of decoded uint8 CHW frames: float32 / 255 unless uint8 is asked for."""
    if return_uint8:
        return frames_uint8
    return frames_uint8.to(torch.float32) / 255


@dataclass
class ItemSpec:
    """The options that shape an item, identical for the reference and the streaming reader.

    In a mixture of datasets, ``key_map`` renames a dataset's keys onto the mixture's common
    names (None drops the key; a delta key's ``_is_pad`` mask follows it) and ``dataset_index``
    is added to every item; with neither, the item is LeRobot's.
    """

    video_keys: list[str]
    image_keys: list[str]
    deltas: dict[str, np.ndarray]
    return_uint8: bool = False
    """Video frames stay uint8; image features and depth maps are float32 either way, as in
    LeRobot."""
    image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None
    key_map: dict[str, str | None] = field(default_factory=dict)
    dataset_index: int | None = None
    depth_keys: frozenset[str] = frozenset()
    """The cameras that are depth maps: their frames come float32 in ``depth_output_unit``
    (dequantized by the decoder, converted by ``EpisodeColumns``) and no transform touches them."""
    depth_output_unit: str = "mm"
    uint8_images: bool = False
    """Image features too are uint8 with ``return_uint8`` (a mixture's target layout, whose
    camera slots each have one dtype), not float32 as LeRobot gives them."""

    @property
    def camera_keys(self) -> list[str]:
        return [*self.video_keys, *self.image_keys]

    def output_key(self, key: str) -> str | None:
        """The item's name for the dataset's key ``key`` (None: dropped)."""
        if key.endswith("_is_pad") and key[: -len("_is_pad")] in self.deltas:
            base = self.output_key(key[: -len("_is_pad")])
            return None if base is None else f"{base}_is_pad"
        return self.key_map.get(key, key)

    @property
    def output_camera_keys(self) -> list[str]:
        """The item's names of the cameras."""
        return [k for k in map(self.output_key, self.camera_keys) if k is not None]

    def video_positions(self, position: int, length: int) -> dict[str, np.ndarray]:
        """For each video camera, the episode frame positions an item needs, clamped."""
        out: dict[str, np.ndarray] = {}
        for key in self.video_keys:
            offsets = self.deltas.get(key, np.zeros(1, dtype=np.int64))
            out[key] = np.clip(position + offsets, 0, length - 1)
        return out

    def build(
        self,
        columns: EpisodeColumns,
        position: int,
        frames: Mapping[str, torch.Tensor],
        task: str,
    ) -> dict:
        """Assemble the item for row ``position`` of an episode.

        ``frames[key]`` is uint8 NCHW, one frame per entry of ``video_positions`` (a depth
        map's: float32, already in the output unit); like LeRobot, a single frame is returned
        as CHW (``squeeze(0)``).
        """
        queries, pads = query_positions(position, columns.length, self.deltas)
        row: dict[str, object] = {}
        for name in columns.names:
            if name in queries:
                row[name] = columns.value(name, queries[name])
            else:
                row[name] = columns.value(name, position)
        uint8_images = self.return_uint8 and self.uint8_images
        for key in self.image_keys:  # LeRobot makes image features float32 whatever
            if key in row and key not in self.depth_keys:  # return_uint8: video frames only
                row[key] = frames_to_output(row[key], uint8_images)
        item: dict[str, object] = {}
        for key in self.video_keys:
            video = frames[key]
            if key not in self.depth_keys:  # depth maps come dequantized by the decoder
                video = frames_to_output(video, self.return_uint8)
            item[key] = video.squeeze(0)
        item.update(row)
        item.update(pads)
        if self.image_transforms is not None:
            for key in self.camera_keys:
                if key in item and key not in self.depth_keys:
                    item[key] = self.image_transforms(item[key])
        item["task"] = task
        if self.key_map:
            item = {name: v for k, v in item.items() if (name := self.output_key(k))}
        if self.dataset_index is not None:
            item["dataset_index"] = torch.tensor(self.dataset_index)
        return item
