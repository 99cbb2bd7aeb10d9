"""``torchrun --standalone --nproc_per_node=N`` (gloo, CPU) on a script of tests/dist_scripts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent.parent / "dist_scripts"


def torchrun(
    script: str, *args: str, ranks: int = 2, timeout: float = 240, check: bool = True
) -> subprocess.CompletedProcess:
    """Run ``script`` under the venv's torchrun; on timeout kill the whole process group (the
    launcher and every rank and worker) and fail with what they printed. ``check``: fail
    unless it exits 0."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={ranks}",
        str(SCRIPTS / script),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{script} hung for {timeout} s\n{out.decode()}\n{err.decode()}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out.decode(), err.decode())
    if check:
        assert result.returncode == 0, f"{script} failed\n{result.stdout}\n{result.stderr}"
    return result
