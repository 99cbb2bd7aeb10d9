"""The lies the fuzz tells (``fuzz_shards.py``), each drawn by a chooser into a converted
dataset taken apart (``mutate.Parts``), and where each is told, for the counts.

A lie is told in one place or, coordinated, in every file that states the fact (a header, its
rows and the manifest; index.json and info.json; every header's cameras), with plausible values
(off by one, swapped width and height, NaN and infinite fps, sizes near the limits) as well as
absurd ones, in index.json, info.json, stats.json, tasks.parquet, the manifest, the episode
headers, the rows, the images in them, the videos, the tar headers themselves, and the tar
members (extra, missing, reordered); the episodes' shards are one per episode, pairs, or all in
one tar. Pixel values and numbers inside valid rows are content, not lies, and are not made.

A chooser is hypothesis's ``st.data()`` (CI: shrinks a failing case to its simplest) or a
seeded ``random.Random`` (``scripts/fuzz_shards.py``: a case replays from its seed).
"""

from __future__ import annotations

import io
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from mutate import Parts, black_mp4, set_tar_field
from PIL import Image

from lerobot_shards.format import MANIFEST_SCHEMA, STATS_FILE, TASKS_FILE

READS = ("plain", "delta", "mixture", "plain", "delta", "mixture", "loader")
"""What a case reads besides the plain epoch (the loader's worker start is the slow one)."""

GAPS: dict[str, str] = {}
"""Lies the reader at hand (issue 36's branch) does not catch yet, by where the lie is (and
``|read`` where only that read fails): CI leaves them out, ``scripts/fuzz_shards.py`` draws
them and marks them."""


def known_gap(case: Case) -> str | None:
    """Why ``case`` is a lie the reader does not catch yet (``GAPS``), or None."""
    for key in [case.where, *(f"{case.where}|{how}" for how in case.reads)]:
        if key in GAPS:
            return GAPS[key]
    return None


Choose = Callable[[str, Sequence[Any]], Any]
"""``choose(label, options)``: one of ``options`` (the label names the draw)."""


def random_chooser(seed: int) -> Choose:
    rng = random.Random(seed)
    return lambda label, options: options[rng.randrange(len(options))]


def hypothesis_chooser(data: Any) -> Choose:
    from hypothesis import strategies as st

    return lambda label, options: data.draw(st.sampled_from(list(options)), label=label)


@dataclass
class Edits:
    """What ``put_together`` is given besides the parts (``mutate.py``)."""

    rows: Callable[[list[dict]], None] | None = None
    index: Callable[[dict], None] | None = None
    shard: Callable[[int, bytearray, dict], None] | None = None
    rechecksum: bool = False


@dataclass
class Case:
    where: str
    """The lie's file and field (or what it coordinates), for the counts."""
    description: str
    edits: Edits
    reads: list[str]
    layout: str


# --- the lies ---------------------------------------------------------------------------------

NAN, INF = math.nan, math.inf
ABSURD = [None, -1, 0, 1, 3, 10**12, "1", "x", [], {}, ["x"], True, 1.5]
LIMITS = [2**31 - 1, 2**31, 2**63 - 1, -(2**63), NAN, INF, -INF]
SHARDS = ["/etc/passwd", "../outside.tar", "s3://other/x.tar", "shards/000/episode-000001.tar"]


def plausible(value: Any) -> list[Any]:
    """Values a writer might get wrong for ``value``: off by one, doubled, negated, the same
    number as a float, near the limits, of another type."""
    out: list[Any] = [*ABSURD, *LIMITS]
    if isinstance(value, int | float) and not isinstance(value, bool):
        out += [value - 1, value + 1, value * 2, -value, float(value)]
    elif isinstance(value, str):
        out += [value + "x", value.upper(), ""]
    elif isinstance(value, list) and value:
        out += [value[:-1], [*value, value[-1]], value[::-1]]
    return out


def relative(choose: Choose, rows: int) -> tuple[str, Any]:
    """A change of a number as it will be: set, shifted, or another row's."""
    return choose(
        "change",
        [("=", v) for v in [*ABSURD, *LIMITS]]
        + [("+", d) for d in (1, -1, 512, -512, 2**31)]
        + [("row", r) for r in range(rows)],
    )


def changed(value: Any, change: tuple[str, Any], rows: list[dict], column: str) -> Any:
    op, arg = change
    if op == "=":
        return arg
    if op == "row":
        return rows[arg % len(rows)].get(column)
    return value + arg if isinstance(value, int) and not isinstance(value, bool) else arg


def set_layout(parts: Parts, layout: str) -> None:
    """Which episodes share a tar: each its own, pairs, or all in one."""
    for i, row in enumerate(parts.rows):
        if layout == "pairs":
            row["shard"] = f"shards/000/pair-{i // 2}.tar"
        elif layout == "all in one":
            row["shard"] = "shards/000/all.tar"


def lie_index(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    key = choose("index.json key", sorted(parts.index))
    v = choose("value", ["<deleted>", *plausible(parts.index[key])])

    def edit(index: dict) -> None:
        index.pop(key) if v == "<deleted>" else index.__setitem__(key, v)

    return f"index.json:{key}", f"index.json {key}={v!r}", Edits(index=edit)


def lie_info(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    key = choose(
        "info.json key",
        ["fps", "total_episodes", "total_frames", "total_tasks", *sorted(parts.info["features"])],
    )
    if key in parts.info["features"]:
        what = choose("field", ["dtype", "shape", "names", "<deleted>"])
        feature = parts.info["features"][key]
        if what == "<deleted>":
            parts.info["features"].pop(key)
            return "info.json:feature", f"info.json feature {key} deleted", Edits()
        v = choose(
            "value",
            [*plausible(feature.get(what)), "video", "image", "int64", "float64", [2], [1, 2, 3]],
        )
        feature[what] = v
        return f"info.json:feature.{what}", f"info.json {key}.{what}={v!r}", Edits()
    v = choose("value", plausible(parts.info.get(key)))
    parts.info[key] = v
    return f"info.json:{key}", f"info.json {key}={v!r}", Edits()


def both_features(parts: Parts) -> list[dict]:
    return [parts.index["features"], parts.info["features"]]


def camera_lists(parts: Parts) -> None:
    """index.json's camera and video keys as the (changed) features say: coordinated."""
    features = parts.info["features"]
    old = parts.index["camera_keys"] + [k for k in features if k not in parts.index["camera_keys"]]
    cams = [k for k in old if features.get(k, {}).get("dtype") in ("video", "image")]
    parts.index["camera_keys"] = cams
    parts.index["video_keys"] = [k for k in cams if features[k]["dtype"] == "video"]


def lie_feature_everywhere(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    """One feature told differently, alike in index.json and info.json (and their key lists)."""
    key = choose("feature", sorted(parts.info["features"]))
    feature = parts.info["features"][key]
    op = choose("op", ["removed", "dtype", "shape", "names"])
    shape = list(feature["shape"])
    if op == "removed":
        value: Any = None
    elif op == "dtype":
        value = choose(
            "dtype",
            [
                d
                for d in [
                    "string",
                    "float64",
                    "float32",
                    "int64",
                    "int32",
                    "bool",
                    "image",
                    "video",
                ]
                if d != feature["dtype"]
            ],
        )
    elif op == "shape":
        value = choose(
            "shape",
            [
                [*shape[:-1], shape[-1] - 1],
                [*shape[:-1], shape[-1] + 1],
                [*shape, 1],
                [math.prod(shape)],
                [shape[1], shape[0], *shape[2:]] if len(shape) > 1 else [2, 2],
                [shape[0] + 1, *shape[1:]],
                [2**31, *shape[1:]],
            ],
        )
    else:
        names = feature.get("names") or []
        value = choose(  # each of a length no axis has (["extra"] would name a scalar)
            "names",
            [
                v
                for v in (names[:-1], [*names, "extra"], ["x"] * (len(names) + 2))
                if len(v) not in (shape[-1], len(shape))
            ],
        )
    for features in both_features(parts):
        if op == "removed":
            features.pop(key)
        else:
            features[key] = {**features[key], op: value}
    camera_lists(parts)
    where = f"index+info:feature {op}"
    if op == "removed" and feature["dtype"] == "video":
        where = "index+info:camera removed"
    elif op == "dtype" and str(value)[:3] == feature["dtype"][:3]:  # float32 as float64, say
        where = "index+info:feature dtype of its kind"
    return where, f"index.json and info.json {key} {op} {value!r}", Edits()


def lie_fps_everywhere(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    v = choose("fps", [NAN, INF, -INF, 0, -10, 9, 11, 10.5, 20, 5, 1e308, 1e-9, "10", 10.0])
    headers = choose("headers too", [False, True])
    parts.index["fps"] = parts.info["fps"] = v
    for features in both_features(parts):
        for ft in features.values():
            if isinstance(ft.get("info"), dict) and "video.fps" in ft["info"]:
                ft["info"]["video.fps"] = v
    if headers:
        for row in range(len(parts.rows)):
            header = parts.header(row)
            for camera in header["cameras"].values():
                camera["fps"] = v
            parts.set_header(row, header)
    where = "index+info+headers:fps" if headers else "index+info:fps"
    return where, f"fps={v!r} in index.json, info.json{' and headers' if headers else ''}", Edits()


def lie_manifest(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    rows = len(parts.rows)
    row = choose("row", range(rows))
    columns = [c for c in MANIFEST_SCHEMA.names if c != "members"]
    column = choose(
        "column",
        [
            *columns,
            "members.0.size",
            "members.1.offset",
            "members.0.name",
            "members.-1.size",
            "<reverse>",
            "<duplicate>",
            "<drop>",
        ],
    )
    change = relative(choose, rows)
    if column == "shard":
        change = ("=", choose("shard", SHARDS))
    rechecksum = choose("checksums after", [False, True])

    def edit(all_rows: list[dict]) -> None:
        if column == "<reverse>":
            all_rows.reverse()
        elif column == "<duplicate>":
            all_rows.insert(row, dict(all_rows[row]))
        elif column == "<drop>":
            all_rows.pop(row)
        elif column.startswith("members."):
            _, i, name = column.split(".")
            members = all_rows[row]["members"]
            member = members[int(i) % len(members)]
            if change[0] == "row":  # the same member of another row
                others = all_rows[change[1] % len(all_rows)]["members"]
                member[name] = others[int(i) % len(others)][name]
            else:
                member[name] = changed(member[name], change, all_rows, name)
        else:
            all_rows[row][column] = changed(all_rows[row][column], change, all_rows, column)

    how = f"{change[0]}{change[1]!r}" + (" (checksums taken again)" if rechecksum else "")
    return (
        f"manifest:{column.split('.')[0] if column.startswith('members') else column}",
        f"manifest row {row} {column} {how}",
        Edits(rows=edit, rechecksum=rechecksum),
    )


def lie_header(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    row = choose("row", range(len(parts.rows)))
    header = parts.header(row)
    cameras = sorted(header["cameras"])
    camera = choose("camera", [None, *cameras]) if cameras else None
    target = header["cameras"][camera] if camera else header
    fields = (
        ["codec", "width", "height", "pix_fmt", "fps", "frames", "skip_frames", "tail_frames"]
        if camera
        else [
            "episode_index",
            "length",
            "dataset_from_index",
            "dataset_to_index",
            "tasks",
            "cameras",
        ]
    )
    name = choose("field", fields)
    extra = {
        "codec": ["h264", "mpeg4", "vp9", "AV1"],
        "pix_fmt": ["yuv444p", "yuv420p10le", "gray", "rgb24"],
        "width": [target.get("height"), 16384, 16385],
        "height": [target.get("width"), 16384, 16385],
        "tasks": [["push the T"]],
    }
    v = choose("value", ["<deleted>", *plausible(target.get(name)), *extra.get(name, [])])
    if v == "<deleted>":
        target.pop(name, None)
    else:
        target[name] = v
    parts.set_header(row, header)
    return (
        f"header:{'camera.' if camera else ''}{name}",
        f"header {row} {camera or ''}.{name}={v!r}",
        Edits(),
    )


def set_rows(parts: Parts, row: int, edit: Callable[[pa.Table], pa.Table]) -> None:
    parts.set_table(row, edit(parts.table(row)))


def column_set(table: pa.Table, name: str, values: Any) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), name, values)


def lie_global_index(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    """An episode's global frame indices told otherwise in its header, its rows and the
    manifest, alike or in some of them; or every episode's shifted alike."""
    rows = len(parts.rows)
    row = choose("row", range(rows))
    places = choose(
        "places",
        [
            "header+rows+manifest",
            "header+rows",
            "manifest",
            "rows",
            "header",
            "every episode, everywhere",
        ],
    )
    start = parts.rows[row]["dataset_from_index"]
    new = choose(
        "new start",
        [start - 1, start + 1, 0, start + 1000, 2**40]
        + [parts.rows[r]["dataset_from_index"] for r in range(rows)],
    )
    shift = new - start
    targets = range(rows) if places.startswith("every") else [row]
    for r in targets:
        length = parts.rows[r]["length"]
        first = parts.rows[r]["dataset_from_index"] + shift
        if "manifest" in places or places.startswith("every"):
            parts.rows[r]["dataset_from_index"], parts.rows[r]["dataset_to_index"] = (
                first,
                first + length,
            )
        if "header" in places or places.startswith("every"):
            header = parts.header(r)
            header["dataset_from_index"], header["dataset_to_index"] = first, first + length
            parts.set_header(r, header)
        if "rows" in places or places.startswith("every"):
            set_rows(
                parts,
                r,
                lambda t, f=first: column_set(
                    t, "index", pa.array(range(f, f + t.num_rows), pa.int64())
                ),
            )
    return (
        f"global index:{places}",
        f"episode row {row}'s global indices from {new} ({places})",
        Edits(),
    )


def lie_rows(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    row = choose("row", range(len(parts.rows)))
    table = parts.table(row)
    name = choose("column", [c for c in table.column_names if "images" not in c])
    op = choose(
        "op",
        [
            "drop",
            "as text",
            "short",
            "nulls",
            "task -1",
            "task 99",
            "wider",
            "float64",
            "int32",
            "as list",
            "as large_list",
            "ragged list",
            "null inside",
            "extra column",
            "renamed",
            "columns reversed",
            "rows reversed",
            "duplicate row",
            "frame_index +1",
            "frame_index reversed",
            "timestamp *2",
            "timestamp +1 frame",
            "frame_index and timestamp +1",
            "timestamp NaN",
        ],
    )
    n = table.num_rows
    if op == "drop":
        table = table.drop_columns([name])
    elif op == "as text":
        table = column_set(table, name, pa.array([str(x) for x in table[name].to_pylist()]))
    elif op == "short":
        table = table.slice(0, n - 1)
    elif op == "nulls":
        table = column_set(table, name, pa.nulls(n, table[name].type))
    elif op in ("task -1", "task 99"):
        table = column_set(table, "task_index", pa.array([-1 if op == "task -1" else 99] * n))
    elif op == "wider":
        wide = [[*x, 0.0] if isinstance(x, list) else [x, 0.0] for x in table[name].to_pylist()]
        table = column_set(table, name, pa.array(wide))
    elif op in ("float64", "int32"):
        typ = table[name].type
        inner = pa.float64() if op == "float64" else pa.int32()
        cast = pa.list_(inner, typ.list_size) if pa.types.is_fixed_size_list(typ) else inner
        try:
            table = column_set(table, name, table[name].cast(cast))
        except (pa.ArrowException, ValueError):
            table = column_set(table, name, pa.array([str(x) for x in table[name].to_pylist()]))
    elif op in ("as list", "as large_list", "ragged list", "null inside"):
        # LeRobot's merge writes a vector as list<float>, not fixed_size_list: the same values,
        # read unchanged. A row of another length, or an empty value inside one, is refused.
        values = [x if isinstance(x, list) else [x] for x in table[name].to_pylist()]
        if op == "ragged list":
            values[-1] = values[-1][:-1]
        if op == "null inside":
            values[0] = [None, *values[0][1:]]
        typ = table[name].type
        inner = typ.value_type if pa.types.is_fixed_size_list(typ) else typ
        kind = pa.large_list(inner) if op == "as large_list" else pa.list_(inner)
        table = column_set(table, name, pa.array(values, kind))
    elif op == "extra column":
        table = table.append_column("secret", pa.array([0.0] * n, pa.float32()))
    elif op == "renamed":
        table = table.rename_columns([c + "_" if c == name else c for c in table.column_names])
    elif op == "columns reversed":
        table = table.select(table.column_names[::-1])
    elif op == "rows reversed":
        table = table.take(pa.array(range(n - 1, -1, -1)))
    elif op == "duplicate row":
        table = pa.concat_tables([table, table.slice(n - 1, 1)])
    elif op.startswith("frame_index") or op.startswith("timestamp"):
        frame = np.asarray(table["frame_index"].to_pylist())
        stamp = np.asarray(table["timestamp"].to_pylist(), dtype=np.float32)
        if op in ("frame_index +1", "frame_index and timestamp +1"):
            frame = frame + 1
        if op == "frame_index reversed":
            frame = frame[::-1]
        if op == "timestamp *2":
            stamp = stamp * 2
        if op in ("timestamp +1 frame", "frame_index and timestamp +1"):
            stamp = stamp + np.float32(0.1)
        if op == "timestamp NaN":
            stamp[-1] = np.nan
        table = column_set(table, "frame_index", pa.array(frame, pa.int64()))
        table = column_set(table, "timestamp", pa.array(stamp, pa.float32()))
        name = "frame_index/timestamp"
    parts.set_table(row, table)
    return f"rows:{op}", f"rows {row} {op} {name}", Edits()


def png(array: np.ndarray, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).convert(mode).save(out, format="PNG")
    return out.getvalue()


def lie_image(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    """An image feature's cell (or column) holding what its feature does not say."""
    row = choose("row", range(len(parts.rows)))
    table = parts.table(row)
    cameras = [c for c in table.column_names if "images" in c]
    camera = choose("camera", cameras)
    position = choose("position", range(table.num_rows))
    op = choose(
        "op",
        [
            "garbage",
            "half",
            "empty",
            "swapped size",
            "one pixel taller",
            "other camera",
            "path to a real file",
            "RGBA, same pixels",
            "column as plain bytes",
            "bytes as text",
        ],
    )
    cells = table[camera].to_pylist()
    cell = cells[position]
    pixels = np.array(Image.open(io.BytesIO(cell["bytes"])).convert("RGB"))
    h, w = pixels.shape[:2]
    if op == "garbage":
        cell["bytes"] = b"\x89PNG not an image at all" * 3
    elif op == "half":
        cell["bytes"] = cell["bytes"][: len(cell["bytes"]) // 2]
    elif op == "empty":
        cell["bytes"] = b""
    elif op == "swapped size":
        cell["bytes"] = png(np.zeros((w, h, 3), np.uint8))
    elif op == "one pixel taller":
        cell["bytes"] = png(np.concatenate([pixels, pixels[-1:]]))
    elif op == "other camera":
        other = next(c for c in cameras if c != camera)
        cell["bytes"] = table[other].to_pylist()[position]["bytes"]
    elif op == "path to a real file":
        path = Path(parts.scratch) / "elsewhere.png"  # outside the dataset
        path.write_bytes(cell["bytes"])
        cell["bytes"], cell["path"] = None, str(path)
    elif op == "RGBA, same pixels":
        cell["bytes"] = png(pixels, "RGBA")
    if op == "column as plain bytes":
        column = pa.array([c["bytes"] for c in cells], pa.binary())
    elif op == "bytes as text":
        column = pa.array([str(c["bytes"][:8]) for c in cells])
    else:
        column = pa.array(cells, table[camera].type)
    parts.set_table(row, column_set(table, camera, column))
    return f"image:{op}", f"rows {row} {camera} row {position}: {op}", Edits()


def lie_video(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    row = choose("row", range(len(parts.rows)))
    camera = choose("camera", sorted(parts.header(row)["cameras"]))
    op = choose(
        "op",
        [
            "half",
            "empty",
            "other camera",
            "other episode",
            "4096x4096",
            "48x32",
            "swapped size",
            "h264",
            "mpeg4",
            "h264 yuv444p",
            "one frame more",
            "one frame fewer",
        ],
    )
    name = next(n for n, _ in parts.members[row] if n.endswith(f".{camera}.mp4"))
    cam = parts.header(row)["cameras"][camera]
    width, height, frames = cam["width"], cam["height"], cam["frames"]
    data = parts.member(row, name)
    if op == "half":
        data = data[: len(data) // 2]
    elif op == "empty":
        data = b""
    elif op == "other camera":
        other = next(n for n, _ in parts.members[row] if n.endswith(".mp4") and n != name)
        data = parts.member(row, other)
    elif op == "other episode":
        other_row = (row + 1) % len(parts.rows)
        key, other_key = name.split(".")[0], parts.members[other_row][0][0].split(".")[0]
        data = parts.member(other_row, name.replace(key, other_key))
    elif op in ("4096x4096", "48x32", "swapped size"):
        size = {"4096x4096": (4096, 4096), "48x32": (48, 32), "swapped size": (height, width)}
        data = black_mp4(*size[op], frames)
    elif op in ("h264", "h264 yuv444p"):
        data = black_mp4(width, height, frames, "libx264", "yuv444p" if "444" in op else "yuv420p")
    elif op == "mpeg4":
        data = black_mp4(width, height, frames)
    else:
        data = black_mp4(width, height, frames + (1 if op == "one frame more" else -1) or 1)
    parts.set_member(row, name, data)
    return f"video:{op}", f"video {row} {camera} {op}", Edits()


def lie_camera_everywhere(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    """A camera's codec, pixel format or size told otherwise in every header and in the
    features of index.json and info.json alike (the videos are what they were)."""
    camera = choose("camera", sorted(parts.index["video_keys"]))
    op = choose(
        "op",
        [
            "codec h264",
            "codec mpeg4",
            "pix_fmt yuv444p",
            "pix_fmt yuv420p10le",
            "swapped size",
            "one pixel wider",
        ],
    )
    key, value = op.split(" ", 1)
    for row in range(len(parts.rows)):
        header = parts.header(row)
        cam = header["cameras"][camera]
        if key in ("codec", "pix_fmt"):
            cam[key] = value
        elif value == "size":
            cam["width"], cam["height"] = cam["height"], cam["width"]
        else:
            cam["width"] += 1
        parts.set_header(row, header)
    for features in both_features(parts):
        ft = features[camera] = json.loads(json.dumps(features[camera]))
        h, w, c = ft["shape"]
        info = ft.get("info", {})
        if key in ("codec", "pix_fmt"):
            info[f"video.{key}"] = value
        else:
            h, w = (w, h) if value == "size" else (h, w + 1)
            ft["shape"] = [h, w, c]
            info["video.height"], info["video.width"] = h, w
    label = key if key in ("codec", "pix_fmt") else "size"
    return (
        f"headers+index+info:{label}",
        f"{camera} {op} in every header, index.json and info.json",
        Edits(),
    )


def lie_stats(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    # No stats of a feature is no lie: LeRobot's add_features writes such a dataset, read with a
    # warning (test_agreeing_lies.py).
    stats = json.loads(parts.others[STATS_FILE])
    key = choose("feature", sorted(stats))
    stat = choose("statistic", sorted(stats[key]))
    op = choose(
        "op",
        [
            "ragged",
            "shorter",
            "longer",
            "text",
            "NaN",
            "infinite",
            "nested deeper",
            "unknown feature",
            "statistic missing",
            "not an object",
            "not JSON",
            "shape of another feature",
        ],
    )
    values = stats[key][stat]
    if op == "ragged":
        stats[key][stat] = [values, values[:-1]] if len(values) > 1 else [values, []]
    elif op == "shorter":
        stats[key][stat] = values[:-1]
    elif op == "longer":
        stats[key][stat] = [*values, values[-1]]
    elif op == "text":
        stats[key][stat] = "x"
    elif op in ("NaN", "infinite"):
        stats[key][stat] = (
            np.where(np.arange(np.size(values)) == 0, NAN if op == "NaN" else INF, np.ravel(values))
            .reshape(np.shape(values))
            .tolist()
        )
    elif op == "nested deeper":
        stats[key][stat] = [values]
    elif op == "unknown feature":
        stats["not.a.feature"] = stats[key]
    elif op == "statistic missing":
        stats[key].pop(stat)
    elif op == "shape of another feature":
        other = next(
            (
                k
                for k in sorted(stats)
                if np.shape(stats[k][stat]) != np.shape(values) and stat in stats[k]
            ),
            key,
        )
        stats[key][stat] = stats[other][stat]
    data = {"not an object": b"[1, 2]", "not JSON": b"{stats"}.get(op)
    parts.others[STATS_FILE] = data if data is not None else json.dumps(stats).encode()
    return f"stats.json:{op}", f"stats.json {key}.{stat} {op}", Edits()


def lie_tasks(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    table = pq.read_table(io.BytesIO(parts.others[TASKS_FILE]))
    tasks = table.to_pylist()
    op = choose(
        "op",
        [
            "two swapped",
            "last dropped",
            "last dropped everywhere",
            "index twice",
            "index as text",
            "task as number",
            "extra task",
            "not parquet",
            "missing",
            "columns renamed",
            "task empty",
        ],
    )
    if op == "two swapped":
        tasks[0]["task"], tasks[1]["task"] = tasks[1]["task"], tasks[0]["task"]
    elif op.startswith("last dropped"):
        gone = tasks.pop()["task"]
        if op.endswith("everywhere"):  # the episodes' headers and manifest rows forget it too
            for row in range(len(parts.rows)):
                header = parts.header(row)
                header["tasks"] = [t for t in header["tasks"] if t != gone]
                parts.set_header(row, header)
                parts.rows[row]["tasks"] = header["tasks"]
    elif op == "index twice":
        tasks[-1]["task_index"] = tasks[0]["task_index"]
    elif op == "index as text":
        tasks = [{**t, "task_index": str(t["task_index"])} for t in tasks]
    elif op == "task as number":
        tasks = [{**t, "task": i} for i, t in enumerate(tasks)]
    elif op == "extra task":
        tasks.append({"task_index": len(tasks), "task": "never done"})
    elif op == "columns renamed":
        tasks = [{"index": t["task_index"], "name": t["task"]} for t in tasks]
    elif op == "task empty":
        tasks[0]["task"] = None
    if op == "missing":
        parts.others.pop(TASKS_FILE)
    elif op == "not parquet":
        parts.others[TASKS_FILE] = b"PAR1 not parquet PAR1"
    else:
        out = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(tasks), out)
        parts.others[TASKS_FILE] = out.getvalue()
    return f"tasks.parquet:{op}", f"tasks.parquet {op}", Edits()


def lie_tar_header(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    """A field of one member's ustar header block, its block checksum recomputed (or not)."""
    row = choose("row", range(len(parts.rows)))
    k = choose("member", range(len(parts.members[row])))
    op = choose(
        "field",
        [
            "name other member",
            "name x",
            "name ../",
            "size +1",
            "size -1",
            "size +512",
            "size text",
            "typeflag directory",
            "typeflag symlink",
            "typeflag hard link",
            "typeflag pax",
            "chksum broken",
            "magic broken",
            "mode",
            "mtime",
        ],
    )
    name = parts.members[row][k][0]
    other = parts.members[row][(k + 1) % len(parts.members[row])][0]
    size = len(parts.members[row][k][1])

    def edit(i: int, shard: bytearray, entry: dict) -> None:
        if i != row:
            return
        at = entry["members"][k]["offset"] - 512
        field = op.split(" ", 1)[0]
        values = {
            "name other member": other.encode(),
            "name x": b"x",
            "name ../": b"../" + name.encode(),
            "size +1": b"%011o" % (size + 1),
            "size -1": b"%011o" % max(size - 1, 0),
            "size +512": b"%011o" % (size + 512),
            "size text": b"twelve",
            "typeflag directory": b"5",
            "typeflag symlink": b"2",
            "typeflag hard link": b"1",
            "typeflag pax": b"x",
            "magic broken": b"tar\0\0\0",
            "mode": b"0000777",
            "mtime": b"%011o" % 2**32,
        }
        if op == "chksum broken":
            set_tar_field(shard, at, "chksum", b"000000\0 ", seal=False)
        else:
            set_tar_field(shard, at, field, values[op])

    return (
        f"tar header:{op.split(' ')[0]}",
        f"tar header of {name} (row {row}): {op}",
        Edits(shard=edit),
    )


def lie_members(parts: Parts, choose: Choose) -> tuple[str, str, Edits]:
    """Tar members extra, missing or reordered; the manifest lists what the tar holds."""
    row = choose("row", range(len(parts.rows)))
    members = parts.members[row]
    op = choose(
        "op",
        [
            "extra junk",
            "extra ../ path",
            "extra copy of own rows",
            "other episode's rows after",
            "other episode's rows before",
            "other episode's header after",
            "missing",
            "first two swapped",
            "reversed",
            "header last",
        ],
    )
    key = members[0][0].split(".")[0]
    other_row = (row + 1) % len(parts.rows)
    other = {n.replace(n.split(".")[0], key): d for n, d in parts.members[other_row]}
    where = choose("position", range(len(members) + 1))
    if op == "extra junk":
        members.insert(where, (f"{key}.extra", b"junk"))
    elif op == "extra ../ path":
        members.insert(where, ("../escape.txt", b"junk"))
    elif op == "extra copy of own rows":
        members.insert(where, members[1])
    elif op.startswith("other episode's"):
        name = f"{key}.{'parquet' if 'rows' in op else 'json'}"
        members.insert(len(members) if op.endswith("after") else 0, (name, other[name]))
    elif op == "missing":
        members.pop(where % len(members))
    elif op == "first two swapped":
        members[0], members[1] = members[1], members[0]
    elif op == "reversed":
        members.reverse()
    elif op == "header last":
        members.append(members.pop(0))
    return f"tar members:{op}", f"row {row} members {op} (at {where})", Edits()


FAMILIES: dict[str, Callable[[Parts, Choose], tuple[str, str, Edits]]] = {
    "index.json": lie_index,
    "info.json": lie_info,
    "index+info": lie_feature_everywhere,
    "fps": lie_fps_everywhere,
    "manifest": lie_manifest,
    "header": lie_header,
    "global index": lie_global_index,
    "rows": lie_rows,
    "image": lie_image,
    "video": lie_video,
    "camera everywhere": lie_camera_everywhere,
    "stats.json": lie_stats,
    "tasks.parquet": lie_tasks,
    "tar header": lie_tar_header,
    "tar members": lie_members,
}
ONLY = {"image": "image", "video": "video", "camera everywhere": "video"}
"""Families for one dataset kind only."""


def draw_case(parts: Parts, kind: str, choose: Choose) -> Case:
    """One lie, drawn by ``choose`` and told in ``parts`` (changed in place)."""
    layout = choose("layout", ["one per shard", "pairs", "all in one"])
    set_layout(parts, layout)
    families = [f for f in FAMILIES if ONLY.get(f, kind) == kind]
    family = choose("family", families)
    where, description, edits = FAMILIES[family](parts, choose)
    also = choose("also read", READS)
    reads = ["plain"] if also == "plain" else ["plain", also]
    return Case(where, f"{description} [{layout}; read {'+'.join(reads)}]", edits, reads, layout)
