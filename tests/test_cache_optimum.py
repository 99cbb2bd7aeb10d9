"""Belady's rule against the exact optimum (issue 42, item 5): the cache's yardstick
(``reader/plan/next_use.belady_bytes``, the rule the store follows) beside the fewest bytes any
cache of the same limit could download, found by an exhaustive search on small cases, and the
store itself following that rule read by read.

The search is written here, apart from the reader: on each miss the downloaded episode may be
kept or not and any cached episodes evicted (evicting at a hit never helps), so the cheapest
plan is a shortest path over the sets of cached episodes (a dynamic program over bitmasks).
With episodes of one size Belady's rule is the optimum (a classic result); with sizes that
differ it is a heuristic, and what it costs over the optimum on these cases is pinned below.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import numpy as np
import pytest

from lerobot_shards.reader.fetch.cache import CacheStore, Reservation
from lerobot_shards.reader.plan.next_use import belady_bytes


def optimum_bytes(reads: list[int], sizes: list[int], limit: int) -> int:
    """The fewest bytes a cache of ``limit`` bytes must download to serve ``reads``."""
    episodes = len(sizes)
    held = [
        sum(sizes[e] for e in range(episodes) if mask >> e & 1) for mask in range(1 << episodes)
    ]
    best = {0: 0}  # set of cached episodes (bitmask) -> fewest bytes so far
    for episode in reads:
        bit = 1 << episode
        after: dict[int, int] = {}
        for cached, cost in best.items():
            if cached & bit:
                after[cached] = min(after.get(cached, cost), cost)
                continue
            cost += sizes[episode]
            union = cached | bit
            kept = union
            while True:  # every subset of what is cached plus the new episode
                if held[kept] <= limit and after.get(kept, cost + 1) > cost:
                    after[kept] = cost
                if kept == 0:
                    break
                kept = (kept - 1) & union
        best = after
    return min(best.values())


def cases(count: int, seed: int, equal: bool) -> list[tuple[list[int], list[int], int]]:
    """Small read sequences: up to 6 episodes, up to 14 reads, a limit of 1 to 3 episodes."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        episodes = rng.randint(2, 6)
        sizes = [3] * episodes if equal else [rng.randint(1, 9) for _ in range(episodes)]
        reads = [rng.randrange(episodes) for _ in range(rng.randint(4, 14))]
        limit = rng.randint(min(sizes), 3 * max(sizes))
        out.append((reads, sizes, limit))
    return out


def test_the_search_finds_the_optimum_of_hand_made_cases():
    # a cache of one episode: keeping 0 (read again soonest) saves its second download
    assert optimum_bytes([0, 1, 0], [5, 5], 5) == 10
    # room for the small ones: the big one is cheaper to read twice than both small ones
    assert optimum_bytes([2, 0, 1, 2, 0, 1], [2, 2, 3], 4) == 2 + 2 + 3 + 3
    assert optimum_bytes([0, 0, 0], [7], 6) == 21  # too big to keep at all


def test_beladys_rule_is_the_optimum_for_episodes_of_one_size():
    for reads, sizes, limit in cases(300, seed=1, equal=True):
        assert belady_bytes(np.array(reads), np.array(sizes), limit) == optimum_bytes(
            reads, sizes, limit
        ), (reads, sizes, limit)


def test_with_sizes_that_differ_beladys_rule_is_above_the_optimum_in_few_cases():
    """The figures docs/caching.md quotes, on these 300 cases: the rule is never below the
    optimum (it is one of the plans the search tries), above it in 17 (6%), by 0.9% on
    average and at worst 1.57x."""
    ratios = []
    for reads, sizes, limit in cases(300, seed=2, equal=False):
        rule = belady_bytes(np.array(reads), np.array(sizes), limit)
        best = optimum_bytes(reads, sizes, limit)
        assert rule >= best
        ratios.append(rule / best)
    assert sum(r > 1 for r in ratios) == 17
    assert round(max(ratios), 2) == 1.57 and round(float(np.mean(ratios)), 3) == 1.009


@pytest.mark.parametrize("equal", [True, False])
def test_the_store_follows_beladys_rule_read_by_read(tmp_path: Path, equal: bool):
    """The store, told each entry's next read (every read records the next, as the reader's
    schedule does), downloads exactly what ``belady_bytes`` says, on 40 of the cases."""
    for n, (reads, sizes, limit) in enumerate(cases(40, seed=3, equal=equal)):
        scale = 1000
        store = CacheStore(tmp_path / str(n), limit * scale, min_free_bytes=0)
        datas = [random.Random(e).randbytes(s * scale) for e, s in enumerate(sizes)]
        keys = [store_key(d) for d in datas]
        clock = time.time() + 10**6  # reads are one second apart, far from the clock
        downloaded = 0
        for i, episode in enumerate(reads):
            plan = {k: next_read(reads, e, i - 1, clock) for e, k in enumerate(keys)}
            mine = next_read(reads, episode, i, clock)
            if store.get(keys[episode], len(datas[episode]), next_use=mine) is not None:
                continue
            downloaded += sizes[episode]
            got = store.reserve(keys[episode], len(datas[episode]), mine, plan.get)
            if isinstance(got, Reservation):
                got.commit(datas[episode])
        store.close()
        expected = belady_bytes(np.array(reads), np.array(sizes), limit)
        assert downloaded == expected, (reads, sizes, limit)


def next_read(reads: list[int], episode: int, after: int, clock: float) -> float:
    """When ``episode`` is read after read ``after`` (read ``j`` at ``clock + j``), or never."""
    later = [j for j in range(after + 1, len(reads)) if reads[j] == episode]
    return clock + later[0] if later else float("inf")


def store_key(data: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(data).hexdigest()
