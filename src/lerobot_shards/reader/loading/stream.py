"""One part's stream of items: the planner's events in, LeRobot items out.

The wiring of the pure planner to the I/O. The part's plan (and, with ``repeat``, the next
epochs' parts) is read ``frame_lookahead`` draws ahead so the frame cache knows which frames
are drawn soon; admissions are fetched, verified and demuxed ahead in a small thread pool
(``fetch.Prefetcher``, within the pool budget); each draw decodes its frame's GOP (on decode
threads, ``decode_ahead`` draws ahead, when there are cores to spare) through the episode's
cameras and the shared :class:`FrameCache`, and builds the item as LeRobot does
(``episode.Episode.item``), in a DataLoader worker straight into the next batch's shared slots.
A draw waits only for its own episode's fetch: while a pool fills (the first one, or the next
epoch's), draws from the episodes already loaded go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lerobot_shards.items import ItemSpec
from lerobot_shards.reader.batches import transfer
from lerobot_shards.reader.fetch.ranged import ADMIT, EVICT, Prefetcher, read_span
from lerobot_shards.reader.frames.episode import Episode
from lerobot_shards.reader.frames.frame_cache import FrameCache, read_ahead
from lerobot_shards.reader.loading import warm_start
from lerobot_shards.reader.loading.cpu import physical_cores
from lerobot_shards.reader.loading.node_cache import NodeSchedule
from lerobot_shards.reader.meta.catalog import Catalog, Member
from lerobot_shards.reader.plan.elastic import Ordering, Part
from lerobot_shards.reader.plan.pool import Admit, Draws, Evict
from lerobot_shards.reader.plan.state import Cursor
from lerobot_shards.trace import COUNTERS, TraceWriter

PREFETCH_LOOKAHEAD_EVENTS = 16
"""Plan events the fetcher reads ahead looking for the next admissions to fetch early."""
FIRST_LOOKAHEAD = 256
"""Draws registered with the frame cache before the first item; the look-ahead then grows to
``frame_lookahead`` as items go out (``frame_cache.read_ahead``)."""


@dataclass(frozen=True)
class StreamOptions:
    """How a part is streamed: the fetching and decoding knobs (each dataset of the catalog
    shapes its own items)."""

    backend: str
    decode_threads: int
    """Threads decoding the GOPs of upcoming draws (0: each GOP when first drawn, inline)."""
    decode_ahead: int
    frame_lookahead: int
    prefetch_depth: int
    fetch_threads: int
    fetch_retries: int
    shared_batches: bool
    """Write frames into the DataLoader worker's shared batch slots (``transfer.BatchArena``)."""
    warm_draws: int = 0
    """When a part ends, the next epoch's first draws fetched and decoded ahead
    (``warm_start.py``)."""


def decode_thread_count(requested: int | None, processes: int) -> int:
    """Decode threads for one of ``processes`` iterating processes: ``requested``, or the
    physical cores (``cpu.py``) shared out over them, none when there are no more cores than
    processes (each process's own thread then keeps its core busy: more threads would only
    contend for it)."""
    if requested is not None:
        return requested
    cores = physical_cores()
    return cores // processes if cores > processes else 0


def stream_part(
    part: Part,
    following: Iterator[Part],
    cursor: Cursor,
    *,
    ordering: Ordering,
    next_ordering: Ordering | None = None,
    catalog: Catalog,
    cache_bytes: int,
    options: StreamOptions,
    stats: dict[str, int],
    trace: TraceWriter | None = None,
    next_part: Callable[[], Part] | None = None,
    node: NodeSchedule | None = None,
    place: Callable[[], Mapping[str, Any] | None] | None = None,
) -> Iterator[dict]:
    """The items of ``part`` from ``cursor.offset`` on (then, with ``ordering.repeat``, of the
    ``following`` epochs' parts), moving ``cursor`` along and recording peaks in ``stats``
    (and, with ``trace``, where the time goes: ``trace.py``). When the part ends, the part
    ``next_part()`` returns (the next epoch's) is warmed up (``warm_start.py``) under
    ``next_ordering`` (the next iteration's, default ``ordering``: they differ only while a
    state of an earlier draw rule is resumed). With ``node``,
    episodes are read through the node-local cache (``node_cache.py``). ``place()``, called
    once per item just before it is made, says where its frames go (a mixed batch's rows:
    ``batches/rows.py``); without it, in a DataLoader worker with ``options.shared_batches``,
    the next batch's slots of the worker's own arena (``batches/transfer.py``)."""
    from_cache_before = stats["frames_from_cache"]
    # what the last part's end prepared for this very stream (another's is dropped)
    warmed = warm_start.claim(part, catalog, ordering, options.backend)
    if cursor.offset:  # a resumed part: its first draws are not the ones warmed
        warmed = {}
    if part.num_samples == 0 or cursor.offset >= part.num_samples:
        return
    if node is not None:  # where the stream is: fetches run ahead of it
        node.clock = lambda: (cursor.epoch, cursor.offset)
    parts_of: dict[int, Part] = {}
    cache = FrameCache(cache_bytes)
    registered = 0  # draws whose frames the cache has been told about
    specs = [member.spec for member in catalog.members]

    def events() -> Iterator[tuple[int, Any]]:
        nonlocal registered
        current, start = part, cursor.offset
        while True:
            parts_of[current.epoch] = current
            lengths = catalog.lengths_of(current.episodes)
            owners = catalog.member_indices(current.episodes)  # one search, not one per piece
            for event in fetch_order(current.plan(ordering, catalog.cost, start)):
                if type(event) is Draws:
                    registered = expect_frames(
                        cache, registered, current, lengths, event, specs, owners
                    )
                yield current.epoch, event
            if not ordering.repeat:
                return
            current, start = next(following), 0

    def classify(step: tuple[int, Any]) -> tuple[str | None, Any]:
        epoch, event = step
        if type(event) is Admit:
            return ADMIT, (epoch, event.piece)
        if type(event) is Evict:
            return EVICT, (epoch, event.piece)
        return None, None

    def size(key: tuple[int, int]) -> int:
        epoch, piece = key
        p = parts_of[epoch]
        return catalog.cost(int(p.episodes[piece]), int(p.starts[piece]), int(p.stops[piece]))

    def fetch_piece(owner: Part, piece: int) -> tuple[Episode, Member]:
        """Piece ``piece`` of ``owner`` fetched, verified and demuxed (through the node's
        cache when there is one)."""
        member, episode = catalog.locate(int(owner.episodes[piece]))
        read = read_span if node is None else node.reader(owner, piece)
        started = time.perf_counter()
        try:
            return member.fetch(episode, options.backend, options.fetch_retries, read), member
        finally:
            COUNTERS.add("fetch_s", time.perf_counter() - started)

    def load(key: tuple[int, int]) -> tuple[Episode, Member]:
        epoch, piece = key
        if epoch == part.epoch and piece in warmed:
            return warmed.pop(piece)
        return fetch_piece(parts_of[epoch], piece)

    prefetcher = Prefetcher(
        load,
        size,
        byte_budget=ordering.byte_budget,
        depth=options.prefetch_depth,
        threads=options.fetch_threads,
        # Runs of draws double up to 512 draws, so a few events reach far enough to fetch the
        # next admissions in time; reading further would register thousands of draws with the
        # frame cache before the first item.
        lookahead_events=PREFETCH_LOOKAHEAD_EVENTS,
    )
    threads = options.decode_threads
    decoder = ThreadPoolExecutor(threads, "lerobot-shards-decode") if threads else None
    if place is None and options.shared_batches:
        pool = transfer.worker_pool()
        place = pool.arena.slots if pool is not None else None
    loading: dict[tuple[int, int], Future] = {}  # admitted, not yet needed
    resident: dict[tuple[int, int], tuple[Episode, Member]] = {}
    fetched = 0
    drawn = 0

    def ready(key: tuple[int, int]) -> tuple[Episode, Member]:
        """The admitted piece ``key``, waiting for its load only now that a draw needs it."""
        nonlocal fetched
        loaded = resident.get(key)
        if loaded is None:
            started = time.perf_counter()
            loaded = resident[key] = loading.pop(key).result()
            COUNTERS.add("fetch_wait_s", time.perf_counter() - started)
            loaded[0].attach(cache, key)
            fetched += loaded[0].fetched
        return loaded

    planned = read_ahead(events(), _draw_count, options.frame_lookahead, FIRST_LOOKAHEAD)
    try:
        for (epoch, event), value in prefetcher.run(planned, classify):
            kind = type(event)
            if kind is Draws:
                if epoch != cursor.epoch:  # the stream ran on into the next epoch
                    cursor.advance(parts_of[epoch])
                    for old in [e for e in parts_of if e < epoch - 1]:
                        del parts_of[old]
                current = parts_of[epoch]
                run = [
                    ((epoch, piece), current.position(piece, frame))
                    for piece, frame in zip(
                        event.pieces.tolist(), event.frames.tolist(), strict=True
                    )
                ]
                # A run ends before the next eviction, so every episode it draws from is
                # resident until it ends: decoding ahead within it never outlives a piece.
                ahead = 0
                for n, (key, position) in enumerate(run):
                    cache.now = drawn
                    if decoder is not None:
                        while ahead < len(run) and ahead <= n + options.decode_ahead:
                            early, at = run[ahead]
                            if early in resident or loading[early].done():  # never wait here
                                episode, owner = ready(early)
                                episode.schedule(at, owner.spec, decoder)
                            ahead += 1
                    episode, member = ready(key)
                    slots = place() if place is not None else None
                    item = episode.item(position, member.spec, member.meta.task_names, slots)
                    if member.placement is not None:  # a target layout's item
                        item = member.placement.apply(item, slots)
                    drawn += 1
                    memory = fetched + cache.nbytes
                    stats["peak_resident_memory"] = max(stats["peak_resident_memory"], memory)
                    cursor.offset += 1
                    cursor.stream_offset += 1
                    COUNTERS.add("items", 1)
                    if trace is not None:
                        trace.tick(frames_from_cache=cache.decodes_saved + from_cache_before)
                    handed = time.perf_counter()
                    yield item
                    COUNTERS.add("outside_s", time.perf_counter() - handed)
            elif kind is Admit:
                loading[(epoch, event.piece)] = value
                stats["peak_budget_bytes"] = max(stats["peak_budget_bytes"], prefetcher.peak_bytes)
            else:
                key = (epoch, event.piece)
                fetched -= ready(key)[0].fetched
                del resident[key]
                cache.forget(key)
        if next_part is not None and options.warm_draws:
            warm_start.begin(
                next_part,
                next_ordering or ordering,
                catalog,
                options.backend,
                fetch_piece,
                options.warm_draws,
                fetch_order,
            )
    finally:
        if decoder is not None:
            decoder.shutdown(wait=True, cancel_futures=True)
        stats["peak_budget_bytes"] = max(stats["peak_budget_bytes"], prefetcher.peak_bytes)
        stats["peak_frame_cache_bytes"] = max(stats["peak_frame_cache_bytes"], cache.peak_bytes)
        stats["frames_from_cache"] += cache.decodes_saved
        if trace is not None:
            trace.close(frames_from_cache=stats["frames_from_cache"])


def fetch_order(events: Iterable[Any], horizon: int = 1024) -> Iterator[Any]:
    """A plan's events with each run of consecutive admissions reordered so that the episodes
    drawn first are fetched first (the draws that follow the run, up to ``horizon`` of them or
    the next eviction, say which). A filling pool then gives its first items after a few
    fetches, not after whichever episode of the pool comes last. Draws keep their order."""
    admits: list[Admit] = []
    held: list[Draws] = []
    drawn = 0
    for event in events:
        kind = type(event)
        if admits and kind is Draws and drawn < horizon:
            held.append(event)
            drawn += len(event.pieces)
            continue
        if kind is Admit and not held:
            admits.append(event)
            continue
        yield from _by_first_draw(admits, held)
        yield from held
        admits, held, drawn = [], [], 0
        if kind is Admit:
            admits.append(event)
        else:
            yield event
    yield from _by_first_draw(admits, held)
    yield from held


def _by_first_draw(admits: list[Admit], draws: list[Draws]) -> list[Admit]:
    first: dict[int, int] = {}
    for run in draws:
        for piece in run.pieces.tolist():
            first.setdefault(piece, len(first))
    return sorted(admits, key=lambda a: first.get(a.piece, len(first)))


def expect_frames(
    cache: FrameCache,
    first: int,
    part: Part,
    lengths: np.ndarray,
    draws: Draws,
    specs: list[ItemSpec],
    owners: np.ndarray,
) -> int:
    """Tell ``cache`` which frames each of ``draws`` (numbered from ``first``) will take;
    returns the next draw's number. ``specs[owners[i]]`` shapes the items of piece ``i``."""
    epoch = part.epoch
    draw = first
    for piece, frame in zip(draws.pieces.tolist(), draws.frames.tolist(), strict=True):
        position = part.position(piece, frame)
        tag = (epoch, piece)
        spec = specs[owners[piece]]
        keys = []
        for key in spec.video_keys:
            offsets = spec.deltas.get(key)
            if offsets is None:
                keys.append((tag, key, position))
            else:
                shown = np.clip(position + offsets, 0, int(lengths[piece]) - 1).tolist()
                keys += [(tag, key, p) for p in shown]
        cache.expect(draw, keys)
        draw += 1
    return draw


def _draw_count(step: tuple[int, Any]) -> int:
    event = step[1]
    return len(event.pieces) if type(event) is Draws else 0
