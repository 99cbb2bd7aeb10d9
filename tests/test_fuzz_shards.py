"""Hypothesis-driven fuzzing of the reader and ``verify --deep`` over 500 mutated
datasets (``support/fuzz_shards.py``: one lie per case in any file, every checksum recomputed),
in a fresh process so that its peak memory is its own: no crash, hang, bare exception or item
that differs from the unmutated dataset's without an error; verify reports what the reader
refuses; peak memory under a stated bound (a 4096x4096 video in place of a 40x56 one once took
2.1 GB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).parent / "support" / "fuzz_shards.py"
CASES = 500
PEAK_RSS_MB = 1500  # the process with torch, PyAV and the reader loaded is about 900 MB


@pytest.mark.timeout(900)
def test_mutated_datasets_are_refused_clearly_or_read_unchanged(av1, tmp_path):
    run = subprocess.run(
        [sys.executable, str(FUZZ), str(av1), str(tmp_path), str(CASES)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stderr[-8000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    print(summary)  # the case count, the error kinds and the peak memory, for the record
    assert summary["cases"] == CASES
    assert len(summary["refused"]) >= 5  # lies in index, manifest, headers, rows and videos
    assert summary["peak_rss_mb"] < PEAK_RSS_MB
    assert summary["slowest_s"] < 60
