"""A picture of where a streaming run's time went: ``lerobot-shards stream ... --report FILE``.

The consuming process records each batch (when it arrived, its samples, the distinct episodes
in it), the memory of its process tree and, in a training benchmark, how long each step waited
for its batch (:class:`RunLog`); each iterating process records its fetch, decode and wait
times (``trace.py``). :func:`write_report` draws them with matplotlib (the ``report``
extra) into one PNG, or a self-contained HTML page holding that picture and a summary table.
"""

from __future__ import annotations

import base64
import html
import io
import os
import platform
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lerobot_shards.memory import tree_usage
from lerobot_shards.reader.loading.cpu import physical_cores, usable_cpus


@dataclass
class RunLog:
    """What the consuming process saw, with times in seconds since ``started``."""

    started: float = field(default_factory=time.perf_counter)
    batch_t: list[float] = field(default_factory=list)
    batch_samples: list[int] = field(default_factory=list)
    batch_distinct: list[int] = field(default_factory=list)
    """Distinct episodes (of a mixture: distinct (dataset, episode)) in each batch."""
    memory_t: list[float] = field(default_factory=list)
    memory_pss: list[int] = field(default_factory=list)
    """PSS in bytes of the consuming process and its DataLoader workers."""
    step_wait_s: list[float] = field(default_factory=list)
    """Per training step: seconds the GPU (the step) waited for its batch."""
    step_s: list[float] = field(default_factory=list)
    """Per training step: seconds the step itself took."""

    def batch(self, samples: int, distinct: int) -> None:
        self.batch_t.append(time.perf_counter() - self.started)
        self.batch_samples.append(samples)
        self.batch_distinct.append(distinct)

    def step(self, wait_s: float, step_s: float) -> None:
        self.step_wait_s.append(wait_s)
        self.step_s.append(step_s)


class MemorySampler:
    """Samples the PSS of this process and its children into ``log`` every ``interval_s``
    (Linux ``/proc``; elsewhere nothing is recorded). A context manager."""

    def __init__(self, log: RunLog, interval_s: float = 0.5) -> None:
        self.log = log
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lerobot-shards-memory", daemon=True)

    def __enter__(self) -> MemorySampler:
        if Path("/proc/self/smaps_rollup").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            pss = tree_usage(os.getpid())["pss"]
            self.log.memory_t.append(time.perf_counter() - self.log.started)
            self.log.memory_pss.append(pss)
            self._stop.wait(self.interval_s)


def machine() -> str:
    """The CPU, its logical CPUs and physical cores, and the platform, in one line."""
    model = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model}, {len(usable_cpus())} CPUs ({physical_cores()} physical cores); "
        f"{platform.platform()}; python {platform.python_version()}"
    )


def summary(log: RunLog, traces: dict[str, list[dict[str, Any]]]) -> list[tuple[str, str]]:
    """The report's table: what the run delivered and, per iterating process, where its time
    went (totals at its last snapshot)."""
    rows = []
    samples = int(sum(log.batch_samples))
    if log.batch_t:
        span = log.batch_t[-1] - log.batch_t[0]
        rate = (samples - log.batch_samples[0]) / span if span > 0 else float("nan")
        rows += [
            ("batches, samples", f"{len(log.batch_t)}, {samples}"),
            ("first batch after", f"{log.batch_t[0]:.2f} s"),
            ("samples/s after the first batch", f"{rate:.1f}"),
            ("distinct episodes per batch (median)", f"{np.median(log.batch_distinct):.1f}"),
        ]
        gaps = np.diff(log.batch_t)
        if len(gaps):
            rows.append(
                (
                    "gap between batches: median, longest",
                    f"{1000 * np.median(gaps):.0f} ms, {1000 * gaps.max():.0f} ms",
                )
            )
    if log.memory_pss:
        rows.append(("peak PSS of the process tree", f"{max(log.memory_pss) / 1e9:.2f} GB"))
    if log.step_s:
        waited, stepped = sum(log.step_wait_s), sum(log.step_s)
        rows.append(
            (
                "GPU idle (waiting for batches)",
                f"{waited:.2f} s of {waited + stepped:.2f} s "
                f"({100 * waited / (waited + stepped):.1f}%)",
            )
        )
    for label, snaps in sorted(traces.items()):
        last = snaps[-1]
        rows.append(
            (
                label,
                f"{int(last['items'])} items; fetch {last['fetch_s']:.1f} s, decode "
                f"{last['decode_s']:.1f} s, waited for fetches {last['fetch_wait_s']:.1f} s, "
                f"outside the stream {last['outside_s']:.1f} s; "
                f"{int(last['frames_decoded'])} frames decoded, "
                f"{int(last.get('frames_from_cache', 0))} from the frame cache",
            )
        )
    return rows


def figure(log: RunLog, traces: dict[str, list[dict[str, Any]]], title: str) -> Any:
    """The report's picture, a matplotlib ``Figure`` of six panels (a 2 x 3 grid), made
    without pyplot: nothing global to select or close."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(18, 9.5))
    axes = fig.subplots(2, 3)
    fig.suptitle(title)
    _rate(axes[0, 0], log)
    _worker_times(axes[0, 1], traces)
    _cache(axes[0, 2], traces, log.started)
    _memory(axes[1, 0], log)
    _mixing(axes[1, 1], log)
    _gpu(axes[1, 2], log)
    fig.tight_layout()
    return fig


def draw(log: RunLog, traces: dict[str, list[dict[str, Any]]], title: str) -> bytes:
    """The report's picture as PNG bytes."""
    out = io.BytesIO()
    figure(log, traces, title).savefig(out, format="png", dpi=80)
    return out.getvalue()


def write_report(
    log: RunLog,
    traces: dict[str, list[dict[str, Any]]],
    path: str | os.PathLike,
    *,
    title: str,
) -> None:
    """Write the report to ``path``: a PNG if it ends in ``.png``, else an HTML page."""
    path = Path(path)
    picture = draw(log, traces, title)
    if path.suffix.lower() == ".png":
        path.write_bytes(picture)
        return
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
        for k, v in summary(log, traces)
    )
    image = base64.b64encode(picture).decode()
    path.write_text(
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "th{text-align:left;padding-right:1em;vertical-align:top}img{max-width:100%}</style>"
        f"</head><body><h1>{html.escape(title)}</h1><p>{html.escape(machine())}</p>"
        f"<table>{rows}</table><img alt='where the time went' "
        f"src='data:image/png;base64,{image}'></body></html>"
    )


def _rate(ax: Any, log: RunLog) -> None:
    ax.set_title("samples per second (1 s bins)")
    ax.set_xlabel("s since start")
    if not log.batch_t:
        return
    t = np.asarray(log.batch_t)
    edges = np.arange(0, np.ceil(t[-1]) + 1)
    counts, _ = np.histogram(t, bins=edges, weights=np.asarray(log.batch_samples))
    ax.step(edges[:-1], counts, where="post")
    ax.axvline(t[0], color="grey", linestyle=":", label="first batch")
    ax.legend()


def _worker_times(ax: Any, traces: dict[str, list[dict[str, Any]]]) -> None:
    ax.set_title("per iterating process: where the time went (s)")
    labels = sorted(traces)
    parts = [
        ("fetch_s", "fetching (fetch threads)"),
        ("decode_s", "decoding"),
        ("fetch_wait_s", "waiting for a fetch"),
        ("outside_s", "collating / waiting for the loader"),
    ]
    x = np.arange(len(labels))
    width = 0.8 / len(parts)
    for n, (key, name) in enumerate(parts):
        ax.bar(x + n * width, [traces[k][-1][key] for k in labels], width, label=name)
    ax.set_xticks(x + 0.4 - width / 2, labels, rotation=15)
    ax.legend(fontsize="small")


def _cache(ax: Any, traces: dict[str, list[dict[str, Any]]], started: float) -> None:
    ax.set_title("camera frames: decoded and from the frame cache (cumulative)")
    ax.set_xlabel("s since start")
    offset = time.time() - (time.perf_counter() - started)  # wall time of ``started``
    for label, snaps in sorted(traces.items()):
        t = [s["t"] - offset for s in snaps]
        ax.plot(t, [s["frames_decoded"] for s in snaps], label=f"{label}: decoded")
        ax.plot(
            t,
            [s.get("frames_from_cache", 0) for s in snaps],
            linestyle="--",
            label=f"{label}: from cache",
        )
    if traces:
        ax.legend(fontsize="small")


def _memory(ax: Any, log: RunLog) -> None:
    ax.set_title("PSS of the process tree (GB)")
    ax.set_xlabel("s since start")
    ax.plot(log.memory_t, [p / 1e9 for p in log.memory_pss])


def _mixing(ax: Any, log: RunLog) -> None:
    ax.set_title("distinct episodes per batch")
    if log.batch_distinct:
        top = max(log.batch_distinct)
        ax.hist(log.batch_distinct, bins=np.arange(0.5, top + 1.5))
    ax.set_xlabel("episodes")
    ax.set_ylabel("batches")


def _gpu(ax: Any, log: RunLog) -> None:
    if not log.step_s:
        ax.set_title("GPU idle: no training step in this run")
        ax.axis("off")
        return
    waited, stepped = sum(log.step_wait_s), sum(log.step_s)
    ax.set_title(f"step waiting for its batch: {100 * waited / (waited + stepped):.1f}% idle")
    ax.plot(np.asarray(log.step_wait_s) * 1000, label="wait (ms)")
    ax.plot(np.asarray(log.step_s) * 1000, label="step (ms)")
    ax.set_xlabel("step")
    ax.legend()
