"""Splitting the selected frames over ranks and DataLoader workers (reader/plan/partition.py)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_shards.reader.plan.partition import (
    Piece,
    Pieces,
    part_index,
    samples_per_part,
    split_parts,
)

lengths_strategy = st.lists(st.integers(0, 12), min_size=1, max_size=25)


def frames_of(part: Pieces) -> list[tuple[int, int]]:
    return [(p.episode, f) for p in part for f in range(p.start, p.stop)]


@settings(max_examples=200, deadline=None)
@given(
    lengths=lengths_strategy,
    num_parts=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 50),
    shuffle=st.booleans(),
)
def test_parts_are_disjoint_cover_everything_and_differ_by_at_most_one(
    lengths, num_parts, seed, epoch, shuffle
):
    episodes = np.arange(len(lengths)) * 3 + 1  # sparse, not starting at 0
    parts = split_parts(
        episodes, np.array(lengths), num_parts, seed=seed, epoch=epoch, shuffle=shuffle
    )
    assert len(parts) == num_parts
    every = sorted(f for part in parts for f in frames_of(part))
    expected = [(int(e), f) for e, n in zip(episodes, lengths, strict=True) for f in range(n)]
    assert every == expected  # each frame exactly once
    sizes = [sum(p.count for p in part) for part in parts]
    assert sizes == samples_per_part(sum(lengths), num_parts, pad=False)
    assert max(sizes) - min(sizes) <= 1
    for part in parts:
        assert list(part.episodes) == sorted(part.episodes)
        assert all(p.count > 0 for p in part)
    cut = [e for e in episodes if sum(e in part.episodes for part in parts) > 1]
    assert len(cut) <= num_parts - 1


@settings(max_examples=100, deadline=None)
@given(lengths=lengths_strategy, num_parts=st.integers(1, 7))
def test_unshuffled_parts_are_consecutive_ranges_of_the_global_order(lengths, num_parts):
    episodes = np.arange(len(lengths))
    parts = split_parts(episodes, np.array(lengths), num_parts, seed=0, epoch=0, shuffle=False)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    global_order = [int(starts[e]) + f for part in parts for e, f in frames_of(part)]
    assert global_order == list(range(sum(lengths)))


def test_one_part_is_every_episode_whole_sorted():
    parts = split_parts(np.array([9, 2, 5, 7]), np.array([4, 0, 3, 1]), 1, seed=3, epoch=8)
    assert parts == [[Piece(5, 0, 3), Piece(7, 0, 1), Piece(9, 0, 4)]]


def test_split_is_a_pure_function_of_seed_epoch_and_parts():
    episodes, lengths = np.arange(40), np.full(40, 5)

    def split(seed, epoch, parts=4):
        return split_parts(episodes, lengths, parts, seed=seed, epoch=epoch)

    assert split(1, 2) == split(1, 2)
    assert split(1, 2) != split(1, 3)
    assert split(1, 2) != split(2, 2)


def test_duplicate_episodes_are_refused():
    with pytest.raises(ValueError, match="Episode 4 is selected twice"):
        split_parts(np.array([4, 4]), np.array([1, 2]), 2, seed=0, epoch=0)


def test_part_index_numbers_every_worker_of_every_rank_once():
    for world, workers in [(1, 0), (1, 1), (2, 0), (3, 2), (2, 4)]:
        seen = [
            part_index(rank, world, worker, workers)
            for rank in range(world)
            for worker in range(max(workers, 1))
        ]
        total = world * max(workers, 1)
        assert [p for p, _ in seen] == list(range(total))  # a rank's workers are consecutive
        assert {n for _, n in seen} == {total}
    with pytest.raises(ValueError, match="rank 2"):
        part_index(2, 2, 0, 0)
    with pytest.raises(ValueError, match="worker_id 1"):
        part_index(0, 1, 1, 0)


@given(total=st.integers(0, 1000), parts=st.integers(1, 40))
def test_samples_per_part(total, parts):
    unpadded = samples_per_part(total, parts, pad=False)
    assert sum(unpadded) == total
    assert max(unpadded) - min(unpadded) <= 1
    if 0 < total < parts:
        with pytest.raises(ValueError, match="cannot give"):
            samples_per_part(total, parts)
        return
    padded = samples_per_part(total, parts)
    assert len(set(padded)) == 1
    assert 0 <= sum(padded) - total < parts
    assert all(p - u in (0, 1) for p, u in zip(padded, unpadded, strict=True))


def test_pieces_behave_like_a_list_of_pieces():
    pieces = Pieces(np.array([1, 4, 6]), np.array([0, 2, 0]), np.array([3, 5, 1]))
    as_list = [Piece(1, 0, 3), Piece(4, 2, 5), Piece(6, 0, 1)]
    assert pieces == as_list and list(pieces) == as_list
    assert pieces[1] == Piece(4, 2, 5) and pieces[1].count == 3
    assert pieces[-1] == Piece(6, 0, 1)
    assert pieces[1:] == as_list[1:]
    assert pieces != as_list[:2] and pieces != [*as_list[:2], Piece(6, 0, 2)]
    assert Pieces.of(as_list) == pieces and list(pieces.counts) == [3, 3, 1]
