"""reader.allocator: DataLoader workers keep freed frame-sized memory instead of faulting it in
again, and leave the allocator alone where told to."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest
from torch.utils.data import DataLoader, IterableDataset

from lerobot_shards.reader.frames import allocator


def glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(None), "mallopt")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not glibc(), reason="malloc tuning applies to glibc only")

# Allocates a batch of frame-sized blocks (as swscale's outputs), frees them all, and again, and
# prints the minor page faults per allocation.
CHURN = textwrap.dedent(
    """
    import ctypes, resource, sys
    from lerobot_shards.reader.frames.allocator import tune_worker_malloc
    if sys.argv[1] == "tune":
        assert tune_worker_malloc()
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = (ctypes.c_void_p,)
    size = 640 * 480 * 3
    def churn(rounds):
        for _ in range(rounds):
            held = [libc.malloc(size) for _ in range(8)]
            for p in held:
                ctypes.memset(p, 1, size)
            for p in held:
                libc.free(p)
    churn(5)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    churn(25)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 200)
    """
)


def faults_per_allocation(mode: str, **env: str) -> float:
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    run_env.update(env)
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode],
        capture_output=True,
        text=True,
        env=run_env,
        check=True,
    ).stdout
    return float(out.split()[-1])


def test_tuned_process_reuses_freed_frames():
    pages = 640 * 480 * 3 // 4096
    assert faults_per_allocation("plain") > pages / 2  # glibc's default: faulted in anew
    assert faults_per_allocation("tune") < 1


def test_opt_out_and_user_settings_are_respected(monkeypatch):
    monkeypatch.setattr(allocator, "_tuned_pid", None)
    monkeypatch.setenv(allocator.DISABLE, "0")
    assert allocator.tune_worker_malloc() is False
    monkeypatch.delenv(allocator.DISABLE)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert allocator.tune_worker_malloc() is False
    assert allocator._tuned_pid is None


class _Probe(IterableDataset):
    """Starts the reader, then says whether this process's allocator is tuned."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __iter__(self):
        from lerobot_shards import ShardedLeRobotDataset

        next(iter(ShardedLeRobotDataset(self.root, shuffle=False)))
        yield allocator._tuned_pid == os.getpid()


def test_reader_tunes_its_dataloader_workers_only(av1):
    assert list(_Probe(str(av1))) == [False]  # the training process is left alone
    assert list(DataLoader(_Probe(str(av1)), batch_size=None, num_workers=1)) == [True]
