"""Physical cores from a CPU topology: hardware threads of one core count once."""

from __future__ import annotations

from pathlib import Path

from lerobot_shards.reader.loading.cpu import physical_cores, usable_cpus


def topology(root: Path, cpus: dict[int, tuple[int, int]]) -> Path:
    for cpu, (package, core) in cpus.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
        (folder / "core_id").write_text(f"{core}\n")
    return root


def test_two_threads_per_core_count_as_one_core(tmp_path):
    # 16 vCPUs: 8 cores of 2 threads, the siblings numbered 8 apart (as Linux numbers them).
    root = topology(tmp_path, {cpu: (0, cpu % 8) for cpu in range(16)})
    assert physical_cores(list(range(16)), root) == 8
    assert physical_cores([0, 8], root) == 1  # one core's two threads
    assert physical_cores([0, 1, 2, 3], root) == 4


def test_core_ids_repeat_across_packages(tmp_path):
    root = topology(tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1)})
    assert physical_cores([0, 1, 2, 3], root) == 4


def test_without_topology_every_cpu_counts(tmp_path):
    assert physical_cores([0, 1, 2], tmp_path) == 3


def test_this_machine():
    cpus = usable_cpus()
    assert 1 <= physical_cores() <= len(cpus)
