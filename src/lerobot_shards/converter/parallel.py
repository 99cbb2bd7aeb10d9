"""Tasks run in this process, a local process pool or as Ray tasks: a bounded number in flight,
results as they finish. ``verify`` checks its shards on it (``convert`` has its executors in
``run`` and ``ray_executor``, with its resume records and retries).

A task is a call ``function(task)``; ``function`` and the tasks are pickled to the workers
(module-level functions, ``functools.partial`` of them, plain data). At most ``max_in_flight``
tasks are submitted and not yet collected (default: two per worker or Ray CPU), so a million
episodes never mean a million queued tasks or results held at once. The first task that raises
stops the run, with its exception.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from lerobot_shards.converter.forkserver import worker_context
from lerobot_shards.converter.ray_executor import import_ray

Task = TypeVar("Task")

EXECUTORS = ("local", "ray")


def run_tasks(
    function: Callable[[Task], Any],
    tasks: Iterable[Task],
    *,
    workers: int = 0,
    executor: str = "local",
    ray_address: str | None = None,
    max_in_flight: int | None = None,
) -> Iterator[tuple[Task, Any]]:
    """``(task, function(task))`` for each task, in the order they finish.

    Args:
        function: What each task runs (picklable).
        tasks: The tasks, read as they are submitted.
        workers: Local processes (0 or 1: in this process, in order).
        executor: ``"local"`` or ``"ray"`` (Ray tasks on the cluster at ``ray_address``:
            default ``RAY_ADDRESS``, else a new local instance; ``workers`` does not apply).
        ray_address: See ``executor``.
        max_in_flight: Tasks submitted and not yet collected (default: two per worker, or
            per CPU of the Ray cluster).
    """
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")
    if executor == "ray":
        yield from _on_ray(function, tasks, ray_address, max_in_flight)
    elif workers <= 1:
        for task in tasks:
            yield task, function(task)
    else:
        yield from _in_processes(function, tasks, workers, max_in_flight or 2 * workers)


def _in_processes(
    function: Callable[[Task], Any], tasks: Iterable[Task], workers: int, bound: int
) -> Iterator[tuple[Task, Any]]:
    queue = iter(tasks)
    first = next(queue, None)
    if first is None:  # nothing to do: no pool started
        return
    queue = itertools.chain([first], queue)
    with ProcessPoolExecutor(workers, mp_context=worker_context()) as pool:
        pending: dict[Future, Task] = {}
        try:
            while True:
                while len(pending) < bound and (task := next(queue, None)) is not None:
                    pending[pool.submit(function, task)] = task
                if not pending:
                    return
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    yield pending.pop(future), future.result()
        finally:
            for future in pending:
                future.cancel()


def _call(function: Callable[[Task], Any], task: Task) -> Any:
    return function(task)


def _on_ray(
    function: Callable[[Task], Any],
    tasks: Iterable[Task],
    address: str | None,
    max_in_flight: int | None,
) -> Iterator[tuple[Task, Any]]:
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address)
    pending: dict = {}
    try:
        remote = ray.remote(num_cpus=1)(_call)
        function_ref = ray.put(function)
        bound = max_in_flight or 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        queue = iter(tasks)
        while True:
            while len(pending) < bound and (task := next(queue, None)) is not None:
                pending[remote.remote(function_ref, task)] = task
            if not pending:
                return
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                task = pending.pop(ref)
                try:
                    yield task, ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    raise (exc.cause or exc) from exc
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started_here:
            ray.shutdown()
