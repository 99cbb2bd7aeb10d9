"""LeRobot's language columns, recorded with LeRobot 0.6.1's own API and read back by its own
``LeRobotDataset`` (pyav): a dataset recorded for annotation (both columns declared, None in
every frame) and the same dataset annotated by the last phases of ``lerobot-annotate`` (its
staging, ``StagingValidator`` and ``LanguageColumnsWriter``; the rows written by hand where its
VLM would write them: plans, subtasks, memories, a task rephrasing, an interjection with a
spoken reply, VQA on the camera). Converted, every item equals LeRobot's, value for value, with
and without ``delta_timestamps``; batched by ``ShardedDataLoader`` in worker processes with
LeRobot's ``lerobot_collate_fn`` (what its trainer uses for such datasets) every batch equals
LeRobot's; and ``lerobot-shards train`` trains on them, every frame once per epoch.

Needs LeRobot (CI's LeRobot environment runs this: ``scripts/test.sh``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from support.batches import assert_same_batch
from support.mutate import put_together, take_apart
from support.required import importorskip

import lerobot_shards
from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
from lerobot_shards.converter.run import ConvertError
from lerobot_shards.format import FormatError

lerobot_dataset = importorskip(
    "lerobot.datasets.lerobot_dataset", reason="LeRobot is optional; CI's LeRobot env runs this"
)
from lerobot.annotations.steerable_pipeline.reader import iter_episodes  # noqa: E402
from lerobot.annotations.steerable_pipeline.staging import EpisodeStaging  # noqa: E402
from lerobot.annotations.steerable_pipeline.validator import StagingValidator  # noqa: E402
from lerobot.annotations.steerable_pipeline.writer import (  # noqa: E402
    LanguageColumnsWriter,
    speech_atom,
)
from lerobot.datasets.language import language_feature_info  # noqa: E402
from lerobot.utils.collate import lerobot_collate_fn  # noqa: E402

CAMERA = "observation.images.rgb"
FEATURES = {
    CAMERA: {"dtype": "video", "shape": (24, 32, 3), "names": ["height", "width", "channels"]},
    "observation.state": {"dtype": "float32", "shape": (2,), "names": ["j0", "j1"]},
    "action": {"dtype": "float32", "shape": (2,), "names": ["j0", "j1"]},
    **language_feature_info(),
}
EPISODES = [(5, "stack the blocks"), (3, "push the T"), (6, "stack the blocks")]
FRAMES = sum(n for n, _ in EPISODES)
DELTAS = {"action": [0.0, 0.1], CAMERA: [-0.1, 0.0]}


def record(root: Path) -> Path:
    """A dataset recorded for annotation: the language columns declared, None in every frame."""
    create = lerobot_dataset.LeRobotDataset.create
    ds = create("local/language", fps=10, features=FEATURES, root=root)
    for episode, (length, task) in enumerate(EPISODES):
        for frame in range(length):
            pixels = np.full((24, 32, 3), 40 * episode + 8 * frame, np.uint8)
            pixels[: 4 * frame + 4, :8] = 255  # the frame number, seen by the codec
            ds.add_frame(
                {
                    CAMERA: pixels,
                    "observation.state": np.array([episode, frame], np.float32),
                    "action": np.array([episode, frame + 0.5], np.float32),
                    "task": task,
                    "language_persistent": None,
                    "language_events": None,
                }
            )
        ds.save_episode()
    ds.finalize()
    return root


def message(role: str, content: str, style: str, t: float, camera: str | None = None) -> dict:
    return {
        "role": role, "content": content, "style": style, "timestamp": t, "camera": camera,
        "tool_calls": None,
    }  # fmt: skip


def annotate(recorded: Path, root: Path, staging: Path) -> Path:
    """``recorded`` copied and annotated as ``lerobot-annotate``'s last phases do: episodes 0
    and 1 staged (episode 2 is left without annotations: empty lists), validated, written."""
    shutil.copytree(recorded, root)
    records = list(iter_episodes(root))
    for record in records[:2]:
        t, episode = record.frame_timestamps, record.episode_index
        stage = EpisodeStaging(staging, episode)
        plan = [
            message("assistant", "1. reach the cube 2. grasp it", "plan", t[0]),
            message("assistant", f"reach the cube {episode}", "subtask", t[0]),
            message("user", f"please {record.episode_task} ({episode})", "task_aug", t[0]),
            message("assistant", "the cube is reached", "memory", t[2]),
            message("assistant", f"grasp the cube {episode}", "subtask", t[2]),
        ]
        if episode == 0:
            plan.append(message("assistant", "1. grasp the blue cube", "plan", t[1]))
            interjection = message("user", "use the blue one", "interjection", t[1])
            stage.write("interjections", [interjection, speech_atom(t[1], "ok, the blue one")])
            answer = json.dumps({"label": "cube", "count": 2})
            stage.write(
                "vqa",
                [
                    message("user", "how many cubes?", "vqa", t[3], CAMERA),
                    message("assistant", answer, "vqa", t[3], CAMERA),
                ],
            )
        stage.write("plan", plan)
    report = StagingValidator(dataset_camera_keys=(CAMERA,)).validate(records, staging)
    assert report.ok, report.errors
    LanguageColumnsWriter().write_all(records, staging, root)
    return root


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each dataset (``empty``, ``annotated``) and its shards."""
    base = tmp_path_factory.mktemp("language")
    empty = record(base / "empty")
    annotated = annotate(empty, base / "annotated", base / "staging")
    out = {}
    for name, root in (("empty", empty), ("annotated", annotated)):
        shards = base / f"{name}-shards"
        lerobot_shards.convert(str(root), str(shards), workers=0, progress=False)
        out[name] = (root, shards)
    return out


def lerobots(root: Path, **options) -> lerobot_dataset.LeRobotDataset:
    return lerobot_dataset.LeRobotDataset(
        "local/language", root=root, video_backend="pyav", **options
    )


def assert_same_value(ours: object, theirs: object, where: object) -> None:
    """Tensors equal (dtype too); other values equal, of the same types all the way down, their
    dicts' keys in the same order (the same JSON text)."""
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs), where
        return
    assert same_types(ours, theirs), (where, ours, theirs)
    assert json.dumps(ours) == json.dumps(theirs), where


def same_types(a: object, b: object) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_types(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_types(x, y) for x, y in zip(a, b, strict=True))
    return True


@pytest.mark.parametrize("delta", [False, True], ids=["plain", "delta"])
@pytest.mark.parametrize("name", ["empty", "annotated"])
def test_every_item_equals_lerobots(recorded, name, delta):
    root, shards = recorded[name]
    deltas = DELTAS if delta else None
    theirs = lerobots(root, delta_timestamps=deltas)
    items = list(ShardedLeRobotDataset(shards, buffer_size=2, delta_timestamps=deltas))
    assert sorted(int(item["index"]) for item in items) == list(range(FRAMES))
    for item in items:
        index = int(item["index"])
        expected = theirs[index]
        assert list(item) == list(expected), index
        for key, value in expected.items():
            assert_same_value(item[key], value, (index, key))
    values = [item["language_persistent"] for item in items]
    if name == "empty":
        assert values == [None] * FRAMES
    else:  # annotated: lists of messages in episodes 0 and 1, empty lists in episode 2
        assert all(isinstance(v, list) for v in values) and any(values) and [] in values


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["empty", "annotated"])
def test_loader_batches_equal_lerobots_with_its_collate(recorded, name):
    """Batches made in worker processes (the reader's shared-memory path) with LeRobot's
    ``lerobot_collate_fn``: each equals that function applied to LeRobot's own items."""
    root, shards = recorded[name]
    theirs = lerobots(root, delta_timestamps=DELTAS)
    ds = ShardedLeRobotDataset(shards, buffer_size=2, delta_timestamps=DELTAS)
    loader = ShardedDataLoader(ds, batch_size=4, num_workers=2, collate_fn=lerobot_collate_fn)
    seen = []
    for batch in loader:
        indices = batch["index"].tolist()
        assert_same_batch(batch, lerobot_collate_fn([theirs[i] for i in indices]))
        seen += indices
    assert sorted(seen) == list(range(FRAMES))


def test_loader_refuses_default_collate_naming_the_columns(recorded):
    """torch's default_collate cannot batch None or lists of messages: refused up front."""
    _, shards = recorded["empty"]
    with pytest.raises(ValueError, match=r"language_persistent.*lerobot_collate_fn"):
        ShardedDataLoader(ShardedLeRobotDataset(shards), batch_size=4)


@pytest.mark.timeout(600)
def test_lerobot_shards_train_on_annotated_shards(recorded, tmp_path):
    """LeRobot's trainer takes its language-aware collate for these shards (it asks the
    dataset's ``meta.has_language_columns``) and trains on every frame once per epoch."""
    importorskip("accelerate", reason="lerobot[training] is optional; CI's LeRobot env runs this")
    from test_lerobot_train import TINY_ACT, flat, train

    _, shards = recorded["annotated"]
    args = [a for a in TINY_ACT if not a.startswith("--batch_size")]
    records, _ = train(
        tmp_path, "--shards", str(shards), *args, "--batch_size=7", "--steps=4",
        "--num_workers=1", f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    (steps,) = records
    indices = flat(steps)
    assert sorted(indices[:FRAMES]) == sorted(indices[FRAMES:]) == list(range(FRAMES))


def rewritten(annotated: Path, dest: Path, key: str, edit, typ=None) -> Path:
    """A copy of ``annotated`` whose column ``key`` holds ``edit(value)`` of each row's value,
    stored as ``typ`` (default: as pyarrow infers it)."""
    shutil.copytree(annotated, dest)
    for path in sorted((dest / "data").rglob("*.parquet")):
        table = pq.read_table(path)
        values = [edit(v) for v in table.column(key).to_pylist()]
        column = pa.array(values, typ) if typ is None or not _is_json(typ) else _json(values, typ)
        pq.write_table(table.set_column(table.schema.get_field_index(key), key, column), path)
    return dest


def _is_json(typ: pa.DataType) -> bool:
    return "arrow.json" in str(typ)


def _json(values: list, typ: pa.DataType) -> pa.Array:
    """``values`` stored as ``typ`` with its tool calls as arrow.json (pyarrow builds none from
    Python values: built as text, then cast)."""
    return pa.array(values, pa.list_(_with_tool_calls(typ.value_type, pa.string()))).cast(typ)


def _with_tool_calls(struct: pa.StructType, entry: pa.DataType) -> pa.StructType:
    fields = [struct.field(i) for i in range(struct.num_fields)]
    return pa.struct([f if f.name != "tool_calls" else (f.name, pa.list_(entry)) for f in fields])


def messages(edit):
    """``edit`` applied to each message of a row (None stays None)."""
    return lambda row: None if row is None else [edit(dict(m)) for m in row]


def round3(value: float) -> float:
    """A float64 timestamp LeRobot's float32 cast changes (0.1 is not 0.10000000149011612)."""
    return round(value, 3)


def reversed_(message: dict) -> list[tuple]:
    return list(reversed(message.items()))


def calls_as_text(message: dict) -> dict:
    calls = message["tool_calls"]
    return {**message, "tool_calls": None if calls is None else [json.dumps(c) for c in calls]}


EVENT_TEXT = pa.list_(
    pa.struct(
        [
            ("role", pa.string()), ("content", pa.string()), ("style", pa.string()),
            ("camera", pa.string()), ("tool_calls", pa.list_(pa.string())),
        ]
    )
)  # fmt: skip
LAYOUTS = {
    # what LeRobot casts: fields in another order, a float64 timestamp not float32's
    "persistent fields reversed, float64 timestamps": (
        "language_persistent",
        messages(lambda m: {k: round3(v) if k == "timestamp" else v for k, v in reversed_(m)}),
        None,
    ),
    "events without camera": (
        "language_events", messages(lambda m: {k: v for k, v in m.items() if k != "camera"}), None
    ),
    "tool calls as JSON text": ("language_events", messages(calls_as_text), EVENT_TEXT),
    "tool calls as arrow.json": (
        "language_events",
        messages(calls_as_text),
        pa.list_(_with_tool_calls(EVENT_TEXT.value_type, pa.json_())),
    ),
    "events as large_list": ("language_events", lambda row: row, "large"),
    "no events at all (list<null>)": ("language_events", lambda row: [], None),
}  # fmt: skip


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_other_writers_layouts_read_as_lerobot_reads_them(recorded, tmp_path, layout):
    """Language columns stored in other Arrow types than LeRobot's annotator writes, each read
    by LeRobot (which casts them to its own) and by the reader to the same values."""
    key, edit, typ = LAYOUTS[layout]
    annotated, _ = recorded["annotated"]
    if typ == "large":
        schema = pq.read_schema(next((annotated / "data").rglob("*.parquet")))
        typ = pa.large_list(schema.field(key).type.value_type)
    root = rewritten(annotated, tmp_path / "source", key, edit, typ)
    lerobot_shards.convert(str(root), str(tmp_path / "shards"), workers=0, progress=False)
    theirs = lerobots(root)
    items = list(ShardedLeRobotDataset(tmp_path / "shards", buffer_size=2))
    assert sorted(int(item["index"]) for item in items) == list(range(FRAMES))
    for item in items:
        index = int(item["index"])
        for key_, value in theirs[index].items():
            assert_same_value(item[key_], value, (index, key_))


REFUSED = {
    "a field LeRobot does not know": (
        messages(lambda m: {**m, "mood": "calm"}), "'mood'"
    ),
    "a float in a tool call": (
        messages(lambda m: {**m, "tool_calls": None if m["tool_calls"] is None else [{"x": 0.25}]}),
        "float",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_reader_cannot_return_as_lerobot_is_refused(recorded, tmp_path, case):
    """A message field LeRobot cannot cast (it fails to load the dataset) and a float in a tool
    call (LeRobot rounds it through pandas' JSON codec) are refused, naming the column: by
    ``convert``, which runs the reader's checks on what it writes, and by the reader, on shards
    written without that check (the episode's rows put back as the source holds them)."""
    edit, named = REFUSED[case]
    annotated, _ = recorded["annotated"]
    root = rewritten(annotated, tmp_path / "source", "language_events", edit)
    with pytest.raises(ConvertError, match="language_events") as refused:
        lerobot_shards.convert(str(root), str(tmp_path / "refused"), workers=0, progress=False)
    assert named in str(refused.value)
    assert not (tmp_path / "refused" / "index.json").exists()
    good = tmp_path / "good"
    lerobot_shards.convert(str(annotated), str(good), workers=0, progress=False)
    parts = take_apart(good)
    source_rows = pa.concat_tables(
        pq.read_table(p) for p in sorted((root / "data").rglob("*.parquet"))
    )
    for row, entry in enumerate(parts.rows):
        episode = source_rows.filter(pc.equal(source_rows["episode_index"], entry["episode_index"]))
        parts.set_table(row, episode.select(parts.table(row).column_names))
    put_together(parts, tmp_path / "shards")
    with pytest.raises(FormatError, match="language_events") as error:
        list(ShardedLeRobotDataset(tmp_path / "shards"))
    assert named in str(error.value)
