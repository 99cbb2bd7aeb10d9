"""Converting one episode: ``convert_episode``, the function every executor runs.

The driver (``run``) calls ``convert_episode`` in its own process or in a process pool; the
Ray executor (``ray_executor``) runs it as Ray tasks; so every executor writes the same bytes.
Both import what they share from here (the job's arguments, ``ConvertError``, the resume
records): ``run`` imports ``ray_executor`` only when the Ray executor is chosen, and
``ray_executor`` never imports ``run``.

After an episode's shard is in place, ``convert_episode`` saves its manifest row as a small
resume record under ``DEST/.convert/done/``; ``run`` reads these records to skip finished
episodes on a rerun.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import asdict, dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.converter.shard import TMP_SUFFIX, write_episode_shard
from lerobot_shards.format import (
    EPISODES_PER_SHARD_DIR,
    ManifestRow,
    Member,
    episode_key,
    join,
)
from lerobot_shards.source import Source, open_source

STATE_DIR = ".convert"
DONE_DIR = f"{STATE_DIR}/done"


class ConvertError(RuntimeError):
    """The conversion cannot start or an episode failed; the message says which and why."""


@dataclass(frozen=True)
class JobArgs:
    """What any process (a pool worker, a Ray worker) needs to convert one episode."""

    source: str
    storage_options: dict | None
    dest: str
    dest_storage_options: dict | None
    tolerance_s: float
    run_id: str
    """Unique per ``convert()`` call: a long-lived worker reopens the source for a new run."""


class _Job:
    """The source and destination opened once per process and run, reused across episodes."""

    def __init__(self, args: JobArgs, src: Source | None = None) -> None:
        self.args = args
        self.src = src or open_source(args.source, args.storage_options)
        self.fs, root = fsspec.core.url_to_fs(args.dest, **(args.dest_storage_options or {}))
        self.root = root.rstrip("/") or "/"


_PROCESS_JOB: _Job | None = None


def job_for(args: JobArgs, src: Source | None = None) -> _Job:
    """This process's open job for ``args``, opened now (reusing ``src`` if given) if the
    process has none for these arguments."""
    global _PROCESS_JOB
    if _PROCESS_JOB is None or _PROCESS_JOB.args != args:
        _PROCESS_JOB = _Job(args, src)
    return _PROCESS_JOB


def forget_job() -> None:
    """Drop this process's open job (the driver does, after converting in its own process)."""
    global _PROCESS_JOB
    _PROCESS_JOB = None


def convert_episode(args: JobArgs, episode_index: int) -> ManifestRow:
    """The per-episode work every executor runs: write the shard, then its resume record.

    Idempotent, so a retry after a crash is safe: the shard and then its record appear
    atomically (temp file and rename, or one upload) with the same bytes every time.
    """
    job = job_for(args)
    row = write_episode_shard(job.src, episode_index, job.fs, job.root, args.tolerance_s)
    record = record_path(job.root, episode_index)
    job.fs.makedirs(posixpath.dirname(record), exist_ok=True)
    data = row_to_json(row)
    if isinstance(job.fs, LocalFileSystem):
        # Whole or absent: a record half-written when the process was killed would be seen
        # (and its finished shard converted again) on the rerun.
        tmp = f"{record}.{os.getpid()}{TMP_SUFFIX}"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, record)
    else:
        job.fs.pipe_file(record, data)  # one upload: an object appears whole
    return row


# --------------------------------------------------------------------------------------------
# resume records
# --------------------------------------------------------------------------------------------


def record_path(root: str, episode_index: int) -> str:
    """Where the resume record of ``episode_index`` lives under the destination ``root``."""
    chunk = episode_index // EPISODES_PER_SHARD_DIR
    return join(root, f"{DONE_DIR}/{chunk:03d}/{episode_key(episode_index)}.json")


def row_to_json(row: ManifestRow) -> bytes:
    return json.dumps(asdict(row)).encode()


def row_from_json(data: bytes) -> ManifestRow:
    raw = json.loads(data)
    raw["members"] = [Member(**m) for m in raw["members"]]
    return ManifestRow(**raw)
