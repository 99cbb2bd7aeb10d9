"""frame_cache.py on its own: the heap-kept cache makes exactly the decisions of a naive
statement of its rule (keep what is drawn soonest, drop what is drawn latest), never holds more
than its cap beyond the draw being built, and read_ahead runs a source far enough ahead."""

from __future__ import annotations

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from lerobot_shards.reader.frames.frame_cache import FrameCache, read_ahead


def naive_decodes(draws: list[list[int]], capacity: int, gop: int) -> list[tuple[int, int]]:
    """The rule stated plainly, O(n^2): every frame costs 1; a draw takes its frames in order; a
    frame not held is decoded, and its GOP mates (frames with the same ``frame // gop``) are
    offered along with it; an offer is held if the frame is drawn again and room can be made by
    dropping held frames drawn strictly later (latest first; among equals, the one whose next
    use was set first); the draw's own frames always fit, and a frame taken and kept for a
    later draw drops the latest-used held frames until back under the cap. Returns ``(draw,
    frame)`` of each decode."""
    uses = [(d, f) for d, frames in enumerate(draws) for f in frames]
    held: dict[int, int] = {}  # frame -> when its next use was set
    decodes = []
    clock = iter(range(10**9))

    def next_use(frame: int, after: int) -> int | None:
        return next((d for i, (d, f) in enumerate(uses) if i >= after and f == frame), None)

    def offer(frame: int, after: int, now: int) -> None:
        when = next_use(frame, after)
        if frame in held or when is None:
            return
        while len(held) + 1 > capacity:
            latest = max(held, key=lambda f: (next_use(f, after), -held[f]), default=None)
            if latest is None or next_use(latest, after) <= when:
                if when <= now:
                    break
                return
            del held[latest]
        held[frame] = next(clock)

    for i, (d, frame) in enumerate(uses):
        if frame in held:
            if next_use(frame, i + 1) is None:
                del held[frame]
            else:
                held[frame] = next(clock)
                while len(held) > capacity:  # back under the cap, but the draw's frames stay
                    latest = max(held, key=lambda f: (next_use(f, i + 1), -held[f]))
                    if next_use(latest, i + 1) <= d:
                        break
                    del held[latest]
            continue
        decodes.append((d, frame))
        mates = [m for m in range(frame // gop * gop, frame // gop * gop + gop) if m != frame]
        for mate in mates:
            offer(mate, i + 1, d)
        offer(frame, i + 1, d)
    return decodes


def cached_decodes(draws: list[list[int]], capacity: int, gop: int) -> list[tuple[int, int]]:
    """The same draws through :class:`FrameCache` (as ``episode.CameraFrames`` drives it)."""
    cache = FrameCache(capacity)
    for d, frames in enumerate(draws):
        cache.expect(d, [("e", "c", f) for f in frames])
    decodes = []
    for d, frames in enumerate(draws):
        cache.now = d
        for frame in frames:
            key = ("e", "c", frame)
            got = cache.take(key)
            if got is not None:
                assert got == frame
                continue
            decodes.append((d, frame))
            start = frame // gop * gop
            for mate in range(start, start + gop):
                if mate != frame:
                    cache.offer(("e", "c", mate), mate, 1)
            cache.offer(key, frame, 1)
            assert cache.nbytes <= max(capacity, len(frames))
    assert cache.nbytes == 0  # every use consumed: nothing held
    return decodes


@settings(max_examples=500, deadline=None)
@given(
    draws=st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=3), max_size=40),
    capacity=st.integers(0, 6),
    gop=st.sampled_from([1, 2, 3, 6]),
)
def test_cache_decides_as_the_naive_rule(draws, capacity, gop):
    assert cached_decodes(draws, capacity, gop) == naive_decodes(draws, capacity, gop)


def test_more_room_never_means_more_decodes():
    draws = [[f] for f in [0, 5, 2, 9, 1, 4, 8, 3, 7, 6, 11, 10, 0, 5]]
    counts = [len(cached_decodes(draws, capacity, 2)) for capacity in range(8)]
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1]


def test_would_hold_matches_offer():
    cache = FrameCache(2)
    cache.expect(0, [("e", "c", 0)])
    cache.expect(5, [("e", "c", 1), ("e", "c", 2)])
    cache.expect(9, [("e", "c", 3)])
    assert not cache.would_hold(("e", "c", 7), 1)  # never drawn
    assert cache.offer(("e", "c", 3), 3, 1) and cache.offer(("e", "c", 1), 1, 1)
    # Full: frame 2 (drawn at 5) would displace frame 3 (drawn at 9), frame 3 nothing.
    assert cache.would_hold(("e", "c", 2), 1) and cache.offer(("e", "c", 2), 2, 1)
    assert not cache.holds(("e", "c", 3))
    assert not cache.would_hold(("e", "c", 3), 1) and not cache.offer(("e", "c", 3), 3, 1)


def test_read_ahead_reads_a_window_of_draws_past_each_event():
    read: list[int] = []

    def source():
        for n, count in enumerate([3, 0, 5, 2, 4, 0, 1]):
            read.append(n)
            yield (n, count)

    seen = []
    for event in read_ahead(source(), lambda e: e[1], window=6):
        seen.append(event[0])
        past = sum(e[1] for e in [(n, c) for n, c in enumerate([3, 0, 5, 2, 4, 0, 1])][: len(read)])
        done = sum(c for n, c in enumerate([3, 0, 5, 2, 4, 0, 1]) if n <= event[0])
        assert past - done >= 6 or len(read) == 7
    assert seen == list(range(7))


def test_registered_uses_cost_little_memory():
    """The plan's look-ahead registers every frame of 8,192 draws per camera: at three cameras
    about 25,000 keys per process, most used once. Their bookkeeping must stay small (a deque
    per key cost about 850 bytes with its entry: 20 MB here)."""
    keys = [(("epoch", d % 64), camera, d) for d in range(8192) for camera in "abc"]
    cache = FrameCache(0)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for draw, key in enumerate(keys):
            cache.expect(draw // 3, [key])
        cache.expect(9000, keys[:300])  # a few frames drawn twice
        per_key = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    finally:
        tracemalloc.stop()
    assert per_key < 150, per_key
    assert cache.next_use(keys[5]) == 1
    cache.take(keys[5])
    assert cache.next_use(keys[5]) == 9000
    cache.take(keys[5])
    assert cache.next_use(keys[5]) is None
    assert cache.next_use(keys[400]) == 133


def test_read_ahead_window_starts_short_and_grows_by_what_went_out():
    """With ``first``, the first event goes out after ``first`` draws were read past it, and the
    window grows by the draws passed on, up to ``window``."""
    counts = [1] * 100
    read: list[int] = []

    def source():
        for n, count in enumerate(counts):
            read.append(n)
            yield (n, count)

    out = read_ahead(source(), lambda e: e[1], window=20, first=4)
    lead = []
    for event in out:
        lead.append(len(read) - 1 - event[0])  # draws read past the event passed on
    assert lead[0] == 4
    assert lead[:17] == list(range(4, 21)) and set(lead[16:80]) == {20}
