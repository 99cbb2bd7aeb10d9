"""A DataLoader worker SIGKILLed mid-epoch (the kernel's OOM killer, a node agent): the training
loop gets an error naming the worker, nothing of the reader's is left behind (no worker process,
no shared memory in /dev/shm, no thread in the training process), and resuming from the last
checkpoint taken after a consumed batch is exact: the batches before it and those after the
resume are the uninterrupted epoch, in order. Real processes, a real SIGKILL."""

from __future__ import annotations

import functools
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux /proc"),
    # 10-20 s each on a loaded 2-core machine: a hang fails instead of blocking CI.
    pytest.mark.timeout(180),
]

BATCH = 4
WORKERS = 2
KILL_AFTER = 3  # batches consumed before the kill
BATCH_TIMEOUT_S = 60
"""The DataLoader's ``timeout``: a batch that takes longer (a worker alive but hung, which the
DataLoader's own check for dead workers does not notice) is an error, not a wait forever. A
batch takes well under a second."""


def dataset(root: Path) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(root, buffer_size=3, seed=11)


def loader(root: Path, timeout: float = BATCH_TIMEOUT_S, **kwargs) -> ShardedDataLoader:
    return ShardedDataLoader(dataset(root), BATCH, num_workers=WORKERS, timeout=timeout, **kwargs)


def note_pid(pids, worker_id: int) -> None:
    """worker_init_fn: record this worker's pid where the test can read it (public API only)."""
    pids[worker_id] = os.getpid()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def shm_entries(pids: set[int]) -> set[str]:
    """Entries of /dev/shm whose names carry one of ``pids`` (torch names its segments
    ``torch_<pid>_...``; other programs on the machine may hold entries of their own)."""
    if not os.path.isdir("/dev/shm"):
        return set()
    return {e for e in os.listdir("/dev/shm") if any(f"_{pid}_" in f"_{e}_" for pid in pids)}


@pytest.mark.parametrize("persistent", [False, True])
def test_a_killed_worker_fails_clearly_and_the_last_checkpoint_resumes_exactly(av1, persistent):
    full = [i for b in loader(av1) for i in b["index"].tolist()]
    assert sorted(full) == list(range(len(full)))

    threads_before = threading.active_count()
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    pids = multiprocessing.get_context().Array("i", WORKERS)
    # No batch timeout here: with one, the DataLoader looks for dead workers only when a wait
    # for a batch times out (its workers come from the forkserver, so no SIGCHLD reaches this
    # process), and noticing the kill took the whole timeout (60 s) instead of its 5 s poll.
    # The module's timeout guards this loop.
    killed = loader(
        av1,
        timeout=0,
        persistent_workers=persistent,
        worker_init_fn=functools.partial(note_pid, pids),
    )
    consumed: list[list[int]] = []
    state = killed.state_dict()  # the checkpoint at the start of the epoch
    victim = None
    with pytest.raises(RuntimeError, match=r"DataLoader worker \(pids?\(?s?\)? [\d, ]+\)") as err:
        for batch in killed:
            indices = batch["index"].tolist()
            del batch
            after = killed.state_dict()  # checkpoint after every consumed batch, as the README
            consumed.append(indices)
            state = after
            if len(consumed) == KILL_AFTER:
                victim = pids[0]
                assert victim > 0 and alive(victim)
                os.kill(victim, signal.SIGKILL)
    assert victim is not None, "the epoch ended before the kill"
    message = str(err.value)
    assert str(victim) in message or "exited unexpectedly" in message, message
    before = [i for b in consumed for i in b]
    assert state["offset"] == len(before)  # the checkpoint is the last consumed batch
    assert len(before) < len(full)  # killed mid-epoch

    # Nothing left behind: every worker gone, no shared memory, no thread in this process.
    workers = set(pids[:])
    deadline = time.monotonic() + 30
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in workers), [p for p in workers if alive(p)]
    assert not shm_entries(workers | {os.getpid()}) - shm_before
    deadline = time.monotonic() + 10
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert threading.active_count() <= threads_before, threading.enumerate()

    # Resume from the last checkpoint: exactly the rest of the epoch, in order. A persistent
    # loader whose epoch failed starts new workers, so the state loads into it; else a new one.
    resumed = killed if persistent else loader(av1)
    resumed.timeout = BATCH_TIMEOUT_S  # the killed loader had none (above)
    resumed.load_state_dict(state)
    rest = [i for b in resumed for i in b["index"].tolist()]
    assert before + rest == full
