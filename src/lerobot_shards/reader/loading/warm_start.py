"""The next epoch's first items, fetched and decoded while the DataLoader starts that epoch.

Why. With one ``iter(loader)`` per epoch, the DataLoader ends an epoch once every worker's part
is spent, and only the next ``iter`` asks the workers for the next one: each fills its pool and
decodes its first batch while the training loop waits (3-6 times the usual gap between batches,
``scripts/bench_epoch_edges.py``). A worker whose part is spent knows its next epoch's part (the
plan is a pure function of the seed, the epoch and the layout), so :func:`begin` fetches the
episodes of that part's first draws and decodes their frames on a thread right away, while the
last batches drain. The next stream :func:`claim`\\ s them only if it is the very stream they
were made for: the same :class:`Catalog` object (the dataset's datasets, selections and item
options; another dataset of the same layout has its own, and its items would come from the
wrong bytes and spec), the same ordering and video backend, and the same part (every field),
from its start; anything else leaves them unused. A frame decodes to the same pixels wherever
it is decoded, so this moves work earlier and never changes what is yielded.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from lerobot_shards.reader.frames.episode import Episode
from lerobot_shards.reader.meta.catalog import Catalog, Member
from lerobot_shards.reader.plan.elastic import Ordering, Part
from lerobot_shards.reader.plan.pool import Draws


@dataclass
class _Warm:
    pid: int
    catalog: Catalog
    """Held, so no other catalog can take its identity while the warm-up waits."""
    ordering: Ordering
    backend: str
    part: Part | None
    """The part warmed (None until the thread has computed it)."""
    stop: threading.Event
    done: Future


_current: _Warm | None = None


def begin(
    next_part: Callable[[], Part],
    ordering: Ordering,
    catalog: Catalog,
    backend: str,
    fetch: Callable[[Part, int], tuple[Episode, Member]],
    draws: int,
    order: Callable[[Any], Any],
) -> None:
    """Start warming the part ``next_part()`` returns: its first ``draws`` draws' episodes
    fetched (``fetch(part, piece)``, as the stream fetches them, with ``backend``) and frames
    decoded, on a daemon thread. ``order`` is the stream's ``fetch_order`` (the plan's events
    as the stream sees them)."""
    global _current
    discard()
    warm = _Warm(os.getpid(), catalog, ordering, backend, None, threading.Event(), Future())
    _current = warm

    threading.Thread(
        target=_run,
        args=(warm, next_part, ordering, catalog, fetch, draws, order),
        name="lerobot-shards-warm-start",
        daemon=True,
    ).start()


def claim(
    part: Part, catalog: Catalog, ordering: Ordering, backend: str
) -> dict[int, tuple[Episode, Member]]:
    """The warmed pieces of ``part`` (episodes with their first draws' frames decoded), if the
    warm-up was made for ``part`` of this very ``catalog`` under ``ordering`` and ``backend``;
    else nothing. Stops the warm-up where it is."""
    global _current
    warm, _current = _current, None
    if warm is None or warm.pid != os.getpid():
        return {}
    warm.stop.set()
    episodes = warm.done.result()
    if (
        warm.catalog is not catalog
        or warm.ordering != ordering
        or warm.backend != backend
        or warm.part is None
        or not _same(warm.part, part)
    ):
        return {}
    return episodes


def discard() -> None:
    """Stop and drop a warm-up nobody claimed."""
    global _current
    warm, _current = _current, None
    if warm is not None:
        warm.stop.set()


def _same(a: Part, b: Part) -> bool:
    """Every field that defines a part equal (its epoch, pieces, positions, entropy, samples)."""
    return all(_equal(getattr(a, f.name), getattr(b, f.name)) for f in fields(Part) if f.init)


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.array_equal(a, b)
    return a == b


def _run(
    warm: _Warm,
    next_part: Callable[[], Part],
    ordering: Ordering,
    catalog: Catalog,
    fetch: Callable[[Part, int], tuple[Episode, Member]],
    draws: int,
    order: Callable[[Any], Any],
) -> None:
    episodes: dict[int, tuple[Episode, Member]] = {}
    try:
        part = next_part()
        first: list[tuple[int, int]] = []  # (piece, episode position) of the first draws
        for event in order(part.plan(ordering, catalog.cost, 0)):
            if type(event) is Draws:
                for piece, frame in zip(event.pieces.tolist(), event.frames.tolist(), strict=True):
                    first.append((piece, part.position(piece, frame)))
                if len(first) >= draws:
                    break
        warm.part = part
        for piece, position in first[:draws]:
            if warm.stop.is_set():
                break
            if piece not in episodes:
                episodes[piece] = fetch(part, piece)
            episode, member = episodes[piece]
            episode.warm_up(position, member.spec)
    except Exception:  # only the head start is lost: the stream fetches again and reports
        episodes = {}
    warm.done.set_result(episodes)
