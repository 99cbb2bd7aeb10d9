"""``lerobot-shards stream --report``: the picture and the page, and the per-process traces
behind them, counted exactly on a finished epoch of the golden dataset. The picture is checked
panel by panel on the matplotlib figure the command drew (titles, and the data each panel
plots), not only as "a PNG"."""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.required import importorskip

from lerobot_shards import convert, report
from lerobot_shards.cli import main
from lerobot_shards.report import RunLog, write_report
from lerobot_shards.trace import COUNTERS, TraceWriter, read_traces

importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")

FRAMES = 74  # av1_multifile
BATCHES = 19  # batches of 4 mixing both workers' samples: 18 full, the last of 2
PNG = b"\x89PNG\r\n\x1a\n"
WORKERS = ["rank 0 worker 0", "rank 0 worker 1"]
TITLES = [
    "samples per second (1 s bins)",
    "per iterating process: where the time went (s)",
    "camera frames: decoded and from the frame cache (cumulative)",
    "PSS of the process tree (GB)",
    "distinct episodes per batch",
]
NO_STEPS = "GPU idle: no training step in this run"
SUMMARY = {
    "batches, samples",
    "first batch after",
    "samples/s after the first batch",
    "distinct episodes per batch (median)",
    "gap between batches: median, longest",
    "peak PSS of the process tree",
    *WORKERS,
}


@pytest.fixture(scope="module")
def converted(golden_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("report") / "shards"
    convert(str(golden_dir / "av1_multifile"), str(dest), workers=1, progress=False)
    return dest


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list:
    """The figures ``report.figure`` makes while a test runs (the very ones drawn)."""
    made: list = []
    real = report.figure

    def recorded(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(report, "figure", recorded)
    return made


def stream_with_report(converted: Path, path: Path) -> str:
    """``lerobot-shards stream`` over one epoch, 2 workers, batches of 4, ``--report path``."""
    result = CliRunner().invoke(
        main,
        [
            "stream", str(converted), "--num-workers", "2", "--batch-size", "4", "--epochs", "1",
            "--report", str(path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"report: {path}" in result.output
    return result.output


def heights(ax) -> list[float]:
    """The heights of a panel's bars."""
    return [patch.get_height() for patch in ax.patches]


def check_stream_panels(fig) -> None:
    """The six panels of one epoch of ``converted`` streamed by 2 workers in batches of 4."""
    rate, times, cache, memory, mixing, gpu = fig.axes
    assert [ax.get_title() for ax in fig.axes] == [*TITLES, NO_STEPS]
    # samples per second: every sample of the epoch in some bin
    assert sum(rate.get_lines()[0].get_ydata()) == FRAMES
    # four bars per iterating process, labelled by process
    assert [t.get_text() for t in times.get_xticklabels()] == WORKERS
    assert len(times.patches) == 4 * len(WORKERS)
    assert all(h >= 0 for h in heights(times)) and any(h > 0 for h in heights(times))
    # decoded and from-cache lines per process; each process decoded frames
    lines = {line.get_label(): line.get_ydata() for line in cache.get_lines()}
    assert set(lines) == {f"{w}: {what}" for w in WORKERS for what in ("decoded", "from cache")}
    assert all(lines[f"{w}: decoded"][-1] > 0 for w in WORKERS)
    # memory sampled at least once, and never zero
    (pss,) = memory.get_lines()
    assert len(pss.get_ydata()) >= 1 and min(pss.get_ydata()) > 0
    # one count per batch, each batch of 1 to 4 distinct episodes
    assert sum(heights(mixing)) == BATCHES
    counted = [round(p.get_x() + p.get_width() / 2) for p in mixing.patches if p.get_height()]
    assert counted and all(1 <= n <= 4 for n in counted)
    # no training steps: the panel says so and draws nothing
    assert not gpu.axison and not gpu.get_lines()


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_stream_report_page_counts_every_item_of_the_epoch_per_worker(converted, tmp_path, figures):
    page = tmp_path / "report.html"
    stream_with_report(converted, page)
    text = page.read_text()
    rows = dict(re.findall(r"<tr><th>(.*?)</th><td>(.*?)</td></tr>", text))
    assert set(rows) == SUMMARY
    assert rows["batches, samples"] == f"{BATCHES}, {FRAMES}"  # no padding: 74 = 37 + 37
    items = [int(rows[w].split(" items")[0]) for w in WORKERS]
    assert sum(items) == FRAMES
    assert 1 <= float(rows["distinct episodes per batch (median)"]) <= 4
    assert float(rows["peak PSS of the process tree"].removesuffix(" GB")) > 0
    assert float(rows["first batch after"].removesuffix(" s")) > 0
    picture = base64.b64decode(re.search(r"base64,([^']+)'", text).group(1))
    assert picture.startswith(PNG)
    (fig,) = figures
    check_stream_panels(fig)


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_stream_report_png_through_the_command_line_has_six_panels(converted, tmp_path, figures):
    picture = tmp_path / "report.png"
    stream_with_report(converted, picture)
    assert picture.read_bytes().startswith(PNG)
    (fig,) = figures
    assert fig.get_suptitle().startswith(f"lerobot-shards stream {converted}: 2 workers, batch 4")
    check_stream_panels(fig)


def test_png_report_and_a_training_log(tmp_path, figures):
    log = RunLog()
    for n in range(20):
        log.batch(8, 1 + n % 5)
        log.step(0.001 * n, 0.05)
    log.memory_t, log.memory_pss = [0.0, 1.0], [10**9, 2 * 10**9]
    out = tmp_path / "report.png"
    write_report(log, {}, out, title="synthetic")
    assert out.read_bytes().startswith(PNG)
    (fig,) = figures
    rate, times, cache, memory, mixing, gpu = fig.axes
    assert [ax.get_title() for ax in fig.axes[:5]] == TITLES
    assert sum(rate.get_lines()[0].get_ydata()) == 160
    assert not times.patches and not cache.get_lines()  # no traces
    assert list(memory.get_lines()[0].get_ydata()) == [1.0, 2.0]
    assert heights(mixing) == [4, 4, 4, 4, 4]  # 1 to 5 distinct episodes, 4 batches each
    # 0.19 s waited of 0.19 + 20 * 0.05 s
    assert gpu.get_title() == "step waiting for its batch: 16.0% idle"
    wait, step = gpu.get_lines()
    assert len(wait.get_ydata()) == len(step.get_ydata()) == 20
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
