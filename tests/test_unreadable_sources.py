"""What the reader cannot read is refused by ``convert``, naming the setting or the feature,
before anything is written: a LeRobot dataset whose rows are stored as Lance (``storage_format``
in its info.json, which LeRobot's main branch reads), and a feature of a type the reader does
not know. Without these refusals both converted, and the reader failed on them at read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.cli import main


def with_info(golden_dir: Path, tmp_path: Path, edit) -> Path:
    """A copy of the golden ``image`` dataset whose info.json ``edit`` changed."""
    root = tmp_path / "source"
    shutil.copytree(golden_dir / "image", root)
    info = json.loads((root / "meta/info.json").read_text())
    edit(info)
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    return root


def refused(source: Path, dest: Path) -> str:
    result = CliRunner().invoke(main, ["convert", str(source), str(dest), "--workers", "0"])
    assert result.exit_code == 1, result.output
    assert not dest.exists(), "nothing is written"
    return result.output


def test_lance_storage_is_refused_naming_the_setting(golden_dir, tmp_path):
    source = with_info(golden_dir, tmp_path, lambda info: info.update(storage_format="lance"))
    message = refused(source, tmp_path / "dest")
    assert "storage_format 'lance'" in message and "meta/info.json" in message


def test_lerobots_default_storage_named_explicitly_converts(golden_dir, tmp_path):
    """``storage_format: "lerobot"`` is LeRobot's default (parquet) said out loud."""
    source = with_info(golden_dir, tmp_path, lambda info: info.update(storage_format="lerobot"))
    lerobot_shards.convert(str(source), str(tmp_path / "dest"), workers=0, progress=False)
    assert len(list(ShardedLeRobotDataset(tmp_path / "dest"))) == 74


@pytest.mark.parametrize(
    ("feature", "spec"),
    [
        ("observation.audio", {"dtype": "audio", "shape": [1600], "names": None}),
        ("observation.notes", {"dtype": "large_string", "shape": [1], "names": None}),
        ("observation.notes", {"dtype": "language", "shape": [1], "names": None}),
    ],
    ids=["audio", "large_string", "language under another name"],
)
def test_a_feature_of_a_type_the_reader_does_not_know_is_refused_by_name(
    golden_dir, tmp_path, feature, spec
):
    source = with_info(golden_dir, tmp_path, lambda info: info["features"].update({feature: spec}))
    message = refused(source, tmp_path / "dest")
    assert f"feature '{feature}' has dtype '{spec['dtype']}'" in message
