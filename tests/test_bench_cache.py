"""``scripts/bench_cache.py`` runs where CI runs (a tiny dataset, two epochs) and prints every
row of its table and both goals; its speed is not judged here, only what cannot depend on it:
a local root downloads nothing, an uncached epoch the whole dataset, a cache larger than the
dataset nothing after the first epoch, a cache of half of it at most half plus an episode per
DataLoader worker in the second, and the yardstick is never below what it claims."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "scripts" / "bench_cache.py"
SETTINGS = ("local", "uncached", "cache 0.5", "cache 1.5")


@pytest.mark.slow
def test_the_benchmark_prints_every_row(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), str(ROOT / "tests"), env.get("PYTHONPATH", "")]
    )
    result = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--cache", str(tmp_path), "--episodes", "6",
            "--epochs", "2", "--fractions", "0.5,1.5", "--quick",
        ],
        capture_output=True, text=True, timeout=600, cwd=SCRIPT.parent, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    rows = re.findall(r"^\| (\d+) \| ([a-z0-9. ]+?) \| (.+) \|$", result.stdout, re.M)
    assert [(int(e), s) for e, s, _ in rows] == [(e, s) for e in (1, 2) for s in SETTINGS]
    largest = float(re.search(r"the largest episode ([0-9.]+) of them", result.stdout).group(1))
    uncached = {e: float(c.split("|")[1]) for e, s, c in rows if s == "uncached"}
    for epoch, setting, cells in rows:
        mb, ratio, belady, rate, to_local = (c.strip() for c in cells.split("|"))
        assert float(rate) > 0 and float(to_local) > 0
        assert (belady == "-") == (setting in ("local", "uncached")), (setting, belady)
        if setting == "local":
            assert float(mb) == 0, "a local root downloaded"
        if setting == "uncached":
            assert float(ratio) >= 0.99, "an uncached epoch read less than the dataset"
        if setting.startswith("cache") and epoch == "1":
            assert float(belady) >= 0.99, "Belady's first epoch is every episode once"
            # Every episode at least once, and never more than without the cache. An episode
            # split between the two workers' parts is read twice: a cache of 1.5 keeps it for
            # the second read; one of 0.5 may be full of entries the pools still map (those
            # are never evicted), and the second read downloads it again.
            assert 0.99 <= float(ratio) <= uncached[epoch] + 0.001, (setting, ratio)
            if setting == "cache 1.5":
                assert float(ratio) <= 1.01, "a cache larger than the dataset downloaded twice"
        if setting == "cache 1.5" and epoch == "2":
            assert float(mb) == 0 and float(belady) == 0, "a warm epoch downloaded"
        if setting == "cache 0.5" and epoch == "2":  # (1 - f) plus an episode per worker
            assert float(ratio) <= 0.5 + 2 * largest + 0.001, (ratio, largest)
    assert "goal: warm epochs" in result.stdout and "goal: cold epoch" in result.stdout
    assert "machine:" in result.stdout
