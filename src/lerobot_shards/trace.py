"""Where an iterating process's time goes, written down for ``lerobot-shards stream --report``.

Why. A DataLoader worker fetches (on fetch threads), decodes (inline or on decode threads),
waits for fetches its draws need, and waits for its DataLoader to ask for more; which of these
dominates says what to change (more workers, a larger pool, a faster store). The main process
cannot see inside its workers, so each iterating process keeps running totals
(:data:`COUNTERS`) and, when the dataset is given a ``trace_dir``, appends a snapshot of them to
``<trace_dir>/trace-<pid>.jsonl`` a few times a second (:class:`TraceWriter`); the report reads
them back (:func:`read_traces`).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

FIELDS = (
    "fetch_s",
    "decode_s",
    "fetch_wait_s",
    "outside_s",
    "items",
    "frames_decoded",
    "packets_decoded",
)
"""``fetch_s``: seconds fetch threads spent fetching, verifying and demuxing episodes;
``decode_s``: seconds spent decoding GOPs (on any thread); ``fetch_wait_s``: seconds the
iterating thread waited for an episode's fetch; ``outside_s``: seconds between handing an item
over and being asked for the next (collating, and waiting for the DataLoader to want more);
``items``: items built; ``frames_decoded``: camera frames decoded for items (or the frame
cache); ``packets_decoded``: packets the decoders were given, each a frame's decoding work, kept
or not (more than ``frames_decoded`` where a frame needs others decoded first)."""


class Counters:
    """Running totals of :data:`FIELDS` for this process, safe to add to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._values = dict.fromkeys(FIELDS, 0.0)

    def add(self, name: str, amount: float) -> None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child starts from zero, not its parent's
                self._pid, self._values = os.getpid(), dict.fromkeys(FIELDS, 0.0)
            self._values[name] += amount

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            if self._pid != os.getpid():
                return dict.fromkeys(FIELDS, 0.0)
            return dict(self._values)


COUNTERS = Counters()


class TraceWriter:
    """Appends this process's counters, with extra values, to ``<folder>/trace-<pid>.jsonl``
    at most every ``interval_s`` seconds (and at :meth:`close`)."""

    def __init__(self, folder: str | os.PathLike, label: str, interval_s: float = 0.25) -> None:
        self.path = Path(folder) / f"trace-{os.getpid()}.jsonl"
        self.label = label
        self.interval_s = interval_s
        self._last: float | None = None  # the first tick always writes

    def tick(self, **extra: Any) -> None:
        """Write a snapshot if ``interval_s`` has passed since the last one."""
        now = time.monotonic()
        if self._last is None or now - self._last >= self.interval_s:
            self._last = now
            self._write(extra)

    def close(self, **extra: Any) -> None:
        """Write a last snapshot."""
        self._write(extra)

    def _write(self, extra: dict[str, Any]) -> None:
        line = {"t": time.time(), "label": self.label, **COUNTERS.snapshot(), **extra}
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def read_traces(folder: str | os.PathLike) -> dict[str, list[dict[str, Any]]]:
    """Every process's snapshots under ``folder``, by label, in time order."""
    traces: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(folder).glob("trace-*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                traces.setdefault(row["label"], []).append(row)
    for rows in traces.values():
        rows.sort(key=lambda r: r["t"])
    return traces
