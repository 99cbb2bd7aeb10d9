"""Converting episodes: ``convert_episode``, the function every executor runs.

The driver (``run``) calls it in its own process or, through ``convert_episodes`` (a run of
consecutive episodes per task, so a task's cost is not its scheduling), in a process pool; the
Ray executor (``ray_executor``) runs it as Ray tasks; so every executor writes the same bytes.
Each process keeps its source open across episodes, with the source videos it is cutting.
Both import what they share from here (the job's arguments, ``ConvertError``, the resume
records): ``run`` imports ``ray_executor`` only when the Ray executor is chosen, and
``ray_executor`` never imports ``run``.

After an episode's shard is in place, ``convert_episode`` saves its manifest row as a resume
record under ``DEST/.convert/done/`` (a JSON line: on a local disk appended to the process's own
log, elsewhere one object each), with what its rows hold that poisons training
(``poisons.py``); ``run`` reads them back (``read_converted``) to skip finished episodes on a
rerun.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from lerobot_shards.converter.shard import SourceVideos, write_episode_shard
from lerobot_shards.format import (
    EPISODES_PER_SHARD_DIR,
    ManifestRow,
    Member,
    episode_key,
    join,
)
from lerobot_shards.poisons import Poison, find_poisons, scan_poisons
from lerobot_shards.source import Source, open_source

STATE_DIR = ".convert"
DONE_DIR = f"{STATE_DIR}/done"


class ConvertError(RuntimeError):
    """The conversion cannot start or an episode failed; the message says which and why."""


def episode_error(episode_index: int, exc: Exception) -> ConvertError:
    """``exc`` as the error of an episode: its message led by the episode, once."""
    message = str(exc)
    where = f"episode {episode_index}"
    if message.startswith((f"{where}:", f"{where} ")):
        return ConvertError(message)
    return ConvertError(f"{where}: {message}")


def no_space(dest: str, doing: str, exc: OSError) -> ConvertError:
    """The error of a destination that ran out of space: what was being written and that a
    rerun, once space is freed, finishes the job."""
    return ConvertError(
        f"{dest}: no space left on device ({doing}: {exc}); the episodes finished so far are "
        "kept: free some space and rerun to finish"
    )


@dataclass(frozen=True)
class Converted:
    """An episode converted: its manifest row, and what its rows hold that poisons training
    (None: not known, a record of an earlier version)."""

    row: ManifestRow
    poisons: list[Poison] | None


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
    decode_check: bool = False
    """Decode each cut's first frame (``cut``)."""


class _Job:
    """The source (and its videos) and the destination opened once per process and run,
    reused across episodes."""

    def __init__(self, args: JobArgs, src: Source | None = None) -> None:
        self.args = args
        self.src = src or open_source(args.source, args.storage_options)
        self.videos = SourceVideos(self.src)
        self.fs, root = fsspec.core.url_to_fs(args.dest, **(args.dest_storage_options or {}))
        self.root = root.rstrip("/") or "/"
        self.records = _Records(self.fs, self.root, args.run_id)
        self.searched: tuple[pa.Table, dict[int, list[Poison]]] | None = None
        """The rows last searched for poisons (the source's, held) and what each episode in
        them holds."""

    def close(self) -> None:
        self.videos.close()
        self.records.close()


_PROCESS_JOB: _Job | None = None


def job_for(args: JobArgs, src: Source | None = None) -> _Job:
    """This process's open job for ``args``, opened now (reusing ``src`` if given) if the
    process has none for these arguments."""
    global _PROCESS_JOB
    if _PROCESS_JOB is None or _PROCESS_JOB.args != args:
        forget_job()
        _PROCESS_JOB = _Job(args, src)
    return _PROCESS_JOB


def forget_job() -> None:
    """Close and drop this process's open job (the driver does, after converting in its own
    process)."""
    global _PROCESS_JOB
    if _PROCESS_JOB is not None:
        _PROCESS_JOB.close()
    _PROCESS_JOB = None


def convert_episode(args: JobArgs, episode_index: int, then: Sequence[int] = ()) -> Converted:
    """The per-episode work every executor runs: write the shard, find its rows' poisons, then
    save its resume record.

    Idempotent, so a retry after a crash is safe: the shard appears atomically (temp file and
    rename, or one upload) with the same bytes every time, and only then its record. ``then``:
    the episodes this process converts next (their rows are read along). A failure is a
    ``ConvertError`` led by the episode (``episode_error``), whichever executor ran it.
    """
    job = job_for(args)
    try:
        row = write_episode_shard(
            job.src, episode_index, job.fs, job.root, args.tolerance_s, job.videos, then,
            args.run_id, args.decode_check,
        )  # fmt: skip
        converted = Converted(row, episode_poisons(job, episode_index))
        job.records.save(converted)
    except ConvertError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise no_space(args.dest, f"writing episode {episode_index}", exc) from exc
        raise episode_error(episode_index, exc) from exc
    return converted


def episode_poisons(job: _Job, episode_index: int) -> list[Poison]:
    """What the episode's rows hold that poisons training, from the rows its shard was just
    written from: the source still holds them, with those of the episodes it read along, which
    are all searched at once (per episode, the search's fixed costs would be a tenth of a small
    episode's conversion)."""
    held = job.src.rows_held(episode_index)
    if held is None:  # not held (the source read the episode alone again): read, search alone
        rows = job.src.read_rows(episode_index)
        return find_poisons(rows, job.src.features, episode_index)
    table, episodes = held
    if job.searched is None or job.searched[0] is not table:
        try:
            job.searched = (table, scan_poisons(table, job.src.features, episodes))
        except ValueError:  # the episodes' rows are interleaved: each searched alone
            rows = job.src.read_rows(episode_index)
            return find_poisons(rows, job.src.features, episode_index)
    return job.searched[1][episode_index]


def convert_episodes(args: JobArgs, episode_indices: list[int]) -> list[Converted]:
    """``convert_episode`` for each of a run of episodes, in order: one pool task (a failure
    ends it, and the driver stops the run)."""
    return [
        convert_episode(args, i, episode_indices[k + 1 :]) for k, i in enumerate(episode_indices)
    ]


# --------------------------------------------------------------------------------------------
# resume records
# --------------------------------------------------------------------------------------------


class _Records:
    """Where a process saves its resume records, one JSON line per finished episode.

    On a local disk they are appended to the process's own log, one per process and run: one
    file per episode made a hundred thousand files to create, and on a rerun to read. A kill
    mid-write leaves at most a torn last line, which ``read_records`` skips (that episode is
    converted again). Elsewhere objects cannot be appended to, so each record is one object.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, run_id: str) -> None:
        self.fs, self.root, self.run_id = fs, root, run_id
        self._fd: int | None = None

    def save(self, converted: Converted) -> None:
        row = converted.row
        line = converted_to_json(converted) + b"\n"
        if not isinstance(self.fs, LocalFileSystem):
            chunk = row.episode_index // EPISODES_PER_SHARD_DIR
            name = f"{DONE_DIR}/{chunk:03d}/{episode_key(row.episode_index)}.jsonl"
            self.fs.pipe_file(join(self.root, name), line)  # one upload: appears whole
            return
        if self._fd is None:
            log = join(self.root, f"{DONE_DIR}/{self.run_id}-{os.getpid()}.jsonl")
            os.makedirs(os.path.dirname(log), exist_ok=True)
            self._fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        view = memoryview(line)
        while view:
            view = view[os.write(self._fd, view) :]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_converted(fs: fsspec.AbstractFileSystem, root: str) -> dict[int, Converted]:
    """Every resume record under the destination ``root``, by episode; torn or unreadable
    lines are skipped."""
    done_dir = join(root, DONE_DIR)
    if not fs.exists(done_dir):
        return {}
    paths = [p for p in fs.find(done_dir) if p.endswith(".jsonl")]
    records = {}
    for data in fs.cat(paths).values() if paths else ():  # concurrent on object stores
        for line in data.splitlines():
            try:
                converted = converted_from_json(line)
            except (ValueError, TypeError, KeyError):
                continue
            records[converted.row.episode_index] = converted
    return records


def read_records(fs: fsspec.AbstractFileSystem, root: str) -> dict[int, ManifestRow]:
    """The manifest rows of :func:`read_converted`'s records, by episode."""
    return {i: converted.row for i, converted in read_converted(fs, root).items()}


def converted_to_json(converted: Converted) -> bytes:
    row = converted.row
    raw = {**vars(row), "members": [vars(m) for m in row.members]}
    if converted.poisons is not None:
        raw["poisons"] = [p.to_json() for p in converted.poisons]
    return json.dumps(raw).encode()


def converted_from_json(data: bytes) -> Converted:
    raw = json.loads(data)
    found = raw.pop("poisons", None)
    raw["members"] = [Member(**m) for m in raw["members"]]
    row = ManifestRow(**raw)
    poisons = None if found is None else [Poison.from_json(p, "a record") for p in found]
    return Converted(row, poisons)
