"""Hypothesis over mutated datasets: each case changes one field of one file of a converted
dataset (index.json, meta/info.json, the manifest, an episode's header, rows or video), puts
it back together with every checksum recomputed (``mutate.py``: only the content lies), then
reads a whole epoch with the reader and runs ``verify --deep``.

A case passes if the reader raises a ``FormatError`` naming the dataset and verify reports a
problem, or if the reader's items equal the unmutated dataset's (the lie changed nothing an
item holds). Anything else fails: a crash, another exception, items that differ without an
error, verify raising or passing a dataset the reader refuses. Mutations are lies a reader can
catch (types, ranges, structure, sizes, counts); pixel values and numbers inside valid rows are
content, not lies, and are not made.

Prints one JSON line: cases, the error kinds seen (by where their message says the lie is),
the slowest case and the peak RSS of this process. Exit 1 with the failing case otherwise.

    python tests/support/fuzz_shards.py SHARDS_ROOT SCRATCH_DIR EXAMPLES
"""

from __future__ import annotations

import json
import re
import resource
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import pyarrow as pa
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).parent))
from mutate import Parts, black_mp4, put_together, take_apart

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import MANIFEST_SCHEMA, FormatError

VALUES = [None, -1, 0, 1, 3, 10**12, "1", "x", [], {}, ["x"], True, 1.5]
SHARDS = ["/etc/passwd", "../outside.tar", "s3://other/x.tar", "shards/000/episode-000001.tar"]


def mutations(parts: Parts) -> st.SearchStrategy:
    """One lie, as (description, apply): ``apply(parts)`` returns (edit_rows, edit_index)."""
    rows = st.integers(0, len(parts.rows) - 1)
    value = st.sampled_from(VALUES)
    no_edit = (None, None)

    def index_lie(key, v, delete):
        def edit(index):
            index.pop(key) if delete else index.__setitem__(key, v)

        return f"index.json {key}={'<deleted>' if delete else v!r}", lambda p: (None, edit)

    def info_lie(key, field, v):
        def apply(p):
            if key == "fps":
                p.info["fps"] = v
            elif field == "<deleted>":
                p.info["features"].pop(key)
            else:
                p.info["features"][key][field] = v
            return no_edit

        return f"info.json {key}.{field}={v!r}", apply

    def manifest_lie(row, column, v):
        def edit(all_rows):
            if column == "<reverse>":
                all_rows.reverse()
            elif column == "<duplicate>":
                all_rows.insert(row, dict(all_rows[row]))
            elif column == "<drop>":
                all_rows.pop(row)
            elif column.startswith("members."):
                _, i, field = column.split(".")
                members = all_rows[row]["members"]
                members[int(i) % len(members)][field] = v
            else:
                all_rows[row][column] = v

        return f"manifest row {row} {column}={v!r}", lambda p: (edit, None)

    def header_lie(row, field, v, camera):
        def apply(p):
            header = p.header(row)
            target = header["cameras"][camera] if camera else header
            if v == "<deleted>":
                target.pop(field, None)
            else:
                target[field] = v
            p.set_header(row, header)
            return no_edit

        return f"header {row} {camera or ''}.{field}={v!r}", apply

    def rows_lie(row, op, column):
        def apply(p):
            table = p.table(row)
            name = column if column in table.column_names else table.column_names[0]
            i = table.schema.get_field_index(name)
            if op == "drop":
                table = table.drop_columns([name])
            elif op == "as text":
                table = table.set_column(
                    i, name, pa.array([str(x) for x in table[name].to_pylist()])
                )
            elif op == "short":
                table = table.slice(0, table.num_rows - 1)
            elif op == "nulls":
                table = table.set_column(i, name, pa.nulls(table.num_rows, table[name].type))
            elif op in ("task -1", "task 99"):
                v = -1 if op == "task -1" else 99
                i = table.schema.get_field_index("task_index")
                table = table.set_column(i, "task_index", pa.array([v] * table.num_rows))
            elif op == "wider":
                wide = [
                    [*x, 0.0] if isinstance(x, list) else [x, 0.0] for x in table[name].to_pylist()
                ]
                table = table.set_column(i, name, pa.array(wide))
            p.set_table(row, table)
            return no_edit

        return f"rows {row} {op} {column}", apply

    def video_lie(row, camera, op):
        def apply(p):
            name = next(n for n, _ in p.members[row] if n.endswith(f".{camera}.mp4"))
            data = p.member(row, name)
            if op == "half":
                data = data[: len(data) // 2]
            elif op == "empty":
                data = b""
            elif op == "other camera":
                other = next(n for n, _ in p.members[row] if n.endswith(".mp4") and n != name)
                data = p.member(row, other)
            elif op == "other episode":
                other_row = (row + 1) % len(p.rows)
                data = p.member(
                    other_row,
                    name.replace(name.split(".")[0], p.members[other_row][0][0].split(".")[0]),
                )
            else:
                width, height = (4096, 4096) if op == "4096x4096" else (48, 32)
                data = black_mp4(width, height, p.rows[row]["length"])
            p.set_member(row, name, data)
            return no_edit

        return f"video {row} {camera} {op}", apply

    keys = sorted(parts.index)
    features = sorted(parts.info["features"])
    cameras = sorted(parts.header(0)["cameras"])
    columns = [*MANIFEST_SCHEMA.names, "members.0.size", "members.1.offset", "members.2.name"]
    columns = [c for c in columns if c != "members"] + ["<reverse>", "<duplicate>", "<drop>"]
    header_fields = ["episode_index", "length", "dataset_from_index", "dataset_to_index",
                     "tasks", "cameras"]  # fmt: skip
    camera_fields = ["codec", "width", "height", "pix_fmt", "fps", "frames", "skip_frames",
                     "tail_frames"]  # fmt: skip
    row_columns = ["action", "observation.state", "timestamp", "index", "episode_index",
                   "task_index", "frame_index"]  # fmt: skip
    shard_values = st.sampled_from(SHARDS)
    return st.one_of(
        st.builds(index_lie, st.sampled_from(keys), value, st.booleans()),
        st.builds(info_lie, st.sampled_from([*features, "fps"]),
                  st.sampled_from(["dtype", "shape", "names", "<deleted>"]),
                  st.one_of(value, st.sampled_from(["video", "image", "int64", [2], [1, 2, 3]]))),
        st.builds(manifest_lie, rows, st.sampled_from(columns), st.one_of(value, shard_values)),
        st.builds(header_lie, rows, st.sampled_from(header_fields), st.one_of(
            value, st.just("<deleted>")), st.none()),
        st.builds(header_lie, rows, st.sampled_from(camera_fields), st.one_of(
            value, st.just("<deleted>")), st.sampled_from(cameras)),
        st.builds(rows_lie, rows, st.sampled_from(
            ["drop", "as text", "short", "nulls", "task -1", "task 99", "wider"]),
            st.sampled_from(row_columns)),
        st.builds(video_lie, rows, st.sampled_from(cameras), st.sampled_from(
            ["half", "empty", "other camera", "other episode", "4096x4096", "48x32"])),
    )  # fmt: skip


def items(root: Path) -> list[dict]:
    return list(ShardedLeRobotDataset(str(root), seed=5))


def same(got: list[dict], want: list[dict]) -> bool:
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if list(a) != list(b):
            return False
        for key, value in b.items():
            other = a[key]
            if isinstance(value, torch.Tensor):
                if not (isinstance(other, torch.Tensor) and other.shape == value.shape
                        and other.dtype == value.dtype and torch.equal(other, value)):  # fmt: skip
                    return False
            elif other != value:
                return False
    return True


def kind_of(message: str) -> str:
    """Where an error says the lie is (its file), for the summary's distinct kinds."""
    for name in ("index.json", "info.json", "manifest", "tasks", "header", "rows", "camera",
                 "video", "checksum", "span", "member"):  # fmt: skip
        if name in message:
            return name
    return re.sub(r"\d+", "N", message)[:60]


def main(root: Path, scratch: Path, examples: int) -> int:
    original = take_apart(root)
    put_together(original.copy(), scratch / "original")
    reference = items(scratch / "original")
    summary: dict = {"cases": 0, "refused": Counter(), "harmless": 0, "slowest_s": 0.0}

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(mutations(original))
    def case(lie):
        description, apply = lie
        started = time.monotonic()
        parts = original.copy()
        edit_rows, edit_index = apply(parts)
        dest = scratch / "case"
        put_together(parts, dest, edit_rows=edit_rows, edit_index=edit_index)
        try:
            got = items(dest)
        except FormatError as exc:
            message = str(exc)
            assert str(dest) in message, f"{description}: the error names no dataset: {message}"
            assert verify_dataset(str(dest), deep=True), f"{description}: verify passed it"
            summary["refused"][kind_of(message)] += 1
        else:
            assert same(got, reference), f"{description}: items differ without an error"
            verify_dataset(str(dest), deep=True)  # must not raise
            summary["harmless"] += 1
        summary["cases"] += 1
        summary["slowest_s"] = max(summary["slowest_s"], time.monotonic() - started)

    try:
        case()
    except Exception:
        print(traceback.format_exc(), file=sys.stderr)
        return 1
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))
