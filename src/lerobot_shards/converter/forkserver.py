"""Where the local executor's worker processes come from: a forkserver (spawn where there is
none), which the command line starts first thing with the converter already imported.

Forking the caller is not safe (its threads, pyarrow's, fsspec's, torch's, may hold locks a
child then waits on forever: seen here with a worker forked from a test process), so workers
start from a forkserver. A plain forkserver leaves each worker to import pyarrow, PyAV and
fsspec itself, a third of a second before its first episode; one that imported them ahead, while
the driver was importing and reading the source's metadata, hands out workers ready to convert.
This module imports nothing heavy, so the command line can start the server before the driver
imports the converter.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver

WORKER_MODULES = ["lerobot_shards.converter.job"]
"""What a worker runs (``job.convert_episodes``), imported once by the forkserver."""


def worker_context() -> multiprocessing.context.BaseContext:
    """The multiprocessing context of the local executor's workers."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


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
