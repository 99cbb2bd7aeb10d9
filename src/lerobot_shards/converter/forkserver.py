"""Where the local executor's worker processes come from: a forkserver (spawn where there is
none), which the command line starts first thing with the converter already imported.

Forking the caller is not safe (its threads, pyarrow's, fsspec's, torch's, may hold locks a
child then waits on forever: seen here with a worker forked from a test process), so workers
start from a forkserver. A plain forkserver leaves each worker to import pyarrow, PyAV and
fsspec itself, a third of a second before its first episode; one that imported them ahead, while
the driver was importing and reading the source's metadata, hands out workers ready to convert.
This module imports nothing heavy, so the command line can start the server before the driver
imports the converter.

Workers do not re-run the caller's main script. A forkserver or spawn worker normally imports
``__main__`` again (as ``__mp_main__``) before its first task, so a plain script that calls
``convert(..., workers=2)`` at top level, as the README shows it, would convert again inside every
worker and break the pool. The workers run only this package's functions on this package's
arguments, so they start without the caller's main module and a script needs no
``if __name__ == "__main__":`` guard where there is a forkserver (Linux, macOS). Storage options
holding objects defined in the main script therefore cannot reach them; nothing in fsspec needs
that.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import multiprocessing.popen_forkserver
import multiprocessing.spawn
import threading

WORKER_MODULES = ["lerobot_shards.converter.job"]
"""What a worker runs (``job.convert_episodes``), imported once by the forkserver."""


_launching = threading.local()
"""``_launching.worker`` is set while this thread launches one of the converter's workers."""
_stdlib_preparation_data = multiprocessing.spawn.get_preparation_data


def _preparation_data(name: str) -> dict:
    """What a new process prepares before its task: the standard data, less the caller's main
    module while this thread launches a converter worker (any other process keeps it)."""
    data = _stdlib_preparation_data(name)
    if getattr(_launching, "worker", False):
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


multiprocessing.spawn.get_preparation_data = _preparation_data


def _without_main(popen: type) -> type:
    """``popen`` (a start method's Popen class) launching with ``_launching.worker`` set."""

    class WorkerPopen(popen):
        def _launch(self, process_obj):
            _launching.worker = True
            try:
                super()._launch(process_obj)
            finally:
                _launching.worker = False

    return WorkerPopen


class _ForkServerWorker(multiprocessing.context.ForkServerProcess):
    _Popen = staticmethod(_without_main(multiprocessing.popen_forkserver.Popen))


class _ForkServerWorkerContext(multiprocessing.context.ForkServerContext):
    Process = _ForkServerWorker


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context of the local executor's workers: a forkserver's, whose
    processes start without the caller's main module (spawn's where there is no forkserver, as on
    Windows: there a script needs its ``if __name__ == "__main__":`` guard)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        return _ForkServerWorkerContext()
    return multiprocessing.get_context("spawn")


def start_early() -> bool:
    """Start the forkserver now, importing the converter, unless this process has set up
    multiprocessing itself (a program that chose its start method or forkserver preloads keeps
    them). Returns whether it was started here."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    if multiprocessing.get_start_method(allow_none=True) is not None:
        return False
    multiprocessing.forkserver.set_forkserver_preload(WORKER_MODULES)
    multiprocessing.forkserver.ensure_running()
    return True
