"""A SOURCE that is a Hub repo id (``lerobot/aloha_sim_insertion_human``) is read as LeRobot
reads it: its local copy under ``HF_LEROBOT_HOME`` when there is one, else
``hf://datasets/<repo_id>`` (no Hub is reachable here: that URL is checked, not fetched). Where
LeRobot looks is checked against LeRobot's own constant (in its environment)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from support.required import importorskip

import lerobot_shards
from lerobot_shards.source.location import resolve_source

HOME_VARS = ("HF_LEROBOT_HOME", "HF_HOME", "XDG_CACHE_HOME")


def test_a_repo_id_with_a_local_copy_converts_from_it(golden_dir, av1, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "home"))
    shutil.copytree(golden_dir / "av1_multifile", tmp_path / "home" / "golden" / "av1")
    monkeypatch.chdir(tmp_path)
    assert resolve_source("golden/av1") == str(tmp_path / "home" / "golden" / "av1")
    lerobot_shards.convert("golden/av1", str(tmp_path / "out"), workers=0, progress=False)
    ours = pq.read_table(tmp_path / "out" / "manifest.parquet").column("checksum")
    assert (
        ours.to_pylist() == pq.read_table(av1 / "manifest.parquet").column("checksum").to_pylist()
    )


def test_a_repo_id_without_a_local_copy_is_read_from_the_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    assert resolve_source("lerobot/pusht") == "hf://datasets/lerobot/pusht"


def test_paths_and_urls_are_what_they_say(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shards" / "pusht").mkdir(parents=True)
    for source in ("shards/pusht", "s3://bucket/pusht", "hf://datasets/lerobot/pusht", "a/b/c"):
        assert resolve_source(source) == source


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"HF_HOME": "/srv/hf"},
        {"XDG_CACHE_HOME": "/srv/cache"},
        {"HF_LEROBOT_HOME": "/srv/lerobot", "HF_HOME": "/srv/hf"},
    ],
)
def test_lerobot_home_is_where_lerobot_looks(env):
    importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")
    base = {k: v for k, v in os.environ.items() if k not in HOME_VARS}

    def printed(code: str) -> str:
        run = subprocess.run([sys.executable, "-c", code], env={**base, **env}, text=True,
                             capture_output=True, check=True)  # fmt: skip
        return run.stdout.strip()

    theirs = printed("from lerobot.utils.constants import HF_LEROBOT_HOME; print(HF_LEROBOT_HOME)")
    ours = printed("from lerobot_shards.source.location import lerobot_home; print(lerobot_home())")
    assert ours == theirs
