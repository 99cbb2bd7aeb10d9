"""Batches on the training device, the next one already on its way while a step runs.

Why. A training loop that does ``batch.to("cuda")`` itself copies each batch while the GPU
waits: the copy is not overlapped with the step, and the thread that launches the GPU's work
also receives the batches from the DataLoader workers. :class:`DeviceFeed` receives the
batches on a thread of its own, which starts each one's copy on a side CUDA stream as it
arrives (up to ``depth`` ahead), so batch ``i + 1`` is copied while step ``i`` runs; the
loop's stream waits for that copy on the GPU, the loop itself never does. Tensors go over the
bus as the loader made them (uint8 frames stay uint8: a quarter of the bytes of float32); the
loop converts them on the device. With ``pin_memory=True`` on the loader the copies are
asynchronous DMA; from pageable memory they hold the receiving thread, not the loop.

Resume stays exact: ``state_dict()`` is the loader's position minus the samples received but
not yet handed to the loop, so a checkpoint taken with batches in flight resumes at the first
batch the loop has not seen.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from lerobot_shards.reader.loading.loader import ShardedDataLoader, batch_length

_END = object()


class DeviceFeed:
    """``loader``'s batches on ``device``, up to ``depth`` copied ahead while the loop's step
    runs (on CUDA, on a side stream), with the loader's ``state_dict``/``load_state_dict`` made
    exact for what the loop consumed (a :class:`ShardedDataLoader`'s; any other iterable of
    batches is fed without them). Iterate it once per epoch, as the loader.

    Args:
        loader: The batches: a :class:`ShardedDataLoader` (its state then counts what the loop
            took, not what was copied ahead), or any iterable of batches (dicts, lists and
            tuples of tensors are walked).
        device: Where the batches go (``"cuda"``, ``"cuda:1"``, a ``torch.device``).
        depth: Batches copied ahead of the loop (at least 1).
        non_blocking: Copy asynchronously (from pinned memory, on CUDA).
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: str | torch.device,
        *,
        depth: int = 2,
        non_blocking: bool = True,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.loader = loader
        self.device = torch.device(device)
        self.depth = depth
        self.non_blocking = non_blocking
        self._consumed = 0  # samples of this epoch handed to the loop

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        # Not a generator: the loader's epoch begins here, in the caller's thread, so a state
        # taken before the first batch already counts from this epoch.
        self._consumed = 0
        batches = iter(self.loader)
        received: queue.Queue = queue.Queue(self.depth)
        stop = threading.Event()
        move = _Mover(self.device, self.non_blocking)
        counted = isinstance(self.loader, ShardedDataLoader)
        thread = threading.Thread(
            target=_receive,
            args=(batches, received, stop, counted, move),
            name="lerobot-shards-feed",
            daemon=True,
        )
        thread.start()
        return self._handed(received, stop, thread)

    def _handed(
        self, received: queue.Queue, stop: threading.Event, thread: threading.Thread
    ) -> Iterator[Any]:
        try:
            while True:
                got = received.get()
                if got is _END:
                    return
                if isinstance(got, BaseException):
                    raise got
                batch, copied, samples = got
                if copied is not None:  # the loop's stream waits for the copy, not the CPU
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(copied)
                    _record_stream(batch, current)
                self._consumed += samples
                yield batch
        finally:
            stop.set()
            while thread.is_alive():  # make room for a receiver waiting to put, then let it end
                with contextlib.suppress(queue.Empty):
                    received.get(timeout=0.05)
            thread.join()

    def state_dict(self) -> dict[str, Any]:
        """The exact position after the batches handed to the loop (those in flight left out:
        a resume delivers them again)."""
        return self._sharded().state_dict(num_samples=self._consumed)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Make the next ``iter(feed)`` deliver exactly what followed ``state``."""
        self._sharded().load_state_dict(state)
        self._consumed = 0

    def _sharded(self) -> ShardedDataLoader:
        if not isinstance(self.loader, ShardedDataLoader):
            raise TypeError(
                f"a DeviceFeed over a {type(self.loader).__name__} has no state to save or load: "
                "feed a lerobot_shards.ShardedDataLoader for exact checkpoints"
            )
        return self.loader


class _Mover:
    """Copies a batch to the device: on CUDA on a side stream, returning the event that marks
    the copy done (the caller's thread is not held for it, even from pageable memory)."""

    def __init__(self, device: torch.device, non_blocking: bool) -> None:
        self.device = device
        self.non_blocking = non_blocking
        self.side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def __call__(self, batch: Any) -> tuple[Any, torch.cuda.Event | None]:
        if self.side is None:
            return _to(batch, self.device, False), None
        with torch.cuda.device(self.device), torch.cuda.stream(self.side):
            moved = _to(batch, self.device, self.non_blocking)
            copied = torch.cuda.Event()
            copied.record(self.side)
        return moved, copied


def _receive(
    batches: Iterator[Any],
    received: queue.Queue,
    stop: threading.Event,
    counted: bool,
    move: _Mover,
) -> None:
    """Thread: take the loader's batches as they come (the DataLoader's iterator runs here) and
    start each one's copy to the device."""
    try:
        for batch in batches:
            samples = batch_length(batch) if counted else 0
            received.put((*move(batch), samples))
            if stop.is_set():
                break
    except BaseException as exc:  # handed to the loop, which raises it
        received.put(exc)
        return
    received.put(_END)


def to_device(
    loader: Iterable[Any],
    device: str | torch.device,
    *,
    depth: int = 2,
    non_blocking: bool = True,
) -> DeviceFeed:
    """``loader``'s batches on ``device``, each copied while the loop works on the one before
    (a :class:`DeviceFeed`; checkpoint it with ``feed.state_dict()``).

    Args:
        loader: The batches (a :class:`ShardedDataLoader`, or any iterable of batches).
        device: Where the batches go (``"cuda"``, a ``torch.device``).
        depth: Batches copied ahead of the loop (at least 1).
        non_blocking: Copy asynchronously (from pinned memory, on CUDA).

    Returns:
        The feed to iterate once per epoch.
    """
    return DeviceFeed(loader, device, depth=depth, non_blocking=non_blocking)


def _to(value: Any, device: torch.device, non_blocking: bool) -> Any:
    """``value`` with every tensor in it on ``device`` (dicts, lists and tuples walked)."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, Mapping):
        return type(value)({k: _to(v, device, non_blocking) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device, non_blocking) for v in value)
    return value


def _record_stream(value: Any, stream: torch.cuda.Stream) -> None:
    """Tell the caching allocator that ``stream`` uses the tensors copied on the side stream,
    so their memory is not reused before the loop's work on them is done."""
    if isinstance(value, torch.Tensor):
        value.record_stream(stream)
    elif isinstance(value, Mapping):
        for v in value.values():
            _record_stream(v, stream)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _record_stream(v, stream)
