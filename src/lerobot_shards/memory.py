"""Real memory of a process tree (Linux ``/proc``), for tests and benchmarks of the byte budget.

The reader's own counters say what it means to hold; what users pay is the memory of the
training process and its DataLoader workers together. PSS (proportional set size) counts a
shared page once over the processes sharing it, so the sum over a tree is what the tree costs,
shared batch segments and torch's shared memory included.

PSS also splits the pages of mapped files (libtorch, FFmpeg, Python's own libraries) over every
process on the machine that maps them, so the tree's share of them moves whenever unrelated
processes using the same installation start or exit (100 MB and more between two runs on a
shared machine). What data costs is anonymous memory (heaps, thread stacks, copied-on-write
pages) and shared memory (batch segments): :func:`tree_usage` reports their PSS apart, as
``data``, which is what tests and benchmarks of the budget compare.
"""

from __future__ import annotations

import os
import threading


def tree_memory(pid: int) -> tuple[int, int]:
    """``(sum of PSS, sum of RSS)`` in bytes over ``pid`` and its descendants."""
    usage = tree_usage(pid)
    return usage["pss"], usage["rss"]


_FIELDS = {"Pss:": "pss", "Rss:": "rss", "Pss_Anon:": "anon", "Pss_Shmem:": "shmem"}


def tree_usage(pid: int) -> dict[str, int]:
    """Sums in bytes over ``pid`` and its descendants: ``pss``, ``rss``, and ``data``, the PSS
    of anonymous plus shared memory (``Pss_Anon + Pss_Shmem``, file-backed pages left out)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    sums = dict.fromkeys(_FIELDS.values(), 0)
    todo = [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    name, _, rest = line.partition(" ")
                    field = _FIELDS.get(name)
                    if field is not None:
                        sums[field] += int(rest.split()[0]) * 1024
        except OSError:
            pass
    return {"pss": sums["pss"], "rss": sums["rss"], "data": sums["anon"] + sums["shmem"]}


class PeakMemory:
    """Samples :func:`tree_memory` of ``pid`` every ``interval_s`` on a thread while in a
    ``with`` block; ``peak_pss``, ``peak_rss`` and ``peak_data`` (see :func:`tree_usage`) are
    the largest sums seen."""

    def __init__(self, pid: int | None = None, interval_s: float = 0.05) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self.peak_pss = 0
        self.peak_rss = 0
        self.peak_data = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int]:
        """Take one sample now (also counted in the peaks); returns ``(pss, rss)``."""
        usage = self.usage()
        return usage["pss"], usage["rss"]

    def usage(self) -> dict[str, int]:
        """Take one sample now (also counted in the peaks); returns :func:`tree_usage`."""
        usage = tree_usage(self.pid)
        self.peak_pss = max(self.peak_pss, usage["pss"])
        self.peak_rss = max(self.peak_rss, usage["rss"])
        self.peak_data = max(self.peak_data, usage["data"])
        return usage

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
