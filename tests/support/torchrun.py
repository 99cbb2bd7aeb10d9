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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_nodes(
    script: str | Path, *args: str, sizes: list[int], timeout: float = 400
) -> list[subprocess.CompletedProcess]:
    """``torchrun --nnodes=len(sizes)`` launched once per node on loopback, ``sizes[n]`` ranks
    on node ``n`` (torchrun takes a ``--nproc-per-node`` per node); every launch's result, in
    node order. On timeout every launch's process group is killed and the test fails."""
    port = free_port()
    launches = []
    for node, size in enumerate(sizes):
        where = ["--standalone"] if len(sizes) == 1 else [
            f"--nnodes={len(sizes)}", f"--node_rank={node}", "--master_addr=127.0.0.1",
            f"--master_port={port}",
        ]  # fmt: skip
        command = [
            sys.executable, "-m", "torch.distributed.run", *where, f"--nproc_per_node={size}",
            str(SCRIPTS / script), *args,
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        launches.append(
            (
                command,
                subprocess.Popen(
                    command,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    start_new_session=True,
                    env=env,
                ),
            )
        )
    results = []
    for command, launch in launches:
        try:
            out, err = launch.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for _, each in launches:
                os.killpg(each.pid, signal.SIGKILL)
            pytest.fail(f"{script} on nodes of {sizes} ranks hung for {timeout} s")
        results.append(
            subprocess.CompletedProcess(command, launch.returncode, out.decode(), err.decode())
        )
    return results
