"""Mixing by the planner alone: distinct episodes per batch of a rank's mixed batches, under each
draw rule of the pool, beside the ideals.

Pure planning, no I/O: a rank with ``--workers`` DataLoader workers, each streaming its part of
a fresh epoch through its pool (``plan/pool.py``), the workers' samples taken one at a time in
turn (``plan/interleave.py``), as ``ShardedDataLoader`` batches them by default; batches of
``--batch-size``. Episodes of 300-500 frames (``bench_peers``' lengths); ``--episodes`` lists
the dataset sizes (24: every episode resident from the start; 288: more than the pools hold).
For every draw rule, over ``--epochs`` epochs and ``--seeds`` seeds:

- mean distinct episodes per full batch (and the range of the per-epoch means);
- the same over the first and the last tenth of each epoch's batches (the pools' steady state
  and the tail, where nothing is left to admit);

beside a global shuffle measured alike (every frame of the dataset in one random permutation per
seed and epoch, cut into batches), its expectation (``batch_size`` frames drawn uniformly without
replacement from all frames) and uniform draws from the episodes the workers' pools hold
together.

``--candidates`` also runs the tail rules the pool's rule was chosen against, simulated by a
plain walk over the same parts (uniform picks while episodes wait, then in the tail: each
resident picked with weight ``frames_left ** a`` for ``a`` in 0 (rule 1), 0.5, 1 (rule 2's
law), 2; or always the resident with the most frames left, ties uniform). Slow: one Python
step per draw.

Usage: ``python scripts/bench_mixing.py [--episodes 24,288] [--workers 2,3] [--epochs 10]
[--candidates]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from lerobot_shards.reader.plan.elastic import Ordering, Planner
from lerobot_shards.reader.plan.pool import RULES, Draws

sys.path.insert(0, str(Path(__file__).parent))
from bench_peers import global_shuffle_ideal, peer_lengths


def rank_stream(
    planner: Planner, ordering: Ordering, workers: int, epoch: int, tail: str | None = None
) -> np.ndarray:
    """Episodes of the rank's samples of ``epoch`` in stream order (one rank, mixed batches);
    with ``tail``, each part drawn by that candidate (:func:`candidate_walk`)."""
    lanes = []
    for part in planner.fresh_parts(ordering, workers, epoch):
        if tail is None:
            pieces = [e.pieces for e in part.plan(ordering, None) if type(e) is Draws]
            picked = np.concatenate(pieces)
        else:
            rng = np.random.default_rng(list(part.entropy))
            picked = candidate_walk(part.table.counts, ordering.buffer_size, tail, rng)
        lanes.append(part.episodes[picked])
    rounds = max(len(lane) for lane in lanes)
    table = np.full((rounds, workers), -1, dtype=np.int64)
    for w, lane in enumerate(lanes):
        table[: len(lane), w] = lane
    flat = table.ravel()
    return flat[flat >= 0]  # a lane that ran out is skipped


def candidate_walk(
    counts: np.ndarray, buffer_size: int, tail: str, rng: np.random.Generator
) -> np.ndarray:
    """The pieces one part draws under a candidate tail rule: uniform picks while pieces wait
    for admission; once none waits, ``tail`` = ``"power:a"`` (weights ``frames_left ** a``) or
    ``"most"`` (the most frames left). Frames within a piece do not change which piece is
    picked, so they are left out."""
    pending = [int(p) for p in rng.permutation(len(counts)) if counts[p] > 0]
    resident: list[int] = []
    left: list[int] = []
    out = []
    while pending or resident:
        while pending and len(resident) < buffer_size:
            resident.append(pending.pop(0))
            left.append(int(counts[resident[-1]]))
        if pending:
            s = int(rng.integers(len(resident)))
        elif tail == "most":
            most = max(left)
            ties = [i for i, n in enumerate(left) if n == most]
            s = ties[int(rng.integers(len(ties)))]
        else:
            weights = np.array(left, dtype=float) ** float(tail.split(":")[1])
            s = int(rng.choice(len(left), p=weights / weights.sum()))
        out.append(resident[s])
        left[s] -= 1
        if not left[s]:
            del resident[s], left[s]
    return np.array(out, dtype=np.int64)


def global_shuffle(lengths: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """Episodes of every frame of the dataset in one uniformly random order."""
    episodes = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(episodes)


def distinct_per_batch(episodes: np.ndarray, batch_size: int) -> np.ndarray:
    whole = len(episodes) // batch_size * batch_size
    batches = np.sort(episodes[:whole].reshape(-1, batch_size), axis=1)
    return 1 + (np.diff(batches, axis=1) != 0).sum(axis=1)


def uniform_ideal(pool: int, batch_size: int) -> float:
    """Expected distinct episodes in ``batch_size`` uniform draws (with replacement) from
    ``pool`` episodes."""
    return pool * (1 - (1 - 1 / pool) ** batch_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", default="24,288")
    parser.add_argument("--workers", default="2,3")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--buffer-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--candidates", action="store_true")
    args = parser.parse_args()
    rules: list[tuple[str, int, str | None]] = [(f"rule {r}", r, None) for r in RULES]
    if args.candidates:
        rules += [(f"tail {t}", RULES[0], t) for t in ("power:0.5", "power:1", "power:2", "most")]
    b = args.batch_size
    started = time.perf_counter()
    for episodes in [int(n) for n in args.episodes.split(",")]:
        lengths = np.array(peer_lengths(episodes), dtype=np.int64)
        planner = Planner(np.arange(episodes), lengths)
        ideal = global_shuffle_ideal(lengths.tolist(), b)
        for workers in [int(w) for w in args.workers.split(",")]:
            held = min(episodes, workers * args.buffer_size)
            print(
                f"\n{episodes} episodes, {workers} workers, buffer_size {args.buffer_size}, "
                f"batch {b}: a global shuffle expects {ideal:.2f}, uniform from the {held} "
                f"episodes the pools hold {uniform_ideal(held, b):.2f}"
            )
            for name, rule, tail in [*rules, ("global shuffle", RULES[0], "global")]:
                means, heads, tails, every = [], [], [], []
                for seed in range(args.seeds):
                    ordering = Ordering(
                        seed, True, args.buffer_size, None, False, False, draw_rule=rule
                    )
                    for epoch in range(args.epochs):
                        if tail == "global":
                            stream = global_shuffle(lengths, seed, epoch)
                        else:
                            stream = rank_stream(planner, ordering, workers, epoch, tail)
                        d = distinct_per_batch(stream, b)
                        tenth = max(1, len(d) // 10)
                        means.append(d.mean())
                        heads.append(d[:tenth].mean())
                        tails.append(d[-tenth:].mean())
                        every.append(d)
                print(
                    f"  {name}: {np.concatenate(every).mean():.2f} distinct per batch "
                    f"(epochs {min(means):.2f}-{max(means):.2f}); first tenth "
                    f"{np.mean(heads):.2f}, last tenth {np.mean(tails):.2f}",
                    flush=True,
                )
    print(f"\n{time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
