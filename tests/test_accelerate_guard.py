"""accelerate's ``prepare`` re-shards an IterableDataset's DataLoader over the processes (rank
0 dispatches its batches by default; ``IterableDatasetShard`` with ``dispatch_batches=False``):
with the reader, which already gives every rank its own part, the job would train on 1/N of
each epoch. Under torchrun (2 processes, gloo) with accelerate's own ``prepare_data_loader``,
the reader refuses both, in process, in forked workers and in spawned ones. Needs accelerate
(CI's LeRobot env)."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.required import importorskip
from support.torchrun import torchrun

importorskip("accelerate", reason="accelerate is optional; CI's LeRobot env runs this")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.mark.parametrize(
    ("mode", "workers", "start", "wrapper"),
    [
        ("dispatch", "0", "fork", "DataLoaderDispatcher"),
        ("dispatch", "2", "fork", "DataLoaderDispatcher"),
        ("dispatch", "2", "spawn", "DataLoaderDispatcher"),
        ("shard", "0", "fork", "IterableDatasetShard"),
        ("shard", "2", "spawn", "IterableDatasetShard"),
    ],
)
def test_accelerate_resharding_is_refused(av1: Path, mode, workers, start, wrapper) -> None:
    result = torchrun("accelerate_resharding.py", str(av1), mode, workers, start, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert f"iterated by accelerate's {wrapper} with 2 processes" in output, output
    assert "iterated a whole epoch" not in output
