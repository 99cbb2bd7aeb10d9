"""Which samples make up an epoch of a weighted mixture of datasets.

Pure and numpy only. Dataset ``d`` holds ``N_d`` frames and contributes ``n_d`` samples per
epoch (:func:`samples_per_dataset`: its weight's share of the epoch size, rounded by largest
remainder). Its frames are laid end to end in a fixed *cycle*: its episodes in an order drawn
once from the seed (ascending with ``shuffle=False``), each episode's frames ascending. Epoch
``e`` takes the window ``[e * n_d, (e + 1) * n_d)`` of that cycle repeated forever.

Why a window of a repeated cycle. A window of length ``n`` over a sequence of period ``N``
holds every element ``floor(n / N)`` or ``ceil(n / N)`` times, and the first ``E`` epochs
together are the window ``[0, E * n_d)``, so after any number of epochs two frames of a dataset
have been yielded a number of times that differs by at most one: the extra (or, for a
down-weighted dataset, the only) appearances rotate through the dataset epoch by epoch. The
window cuts at most two episodes, so an epoch fetches whole episodes, not scattered frames.

An epoch's samples are :class:`Units`: frame ranges of episodes (an episode may appear in
several units when its dataset is up-weighted). The partition and the pool treat units as they
treat episodes; a sample is then identified by its unit and its frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

# Entropy word of each dataset's cycle order, apart from every split and pool stream.
_CYCLE_STREAM = 0xFFFF_FFFD


@dataclass(frozen=True)
class Units:
    """An epoch's samples: unit ``u`` is frames ``starts[u]:stops[u]`` of episode
    ``episodes[u]`` (a global episode id). Sample ids number the units' frames end to end."""

    episodes: np.ndarray
    starts: np.ndarray
    stops: np.ndarray

    @property
    def counts(self) -> np.ndarray:
        return self.stops - self.starts

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    @classmethod
    def whole(cls, episodes: np.ndarray, lengths: np.ndarray) -> Units:
        """Every frame of every episode once, in ascending episode order."""
        episodes = np.asarray(episodes, dtype=np.int64)
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(episodes) and (episodes[1:] < episodes[:-1]).any():
            order = np.argsort(episodes, kind="stable")
            episodes, lengths = episodes[order], lengths[order]
        return cls(episodes, np.zeros(len(episodes), dtype=np.int64), lengths)


def samples_per_dataset(
    frames: Sequence[int], weights: Sequence[float] | None, epoch_size: int | None
) -> np.ndarray:
    """Samples each dataset contributes to an epoch.

    ``epoch_size`` defaults to the total frames; ``weights`` (default: the frame counts, so
    that without weights every frame is yielded once) are each dataset's share of it, exact
    (``Fraction``) and rounded by largest remainder, ties to the earlier dataset, so the
    counts sum to ``epoch_size``.
    """
    frames = [int(f) for f in frames]
    total = sum(frames) if epoch_size is None else int(epoch_size)
    if total < 0:
        raise ValueError(f"epoch_size must be non-negative, got {epoch_size}")
    if weights is None:
        weights = frames
    if len(weights) != len(frames):
        raise ValueError(f"{len(weights)} weights given for {len(frames)} datasets")
    shares = [Fraction(w) for w in weights]
    if any(s < 0 for s in shares):
        raise ValueError(f"weights must be non-negative, got {list(weights)}")
    weight_sum = sum(shares)
    if weight_sum == 0:
        if total == 0:
            return np.zeros(len(frames), dtype=np.int64)
        raise ValueError("the weights sum to zero: no dataset can fill the epoch")
    quotas = [total * s / weight_sum for s in shares]
    counts = [int(q) for q in quotas]  # floor: quotas are non-negative
    by_remainder = sorted(range(len(quotas)), key=lambda d: (-(quotas[d] - counts[d]), d))
    for d in by_remainder[: total - sum(counts)]:
        counts[d] += 1
    for d, (n, f) in enumerate(zip(counts, frames, strict=True)):
        if n and not f:
            raise ValueError(f"dataset {d} has weight {weights[d]} but no frames to yield")
    return np.asarray(counts, dtype=np.int64)


class MixturePlan:
    """The units of every epoch of a mixture: pure, a function of the datasets' episodes and
    lengths, the samples per dataset, the seed and ``shuffle``.

    ``episodes[d]`` are dataset ``d``'s global episode ids, ``lengths[d]`` their frames.
    """

    def __init__(
        self,
        episodes: Sequence[np.ndarray],
        lengths: Sequence[np.ndarray],
        samples: Sequence[int],
        *,
        seed: int,
        shuffle: bool = True,
    ) -> None:
        if not (len(episodes) == len(lengths) == len(samples)):
            raise ValueError("episodes, lengths and samples need one entry per dataset")
        self.samples = np.asarray(samples, dtype=np.int64)
        self._cycles = []
        for d, (eps, lens) in enumerate(zip(episodes, lengths, strict=True)):
            whole = Units.whole(eps, lens)
            keep = whole.counts > 0
            eps, lens = whole.episodes[keep], whole.counts[keep]
            if shuffle and len(eps) > 1:
                order = np.random.default_rng([seed, _CYCLE_STREAM, d]).permutation(len(eps))
            else:
                order = np.arange(len(eps))
            ends = np.cumsum(lens[order])
            self._cycles.append((eps, lens, eps[order], ends - lens[order], ends))

    @property
    def total(self) -> int:
        """Samples per epoch (every epoch has the same)."""
        return int(self.samples.sum())

    def units(self, epoch: int) -> Units:
        """Epoch ``epoch``'s units, dataset by dataset: whole passes over the dataset in
        ascending episode order, then the window's cut ends in cycle order."""
        parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for (eps, lens, cyc_eps, begins, ends), n in zip(
            self._cycles, self.samples.tolist(), strict=True
        ):
            period = int(ends[-1]) if len(ends) else 0
            if not n:
                continue
            first = epoch * n % period
            whole, rest = divmod(n, period)
            zeros = np.zeros(len(eps), dtype=np.int64)
            for _ in range(whole):  # each pass holds every frame once, wherever it starts
                parts.append((eps, zeros, lens))
            if rest:
                tail = min(period, first + rest)
                parts.append(_segment(cyc_eps, begins, ends, first, tail))
                if first + rest > period:
                    parts.append(_segment(cyc_eps, begins, ends, 0, first + rest - period))
        if not parts:
            empty = np.zeros(0, dtype=np.int64)
            return Units(empty, empty, empty)
        return Units(*(np.concatenate(column) for column in zip(*parts, strict=True)))


def _segment(
    episodes: np.ndarray, begins: np.ndarray, ends: np.ndarray, lo: int, hi: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The units of cycle positions ``lo:hi``: the episodes they overlap, each one's frames."""
    first = int(np.searchsorted(ends, lo, side="right"))
    last = int(np.searchsorted(begins, hi, side="left"))
    b, e = begins[first:last], ends[first:last]
    return episodes[first:last], np.maximum(b, lo) - b, np.minimum(e, hi) - b
