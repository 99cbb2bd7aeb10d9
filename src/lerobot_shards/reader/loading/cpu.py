"""How many cores this process may really use: logical CPUs grouped into physical cores.

Why. Decoding AV1 keeps a core's execution units busy, so a second hardware thread on the same
core adds little: a 16-vCPU machine that is 8 cores with two threads each stopped scaling at 8
DataLoader workers. Default decode threads and suggested workers are sized by physical cores.
Linux reports each CPU's core in ``/sys/devices/system/cpu/cpuN/topology``; elsewhere (or where
that cannot be read) every logical CPU counts as a core.
"""

from __future__ import annotations

import os
from pathlib import Path

_TOPOLOGY = Path("/sys/devices/system/cpu")


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int] | None = None, topology: Path = _TOPOLOGY) -> int:
    """Distinct physical cores among ``cpus`` (default: the usable ones): CPUs that share a
    ``(physical_package_id, core_id)`` are one core's hardware threads."""
    cpus = usable_cpus() if cpus is None else cpus
    cores = set()
    for cpu in cpus:
        folder = topology / f"cpu{cpu}" / "topology"
        try:
            package = (folder / "physical_package_id").read_text().strip()
            core = (folder / "core_id").read_text().strip()
        except OSError:
            return len(cpus)  # no topology: count logical CPUs
        cores.add((package, core))
    return max(1, len(cores))


def suggested_workers() -> int:
    """DataLoader workers for one training process on this machine: one per physical core (each
    worker decodes on its own core; the training process itself needs only a few percent of
    one while it receives batches)."""
    return physical_cores()
