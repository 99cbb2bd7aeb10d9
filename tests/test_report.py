"""``lerobot-shards stream --report``: the picture and the page, and the per-process traces
behind them, counted exactly on a finished epoch of the golden dataset."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.required import importorskip

from lerobot_shards import convert
from lerobot_shards.cli import main
from lerobot_shards.report import RunLog, write_report
from lerobot_shards.trace import COUNTERS, TraceWriter, read_traces

importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")

FRAMES = 74  # av1_multifile
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def converted(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("report") / "shards"
    convert(str(golden_dir / "av1_multifile"), str(dest), workers=1, progress=False)
    return dest


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_stream_report_page_counts_every_item_of_the_epoch_per_worker(converted, tmp_path):
    page = tmp_path / "report.html"
    result = CliRunner().invoke(
        main,
        [
            "stream", str(converted), "--workers", "2", "--batch-size", "4", "--epochs", "1",
            "--report", str(page),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = page.read_text()
    rows = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", text))
    assert set(rows) >= {"batches, samples", "rank 0 worker 0", "rank 0 worker 1"}
    assert rows["batches, samples"].endswith(f", {FRAMES}")  # no padding: 74 = 37 + 37
    items = [int(rows[f"rank 0 worker {w}"].split(" items")[0]) for w in (0, 1)]
    assert sum(items) == FRAMES
    picture = base64.b64decode(re.search(r"base64,([^']+)'", text).group(1))
    assert picture.startswith(PNG)


def test_png_report_and_a_training_log(tmp_path):
    log = RunLog()
    for n in range(20):
        log.batch(8, 1 + n % 5)
        log.step(0.001 * n, 0.05)
    log.memory_t, log.memory_pss = [0.0, 1.0], [10**9, 2 * 10**9]
    out = tmp_path / "report.png"
    write_report(log, {}, out, title="synthetic")
    assert out.read_bytes().startswith(PNG)
    page = tmp_path / "report.html"
    write_report(log, {}, page, title="synthetic")
    text = page.read_text()
    assert "GPU idle (waiting for batches)" in text and "peak PSS of the process tree" in text
    assert "2.00 GB" in text  # the peak of the samples given


def test_trace_snapshots_are_read_back_in_order(tmp_path):
    writer = TraceWriter(tmp_path, "rank 0 worker 3", interval_s=3600)
    before = COUNTERS.snapshot()["items"]
    writer.tick(frames_from_cache=1)  # the first tick always writes
    COUNTERS.add("items", 5)
    writer.tick(frames_from_cache=2)  # within the interval: not written
    writer.close(frames_from_cache=3)
    traces = read_traces(tmp_path)
    rows = traces["rank 0 worker 3"]
    assert [r["frames_from_cache"] for r in rows] == [1, 3]
    assert rows[-1]["items"] - rows[0]["items"] == 5 and rows[0]["items"] == before
    assert (tmp_path / f"trace-{os.getpid()}.jsonl").exists()
