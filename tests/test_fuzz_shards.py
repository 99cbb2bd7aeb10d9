"""Hypothesis-driven fuzzing of the reader and ``verify --deep`` over mutated datasets of both
kinds, a video dataset and an image (non-video) one (``support/fuzz_shards.py``: one lie per
case, in one file or coordinated across every file that states it, every checksum
recomputed; read plainly and, drawn, through DataLoader workers, with delta_timestamps and
return_uint8, or in a mixture), each kind in a fresh process so that its peak memory is its
own: no crash, hang, bare exception, or item or ``ds.meta`` that differs from the unmutated
dataset's without an error; verify reports what the reader refuses; peak memory under a stated
bound (a 4096x4096 video in place of a 40x56 one once took 2.1 GB).

Derandomized where ``CI`` is set; elsewhere each run draws fresh cases from a seed it prints
(``FUZZ_SEED`` replays it). ``scripts/fuzz_shards.py`` explores for as long as it is given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).parent / "support" / "fuzz_shards.py"
CASES = 150
"""Per kind: about a minute each on a loaded 2-core machine (a loader case starts two workers)."""
PEAK_RSS_MB = 1500  # the process with torch, PyAV and the reader loaded is about 900 MB


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["video", "image"])
def test_mutated_datasets_are_refused_clearly_or_read_unchanged(shards, kind, tmp_path):
    root = shards({"video": "av1_multifile", "image": "image"}[kind])
    run = subprocess.run(
        [sys.executable, str(FUZZ), kind, str(root), str(tmp_path), str(CASES)],
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stderr[-8000:]
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    print(run.stderr.splitlines()[0], summary)  # the seed, the counts by where, the peak memory
    assert summary["cases"] == CASES
    where = {w.split(":")[0] for w, outcomes in summary["where"].items() if "reader" in outcomes}
    assert len(where) >= 8  # refused lies in many files: index, info, manifest, headers, rows...
    assert summary["peak_rss_mb"] < PEAK_RSS_MB
    assert summary["slowest_s"] < 60
