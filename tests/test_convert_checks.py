"""A conversion that completes is one the reader reads (issue 41): ``convert`` runs the reader's
checks on what it writes (each episode's rows, header and videos as it writes them; index.json,
the manifest and meta/ before index.json says the dataset is complete), so a source the reader
would refuse once converted is refused by ``convert``, with the reader's own message, before
anyone starts a run.

Each flaw is told twice: in a LeRobot source, which ``convert`` must refuse, and in the shards
of the unflawed source (``support/mutate.py``), which the reader refuses; the two messages are
the same but for the dataset's path (and the converter's "episode N: " in front).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from support.mutate import Parts, put_together, take_apart

from lerobot_shards import ShardedLeRobotDataset, convert
from lerobot_shards.converter.run import ConvertError
from lerobot_shards.format import INDEX_FILE, INFO_FILE, STATS_FILE, FormatError

EPISODE = 2
ROW = 5
CAM = "observation.images.cam_high"


def ragged(rows: pa.Table) -> pa.Table:
    """observation.state as LeRobot's merge writes it (list<float>), one row a value short."""
    values = rows["observation.state"].to_pylist()
    values[ROW] = values[ROW][:-1]
    column = pa.array(values, pa.list_(pa.float32()))
    return rows.set_column(
        rows.column_names.index("observation.state"), "observation.state", column
    )


def late(rows: pa.Table) -> pa.Table:
    """One row's timestamp half a frame late."""
    stamps = rows["timestamp"].to_pylist()
    stamps[ROW] += 0.05
    column = pa.array(stamps, rows["timestamp"].type)
    return rows.set_column(rows.column_names.index("timestamp"), "timestamp", column)


def other_task(rows: pa.Table) -> pa.Table:
    """One row's task_index names a task that is not its episode's."""
    tasks = rows["task_index"].to_pylist()
    tasks[ROW] = 3 if tasks[ROW] != 3 else 2
    column = pa.array(tasks, rows["task_index"].type)
    return rows.set_column(rows.column_names.index("task_index"), "task_index", column)


def nan_stat(stats: dict) -> None:
    stats["action"]["mean"][0] = math.nan  # json writes NaN, and reads it


def codec_lie(info: dict) -> None:
    info["features"][CAM]["info"]["video.codec"] = "h264"


def tasks_miscounted(info: dict) -> None:
    info["total_tasks"] += 1


FLAWS: dict[str, tuple[str, Callable, str]] = {
    "a ragged vector": ("image", ragged, "holds 3 values on axis 0"),
    "a timestamp off": ("image", late, f"row {ROW}'s timestamp is"),
    "a task not the episode's": ("image", other_task, "not one of its header's tasks"),
    "stats that are not finite": ("image", nan_stat, "is not finite"),
    "info.json's codec": ("av1_multifile", codec_lie, "the header says codec 'av1'"),
    "info.json's total_tasks": ("image", tasks_miscounted, "info.json says total_tasks=5"),
}
"""What the flaw is told in (a golden dataset), how, and a part of the message it is refused
with."""
BEFORE_ANY_EPISODE = {"stats that are not finite"}
"""Flaws refused before any episode is converted, naming the source's file (the reader names
the same file of the converted dataset); the others name the destination's shard."""


def flaw_source(root: Path, flaw: Callable) -> None:
    """Tell ``flaw`` in the LeRobot dataset at ``root``."""
    if flaw is nan_stat:
        stats = json.loads((root / STATS_FILE).read_text())
        flaw(stats)
        (root / STATS_FILE).write_text(json.dumps(stats))
    elif flaw in (codec_lie, tasks_miscounted):
        info = json.loads((root / INFO_FILE).read_text())
        flaw(info)
        (root / INFO_FILE).write_text(json.dumps(info))
    else:  # the episode's rows, in the data file that holds them
        for path in sorted(root.glob("data/*/*.parquet")):
            table = pq.read_table(path)
            mine = pc.equal(table["episode_index"], EPISODE)
            if not pc.any(mine).as_py():
                continue
            told = flaw(table.filter(mine))
            rest = table.filter(pc.invert(mine)).cast(told.schema)
            pq.write_table(pa.concat_tables([rest, told]).sort_by("index"), path)


def flaw_shards(parts: Parts, flaw: Callable) -> None:
    """Tell ``flaw`` in a converted dataset taken apart (every file that states the fact)."""
    if flaw is nan_stat:
        stats = json.loads(parts.others[STATS_FILE])
        flaw(stats)
        parts.others[STATS_FILE] = json.dumps(stats).encode()
    elif flaw is codec_lie:
        flaw(parts.info)
        flaw(parts.index)
    elif flaw is tasks_miscounted:
        flaw(parts.info)
    else:
        row = [r["episode_index"] for r in parts.rows].index(EPISODE)
        parts.set_table(row, flaw(parts.table(row)))


@pytest.mark.parametrize("name", list(FLAWS))
def test_convert_refuses_what_the_reader_would_with_its_message(
    name, golden_copy, shards, tmp_path
):
    dataset, flaw, text = FLAWS[name]
    parts = take_apart(shards(dataset))
    flaw_shards(parts, flaw)
    put_together(parts, tmp_path / "lie")
    with pytest.raises(FormatError) as read:
        list(ShardedLeRobotDataset(str(tmp_path / "lie"), shuffle=False))
    source, dest = golden_copy(dataset), tmp_path / "converted"
    flaw_source(source, flaw)
    with pytest.raises(ConvertError) as converted:
        convert(str(source), str(dest), workers=0, progress=False)
    named = source if name in BEFORE_ANY_EPISODE else dest
    said = str(read.value).replace(str(tmp_path / "lie"), str(named))
    assert text in said, said
    episode = said.split("(episode ", 1)[1].split(")")[0] if "(episode " in said else None
    assert str(converted.value) == (f"episode {episode}: {said}" if episode else said)
    assert not (dest / INDEX_FILE).exists()  # never a finished dataset
    if name in BEFORE_ANY_EPISODE:
        assert not (dest / "shards").exists()
