"""Training poisons named at conversion (``poisons.py``): datasets with a NaN, with Infs and with
a frozen joint (and, in all of them, a one-frame episode) converted through the command line.
``convert`` names each, per feature and episode, in its summary and as JSON, and writes them
beside the shards, where ``inspect`` finds them; ``convert --strict`` refuses the NaN and the
Infs, not the frozen joint; a resumed conversion keeps what the finished episodes held. The
expected findings are written out by hand from where each fixture put its poison.

Also, against a plain loop over every value, the search over many episodes' rows at once (as
the converter reads them) in every Arrow encoding of a vector feature that LeRobot writes
(``fixed_size_list``, ``list``, ``large_list``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_shards.cli import main
from lerobot_shards.converter.job import DONE_DIR
from lerobot_shards.format import INDEX_FILE
from lerobot_shards.poisons import POISONS_FILE, Poison, find_poisons, scan_poisons
from lerobot_shards.testing.factory import make_dataset

LENGTHS = [6, 1, 5, 4]
STARTS = [0, 6, 7, 12]
"""Each episode's first global index."""
ONE_FRAME = {"kind": "one_frame", "episode_index": 1}
POISONED = {
    # a NaN in observation.state: episode 2, frame 3, joint 1
    "nan": (
        [("observation.state", 2, 3, 1, float("nan"))],
        [{"kind": "non_finite", "episode_index": 2, "feature": "observation.state",
          "count": 1, "first_index": STARTS[2] + 3}],
    ),
    # an Inf and a -Inf in action: episode 3, frames 1 and 2
    "inf": (
        [("action", 3, 1, 0, float("inf")), ("action", 3, 2, 3, float("-inf"))],
        [{"kind": "non_finite", "episode_index": 3, "feature": "action", "count": 2,
          "first_index": STARTS[3] + 1}],
    ),
    # joint 2 of observation.state frozen at 7.0 for the whole of episode 0
    "frozen": (
        [("observation.state", 0, f, 2, 7.0) for f in range(LENGTHS[0])],
        [{"kind": "constant", "episode_index": 0, "feature": "observation.state",
          "dimensions": [2], "names": ["j2"]}],
    ),
}  # fmt: skip


def expected(kind: str) -> list[dict]:
    return sorted([ONE_FRAME, *POISONED[kind][1]], key=json.dumps)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each poisoned dataset: the factory's (state and action move every frame), its rows
    edited where ``POISONED`` says."""
    base = tmp_path_factory.mktemp("poisoned")
    out = {}
    for kind, (edits, _) in POISONED.items():
        root = make_dataset(
            base / kind, episode_lengths=LENGTHS, cameras={"observation.images.top": (8, 8)},
            video=False,
        )  # fmt: skip
        (path,) = (root / "data").rglob("*.parquet")
        table = pq.read_table(path)
        for key, episode, frame, joint, value in edits:
            values = np.stack(table.column(key).to_numpy(zero_copy_only=False)).copy()
            values[STARTS[episode] + frame, joint] = value
            column = pa.FixedSizeListArray.from_arrays(pa.array(values.ravel(), pa.float32()), 4)
            table = table.set_column(table.schema.get_field_index(key), key, column)
        pq.write_table(table, path)
        out[kind] = root
    return out


def convert(source: Path, dest: Path, *flags: str):
    return CliRunner().invoke(
        main, ["convert", str(source), str(dest), "--workers", "0", "--no-progress", *flags]
    )


@pytest.mark.parametrize("kind", list(POISONED))
def test_convert_names_each_poison_in_its_summary_and_json(sources, tmp_path, kind):
    result = convert(sources[kind], tmp_path / "json", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert sorted(summary["poisons"], key=json.dumps) == expected(kind)
    assert summary["unchecked_episodes"] == []

    text = convert(sources[kind], tmp_path / "text")
    assert text.exit_code == 0, text.output
    assert "one-frame episodes: 1 (1)" in text.output
    for finding in POISONED[kind][1]:
        line = next(
            ln for ln in text.output.splitlines() if ln.strip().startswith(finding["feature"])
        )
        assert f"({finding['episode_index']})" in line, line
        if finding["kind"] == "non_finite":
            assert f"{finding['count']} non-finite" in line
            assert f"the first at index {finding['first_index']}" in line
        else:
            assert "dimension(s) [2] (j2) constant" in line


@pytest.mark.parametrize("kind", list(POISONED))
def test_inspect_reports_what_convert_found(sources, tmp_path, kind):
    assert convert(sources[kind], tmp_path / "d").exit_code == 0
    saved = json.loads((tmp_path / "d" / POISONS_FILE).read_text())
    assert sorted(saved["poisons"], key=json.dumps) == expected(kind)
    shown = CliRunner().invoke(main, ["inspect", str(tmp_path / "d"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert sorted(json.loads(shown.output)["poisons"], key=json.dumps) == expected(kind)
    text = CliRunner().invoke(main, ["inspect", str(tmp_path / "d")]).output
    assert "poisons (LeRobot reads these" in text and "one-frame episodes: 1 (1)" in text
    for finding in POISONED[kind][1]:
        assert f"{finding['feature']}: " in text


@pytest.mark.parametrize("kind", ["nan", "inf"])
def test_strict_refuses_non_finite_values_naming_feature_episode_and_index(sources, tmp_path, kind):
    (finding,) = POISONED[kind][1]
    result = convert(sources[kind], tmp_path / "d", "--strict")
    assert result.exit_code == 1
    message = result.output
    assert "--strict refuses non-finite values" in message
    assert f"episode {finding['episode_index']}: {finding['feature']}" in message
    assert f"the first at index {finding['first_index']}" in message
    assert not (tmp_path / "d" / INDEX_FILE).exists()  # no finished dataset
    again = convert(sources[kind], tmp_path / "d")  # without --strict: finished, warned
    assert again.exit_code == 0 and "non-finite" in again.output


def test_strict_converts_a_frozen_joint_with_a_warning(sources, tmp_path):
    result = convert(sources["frozen"], tmp_path / "d", "--strict")
    assert result.exit_code == 0, result.output
    assert "dimension(s) [2] (j2) constant" in result.output


def test_a_resumed_conversion_keeps_the_finished_episodes_findings(sources, tmp_path):
    """A rerun converts nothing (every episode finished) and still names every finding; records
    of an earlier version (without findings) are reported unchecked, and --strict converts
    those episodes again to check them."""
    dest = tmp_path / "d"
    assert convert(sources["nan"], dest).exit_code == 0
    (dest / INDEX_FILE).unlink()
    rerun = json.loads(convert(sources["nan"], dest, "--json").output)
    assert rerun["converted"] == 0 and sorted(rerun["poisons"], key=json.dumps) == expected("nan")

    for log in (dest / DONE_DIR).glob("*.jsonl"):  # an earlier version's records
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        log.write_text(
            "".join(
                json.dumps({k: v for k, v in r.items() if k != "poisons"}) + "\n" for r in lines
            )
        )
    old = json.loads(convert(sources["nan"], dest, "--json").output)
    assert old["converted"] == 0 and old["poisons"] == []
    assert old["unchecked_episodes"] == [0, 1, 2, 3]
    assert "4 episode(s) not checked" in CliRunner().invoke(main, ["inspect", str(dest)]).output
    strict = convert(sources["nan"], dest, "--strict")
    assert strict.exit_code == 1 and "episode 2: observation.state" in strict.output


# ---------------------------------------------------------------- the search, by hand

ENCODINGS = {
    "fixed_size_list": lambda values: pa.FixedSizeListArray.from_arrays(
        pa.array(values.ravel()), values.shape[1]
    ),
    "list": lambda values: pa.array(list(values), pa.list_(pa.from_numpy_dtype(values.dtype))),
    "large_list": lambda values: pa.array(
        list(values), pa.large_list(pa.from_numpy_dtype(values.dtype))
    ),
}
CELLS = st.sampled_from([0.0, 1.0, -2.5, float("nan"), float("inf"), float("-inf")])


def plain_loop(rows: list[list[float]], episode: int, start: int) -> list[Poison]:
    """One episode's findings, the slow way: every value looked at."""
    want = []
    if len(rows) == 1:
        want.append(Poison("one_frame", episode))
    bad = [(r, c) for r, row in enumerate(rows) for c, v in enumerate(row) if not np.isfinite(v)]
    if bad:
        first = start + bad[0][0]
        want.append(Poison("non_finite", episode, "action", count=len(bad), first_index=first))
    if len(rows) > 1:  # NaN equals nothing, not even itself: a NaN column is not frozen
        frozen = tuple(c for c in range(3) if all(row[c] == rows[0][c] for row in rows))
        if frozen:
            names = tuple("abc"[c] for c in frozen)
            want.append(Poison("constant", episode, "action", dimensions=frozen, names=names))
    return want


@settings(max_examples=40)
@given(
    episodes=st.lists(
        st.lists(st.lists(CELLS, min_size=3, max_size=3), min_size=1, max_size=5),
        min_size=1,
        max_size=5,
    ),
    encoding=st.sampled_from(list(ENCODINGS)),
    dtype=st.sampled_from([np.float32, np.float64]),
    order=st.randoms(use_true_random=False),
)
def test_findings_equal_a_plain_loop_over_the_rows(episodes, encoding, dtype, order):
    """Several episodes' rows in one table (as a converter reads them), searched at once: each
    episode's findings are those a plain loop over its own rows finds."""
    ids = list(range(len(episodes)))
    order.shuffle(ids)  # episodes in any order, each one's rows together
    rows = [row for episode in episodes for row in episode]
    starts = np.cumsum([0] + [len(e) for e in episodes])[:-1]
    first = 40
    nan = float("nan")
    table = pa.table(
        {  # a row before the episodes', sliced off: arrays that start at an offset
            "action": ENCODINGS[encoding](np.array([[nan] * 3, *rows], dtype=dtype)),
            "index": pa.array(range(first - 1, first + len(rows)), pa.int64()),
        }
    ).slice(1)
    features = {"action": {"dtype": np.dtype(dtype).name, "shape": [3], "names": ["a", "b", "c"]}}
    owner = np.repeat(ids, [len(e) for e in episodes])
    found = scan_poisons(table, features, owner)
    want = {
        ids[k]: plain_loop(episode, ids[k], first + int(starts[k]))
        for k, episode in enumerate(episodes)
    }
    assert found == want
    if len(episodes) == 1:
        assert find_poisons(table, features, ids[0]) == want[ids[0]]
