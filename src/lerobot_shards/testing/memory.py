"""Real memory of a process tree (Linux ``/proc``), for tests and benchmarks of the byte budget.

The reader's own counters say what it means to hold; what users pay is the memory of the
training process and its DataLoader workers together. PSS (proportional set size) counts a
shared page once over the processes sharing it, so the sum over a tree is what the tree costs,
shared batch segments and torch's shared memory included.
"""

from __future__ import annotations

import os
import threading


def tree_memory(pid: int) -> tuple[int, int]:
    """``(sum of PSS, sum of RSS)`` in bytes over ``pid`` and its descendants."""
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
    pss = rss = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        todo.extend(children.get(p, []))
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Rss:"):
                        rss += int(line.split()[1]) * 1024
                    elif line.startswith("Pss:"):
                        pss += int(line.split()[1]) * 1024
        except OSError:
            pass
    return pss, rss


class PeakMemory:
    """Samples :func:`tree_memory` of ``pid`` every ``interval_s`` on a thread while in a
    ``with`` block; ``peak_pss`` and ``peak_rss`` are the largest sums seen."""

    def __init__(self, pid: int | None = None, interval_s: float = 0.05) -> None:
        self.pid = os.getpid() if pid is None else pid
        self.interval_s = interval_s
        self.peak_pss = 0
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[int, int]:
        """Take one sample now (also counted in the peaks)."""
        pss, rss = tree_memory(self.pid)
        self.peak_pss, self.peak_rss = max(self.peak_pss, pss), max(self.peak_rss, rss)
        return pss, rss

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
