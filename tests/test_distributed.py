"""Real distributed runs: ``torchrun --standalone --nproc_per_node=2`` (gloo, CPU) on scripts
that stream the dataset with DataLoader workers, as a multi-GPU job would.

The golden dataset has 74 frames: over 2 ranks x 2 workers (4 parts) that is not a whole
number per part, so the ranks must pad to equal lengths, and a DDP loop only ends if every rank
takes the same number of steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.torchrun import torchrun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FRAMES = 74
RANKS = 2
WORKERS = 2


def test_ranks_stream_disjoint_complete_equal_parts(av1: Path, tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    torchrun("stream_epoch.py", str(av1), str(out))
    result = json.loads(out.read_text())
    assert (result["world_size"], result["num_frames"]) == (RANKS, FRAMES)
    ranks = sorted(result["ranks"], key=lambda r: r["rank"])
    per_rank = [r["indices"] for r in ranks]
    lengths = {len(i) for i in per_rank}
    assert lengths == {-(-FRAMES // (RANKS * WORKERS)) * WORKERS}, lengths  # 19 per part
    assert not set(per_rank[0]) & set(per_rank[1])
    assert set(per_rank[0]) | set(per_rank[1]) == set(range(FRAMES))
    padding = sum(len(i) for i in per_rank) - FRAMES
    assert padding == sum(r["padding"] for r in ranks) == 2
    for rank, indices in zip(ranks, per_rank, strict=True):
        # Padding repeats a rank's own frames; nothing else repeats.
        assert len(indices) - len(set(indices)) == rank["padding"]


def test_ddp_epoch_ends_on_every_rank(av1: Path, tmp_path: Path) -> None:
    out = tmp_path / "ddp.json"
    torchrun("ddp_train.py", str(av1), str(out))
    result = json.loads(out.read_text())
    assert result["num_frames"] == FRAMES
    steps = {r["steps"] for r in result["ranks"]}
    samples = [r["samples"] for r in result["ranks"]]
    assert steps == {2 * 5}, steps  # each worker: 19 samples, batches of 4 -> 5 batches
    assert sum(samples) == FRAMES + 2
    assert result["same_weights"], "DDP ranks ended with different weights"


def test_ddp_epoch_of_mixed_batches_ends_on_every_rank(av1: Path, tmp_path: Path) -> None:
    """A ShardedDataLoader of 3 workers per rank, whose batches take every worker's samples in
    turn: 13 samples per part (74 frames over 6 parts, padded), 39 per rank, 10 batches of up
    to 4 on every rank (3 workers each making its own batches would take 3 x 4 = 12)."""
    out = tmp_path / "ddp.json"
    torchrun("ddp_train.py", str(av1), str(out), "3", "sharded")
    result = json.loads(out.read_text())
    steps = {r["steps"] for r in result["ranks"]}
    assert steps == {10}, steps
    indices = [r["indices"] for r in result["ranks"]]
    assert [len(i) for i in indices] == [39, 39]
    assert not set(indices[0]) & set(indices[1])
    assert set(indices[0]) | set(indices[1]) == set(range(FRAMES))
    assert result["same_weights"], "DDP ranks ended with different weights"


def test_weighted_mixture_over_ranks_and_workers_counts_every_frame_exactly(
    av1: Path, shards, tmp_path: Path
) -> None:
    from collections import Counter
    from fractions import Fraction

    from lerobot_shards import ShardedLeRobotDataset

    image = shards("image")
    out = tmp_path / "mixture.json"
    torchrun("mixture_epochs.py", str(out), str(av1), "1", str(image), "2")
    result = json.loads(out.read_text())
    ranks = result["ranks"]
    frames = []  # every (dataset_index, index) of the mixture
    for d, root in enumerate((av1, image)):
        frames += [(d, int(i["index"])) for i in ShardedLeRobotDataset(root, shuffle=False)]
    # Samples per dataset and epoch, from the weights (1 and 2) here, not the reader's own
    # ``samples_per_dataset``: each dataset's share of the epoch, within one of exact.
    share = result["share"]
    assert sum(share) == len(frames)
    assert all(
        abs(n - Fraction(len(frames) * w, 3)) < 1 for n, w in zip(share, (1, 2), strict=True)
    )
    so_far: Counter = Counter()
    for epoch in range(2):
        seen = Counter()
        for rank in ranks:
            seen.update(tuple(pair) for pair in rank[epoch])
        lengths = [len(rank[epoch]) for rank in ranks]
        assert max(lengths) - min(lengths) <= 1, lengths  # ranks balanced (no padding asked)
        so_far.update(seen)
        for d, n in enumerate(share):
            mine = [f for f in frames if f[0] == d]
            assert sum(seen[f] for f in mine) == n
            assert {seen[f] for f in mine} <= {n // len(mine), -(-n // len(mine))}
            cumulative = [so_far[f] for f in mine]
            assert max(cumulative) - min(cumulative) <= 1
