"""Checks of everything a dataset's writer controls, before the reader or ``verify`` trusts it.

A reader opens datasets it did not write (the Hub, a CDN, another lab's bucket). Every field of
``index.json``, the manifest and each episode's header is checked here for its type and range,
paths are confined to the dataset's root, and spans and sizes are bounded before anything is
allocated: a dataset that lies gets a :class:`FormatError` naming the file (and the shard and
episode), never a crash, a hang, an unbounded allocation or items that contradict the metadata.
The reader and ``verify`` call the same checks, so they agree on what is broken.
"""

from __future__ import annotations

import io
import json
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lerobot_shards.arrow import as_numpy
from lerobot_shards.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_FILE,
    MANIFEST_SCHEMA,
    CameraHeader,
    DatasetIndex,
    EpisodeHeader,
    FormatError,
    checksum_digests,
    equal_strings,
    join,
    read_large,
    read_whole,
    shard_paths,
)
from lerobot_shards.language import LANGUAGE_COLUMNS, LanguageColumn

MAX_SIDE = 16384
"""The largest frame width or height a header may declare (16K video)."""
SHARD_PATH = r"^shards/([A-Za-z0-9_-][A-Za-z0-9._-]*/)*[A-Za-z0-9_-][A-Za-z0-9._-]*\.tar$"
"""A shard path: relative, under ``shards/``, no ``..``, no scheme, no absolute path."""
DTYPES = frozenset(
    ["video", "image", "bool", "string", "language"]
    + [f"float{n}" for n in (16, 32, 64)]
    + [f"{sign}int{n}" for sign in ("", "u") for n in (8, 16, 32, 64)]
)
"""The feature dtypes the reader makes items of (LeRobot's); any other is refused."""
NUMERIC = frozenset(["float32", "int64", "bool"])
"""The value kinds (:func:`value_kind`) of features whose rows are numbers."""
TOLERANCE_S = 1e-4
"""LeRobot's default ``tolerance_s``: how far a row's ``timestamp`` may be from
``frame_index / fps`` (plus the rounding of a float32 timestamp)."""


def integer(value: Any, where: str, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """``value`` if it is an int (not a bool) in ``[minimum, maximum]``, else FormatError."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f"in {minimum}..{maximum}" if maximum is not None else f">= {minimum}"
        raise FormatError(f"{where}: {name} must be an integer {bound}, got {value!r}")
    return value


def number(value: Any, where: str, name: str) -> float:
    """``value`` if it is a positive finite int or float (not a bool), else FormatError."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not np.isfinite(value)
        or value <= 0
    ):
        raise FormatError(f"{where}: {name} must be a positive number, got {value!r}")
    return float(value)


def text(value: Any, where: str, name: str) -> str:
    if not isinstance(value, str):
        raise FormatError(f"{where}: {name} must be a string, got {value!r}")
    return value


def texts(value: Any, where: str, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FormatError(f"{where}: {name} must be a list of strings, got {value!r}")
    return value


def mapping(value: Any, where: str, name: str) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"{where}: {name} must be an object, got {type(value).__name__}")
    return value


def value_kind(feature: Mapping[str, Any], return_uint8: bool) -> tuple[str, tuple[int, ...]]:
    """The dtype and per-item shape of a feature's values, by LeRobot's rules: a
    feature of shape ``(1,)`` is a scalar, floats are float32 and integers int64, a camera's
    ``(H, W, C)`` is a ``(C, H, W)`` frame (uint8 for a video with ``return_uint8``, but a
    depth map's, which is float32 whatever: ``lerobot_shards.depth``)."""
    dtype = str(feature.get("dtype"))
    shape = tuple(int(n) for n in feature.get("shape", ()))
    if dtype in ("video", "image"):
        names = list(feature.get("names") or [])
        channel = names.index("channels") if "channels" in names else len(shape) - 1
        hw = tuple(n for i, n in enumerate(shape) if i != channel)
        uint8 = return_uint8 and dtype == "video" and not is_depth_map(feature)
        return ("uint8" if uint8 else "float32"), (shape[channel], *hw)
    if dtype.startswith("float"):
        kind = "float32"
    elif dtype.startswith(("int", "uint")):
        kind = "int64"
    elif dtype == "bool":
        kind = "bool"
    else:
        return ("str" if dtype == "string" else "object"), shape
    return kind, (() if shape == (1,) else shape)


def is_depth_map(feature: Mapping[str, Any]) -> bool:
    """Whether a feature is a depth map, by LeRobot's rule (``meta.depth_keys``): its info says
    ``is_depth_map`` (older datasets: ``video.is_depth_map``, in ``info`` or ``video_info``).

    Args:
        feature: an entry of ``info.json``'s features.
    """
    info = feature.get("info") if isinstance(feature.get("info"), Mapping) else {}
    video_info = feature.get("video_info") if isinstance(feature.get("video_info"), Mapping) else {}
    return bool(
        info.get("is_depth_map")
        or info.get("video.is_depth_map")
        or video_info.get("video.is_depth_map")
    )


DEPTH_UNITS = ("mm", "m")
"""The units LeRobot records depth in (``info.depth_unit``) and returns it in."""
DEPTH_QUANTIZATION = ("video.depth_min", "video.depth_max", "video.shift", "video.use_log")
"""A depth video's quantization, in its feature's info (metres; None: LeRobot's default)."""


def check_depth_feature(feature: Mapping[str, Any], where: str) -> None:
    """A depth map's feature as LeRobot reads it: a camera of one channel, its ``depth_unit``
    one LeRobot converts (or none: returned as stored), its quantization numbers, and with a
    logarithmic one, ``depth_min + shift > 0`` (LeRobot fails every read otherwise).

    Args:
        feature: the depth map's entry of ``info.json``'s features.
        where: the file and feature, for the error.
    """
    if feature.get("dtype") not in ("video", "image"):
        raise FormatError(f"{where} is marked is_depth_map but is no camera ({feature['dtype']})")
    channels = value_kind(feature, False)[1][0]
    if channels != 1:
        raise FormatError(
            f"{where}: a depth map has one channel, its shape {list(feature['shape'])} has "
            f"{channels} (LeRobot returns it as (1, H, W))"
        )
    info = feature.get("info") if isinstance(feature.get("info"), Mapping) else {}
    unit = info.get("depth_unit")
    if unit is not None and unit not in DEPTH_UNITS:
        raise FormatError(
            f"{where}: depth_unit {unit!r} is not one of {list(DEPTH_UNITS)}, which LeRobot "
            "converts"
        )
    values = {name: info.get(name) for name in DEPTH_QUANTIZATION}
    for name, value in values.items():
        if value is None:
            continue
        if name == "video.use_log":
            if not isinstance(value, bool):
                raise FormatError(f"{where}: {name} must be true or false, got {value!r}")
        elif (
            not isinstance(value, int | float) or isinstance(value, bool) or not np.isfinite(value)
        ):
            raise FormatError(f"{where}: {name} must be a number (metres), got {value!r}")
    depth_min = values["video.depth_min"] if values["video.depth_min"] is not None else 0.01
    shift = values["video.shift"] if values["video.shift"] is not None else 3.5
    if values["video.use_log"] is not False and depth_min + shift <= 0:
        raise FormatError(
            f"{where}: video.depth_min + video.shift = {depth_min + shift} is not positive: "
            "its logarithmic quantization has no inverse"
        )


def frame_size(feature: Mapping) -> tuple[int, int]:
    """(height, width) of a camera feature, by LeRobot's rule (:func:`value_kind`)."""
    _, (_, height, width) = value_kind(feature, False)
    return height, width


def frame_channels(feature: Mapping) -> int:
    """Channels of a camera feature's frames, by LeRobot's rule (:func:`value_kind`)."""
    return value_kind(feature, False)[1][0]


def row_keys(features: Mapping[str, Mapping]) -> list[str]:
    """The columns of a dataset's rows, in the order LeRobot reads them (and an item's keys
    follow): the features' order, the videos left out. LeRobot reads the rows through Hugging
    Face ``datasets`` with the features, which puts the columns in their order, whatever the
    parquet's (``lerobot-annotate`` appends its language columns at the end)."""
    return [k for k, f in features.items() if f.get("dtype") != "video"]


def check_rows(
    table: pa.Table,
    features: Mapping[str, Mapping],
    header: Any,
    tasks: Sequence[str],
    where: str,
    fps: float,
    tolerance_s: float = TOLERANCE_S,
) -> pa.Table:
    """The episode's rows, checked, each numeric feature in its Arrow type of the shards
    (:func:`canonical_column`). They hold exactly the features but the videos (no other
    column, none twice; in any order: LeRobot reads them in the features' order, and so do
    items, :func:`row_keys`), each of its declared dtype (exactly: a float64 column is no
    float32 feature) and shape, no empty values (but in LeRobot's language columns, None where
    a row is empty), every image as bytes (not a path), every language column one LeRobot
    reads (``language.py``); their ``episode_index`` and ``index`` are the header's,
    ``frame_index`` counts 0..length-1 and ``timestamp`` is ``frame_index / fps`` within
    ``tolerance_s`` (items must agree with what LeRobot serves, which finds video frames by
    timestamp); every ``task_index`` names one of the dataset's ``tasks`` (by task_index), and
    one its header names. Columnar: per episode, not per row."""
    names = table.column_names  # a new list at each call: taken once
    nulls = [
        name
        for i, name in enumerate(names)
        if table.column(i).null_count and name not in LANGUAGE_COLUMNS
    ]
    if nulls:
        raise FormatError(f"{where}: the rows' {nulls} have empty values")
    wanted = row_keys(features)
    present, allowed = set(names), set(wanted)
    extra = [name for name in names if name not in allowed]
    if extra:
        raise FormatError(f"{where}: the rows have columns {extra} that are not features")
    missing = [key for key in wanted if key not in present]
    if missing:
        raise FormatError(f"{where}: the rows lack the feature {missing[0]!r}")
    if len(names) != len(present):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise FormatError(f"{where}: the rows hold the columns {twice} more than once")
    columns: dict[str, pa.ChunkedArray] = {}  # numeric features in another type than the shards'
    for key in wanted:
        feature, column = features[key], table.column(names.index(key))
        if feature.get("dtype") == "image":
            _check_image_column(column, key, where)
        elif feature.get("dtype") == "string":
            if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
                raise FormatError(
                    f"{where}: the rows' {key!r} is {column.type}, the features say string"
                )
        elif key in LANGUAGE_COLUMNS:
            try:
                LanguageColumn(column, key)
            except ValueError as exc:
                raise FormatError(f"{where}: {exc}") from exc
        elif value_kind(feature, False)[0] in NUMERIC:
            canonical = canonical_column(column, feature, key, where)
            if canonical is not column:  # in another Arrow type: replaced below
                columns[key] = canonical
    for key, column in columns.items():
        table = table.set_column(names.index(key), key, column)
    positions = np.arange(table.num_rows)
    expected = {
        "episode_index": np.full(table.num_rows, header.episode_index),
        "index": np.arange(header.dataset_from_index, header.dataset_to_index),
        "frame_index": positions,
    }
    for key, want in expected.items():
        got = as_numpy(table.column(key)) if key in present else None
        if got is None or got.shape != want.shape or not np.array_equal(got, want):
            raise FormatError(f"{where}: the rows' {key!r} is not the header's")
    got = as_numpy(table.column("timestamp")) if "timestamp" in present else None
    want = positions / fps
    if got is None or got.shape != want.shape or not np.issubdtype(got.dtype, np.floating):
        raise FormatError(f"{where}: the rows' 'timestamp' is not one number per row")
    # a float32 timestamp is rounded to 24 bits: a long episode's are that far off, no further
    off = ~(np.abs(got.astype(np.float64) - want) <= tolerance_s + np.abs(want) * 2.0**-23)
    if off.any():
        row = int(np.flatnonzero(off)[0])
        raise FormatError(
            f"{where}: row {row}'s timestamp is {float(got[row])!r}, not frame_index / fps = "
            f"{want[row]!r} (within tolerance_s={tolerance_s})"
        )
    indices = as_numpy(table.column("task_index")) if "task_index" in present else None
    if indices is None or indices.ndim != 1 or indices.min() < 0 or indices.max() >= len(tasks):
        raise FormatError(f"{where}: a task_index is not one of the {len(tasks)} tasks")
    for i in np.unique(indices).tolist():
        if tasks[i] not in header.tasks:
            row = int(np.flatnonzero(indices == i)[0])
            raise FormatError(
                f"{where}: row {row}'s task_index {i} is the task {tasks[i]!r}, not one of its "
                f"header's tasks {header.tasks}"
            )
    return table


_is_fixed = pa.types.is_fixed_size_list


def _nested(element: pa.DataType, shape: tuple[int, ...]) -> pa.DataType:
    """The Arrow type the shards store a numeric feature's rows in: its element type as a
    scalar for shape ``()``, else nested ``fixed_size_list`` of its shape (what LeRobot's
    recorder writes, and what LeRobot casts every data file to when it loads one)."""
    for size in reversed(shape):
        element = pa.list_(pa.field("element", element), size)
    return element


def canonical_rows(table: pa.Table, features: Mapping[str, Mapping], where: str) -> pa.Table:
    """``table`` with each numeric feature's column in the shards' Arrow type
    (:func:`canonical_column`); every other column as it is."""
    for position, key in enumerate(table.column_names):
        feature = features.get(key)
        if feature is None or feature.get("dtype") in ("video", "image"):
            continue
        if value_kind(feature, False)[0] in NUMERIC:
            column = table.column(position)
            canonical = canonical_column(column, feature, key, where)
            if canonical is not column:
                table = table.set_column(position, key, canonical)
    return table


def canonical_column(
    column: pa.ChunkedArray, feature: Mapping[str, Any], key: str, where: str
) -> pa.ChunkedArray:
    """A numeric feature's rows in the shards' Arrow type, the same values (``column`` itself
    where it is in that type): nested ``fixed_size_list`` of the feature's dtype as deep as its
    shape (a scalar for shape ``(1,)``), what LeRobot's recorder writes.

    LeRobot's own tools write vectors as ``list`` where a recording writes ``fixed_size_list``
    (``aggregate_datasets``, ``modify_tasks`` and the v2.1 to v3.0 script go through pandas),
    and Hugging Face's ``Array2D`` and up store nested ``list``; LeRobot casts each data file to
    the features' type when it loads it. So ``list``, ``large_list`` and ``fixed_size_list``,
    nested as deep as the shape, of the features' exact element type, are one feature when
    every row has the features' shape. A row of another shape, an empty value at any depth or
    another element type is refused (LeRobot's cast fails, or changes the values)."""
    shape = value_kind(feature, False)[1]
    element = pa.type_for_alias(str(feature["dtype"]))
    if not shape and column.type == element:  # a scalar, as every writer stores one
        if column.null_count:
            raise FormatError(f"{where}: the rows' {key!r} have empty values")
        return column
    values = column
    if isinstance(values.type, pa.ExtensionType):  # Hugging Face's ArrayND: nested lists
        values = pa.chunked_array([c.storage for c in values.chunks], values.type.storage_type)
    levels, leaf = [], values.type
    while pa.types.is_list(leaf) or pa.types.is_large_list(leaf) or _is_fixed(leaf):
        levels.append(leaf)
        leaf = leaf.value_type
    sizes = tuple((t.list_size if _is_fixed(t) else n) for t, n in zip(levels, shape, strict=False))
    if leaf != element or len(levels) != len(shape) or sizes != shape:
        raise FormatError(
            f"{where}: the rows' {key!r} is {column.type} per row, the features say "
            f"{feature['dtype']} of shape {shape}"
        )
    level, outer = values, 1
    for axis, size in enumerate(shape):
        if level.null_count:
            raise FormatError(f"{where}: the rows' {key!r} have empty values inside a row")
        if not _is_fixed(level.type):
            lengths = as_numpy(pc.list_value_length(level))
            bad = np.flatnonzero(lengths != size)
            if len(bad):
                raise FormatError(
                    f"{where}: row {int(bad[0]) // outer}'s {key!r} holds {int(lengths[bad[0]])} "
                    f"values on axis {axis}, the features say shape {shape}"
                )
        level, outer = pc.list_flatten(level), outer * size
    if level.null_count:
        raise FormatError(f"{where}: the rows' {key!r} have empty values inside a row")
    if values is column and all(_is_fixed(t) for t in levels):
        return column
    return values.cast(_nested(element, shape))


def _check_image_column(column: pa.ChunkedArray, key: str, where: str) -> None:
    """An image feature's rows each hold encoded bytes (LeRobot's struct of bytes and path):
    a row that names a file would send the reader outside the dataset."""
    typ = column.type
    if not pa.types.is_struct(typ) or typ.get_field_index("bytes") < 0:
        raise FormatError(f"{where}: the rows' image {key!r} is {typ}, not a struct with bytes")
    if not pa.types.is_binary(typ.field("bytes").type) and not pa.types.is_large_binary(
        typ.field("bytes").type
    ):
        raise FormatError(f"{where}: the rows' image {key!r} bytes are {typ.field('bytes').type}")
    if any(chunk.field("bytes").null_count for chunk in column.chunks):
        raise FormatError(f"{where}: a row of image {key!r} names a file instead of its bytes")


def decode_image(
    value: object,
    size: tuple[int, int] | None = None,
    allow_path: bool = True,
    channels: int | None = None,
) -> np.ndarray:
    """PNG/JPEG bytes (LeRobot's ``image`` feature: a struct of bytes and path) to HWC uint8,
    one channel per band of the image as stored, as LeRobot's ``ToTensor`` makes them (a
    grayscale PNG is one channel, never made RGB); bytes that are no image raise ValueError, as
    every other lie of an image does.

    ``size`` (height, width) and ``channels``: what the features declare, checked before the
    pixels are decoded (a grayscale PNG of a 3-channel feature is a lie: LeRobot would serve it
    as one channel). ``allow_path``: a row naming a file instead of holding its bytes is read
    from disk (a LeRobot dataset being recorded); shards hold the bytes, and never send a reader
    elsewhere."""
    from PIL import Image  # here: a dataset without images never imports it

    data = image_bytes(value, allow_path)
    try:
        with Image.open(io.BytesIO(data)) as img:
            if size is not None and (img.height, img.width) != tuple(size):
                raise ValueError(
                    f"an image is {img.height}x{img.width}, the features say {size[0]}x{size[1]}"
                )
            bands = len(img.getbands())
            if channels is not None and bands != channels:
                raise ValueError(
                    f"an image is {bands}-channel (PIL mode {img.mode}), the features say "
                    f"{channels} channels"
                )
            if img.mode == "1":  # ToTensor: 0 or 1.0, as 0 or 255 here
                return np.array(img, dtype=np.uint8)[..., None] * np.uint8(255)
            array = np.array(img)  # writable, for torch.from_numpy
            if array.dtype != np.uint8:
                raise ValueError(f"an image of PIL mode {img.mode} is not 8 bits per channel")
            return array.reshape(img.height, img.width, bands)
    except (OSError, SyntaxError, Image.DecompressionBombError) as exc:  # PIL's decode errors
        raise ValueError(f"an image does not decode: {exc}") from exc


def image_bytes(value: object, allow_path: bool = True) -> bytes:
    """An image cell's encoded bytes.

    Args:
        value: the cell (LeRobot's struct of bytes and path, or the bytes).
        allow_path: whether a cell naming a file is read (``decode_image`` says when).
    """
    data = value["bytes"] if isinstance(value, Mapping) else value
    if data is None and isinstance(value, Mapping) and value.get("path"):
        if not allow_path:
            raise ValueError(f"an image names a file ({value['path']!r}) instead of its bytes")
        with open(value["path"], "rb") as f:
            data = f.read()
    if not isinstance(data, bytes):
        raise ValueError(f"an image holds {type(data).__name__}, not encoded bytes")
    return data


def check_header_matches(header: Any, row: Mapping[str, int], where: str) -> None:
    """An episode's header states the episode, length and global index range its manifest
    row (``episode_index``, ``length``, ``dataset_from_index``) does."""
    said = (header.episode_index, header.length, header.dataset_from_index)
    listed = (row["episode_index"], row["length"], row["dataset_from_index"])
    if said != listed:
        raise FormatError(
            f"{where}: the header says episode {said[0]} of {said[1]} frames from index "
            f"{said[2]}, the manifest episode {listed[0]} of {listed[1]} from {listed[2]}"
        )


def check_header_cameras(header: Any, features: Mapping[str, Mapping], where: str) -> None:
    """An episode header's cameras are exactly the video features: a camera the features lack
    is a video no item shows, one they have but the header lacks a video no shard holds."""
    videos = sorted(k for k, f in features.items() if f.get("dtype") == "video")
    if sorted(header.cameras) != videos:
        raise FormatError(
            f"{where}: the header's cameras are {sorted(header.cameras)}, the video features "
            f"{videos}"
        )


def check_camera(camera: Any, feature: Mapping, length: int, key: str, where: str) -> None:
    """A header's camera holds the episode's frames (plus those it drops) at the features'
    frame size."""
    if camera.frames != length + camera.skip_frames + camera.tail_frames:
        raise FormatError(
            f"{where}: camera {key}: the header says {camera.frames} frames, not "
            f"{length} + {camera.skip_frames} skipped + {camera.tail_frames} after"
        )
    height, width = frame_size(feature)
    if (camera.height, camera.width) != (height, width):
        raise FormatError(
            f"{where}: camera {key}: the header says {camera.height}x{camera.width}, "
            f"the features {height}x{width}"
        )
    info = feature.get("info") if isinstance(feature.get("info"), Mapping) else {}
    declared = {"codec": info.get("video.codec"), "pix_fmt": info.get("video.pix_fmt")}
    said = {"codec": camera.codec, "pix_fmt": camera.pix_fmt}
    for name, value in declared.items():
        if value is not None and _canonical(name, value) != _canonical(name, said[name]):
            raise FormatError(
                f"{where}: camera {key}: the header says {name} {said[name]!r}, info.json {value!r}"
            )


def check_stream(context: Any, camera: Any, where: str) -> None:
    """A camera's mp4, as its demuxer reports it (``context``: PyAV's codec context of its
    stream), is of the size, codec and pixel format its header says: a video in another codec
    or pixel format decodes to other pixels than the ones LeRobot serves. Checked before any
    frame is decoded."""
    if context is None:
        raise FormatError(f"{where}: video does not decode: no codec")
    coded = (context.height, context.width)
    if coded != (camera.height, camera.width):
        raise FormatError(
            f"{where}: the video is {coded[0]}x{coded[1]}, its header and the features say "
            f"{camera.height}x{camera.width}"
        )
    codec, pix_fmt = context.codec.canonical_name, context.pix_fmt or ""
    if _canonical("codec", camera.codec) != codec:
        raise FormatError(f"{where}: the video is {codec}, its header says {camera.codec}")
    if pix_fmt != camera.pix_fmt:
        raise FormatError(
            f"{where}: the video's pixel format is {pix_fmt or 'unknown'}, its header says "
            f"{camera.pix_fmt or 'unknown'}"
        )


def _canonical(name: str, value: Any) -> Any:
    """A codec by its canonical name (``libsvtav1`` and ``libdav1d`` are ``av1``, as PyAV
    names them); any other value as it is."""
    if name != "codec" or not isinstance(value, str):
        return value
    import av

    for mode in ("r", "w"):
        try:
            return av.Codec(value, mode).canonical_name
        except (av.error.FFmpegError, ValueError):  # PyAV: UnknownCodecError is a ValueError
            continue
    return value


def check_features(features: Any, where: str) -> dict[str, dict]:
    """``features`` as ``info.json`` has them: each a dtype and a shape of positive ints."""
    for key, feature in mapping(features, where, "features").items():
        feature = mapping(feature, where, f"feature {key!r}")
        dtype = text(feature.get("dtype"), where, f"feature {key!r} dtype")
        if dtype not in DTYPES:
            raise FormatError(
                f"{where}: feature {key!r} has dtype {dtype!r}, which lerobot-shards does not "
                f"read (it reads {', '.join(sorted(DTYPES))})"
            )
        if (dtype == "language") != (key in LANGUAGE_COLUMNS):
            raise FormatError(
                f"{where}: feature {key!r} has dtype {dtype!r}; LeRobot reads language columns "
                f"by name, and only {list(LANGUAGE_COLUMNS)}, as dtype 'language'"
            )
        shape = feature.get("shape")
        if not isinstance(shape, list | tuple) or not shape:
            raise FormatError(f"{where}: feature {key!r} shape must be a list, got {shape!r}")
        for n in shape:
            integer(n, where, f"feature {key!r} shape", minimum=1, maximum=2**31)
        if feature["dtype"] in ("video", "image") and len(shape) != 3:
            raise FormatError(f"{where}: camera {key!r} shape must be 3 numbers, got {shape!r}")
        check_names(feature.get("names"), feature["dtype"], shape, f"{where}: feature {key!r}")
        if is_depth_map(feature):
            check_depth_feature(feature, f"{where}: feature {key!r}")
    return features


def check_names(names: Any, dtype: str, shape: Sequence[int], where: str) -> None:
    """A feature's ``names``, where a list, as LeRobot writes them: a camera's one per axis
    (``["height", "width", "channels"]``), any other feature's one per value of its last
    axis (one per axis also, where it has several). A dict (``{"motors": [...]}``, LeRobot
    v2's) or null says nothing to check."""
    if not isinstance(names, list):
        return
    if dtype in ("video", "image"):
        allowed = {len(shape)}
    else:
        allowed = {shape[-1]} if len(shape) == 1 else {shape[-1], len(shape)}
    if len(names) not in allowed:
        raise FormatError(f"{where}: {len(names)} names {names} for shape {list(shape)}")


def check_camera_keys(
    features: Mapping[str, Mapping], camera_keys: list[str], video_keys: list[str], where: str
) -> None:
    """The index's camera and video keys are exactly the features' images and videos."""
    videos = [k for k, f in features.items() if f.get("dtype") == "video"]
    images = [k for k, f in features.items() if f.get("dtype") == "image"]
    if sorted(video_keys) != sorted(videos):
        raise FormatError(f"{where}: video_keys {video_keys} but the video features are {videos}")
    if sorted(camera_keys) != sorted(videos + images):
        raise FormatError(
            f"{where}: camera_keys {camera_keys} but the image and video features are "
            f"{videos + images}"
        )


@dataclass(frozen=True)
class CheckedRows:
    """Manifest rows that passed :func:`check_manifest`, with what the checks found on the way:
    the rows whose shard path is not ``format.shard_path``'s and every checksum's digest
    (``format.checksum_digests``)."""

    table: pa.Table
    other_shards: np.ndarray
    digests: np.ndarray

    def filter(self, keep: np.ndarray) -> CheckedRows:
        """The rows ``keep`` (a mask) marks."""
        rows = np.flatnonzero(keep)
        other = np.flatnonzero(np.isin(rows, self.other_shards))
        return CheckedRows(self.table.filter(keep), other, self.digests[rows])


def check_manifest(
    table: pa.Table, where: str, first_row: int = 0, after: tuple[int, int] | None = None
) -> pa.Table:
    """The manifest with its columns' types (:func:`checked_manifest`, which says more)."""
    return checked_manifest(table, where, first_row, after).table


def checked_manifest(
    table: pa.Table, where: str, first_row: int = 0, after: tuple[int, int] | None = None
) -> CheckedRows:
    """The manifest with its columns' types, sorted unique episodes, lengths that match their
    index ranges, spans and members that fit, shard paths confined to the root, checksums
    that are checksums; columnar (numpy over the columns' bytes, chunk by chunk: no copy of the
    members, no regular expression over a million strings), so a million rows check in a
    fraction of a second.

    A part of a manifest (:class:`ManifestFile` reads one a batch at a time) is its rows from
    ``first_row`` on, ``after`` the ``(episode_index, dataset_to_index)`` of the row before."""
    try:
        table = table.select(MANIFEST_SCHEMA.names).cast(MANIFEST_SCHEMA)
    except (pa.ArrowException, KeyError, ValueError) as exc:
        raise FormatError(f"{where}: manifest columns have the wrong types: {exc}") from exc
    for name in MANIFEST_SCHEMA.names:
        if table.column(name).null_count:
            raise FormatError(f"{where}: manifest column {name!r} has empty values")
    episodes = as_numpy(table.column("episode_index"))
    lengths = as_numpy(table.column("length"))
    starts = as_numpy(table.column("dataset_from_index"))
    stops = as_numpy(table.column("dataset_to_index"))
    offsets = as_numpy(table.column("offset"))
    sizes = as_numpy(table.column("size"))
    shards = table.column("shard")

    def refuse(bad: np.ndarray, problem: str) -> None:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise FormatError(
                f"{where}: episode {int(episodes[row])} (row {first_row + row}, shard "
                f"{shards[row].as_py()!r}): {problem}"
            )

    before_episode, before_stop = (-1, 0) if after is None else after
    refuse(episodes < 0, "negative episode_index")
    unsorted = np.diff(episodes, prepend=before_episode) <= 0
    refuse(unsorted, "episodes are not sorted and unique")
    refuse(lengths < 1, "length must be at least 1")
    refuse((starts < 0) | (stops - starts != lengths), "dataset_to_index - from_index != length")
    overlap = starts < np.concatenate([[before_stop], stops[:-1]])
    refuse(overlap, "its index range overlaps the previous episode's, or comes before it")
    refuse((offsets < 0) | (sizes < 1), "negative offset or empty span")
    other = np.flatnonzero(~equal_strings(shards, shard_paths(episodes)))  # not shard_path's
    confined = np.ones(len(episodes), bool)
    if len(other):
        matched = pc.match_substring_regex(shards.take(other), SHARD_PATH)
        confined[other] = as_numpy(matched, zero_copy_only=False)
    refuse(~confined, "shard path is not a relative path under shards/")
    digests, valid = checksum_digests(table.column("checksum"))
    refuse(~valid, "checksum is not sha256:<64 hex digits>")
    bad_rows = np.zeros(len(episodes), dtype=bool)
    row = 0
    for chunk in table.column("members").chunks:
        name, m_offsets, m_sizes = chunk.flatten().flatten()
        if name.null_count or m_offsets.null_count or m_sizes.null_count:
            raise FormatError(f"{where}: manifest column 'members' has empty values")
        counts = np.diff(as_numpy(chunk.offsets))
        m_offsets, m_sizes = as_numpy(m_offsets), as_numpy(m_sizes)
        rows = slice(row, row + len(chunk))
        width = int(counts[0]) if len(counts) else 0
        if width and (counts == width).all():  # as many members each: a matrix, no gather
            m_offsets, m_sizes = m_offsets.reshape(-1, width), m_sizes.reshape(-1, width)
            begins, ends = offsets[rows, None], (offsets[rows] + sizes[rows])[:, None]
            outside = (m_offsets < begins) | (m_sizes < 0) | (m_offsets + m_sizes > ends)
            bad_rows[rows] |= outside.any(axis=1)
        else:
            owner = np.repeat(np.arange(row, row + len(chunk)), counts)
            outside = (m_offsets < offsets[owner]) | (m_sizes < 0)
            outside |= m_offsets + m_sizes > offsets[owner] + sizes[owner]
            bad_rows[owner[outside]] = True
        row += len(chunk)
    refuse(bad_rows, "a member lies outside the episode's span")
    return CheckedRows(table, other, digests)


def check_totals(index: Any, manifest: pa.Table, where: str) -> None:
    """``index.json``'s totals are the manifest's: no episode dropped or added."""
    totals = {
        "total_episodes": manifest.num_rows,
        "total_frames": int(pc.sum(manifest.column("length")).as_py() or 0),
        "total_bytes": int(pc.sum(manifest.column("size")).as_py() or 0),
    }
    for name, value in totals.items():
        if getattr(index, name) != value:
            raise FormatError(
                f"{where}: index.json {name}={getattr(index, name)}, manifest: {value}"
            )


def check_ranges(
    manifest: pa.Table,
    info: Mapping[str, Any],
    where: str,
    shard_of: Callable[[int], str] | None = None,
) -> None:
    """The manifest's global index ranges (disjoint and in episode order: :func:`check_manifest`)
    lie within the source's ``total_frames`` (``info.json``); where the manifest holds as many
    episodes as the source, they hold its ``total_frames``, so they tile ``[0, total_frames)``
    as LeRobot numbers them, with no gap. ``shard_of(row)``: a row's shard, where ``manifest``
    holds its numbers only."""
    total_frames, total_episodes = info.get("total_frames"), info.get("total_episodes")
    if total_frames is None:
        return
    total_frames = integer(total_frames, where, "total_frames")
    stops = as_numpy(manifest.column("dataset_to_index"))
    episodes = as_numpy(manifest.column("episode_index"))
    past = np.flatnonzero(stops > total_frames)
    if len(past):
        row = int(past[0])
        shard = shard_of(row) if shard_of else manifest.column("shard")[row].as_py()
        raise FormatError(
            f"{where}: episode {int(episodes[row])} (row {row}, shard {shard!r}): "
            f"its index range ends at {int(stops[row])}, past info.json's {total_frames} frames"
        )
    frames = int(pc.sum(manifest.column("length")).as_py() or 0)
    if total_episodes == manifest.num_rows and frames != total_frames:
        raise FormatError(
            f"{where}: info.json says {total_episodes} episodes of {total_frames} frames; the "
            f"manifest's {manifest.num_rows} episodes hold {frames}: their index ranges leave gaps"
        )


class MissingStatsWarning(UserWarning):
    """``meta/stats.json`` has no statistics of some features: LeRobot reads such a dataset
    (its ``add_features`` writes one) and normalizes none of those features."""


STATS_EXEMPT = frozenset(["string", "language"])
"""Feature dtypes LeRobot computes no statistics of (``compute_episode_stats``)."""


def check_stats(stats: Any, features: Mapping[str, Mapping], where: str) -> dict[str, Any]:
    """``meta/stats.json`` as numpy arrays (LeRobot's ``cast_stats_to_numpy``), as LeRobot
    writes it: no entry of what is not a feature, and one per feature but text ones (a feature
    without is warned of: :class:`MissingStatsWarning`), the cameras' with the same
    statistics, the other features' with the same statistics (LeRobot's quantile script may
    leave the cameras' as they were), each a rectangular array of finite numbers of its
    feature's shape (``count`` one number, a camera's stats one per channel, ``(C, 1, 1)``,
    any other the feature's shape, or its last axis': LeRobot's recorder writes those of a
    feature of several axes so). LeRobot normalizes with them: a NaN would train on NaN."""
    stats = mapping(stats, where, "stats")
    unknown = sorted(k for k in stats if k not in features)
    if unknown:
        raise FormatError(f"{where}: stats of {unknown}, which are not features")
    missing = [
        k for k, f in features.items() if f.get("dtype") not in STATS_EXEMPT and k not in stats
    ]
    if missing:
        warnings.warn(
            f"{where}: no statistics of the features {missing} (LeRobot's add_features and "
            "image-to-video conversion write none): LeRobot normalizes none of them, so a "
            "policy that takes one in or out trains on its raw values",
            MissingStatsWarning,
            stacklevel=2,
        )
    out: dict[str, Any] = {}
    names: dict[bool, tuple[str, list[str]]] = {}  # by whether the feature is a camera
    for key, feature_stats in stats.items():
        feature_stats = mapping(feature_stats, where, f"stats of {key!r}")
        feature = features[key]
        camera = feature.get("dtype") in ("video", "image")
        first, first_names = names.setdefault(camera, (key, sorted(feature_stats)))
        if sorted(feature_stats) != first_names:
            raise FormatError(
                f"{where}: the stats of {key!r} are {sorted(feature_stats)}, those of "
                f"{first!r} {first_names}"
            )
        if camera:
            shape = (value_kind(feature, False)[1][0], 1, 1)
        else:
            shape = tuple(feature.get("shape", ()))
        out[key] = {}
        for name, value in feature_stats.items():
            try:
                array = np.array(value, dtype=np.float64)
            except (ValueError, TypeError) as exc:
                raise FormatError(
                    f"{where}: stat {name!r} of {key!r} is not an array of numbers: {exc}"
                ) from exc
            want = (1,) if name == "count" else shape
            # LeRobot's recorder computes a feature's stats along its last axis (its
            # RunningQuantileStats): a (2, 3) feature's are of shape (3,), and broadcast
            if array.shape != want and (camera or name == "count" or array.shape != want[-1:]):
                raise FormatError(
                    f"{where}: stat {name!r} of {key!r} has shape {array.shape}, the feature {want}"
                )
            if not np.isfinite(array).all():
                raise FormatError(f"{where}: stat {name!r} of {key!r} is not finite (NaN or inf)")
            out[key][name] = np.array(value)
    return out


def check_tasks(indices: list[Any], where: str) -> None:
    """``meta/tasks.parquet``'s task_index: exactly 0..n-1 (any order)."""
    if sorted(indices) != list(range(len(indices))):
        raise FormatError(f"{where}: task_index must be 0..{len(indices) - 1}, each once")


def check_header_camera(raw: Any, where: str) -> dict[str, Any]:
    """One camera of an episode header, every field typed and in range."""
    raw = mapping(raw, where, "camera")
    return {
        **raw,
        "codec": text(raw.get("codec"), where, "codec"),
        "width": integer(raw.get("width"), where, "width", 1, MAX_SIDE),
        "height": integer(raw.get("height"), where, "height", 1, MAX_SIDE),
        "pix_fmt": text(raw.get("pix_fmt"), where, "pix_fmt"),
        "fps": number(raw.get("fps"), where, "fps"),
        "frames": integer(raw.get("frames"), where, "frames", 1),
        "skip_frames": integer(raw.get("skip_frames", 0), where, "skip_frames"),
        "tail_frames": integer(raw.get("tail_frames", 0), where, "tail_frames"),
    }


def check_header(raw: Any, where: str) -> dict[str, Any]:
    """An episode header's fields typed and in range (cameras: :func:`check_header_camera`)."""
    raw = mapping(raw, where, "header")
    length = integer(raw.get("length"), where, "length", 1)
    start = integer(raw.get("dataset_from_index"), where, "dataset_from_index")
    stop = integer(raw.get("dataset_to_index"), where, "dataset_to_index")
    if stop - start != length:
        raise FormatError(f"{where}: dataset_to_index - dataset_from_index != length")
    cameras = mapping(raw.get("cameras", {}), where, "cameras")
    return {
        **raw,
        "episode_index": integer(raw.get("episode_index"), where, "episode_index"),
        "tasks": texts(raw.get("tasks"), where, "tasks"),
        "cameras": {
            text(key, where, "camera key"): check_header_camera(cam, f"{where} camera {key}")
            for key, cam in cameras.items()
        },
    }


def check_tar_member(
    data: memoryview | bytes, offset: int, size: int, name: str, where: str
) -> None:
    """The tar header before a member's data (offset within ``data``) names it (when the name
    fits the header's 100 bytes; a longer one is in a PAX header before it) and gives the size
    the manifest gives; a manifest that says otherwise is refused."""
    if offset < 512:
        raise FormatError(f"{where}: member {name!r} has no tar header before it")
    block = bytes(data[offset - 512 : offset])
    stored = block[:100].rstrip(b"\0").decode("utf-8", "replace")
    if len(name.encode()) < 100 and stored != name:
        raise FormatError(f"{where}: the tar holds {stored!r} where the manifest says {name!r}")
    field = block[124:136].rstrip(b"\0 ").decode("ascii", "replace")
    if not re.fullmatch(r"[0-7]+", field) or int(field, 8) != size:
        raise FormatError(
            f"{where}: member {name!r} is {field!r} (octal) bytes in the tar, "
            f"{size} in the manifest"
        )


# --------------------------------------------------------------------------------------------
# The format's files read back, every field checked
# --------------------------------------------------------------------------------------------


def parse_header(data: bytes | str, where: str = "episode header") -> EpisodeHeader:
    """An episode's JSON header, every field checked (:func:`check_header`)."""
    try:
        raw = check_header(json.loads(data), where)
        cameras = {k: CameraHeader(**c) for k, c in raw.pop("cameras").items()}
        return EpisodeHeader(**raw, cameras=cameras)
    except (ValueError, TypeError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{where}: not a valid episode header: {exc}") from exc


def parse_index(data: bytes | str, where: str = INDEX_FILE) -> DatasetIndex:
    """``index.json``'s contents, every field checked; a newer format version is refused."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise FormatError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise FormatError(f"{where}: unknown format {got!r}, expected {FORMAT_NAME!r}")
    version = integer(raw.get("format_version"), where, "format_version", minimum=1)
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{where}: format version {version!r} is newer than this reader supports "
            f"({FORMAT_VERSION}); upgrade lerobot-shards"
        )
    known = set(DatasetIndex.__dataclass_fields__)
    try:
        index = DatasetIndex(**{k: val for k, val in raw.items() if k in known})
    except TypeError as exc:
        raise FormatError(f"{where}: incomplete index: {exc}") from exc
    text(index.codebase_version, where, "codebase_version")
    number(index.fps, where, "fps")
    check_features(index.features, where)
    for name in ("total_episodes", "total_frames", "total_bytes"):
        integer(getattr(index, name), where, name)
    text(index.writer_version, where, "writer_version")
    text(index.manifest_checksum, where, "manifest_checksum")
    texts(index.camera_keys, where, "camera_keys")
    texts(index.video_keys, where, "video_keys")
    check_camera_keys(index.features, index.camera_keys, index.video_keys, where)
    return index


def read_index(fs: fsspec.AbstractFileSystem, root: str) -> DatasetIndex:
    """Read ``index.json`` of a converted dataset, with a clear error if it is not one."""
    path = join(root, INDEX_FILE)
    try:
        data = read_whole(fs, path)
    except FileNotFoundError as exc:
        raise FormatError(
            f"{path} not found: {root} is not a finished lerobot-shards dataset "
            "(convert it first, or rerun an interrupted conversion)"
        ) from exc
    return parse_index(data, where=path)


MANIFEST_BATCH = 65536
"""Manifest rows read, checked and handed on at a time: a million episodes' manifest is half a
gigabyte as one Arrow table, and reading it whole took four times the CPU of reading it a
batch at a time (each batch's memory reused for the next)."""


class ManifestFile:
    """A manifest file's bytes (read from ``path``), read back a batch of rows at a time."""

    def __init__(self, data: bytes | pa.Buffer, path: str) -> None:
        self.path = path
        try:
            self._file = pq.ParquetFile(pa.BufferReader(data))
        except Exception as exc:
            raise FormatError(f"{path}: manifest does not parse: {exc}") from exc
        names = self._file.schema_arrow.names
        missing = [n for n in MANIFEST_SCHEMA.names if n not in names]
        if missing:
            raise FormatError(f"{path}: manifest lacks columns {missing}")
        self.num_rows = self._file.metadata.num_rows

    def numbers(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Every row's ``names`` (integer columns) and nothing else decoded: a summary's
        columns (``inspect``), checked for their type and for empty values, not the rows."""
        try:
            table = self._file.read(columns=list(names), use_threads=False)
            table = table.cast(pa.schema([MANIFEST_SCHEMA.field(n) for n in names]))
        except Exception as exc:
            raise FormatError(f"{self.path}: manifest does not parse: {exc}") from exc
        out = {}
        for name in names:
            column = table.column(name)
            if column.null_count:
                raise FormatError(f"{self.path}: manifest column {name!r} has empty values")
            out[name] = column.to_numpy()
        return out

    def first_row(self) -> pa.Table:
        """The first row, checked (:func:`check_manifest`), of every column; no row if none."""
        if not self._file.metadata.num_row_groups:
            return check_manifest(MANIFEST_SCHEMA.empty_table(), self.path)
        try:
            batch = next(self._file.iter_batches(1, columns=MANIFEST_SCHEMA.names), None)
        except Exception as exc:
            raise FormatError(f"{self.path}: manifest does not parse: {exc}") from exc
        if batch is None:
            return check_manifest(MANIFEST_SCHEMA.empty_table(), self.path)
        return check_manifest(pa.Table.from_batches([batch]), self.path)

    def batches(self) -> Iterator[CheckedRows]:
        """Every row, in order, a checked batch at a time (:func:`checked_manifest`: each
        batch's rows after the previous batch's too)."""
        # one thread: decoding the columns on several took a fifth more CPU time in all (a
        # million rows: 0.53 s against 0.43 s), and the DataLoader's workers want the cores
        batches = self._file.iter_batches(
            MANIFEST_BATCH, columns=MANIFEST_SCHEMA.names, use_threads=False
        )
        row, after = 0, None
        while True:
            try:
                batch = next(batches, None)
            except Exception as exc:
                raise FormatError(f"{self.path}: manifest does not parse: {exc}") from exc
            if batch is None:
                return
            rows = checked_manifest(pa.Table.from_batches([batch]), self.path, row, after)
            table = rows.table
            if table.num_rows:
                last = table.slice(table.num_rows - 1)
                after = (last["episode_index"][0].as_py(), last["dataset_to_index"][0].as_py())
            row += table.num_rows
            yield rows


def read_manifest(fs: fsspec.AbstractFileSystem, path: str) -> pa.Table:
    """Read and validate ``manifest.parquet``.

    One whole-file read: on object storage that is one GET, where parquet's own reader asks for
    the footer and the columns apart (it matters when a mixture opens hundreds of manifests)."""
    data = read_large(fs, path)  # outside the parse: a failed read is not a bad manifest
    return parse_manifest(data, path)


def parse_manifest(data: bytes | pa.Buffer, path: str) -> pa.Table:
    """The manifest file ``data`` (read from ``path``), parsed and validated, as one table (of
    a chunk per batch read)."""
    tables = [rows.table for rows in ManifestFile(data, path).batches()]
    return (
        pa.concat_tables(tables) if tables else check_manifest(MANIFEST_SCHEMA.empty_table(), path)
    )
