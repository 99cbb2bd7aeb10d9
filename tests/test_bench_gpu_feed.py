"""``scripts/bench_gpu_feed.py`` runs where CI runs (no GPU: the loaders, and the step on the
CPU at a small size) and prints its whole table; its speed is not judged here."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "bench_gpu_feed.py"


@pytest.mark.filterwarnings("ignore")
def test_the_benchmark_prints_every_figure_on_the_cpu(tmp_path):
    report = tmp_path / "fed.html"
    result = subprocess.run(
        [
            sys.executable, str(SCRIPT), "--cache", str(tmp_path), "--datasets", "2",
            "--episodes", "4", "--lengths", "12,16", "--workers", "1,2", "--batch-size", "4",
            "--seconds", "1", "--device", "cpu", "--report", str(report),
        ],
        capture_output=True, text=True, timeout=900, cwd=SCRIPT.parent,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    rows = dict(re.findall(r"^\| (.+?) +\| (.+) \|$", result.stdout, re.M))
    alone = rows["reader alone (default decode threads), samples/s by workers 1 / 2"]
    assert all(float(r.replace(",", "")) > 0 for r in re.findall(r"[\d,.]+(?= /| \()", alone))
    assert float(rows["a training step alone (small on cpu, one batch kept there)"].split()[0]) > 0
    # The fed step runs at the fastest worker count, which timing picks: either is a right row.
    (fed,) = [
        v
        for k, v in rows.items()
        if re.fullmatch(r"the step fed by the reader \([12] workers, to_device\)", k)
    ]
    assert re.match(r"[\d,.]+ samples/s \([\d.]+ of the step alone", fed)
    assert "machine:" in result.stdout and report.read_text().startswith("<!doctype html>")
