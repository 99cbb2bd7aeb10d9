"""How a rank's byte budget is shared out: per DataLoader worker, a frame cache and a pool.

Each worker (each part of the plan) holds its own pool of fetched episodes and its own cache of
decoded frames. A user's ``byte_budget_gb`` is meant as the memory those take. Mixing is what the
pool is for and the cache only saves decoding, so each worker's equal share pays first for a
full pool (the ``buffer_size`` largest episodes, compressed) and the frame cache gets what is
left, up to the worker's share of ``frame_cache_gb``; anything still left also goes to the pool.
Compressed episodes are small (a few MB for hundreds of frames of three cameras), so a budget of
a few hundred MB keeps a pool of dozens of episodes full; a budget that cannot is not an error
but worth a warning with the numbers, since it quietly makes batches mix fewer episodes. A cache
squeezed to nothing is still exact: each GOP is then decoded again for each of its frames.
Pure: no I/O.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GB = 10**9


class SmallPoolWarning(UserWarning):
    """The byte budget holds fewer episodes than ``buffer_size``: batches mix fewer episodes."""


@dataclass(frozen=True)
class PoolBudget:
    """One part's budget: ``pool`` bytes of fetched episodes (None: no byte limit) and a frame
    cache of ``cache`` bytes; ``advice`` is non-empty when the pool cannot hold ``buffer_size``
    median-sized episodes (what the warning says)."""

    pool: int | None
    cache: int
    advice: str = ""

    def warn_if_small(self) -> None:
        """Warn (:class:`SmallPoolWarning`) when the pool budget cannot hold a typical pool."""
        if self.advice:
            warnings.warn(self.advice, SmallPoolWarning, stacklevel=3)


def split_budget(
    byte_budget: int | None,
    frame_cache: int,
    *,
    workers: int,
    num_parts: int,
    episode_bytes: np.ndarray,
    episodes: np.ndarray,
    buffer_size: int,
    name: Callable[[int], str] = "Episode {}".format,
) -> PoolBudget:
    """The budget of each of a rank's ``workers`` parts (``num_parts`` over all ranks).

    ``byte_budget`` and ``frame_cache`` are the rank's; ``episode_bytes[i]`` is what episode
    ``episodes[i]`` costs resident (its fetched bytes). Raises ``ValueError``, naming the
    episode (as ``name(episode)`` does), if one episode alone exceeds a worker's share.
    """
    sizes = np.asarray(episode_bytes, dtype=np.int64)
    cache = int(frame_cache) // workers
    wanted = min(buffer_size, max(1, math.ceil(len(sizes) / max(1, num_parts))))
    if byte_budget is None or not len(sizes):
        return PoolBudget(None, cache)
    share = int(byte_budget) // workers
    largest = int(np.argmax(sizes))
    if sizes[largest] > share:
        over = np.flatnonzero(sizes > share)
        first = over[np.argmin(np.asarray(episodes)[over])]
        split = f" split over the rank's {workers} DataLoader workers" if workers > 1 else ""
        raise ValueError(
            f"{name(int(episodes[first]))} is {int(sizes[first])} bytes, more than the "
            f"byte budget of {share} bytes per worker (byte_budget_gb={byte_budget / GB:g}"
            f"{split}): raise byte_budget_gb or use fewer workers"
        )
    full_pool = int(np.sort(sizes)[-wanted:].sum())  # any ``wanted`` episodes fit in it
    cache = max(0, min(cache, share - full_pool))
    pool = share - cache
    median = max(1, int(np.median(sizes)))
    if pool >= full_pool or pool // median >= wanted:  # full, or but for the largest episodes
        return PoolBudget(pool, cache)
    full = _round_up(full_pool * workers / GB)
    with_cache = _round_up((full_pool + int(frame_cache) // workers) * workers / GB)
    advice = (
        f"byte_budget_gb={byte_budget / GB:g} gives each of the rank's {workers} DataLoader "
        f"worker(s) {_size(share)} for fetched episodes: about {pool // median} of the median "
        f"{_size(median)}, fewer than the {wanted} the pool would hold (buffer_size="
        f"{buffer_size}), so batches mix fewer episodes, and no frame cache is left; "
        f"byte_budget_gb={full:g} keeps the pool full, {with_cache:g} also the whole frame "
        f"cache (frame_cache_gb={frame_cache / GB:g})"
    )
    return PoolBudget(pool, cache, advice)


def _size(n: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def _round_up(x: float) -> float:
    """``x`` rounded up to two significant digits."""
    if x <= 0:
        return 0.0
    scale = 10 ** (math.floor(math.log10(x)) - 1)
    return round(math.ceil(x / scale) * scale, 12)
