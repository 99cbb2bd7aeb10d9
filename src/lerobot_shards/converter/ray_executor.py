"""Run the converter's episodes as Ray tasks on a cluster, with back-pressure.

Each task runs ``job.convert_episode``, the same function the local executor runs, so both write
the same bytes. The driver keeps at most ``max_in_flight`` tasks submitted and not yet collected
(so a million-episode dataset never means a million queued tasks or results held at once), and
yields each task's result (its manifest row and findings) as it finishes; ``run.convert`` shows
progress and writes the manifest and ``index.json`` from them, exactly as for the local
executor.

Ray retries a task whose worker died (``max_retries``). That is safe because an episode's shard
appears atomically with the same bytes on every attempt and its resume record is rewritten. An
exception raised by the conversion itself is not retried (a damaged episode fails the same way
every time): the run stops and reports the episode and the error.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

from lerobot_shards.converter.job import (
    Converted,
    ConvertError,
    JobArgs,
    convert_episode,
    episode_error,
)

INSTALL_HINT = "pip install 'lerobot-shards[ray]'"
MAX_RETRIES = 3
"""Attempts after a worker or node dies (Ray's own default for tasks)."""


def import_ray() -> ModuleType:
    """The ``ray`` module, or a ConvertError that says how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ConvertError(
            f"the Ray executor needs Ray, which is not installed here ({exc}); "
            f"install it with: {INSTALL_HINT}"
        ) from exc
    return ray


def run_ray(
    args: JobArgs,
    todo: list[int],
    *,
    address: str | None = None,
    max_in_flight: int | None = None,
    max_retries: int = MAX_RETRIES,
) -> Iterator[Converted]:
    """Convert ``todo`` as Ray tasks, yielding each as it finishes; the first failure stops.

    Connects to ``address`` (default: ``RAY_ADDRESS``, else a new local instance) unless Ray is
    already initialised in this process, and shuts down only what it started.
    """
    if not todo:
        return
    ray = import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address)
    pending: dict = {}
    try:
        task = ray.remote(num_cpus=1, max_retries=max_retries)(convert_episode)
        args_ref = ray.put(args)
        bound = max_in_flight or 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        queue = iter(todo)
        while True:
            while len(pending) < max(1, bound) and (i := next(queue, None)) is not None:
                pending[task.remote(args_ref, i)] = i
            if not pending:
                break
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                i = pending.pop(ref)
                try:
                    converted = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:
                    raise episode_error(i, exc.cause or exc) from exc
                except ray.exceptions.RayError as exc:  # e.g. its worker died max_retries times
                    raise ConvertError(f"episode {i}: {type(exc).__name__}: {exc}") from exc
                yield converted
    finally:
        for ref in pending:
            ray.cancel(ref)
        if started_here:
            ray.shutdown()
