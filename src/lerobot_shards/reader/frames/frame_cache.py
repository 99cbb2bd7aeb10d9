"""Decoded frames held between draws: a byte-capped cache that keeps what is drawn soonest.

Decoding a frame means decoding its GOP from the keyframe, so a GOP's other frames come almost
for free, but the pool draws them at random times: holding each until its own draw grows with
pool size times episode length (gigabytes at ALOHA scale). The plan is known ahead, so the
cache knows when each frame will be drawn next. :class:`FrameCache` holds decoded frames within
``capacity`` bytes and, when full, drops the frame whose next use is latest (Belady's rule,
optimal for a known future); a frame with no use in the look-ahead window is never kept, and a
dropped frame is decoded again when its draw comes.

The stream registers each draw's frames ahead of consuming them (:meth:`FrameCache.expect`),
so every :meth:`FrameCache.take` consumes the earliest registered use of its key. Draws are
numbered in stream order; :attr:`FrameCache.now` is the draw being built, whose own frames are
always kept until used (an item may show several frames of one GOP), even past the cap; once
taken, a frame kept for a later draw must fit under the cap again.

Frames decoded ahead on threads (``decode.py``) are held as placeholders (the decode's future
and the frame's position in its result) from the moment they are scheduled, so the cap bounds
them too. Pure bookkeeping: no decoding and no I/O here.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import Future
from typing import Any, TypeVar

E = TypeVar("E")

Key = tuple[Hashable, str, int]
"""One frame: ``(episode tag, camera, position)``; the reader's tag is ``(epoch, piece)``."""


class Pending:
    """A frame being decoded ahead: position ``position`` of ``future``'s result (a dict by
    position), the future set once the decode is submitted."""

    __slots__ = ("future", "position")

    def __init__(self, position: int) -> None:
        self.future: Future | None = None
        self.position = position

    def result(self) -> Any:
        return self.future.result()[self.position]


class FrameCache:
    """Decoded frames by key, within ``capacity`` bytes, evicting the latest next use first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"a frame cache capacity must be non-negative, got {capacity}")
        self.capacity = int(capacity)
        self.now = 0
        """The draw whose item is being built: its frames are kept even past the cap."""
        self.nbytes = 0
        """Bytes held (placeholders counted at their frames' size)."""
        self.peak_bytes = 0
        self.decodes_saved = 0
        """Frames taken from the cache instead of decoded."""
        # Each key's registered uses, earliest first: a bare int while there is one (most keys:
        # a frame drawn once), a deque only for frames drawn again. A deque per key cost about 850
        # bytes with its entry, 20 MB per process for the plan's look-ahead over three cameras.
        self._uses: dict[Key, int | deque[int]] = {}
        self._held: dict[Key, tuple[Any, int]] = {}  # key -> (frame or Pending, bytes)
        self._heap: list[tuple[int, int, Key]] = []  # (-next use, tiebreak, key), lazily pruned
        self._tiebreak = 0

    def expect(self, draw: int, keys: Iterable[Key]) -> None:
        """Register that draw ``draw`` will take each of ``keys`` (a key once per take)."""
        for key in keys:
            uses = self._uses.get(key)
            if uses is None:
                self._uses[key] = draw
            elif isinstance(uses, deque):
                uses.append(draw)
            else:
                self._uses[key] = deque((uses, draw))

    def next_use(self, key: Key) -> int | None:
        """The draw that next takes ``key``, if one is registered."""
        uses = self._uses.get(key)
        return uses[0] if isinstance(uses, deque) else uses

    def holds(self, key: Key) -> bool:
        return key in self._held

    def take(self, key: Key) -> Any | None:
        """Consume the next use of ``key``; its frame if held (waiting for a decode ahead),
        else None (the caller decodes it and :meth:`offer` s what it decoded)."""
        uses = self._uses.get(key)
        if isinstance(uses, deque):
            uses.popleft()
            if len(uses) == 1:
                self._uses[key] = uses[0]
        elif uses is not None:
            del self._uses[key]
        entry = self._held.get(key)
        if entry is None:
            return None
        value, nbytes = entry
        if isinstance(value, Pending):
            value = value.result()
        self.decodes_saved += 1
        after = self.next_use(key)
        if after is None:
            del self._held[key]
            self.nbytes -= nbytes
        else:
            self._held[key] = (value, nbytes)
            self._push(key, after)
            self._shrink()
        return value

    def replace(self, key: Key, frame: Any, nbytes: int) -> None:
        """Hold ``frame`` (``nbytes``) for ``key`` in place of what is held (a converted copy),
        then drop what is used latest if that took the cache past its cap."""
        if key in self._held:
            self.nbytes += nbytes - self._held[key][1]
            self._held[key] = (frame, nbytes)
            self.peak_bytes = max(self.peak_bytes, self.nbytes)
            self._shrink()

    def would_hold(self, key: Key, nbytes: int) -> bool:
        """Whether :meth:`offer` would now hold a frame for ``key`` (to skip decoding frames
        that would be dropped at once)."""
        if key in self._held:
            return False
        when = self.next_use(key)
        if when is None:
            return False
        if self.nbytes + nbytes <= self.capacity or when <= self.now:
            return True
        top = self._latest()
        return top is not None and -top[0] > when

    def offer(self, key: Key, frame: Any, nbytes: int) -> bool:
        """Hold ``frame`` if it has a registered next use and room can be made for it by
        dropping frames used later; returns whether it is held."""
        if key in self._held:
            return True
        when = self.next_use(key)
        if when is None or not self._make_room(nbytes, when):
            return False
        self._held[key] = (frame, nbytes)
        self.nbytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.nbytes)
        self._push(key, when)
        return True

    def forget(self, tag: Hashable) -> None:
        """Drop what is held and registered for episode ``tag`` (evicted: nothing should be)."""
        for key in [k for k in self._held if k[0] == tag]:
            self.nbytes -= self._held.pop(key)[1]
        for key in [k for k in self._uses if k[0] == tag]:
            del self._uses[key]

    def _push(self, key: Key, when: int) -> None:
        self._tiebreak += 1
        heapq.heappush(self._heap, (-when, self._tiebreak, key))
        if len(self._heap) > 4 * len(self._held) + 1024:  # mostly stale entries: rebuild
            self._heap = []
            for k in self._held:
                self._tiebreak += 1
                self._heap.append((-self.next_use(k), self._tiebreak, k))
            heapq.heapify(self._heap)

    def _latest(self) -> tuple[int, int, Key] | None:
        """The heap entry of the held frame used latest (stale entries pruned on the way)."""
        heap = self._heap
        while heap:
            neg, _, key = heap[0]
            if key in self._held and self.next_use(key) == -neg:
                return heap[0]
            heapq.heappop(heap)  # stale: dropped, or pushed again with a new next use
        return None

    def _shrink(self) -> None:
        """Back within the cap after a taken frame is kept for a later draw: drop frames used
        latest, except the current draw's and those still being decoded."""
        while self.nbytes > self.capacity:
            top = self._latest()
            if top is None or -top[0] <= self.now or isinstance(self._held[top[2]][0], Pending):
                return
            heapq.heappop(self._heap)
            self.nbytes -= self._held.pop(top[2])[1]

    def _make_room(self, nbytes: int, when: int) -> bool:
        """Drop frames whose next use is after ``when`` (latest first) until ``nbytes`` fit;
        the current draw's own frames always fit. Frames still being decoded are not dropped."""
        while self.nbytes + nbytes > self.capacity:
            top = self._latest()
            if top is None or -top[0] <= when or isinstance(self._held[top[2]][0], Pending):
                return when <= self.now
            heapq.heappop(self._heap)
            self.nbytes -= self._held.pop(top[2])[1]
        return True


def read_ahead(
    events: Iterable[E], draws: Callable[[E], int], window: int, first: int | None = None
) -> Iterator[E]:
    """``events`` unchanged, each passed on only once ``window`` more draws have been read past
    it (``draws(event)`` counts an event's draws), so whatever the source does as it produces
    draws (telling a :class:`FrameCache` about them) runs that far ahead of the consumer.

    With ``first``, the window starts at ``first`` draws and grows by one for every draw passed
    on, up to ``window``: the first events go out after a short read, not a whole window's
    (registering 8,192 draws of three cameras takes a fifth of a second before the first item).
    """
    buffered: deque[tuple[E, int]] = deque()
    ahead = 0  # draws in the buffered events
    width = window if first is None else min(window, first)
    for event in events:
        count = draws(event)
        buffered.append((event, count))
        ahead += count
        while buffered and ahead - buffered[0][1] >= width:
            passed, passed_draws = buffered.popleft()
            ahead -= passed_draws
            width = min(window, width + passed_draws)
            yield passed
    for event, _ in buffered:
        yield event
