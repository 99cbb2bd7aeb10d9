"""``lerobot-shards train``'s own options (``--shards``, ``--weights``, ``--buffer-size``,
``--byte-budget-gb``, ``--storage-options``, ``--layout``, ``--embodiments``) reach the reader
the run streams from: its real command line (click, in this process) with LeRobot's trainer
replaced by a stub that keeps what it was handed, then the reader those shards open. Pure: no
LeRobot needed (LeRobot's own settings, ``--dataset.*``, ``--seed``, ``--tolerance_s``:
test_lerobot_train_datasets.py)."""

from __future__ import annotations

import json
import sys
import types

import pytest
from click.testing import CliRunner

from lerobot_shards import TargetLayout
from lerobot_shards.cli import main


@pytest.fixture
def trainer(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """The ``(shards, arguments)`` each ``lerobot-shards train`` hands LeRobot's trainer."""
    calls: list[tuple] = []
    stub = types.ModuleType("lerobot_shards.train.run")
    stub.train = lambda shards, arguments: calls.append((shards, list(arguments)))
    monkeypatch.setitem(sys.modules, "lerobot_shards.train.run", stub)
    return calls


def test_reader_options_reach_the_reader(av1, trainer):
    result = CliRunner().invoke(
        main,
        [
            "train", "--shards", str(av1), "--buffer-size", "3", "--byte-budget-gb", "0.5",
            "--storage-options", '{"auto_mkdir": true}', "--policy.type=act", "--seed=7",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ((shards, arguments),) = trainer
    assert arguments == ["--policy.type=act", "--seed=7"]  # LeRobot's, left to LeRobot
    ds = shards.open()
    assert ds.root == str(av1) and not ds.is_mixture
    assert ds.buffer_size == 3
    assert ds.byte_budget == 500_000_000
    (member,) = ds.datasets
    assert member.storage_options == {"auto_mkdir": True}
    assert member.fs.auto_mkdir is True  # the filesystem the reader fetches with
    assert ds.spec.return_uint8  # as LeRobot's factory asks


def test_cache_options_reach_the_reader(av1, trainer, tmp_path):
    """--cache-dir (which caches even a local root), --cache-limit-gb and --node-affinity, and
    --no-cache."""
    folder = tmp_path / "cache"
    result = CliRunner().invoke(
        main,
        [
            "train", "--shards", str(av1), "--cache-dir", str(folder), "--cache-limit-gb", "2",
            "--node-affinity", "--policy.type=act",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ds = trainer[-1][0].open()
    assert ds.cache is not None and ds.cache.directory == folder
    assert ds.cache.limit_bytes == 2_000_000_000
    assert ds.node_affinity is True
    result = CliRunner().invoke(
        main, ["train", "--shards", str(av1), "--no-cache", "--no-node-affinity"]
    )
    assert result.exit_code == 0, result.output
    ds = trainer[-1][0].open()
    assert ds.cache is None and ds.node_affinity is False


def test_defaults_reach_the_reader(av1, trainer):
    result = CliRunner().invoke(main, ["train", "--shards", str(av1), "--policy.type=act"])
    assert result.exit_code == 0, result.output
    ((shards, _),) = trainer
    ds = shards.open()
    assert (ds.buffer_size, ds.byte_budget) == (64, None)
    assert ds.datasets[0].storage_options == {}


def test_several_shards_and_weights_make_the_mixture(av1, shards, trainer):
    v21 = shards("v21_video")
    result = CliRunner().invoke(
        main,
        [
            "train", "--shards", str(av1), "--shards", str(v21), "--weights", "2,1",
            "--buffer-size", "5", "--policy.type=act",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ((shards_, _),) = trainer
    ds = shards_.open()
    assert ds.is_mixture and ds.root == [str(av1), str(v21)]
    # 148 frames at 2:1: 98.67 and 49.33 samples, 99 and 49 by the largest remainder
    assert ds.samples_per_dataset.tolist() == [99, 49]
    assert ds.buffer_size == 5


GOLDEN_LAYOUT = {
    "vectors": {"action": 8, "observation.state": 8},
    "cameras": ["observation.images.top"],
    "image_size": [16, 24],
    "embodiments": {
        "golden_arm": {
            "key_map": {
                "observation.images.cam_high": "observation.images.top",
                "observation.images.cam_left_wrist": None,
            }
        }
    },
}


def test_a_layout_and_embodiments_reach_the_reader(av1, shards, trainer, tmp_path):
    """--layout is read when the command starts (its content, not its path, goes on: a
    checkpoint holds it); --embodiments names each dataset's robot."""
    layout = tmp_path / "layout.json"
    layout.write_text(json.dumps(GOLDEN_LAYOUT))
    v21 = shards("v21_video")
    result = CliRunner().invoke(
        main,
        [
            "train", "--shards", str(av1), "--shards", str(v21), "--layout", str(layout),
            "--embodiments", "golden_arm,golden_arm", "--policy.type=act",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    ((shards_, _),) = trainer
    layout.unlink()
    assert shards_.layout == TargetLayout.from_dict(GOLDEN_LAYOUT).to_dict()
    ds = shards_.open()
    assert ds.layout == TargetLayout.from_dict(GOLDEN_LAYOUT)
    assert ds.meta.embodiments == ["golden_arm", "golden_arm"]
    assert ds.meta.dataset_names == ["av1_multifile", "v21_video"]
    item = next(iter(ds))
    assert item["observation.images.top"].shape == (3, 16, 24) and item["action"].shape == (8,)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--storage-options", "{not json"], "--storage-options"),
        (["--weights", "2,1"], "--weights"),  # one --shards: no mixture to weigh
        (["--embodiments", "golden_arm"], "--embodiments"),  # no --layout
        (["--layout", "LAYOUT", "--embodiments", "a,b"], "--embodiments"),  # two for one
        (["--layout", "BAD_LAYOUT"], "--layout"),
    ],
)
def test_bad_reader_options_are_refused_before_the_trainer_starts(
    av1, trainer, arguments, named, tmp_path
):
    (tmp_path / "layout.json").write_text(json.dumps(GOLDEN_LAYOUT))
    (tmp_path / "bad.json").write_text(json.dumps({**GOLDEN_LAYOUT, "resize": "crop"}))
    paths = {"LAYOUT": str(tmp_path / "layout.json"), "BAD_LAYOUT": str(tmp_path / "bad.json")}
    arguments = [paths.get(a, a) for a in arguments]
    result = CliRunner().invoke(main, ["train", "--shards", str(av1), *arguments])
    assert result.exit_code != 0
    assert named in result.output
    assert not trainer
