"""Node affinity (issue 38, item 4; unequal nodes, issue 42): with ranks on several nodes,
each node reads the same episodes every epoch, shuffled over its ranks and workers, every frame
still exactly once per epoch over all ranks, every part still yielding as many samples
(reader/plan/partition.py ``split_nodes``, reader/plan/elastic.py ``Planner.fresh_parts``).
Nodes may hold unequal numbers of ranks, numbered in any order (reader/plan/nodes.py).

What a part owns is read from its pieces, and what it yields from a replay of its pool's plan
(``first_draws``), not from the split's own arithmetic; equal nodes split exactly as before
unequal ones were supported (a copy of that code is the reference); the last test streams a
real dataset as 4 ranks on 2 simulated nodes (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE set per rank
in process).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import lerobot_shards
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.reader.plan.elastic import Layout, Ordering, Part, Planner, node_parts
from lerobot_shards.reader.plan.nodes import Nodes
from lerobot_shards.reader.plan.partition import (
    Pieces,
    node_places,
    part_index,
    samples_per_part,
    split_nodes,
    split_parts,
)
from lerobot_shards.reader.plan.pool import first_draws
from lerobot_shards.testing.factory import make_dataset


def owned(planner: Planner, part: Part) -> list[int]:
    """Sample ids of the frames a part's pieces hold (each piece's rows, one by one)."""
    out = []
    for unit, start, stop in zip(
        part.units.tolist(), part.starts.tolist(), part.stops.tolist(), strict=True
    ):
        out += planner.ids(part.epoch, [unit] * (stop - start), range(start, stop)).tolist()
    return out


def yielded(planner: Planner, part: Part, ordering: Ordering) -> list[int]:
    """Sample ids of everything the part's pool draws, in order, padding included."""
    if not part.num_samples:
        return []
    pieces, frames = first_draws(part.plan(ordering, None), part.num_samples)
    return planner.ids(part.epoch, part.units[pieces], frames).tolist()


def ordering_of(seed: int, shuffle: bool, pad: bool, affinity: bool) -> Ordering:
    return Ordering(seed, shuffle, 2, None, pad, False, affinity)


even_layouts = st.builds(
    lambda nodes, local, workers: Layout(nodes * local, workers, nodes),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(0, 3),
)
layouts = st.one_of(
    even_layouts,
    st.builds(  # any ranks on any nodes: unequal sizes, ranks not numbered node by node
        lambda names, workers: Layout(len(names), workers, Nodes.of_names(names)),
        st.lists(st.integers(0, 3), min_size=1, max_size=8),
        st.integers(0, 3),
    ),
)


def first_ranks(layout: Layout) -> list[int]:
    """One rank of each node."""
    return [layout.nodes.ranks(n)[0] for n in range(layout.nodes.count)]


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 15), min_size=1, max_size=20),
    layout=layouts,
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 30),
    shuffle=st.booleans(),
    pad=st.booleans(),
)
def test_every_frame_once_and_equal_samples_per_part(lengths, layout, seed, epoch, shuffle, pad):
    total = sum(lengths)
    assume(not pad or total >= layout.num_parts)
    planner = Planner(np.arange(len(lengths)) * 2 + 1, np.array(lengths))
    ordering = ordering_of(seed, shuffle, pad, True)
    parts = planner.fresh_parts(ordering, layout.num_parts, epoch, layout.nodes)
    assert len(parts) == layout.num_parts
    owns = [owned(planner, p) for p in parts]
    assert sorted(i for o in owns for i in o) == list(range(total))  # each frame exactly once
    sizes = [len(o) for o in owns]
    assert max(sizes) - min(sizes) <= 1
    # ceil(ceil(total / nodes) / P) == ceil(total / (nodes * P)): no part outgrows the padding.
    assert max(sizes) <= -(-total // layout.num_parts)
    draws = [yielded(planner, p, ordering) for p in parts]
    for own, got in zip(owns, draws, strict=True):
        assert set(got) == set(own)  # padding repeats only the part's own frames
        assert len(got) - len(set(got)) <= 1
    if pad:
        assert {len(d) for d in draws} == {-(-total // layout.num_parts)}  # DDP never hangs
    else:
        assert [len(d) for d in draws] == sizes


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 15), min_size=1, max_size=20),
    layout=layouts,
    seed=st.integers(0, 2**32 - 1),
    epochs=st.lists(st.integers(0, 1000), min_size=2, max_size=4, unique=True),
    shuffle=st.booleans(),
)
def test_a_node_reads_the_same_frames_every_epoch(lengths, layout, seed, epochs, shuffle):
    planner = Planner(np.arange(len(lengths)), np.array(lengths))
    ordering = ordering_of(seed, shuffle, False, True)
    node_sets = []
    for epoch in epochs:
        parts = planner.fresh_parts(ordering, layout.num_parts, epoch, layout.nodes)
        per_node = []
        for first_rank in first_ranks(layout):
            mine = node_parts(layout, first_rank)
            per_node.append(sorted(i for q in mine for i in owned(planner, parts[q])))
        node_sets.append(per_node)
        total, parts = sum(lengths), layout.num_parts
        for share, rank in zip(per_node, first_ranks(layout), strict=True):
            exact = total * len(node_parts(layout, rank)) / parts  # in proportion to parts
            assert abs(len(share) - exact) < 1
    assert all(s == node_sets[0] for s in node_sets)


def test_a_node_shuffles_its_share_differently_every_epoch():
    """2 nodes x 2 ranks x 2 workers over 40 episodes: the node's frames stay, the parts they
    fall into and the order they are drawn in change from epoch to epoch."""
    lengths = np.arange(40) % 7 + 3
    layout = Layout(4, 2, 2)
    planner = Planner(np.arange(40), lengths)
    ordering = ordering_of(3, True, True, True)
    sequences, splits = [], []
    for epoch in range(4):
        parts = planner.fresh_parts(ordering, layout.num_parts, epoch, layout.nodes)
        mine = node_parts(layout, 1)
        sequences.append([i for q in mine for i in yielded(planner, parts[q], ordering)])
        splits.append([sorted(owned(planner, parts[q])) for q in mine])
    assert len({tuple(sorted(set(s))) for s in sequences}) == 1
    assert len({tuple(s) for s in sequences}) == 4
    assert len({tuple(map(tuple, s)) for s in splits}) == 4


@settings(max_examples=120, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 15), min_size=1, max_size=20),
    layout=layouts,
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 30),
    shuffle=st.booleans(),
    pad=st.booleans(),
    affinity=st.booleans(),
)
def test_without_affinity_or_on_one_node_the_parts_are_the_plain_split(
    lengths, layout, seed, epoch, shuffle, pad, affinity
):
    """Affinity off (any nodes), or one node: the very parts of ``split_parts``, the samples
    of ``samples_per_part`` and the pools' seeds of a layout that knows no nodes."""
    total = sum(lengths)
    assume(not pad or total >= layout.num_parts)
    nodes = 1 if affinity else layout.nodes
    planner = Planner(np.arange(len(lengths)), np.array(lengths))
    ordering = ordering_of(seed, shuffle, pad, affinity)
    parts = planner.fresh_parts(ordering, layout.num_parts, epoch, nodes)
    plain = Planner(np.arange(len(lengths)), np.array(lengths)).fresh_parts(
        Ordering(seed, shuffle, 2, None, pad, False), layout.num_parts, epoch
    )
    split = split_parts(
        np.arange(len(lengths)), np.array(lengths), layout.num_parts, seed=seed, epoch=epoch,
        shuffle=shuffle,
    )  # fmt: skip
    samples = samples_per_part(total, layout.num_parts, pad)
    for p, (part, same, pieces) in enumerate(zip(parts, plain, split, strict=True)):
        assert part.table == pieces == same.table
        assert part.num_samples == samples[p] == same.num_samples
        assert part.entropy == same.entropy
        assert yielded(planner, part, ordering) == yielded(planner, same, ordering)


@settings(max_examples=60, deadline=None)
@given(layout=layouts)
def test_node_parts_are_the_parts_of_the_ranks_of_one_node(layout):
    for rank in range(layout.world_size):
        node = layout.nodes.of_rank[rank]
        want = [
            part_index(r, layout.world_size, w, layout.num_workers)[0]
            for r in range(layout.world_size)
            if layout.nodes.of_rank[r] == node
            for w in range(layout.workers)
        ]
        assert node_parts(layout, rank) == want


def split_even_nodes_before(episodes, lengths, nodes, per_node, *, place, seed, epoch, shuffle):
    """``split_nodes`` as it was before nodes of unequal sizes (a copy of that code): equal
    shares cut with ``_cut``'s equal sizes, each shuffled and cut into ``per_node`` parts."""

    def cut(pieces: Pieces, num_parts: int) -> list[Pieces]:
        ends = np.cumsum(pieces.counts)
        begins = ends - pieces.counts
        total = int(ends[-1]) if len(ends) else 0
        sizes = np.asarray(samples_per_part(total, num_parts, pad=False), dtype=np.int64)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        out = []
        for p in range(num_parts):
            lo, hi = int(bounds[p]), int(bounds[p + 1])
            first = int(np.searchsorted(ends, lo, side="right"))
            last = int(np.searchsorted(begins, hi, side="left"))
            eps = pieces.episodes[first:last]
            b, o = begins[first:last], pieces.starts[first:last]
            starts = np.maximum(b, lo) - b + o
            stops = np.minimum(ends[first:last], hi) - b + o
            sort = np.argsort(eps, kind="stable")
            out.append(Pieces(eps[sort], starts[sort], stops[sort]))
        return out

    episodes, lengths, place = (np.asarray(a, dtype=np.int64) for a in (episodes, lengths, place))
    kept = np.flatnonzero(lengths > 0)
    kept = kept[np.argsort(episodes[kept], kind="stable")]
    episodes, lengths, place = episodes[kept], lengths[kept], place[kept]
    by_place = np.argsort(place, kind="stable")
    shares = cut(Pieces(episodes[by_place], np.zeros_like(lengths), lengths[by_place]), nodes)
    parts = []
    for node, share in enumerate(shares):
        if shuffle and per_node > 1:
            entropy = [seed, epoch, 0xFFFF_FFFC, nodes, node, per_node]
            order = np.random.default_rng(entropy).permutation(len(share))
            share = Pieces(share.episodes[order], share.starts[order], share.stops[order])
        parts += cut(share, per_node)
    return parts


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 15), min_size=1, max_size=20),
    nodes=st.integers(1, 4),
    per_node=st.integers(1, 4),
    seed=st.integers(0, 2**32 - 1),
    epoch=st.integers(0, 30),
    shuffle=st.booleans(),
)
def test_equal_nodes_split_as_before_unequal_ones_were_supported(
    lengths, nodes, per_node, seed, epoch, shuffle
):
    """Checkpoints taken on equal nodes replay the very parts they were taken with."""
    episodes = np.arange(len(lengths)) * 3
    place = node_places(episodes, seed, shuffle)
    args = {"place": place, "seed": seed, "epoch": epoch, "shuffle": shuffle}
    got = split_nodes(episodes, np.array(lengths), [per_node] * nodes, **args)
    want = split_even_nodes_before(episodes, lengths, nodes, per_node, **args)
    assert got == want
    groups = Nodes.even(nodes, nodes).part_groups(per_node)
    sizes = samples_per_part(sum(lengths), nodes * per_node, False, groups)
    assert sizes == [int(p.counts.sum()) for p in want]


# ---------------------------------------------------------------------- a real stream

LENGTHS = [5, 9, 3, 7, 4, 8, 6, 2, 5, 7, 3, 6]


@pytest.fixture(scope="module")
def factory_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("affinity")
    src = make_dataset(
        tmp / "src", episode_lengths=LENGTHS, cameras={"observation.images.cam": (24, 32)}
    )
    lerobot_shards.convert(str(src), str(tmp / "shards"), workers=0, progress=False)
    return tmp / "shards"


def as_rank(monkeypatch: pytest.MonkeyPatch, rank: int, world: int, local: int) -> None:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local))


def episode_of(index: int) -> int:
    return int(np.searchsorted(np.cumsum(LENGTHS), index, side="right"))


def test_two_nodes_of_two_ranks_stream_every_frame_once_and_keep_their_episodes(
    factory_shards, monkeypatch
):
    total = sum(LENGTHS)
    node_episodes = []
    for epoch in range(3):
        streams = []
        for rank in range(4):
            as_rank(monkeypatch, rank, 4, 2)
            ds = ShardedLeRobotDataset(factory_shards, seed=7, buffer_size=2, node_affinity=True)
            ds.set_epoch(epoch)
            streams.append([int(item["index"]) for item in ds])
        assert {len(s) for s in streams} == {-(-total // 4)}
        frames = Counter(i for s in streams for i in s)
        assert set(frames) == set(range(total))
        assert sum(frames.values()) - total == 4 * -(-total // 4) - total  # padding only
        node_episodes.append(
            [{episode_of(i) for i in a + b} for a, b in (streams[:2], streams[2:])]
        )
    assert node_episodes[0] == node_episodes[1] == node_episodes[2]
    # Without affinity the same nodes read other episodes from one epoch to the next.
    seen = []
    for epoch in range(3):
        mine = []
        for rank in range(2):
            as_rank(monkeypatch, rank, 4, 2)
            ds = ShardedLeRobotDataset(factory_shards, seed=7, buffer_size=2, node_affinity=False)
            ds.set_epoch(epoch)
            mine += [episode_of(int(item["index"])) for item in ds]
        seen.append(set(mine))
    assert not seen[0] == seen[1] == seen[2]
