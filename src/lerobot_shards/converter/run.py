"""The conversion driver: episodes in parallel, resumable, with progress; ``convert()``.

Every executor runs the same per-episode function, ``job.convert_episode``: in this process, in
a local process pool (runs of consecutive episodes per task, ``job.convert_episodes``), or as
Ray tasks on a cluster (``ray_executor``). The driver alone decides what to convert, shows
progress and writes the dataset-level files.

Resume works from small per-episode records: after an episode's shard is in place, its manifest
row is saved under ``DEST/.convert/done/`` (``job.read_records`` reads them back). A rerun
trusts a record whose shard still has the recorded size and checksum (``resume``) and converts
everything else. A run holds the destination's lock (``lock``) throughout, so two runs never
write one destination at once. The dataset-level files are each replaced whole, and only if
their bytes change, ``index.json`` last: an interrupted first run is never mistaken for a
finished one, and an interrupted rerun leaves a finished dataset readable.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import posixpath
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from tqdm.auto import tqdm

from lerobot_shards import __version__
from lerobot_shards.converter.check import read_dataset
from lerobot_shards.converter.cut import DEFAULT_TOLERANCE_S
from lerobot_shards.converter.forkserver import worker_context
from lerobot_shards.converter.job import (
    STATE_DIR,
    Converted,
    ConvertError,
    JobArgs,
    convert_episode,
    convert_episodes,
    forget_job,
    job_for,
    no_space,
)
from lerobot_shards.converter.lock import LOCK_FILE, DestinationLock, acquire_lock
from lerobot_shards.converter.resume import finished_rows
from lerobot_shards.converter.shard import TMP_SUFFIX, is_temp_of
from lerobot_shards.format import (
    FORMAT_VERSION,
    INDEX_FILE,
    INFO_FILE,
    MANIFEST_FILE,
    META_DIR,
    SHARDS_DIR,
    STATS_FILE,
    TASKS_FILE,
    DatasetIndex,
    FormatError,
    ManifestColumns,
    checksum,
    file_checksum,
    join,
)
from lerobot_shards.poisons import (
    NON_FINITE,
    POISONS_FILE,
    Poison,
    poisons_json,
    summary_lines,
)
from lerobot_shards.source import Source, open_source
from lerobot_shards.source.location import resolve_source
from lerobot_shards.validate import MissingStatsWarning, check_features, check_stats

# ConvertError, JobArgs, convert_episode and STATE_DIR live in ``job`` (``ray_executor`` needs
# them too) and are importable from here as well.

OPTIONS_FILE = f"{STATE_DIR}/options.json"
EXECUTORS = ("local", "ray")


@dataclass
class ConvertSummary:
    """What :func:`convert` did, and the converted dataset's totals."""

    dest: str
    """The converted dataset, as given."""
    episodes: int
    """Episodes in the converted dataset."""
    converted: int
    """Episodes converted by this run (the others were already done)."""
    frames: int
    """Frames in the converted dataset."""
    bytes: int
    """Total shard bytes of the dataset."""
    written_bytes: int
    """Shard bytes written by this run."""
    seconds: float
    """How long the conversion took."""
    decode_check: bool = False
    """Whether each cut's first frame was decoded (what ``line`` says was checked)."""
    poisons: list[Poison] = field(default_factory=list)
    """What the dataset's rows hold that poisons training (``poisons.py``), by episode."""
    unchecked: list[int] = field(default_factory=list)
    """Episodes whose rows were not checked (finished by an earlier version)."""

    def to_json(self) -> dict:
        """The summary as a JSON object (``convert --json``)."""
        out = {k: v for k, v in vars(self).items() if k not in ("poisons", "unchecked")}
        out["poisons"] = [p.to_json() for p in self.poisons]
        out["unchecked_episodes"] = list(self.unchecked)
        return out

    def warnings(self) -> list[str]:
        """Readable lines about the poisons found (none if none were)."""
        lines = summary_lines(self.poisons, len(self.unchecked))
        if not lines:
            return []
        return ["warnings (LeRobot reads these; a training run may not survive them):"] + [
            f"  {line}" for line in lines
        ]

    def line(self) -> str:
        """The summary in one line, as ``lerobot-shards convert`` prints it."""
        rate = self.written_bytes / 1e6 / self.seconds if self.seconds else 0.0
        checked = "each cut's first frame decoded" if self.decode_check else "no frame decoded"
        return (
            f"{self.dest}: {self.episodes} episodes ({self.converted} converted, "
            f"{self.episodes - self.converted} already done), {self.frames} frames, "
            f"{self.bytes / 1e6:.1f} MB in {self.seconds:.1f} s ({rate:.1f} MB/s written); "
            f"checked: frame counts and timestamps, {checked} (verify --deep decodes all)"
        )


def convert(
    source: str,
    dest: str,
    *,
    episodes: Iterable[int] | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    storage_options: dict | None = None,
    dest_storage_options: dict | None = None,
    progress: bool = True,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    executor: str = "local",
    ray_address: str | None = None,
    max_in_flight: int | None = None,
    decode_check: bool = False,
    trust_finished: bool = False,
    strict: bool = False,
) -> ConvertSummary:
    """Convert a LeRobot dataset (v3.0 or v2.1) at ``source`` into shards at ``dest``.

    Reruns resume: only missing or broken episodes are converted. A finished shard is kept if
    it still has its recorded size and checksum, which reads it once. Both executors write the
    same bytes. Every cut is checked to hold exactly the episode's frames at the rows'
    timestamps; ``verify --deep`` decodes every frame.

    Args:
        source: The LeRobot dataset: a local path, an fsspec URL (``s3://``, ``https://``,
            ``hf://datasets/...``), or a Hub repo id, read from LeRobot's local copy when it has
            one (``source/location.py``).
        dest: Where the shards go: a local path or an fsspec URL.
        episodes: The episode indices to convert; None converts all.
        workers: With ``executor="local"``, converter processes; None: the CPU count
            (``os.cpu_count()``); 0 or 1 converts in this process (so do ``memory://`` paths,
            whose contents live in one process). Not for Ray, which runs a task per episode on
            the cluster's CPUs.
        overwrite: Delete ``dest`` first and start afresh; without it, a destination holding
            another conversion is refused.
        storage_options: fsspec options for ``source`` (an endpoint, credentials: MinIO, R2,
            ...).
        dest_storage_options: fsspec options for ``dest``; None: none.
        progress: Show a progress bar.
        tolerance_s: Most seconds a video frame may be from its row's timestamp (LeRobot's own
            default).
        executor: ``"local"``: a process pool on this machine; ``"ray"``: Ray tasks on the
            cluster at ``ray_address`` (``pip install 'lerobot-shards[ray]'``; source and
            destination must be reachable from every node).
        ray_address: The Ray cluster; None: ``RAY_ADDRESS``, else a new local Ray instance (an
            already initialised Ray is used as it is).
        max_in_flight: Most episodes submitted and not yet collected; None: two pool tasks of up
            to 64 consecutive episodes per worker, or with Ray twice the cluster's CPUs.
        decode_check: Also decode each cut's first frame, which catches damaged codec parameters
            and first keyframes in the source for one keyframe decode per episode and camera
            (about 45% more time per episode).
        trust_finished: On a rerun, keep a finished shard that has its recorded size without
            reading it to check its checksum (for a resume on object storage, where reading
            means downloading).

        strict: Refuse a dataset whose rows hold non-finite values (NaN, Inf). Whether or
            not, the rows are searched for what poisons training (``poisons.py``: non-finite
            values, action or state dimensions constant over an episode, one-frame episodes),
            reported in the summary and written to ``poisons.json``.

    Returns:
        What was converted, the dataset's totals and the poisons found (``summary.line()``
        says it in one line).
    """
    started = time.perf_counter()
    if executor not in EXECUTORS:
        raise ConvertError(f"unknown executor {executor!r}; expected one of {EXECUTORS}")
    if executor == "ray":
        if workers is not None:
            raise ConvertError(
                "workers is for the local executor; Ray runs a task per episode on the "
                "cluster's CPUs (bound them with max_in_flight)"
            )
        from lerobot_shards.converter.ray_executor import import_ray

        import_ray()  # before touching DEST: says how to install Ray if it is missing
    source = resolve_source(str(source))
    src = open_source(source, storage_options)
    _check_meta(src)
    fs, root = fsspec.core.url_to_fs(str(dest), **(dest_storage_options or {}))
    root = root.rstrip("/") or "/"
    in_memory = "memory" in _protocols(fs) or "memory" in _protocols(src.fs)
    if executor == "ray" and in_memory:
        raise ConvertError(
            f"{source} -> {dest}: memory:// lives in one process; the Ray executor needs "
            "storage its workers can reach (a shared disk, s3://, gs://, hf://...)"
        )
    selected = _select(src, episodes)
    options = _options(src, selected)
    _check_dest(fs, root, str(dest), src, options, overwrite)  # before the lock creates files
    args = JobArgs(
        source=_absolute(str(source)),
        storage_options=storage_options,
        dest=_absolute(str(dest)),
        dest_storage_options=dest_storage_options,
        tolerance_s=tolerance_s,
        run_id=uuid.uuid4().hex,
        decode_check=decode_check,
    )
    with acquire_lock(fs, root, str(dest), args.run_id) as lock:
        try:
            _prepare_dest(fs, root, options, overwrite)
            done = finished_rows(fs, root, selected, hashed=not trust_finished)
            if strict:  # every episode checked: those finished unchecked converted again
                done = {i: c for i, c in done.items() if c.poisons is not None}
                for converted in done.values():
                    refuse_non_finite(converted, str(dest))
            todo = [i for i in selected if i not in done]
            rows = ManifestColumns()  # a few hundred bytes a row, not a row object's 2 kB
            poisons: list[Poison] = []
            unchecked: list[int] = []
            for i in selected:
                if i in done:
                    _keep(done[i], rows, poisons, unchecked)
            del done
            if executor == "ray":
                from lerobot_shards.converter.ray_executor import run_ray

                finished = run_ray(args, todo, address=ray_address, max_in_flight=max_in_flight)
            else:
                n_workers = (os.cpu_count() or 1) if workers is None else max(0, int(workers))
                if in_memory:
                    n_workers = 0
                finished = _run_local(args, src, todo, n_workers, max_in_flight)
            refused = str(dest) if strict else None
            written = _collect(
                finished, rows, poisons, unchecked, len(selected), len(todo), progress, lock,
                refused,
            )  # fmt: skip
            poisons.sort(key=lambda p: p.episode_index)  # stable: each episode's in its order
            unchecked.sort()
            _remove_temp_files(fs, root, args.run_id)  # of workers that died mid-write
            lock.check()
            _write_dataset_files(fs, root, src, rows, poisons_json(poisons, unchecked))
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise no_space(str(dest), "writing the dataset's files", exc) from exc
            raise
    return ConvertSummary(
        dest=str(dest),
        episodes=len(rows),
        converted=len(todo),
        frames=rows.total_frames,
        bytes=rows.total_bytes,
        written_bytes=written,
        seconds=time.perf_counter() - started,
        decode_check=decode_check,
        poisons=poisons,
        unchecked=unchecked,
    )


def _collect(
    finished: Iterator[Converted],
    rows: ManifestColumns,
    poisons: list[Poison],
    unchecked: list[int],
    total: int,
    todo: int,
    progress: bool,
    lock: DestinationLock,
    strict_dest: str | None = None,
) -> int:
    """Add the episodes of ``finished`` to ``rows``, ``poisons`` and ``unchecked`` as they
    come (:func:`_keep`), with progress; returns the shard bytes written. Stops if the lock was
    lost, or (``strict_dest``: ``--strict``) at the first episode with non-finite values."""
    written = 0
    with tqdm(
        total=total, initial=total - todo, unit="ep", desc="convert", disable=not progress,
        smoothing=0.1,
    ) as bar:  # fmt: skip
        run_started = time.perf_counter()
        for converted in finished:
            lock.check()
            if strict_dest is not None:
                refuse_non_finite(converted, strict_dest)
            row = converted.row
            _keep(converted, rows, poisons, unchecked)
            written += row.size
            bar.update(1)
            elapsed = time.perf_counter() - run_started
            bar.set_postfix_str(f"{written / 1e6 / max(elapsed, 1e-9):.1f} MB/s", refresh=False)
    return written


def _keep(
    converted: Converted, rows: ManifestColumns, poisons: list[Poison], unchecked: list[int]
) -> None:
    """What the dataset's files need of a finished episode: its row (as columns), its poisons,
    whether its rows were checked; nothing per episode beyond that."""
    rows.add(converted.row)
    if converted.poisons is None:
        unchecked.append(converted.row.episode_index)
    else:
        poisons += converted.poisons


def refuse_non_finite(converted: Converted, dest: str) -> None:
    """``--strict``: an episode whose rows hold a NaN or an Inf is refused, naming the feature,
    the episode and the first index (its shard stays, and a run without ``--strict`` finishes
    the dataset)."""
    for poison in converted.poisons or ():
        if poison.kind == NON_FINITE:
            raise ConvertError(
                f"{dest}: --strict refuses non-finite values: {poison} (LeRobot reads them as "
                "they are; a training run's loss turns NaN)"
            )


# --------------------------------------------------------------------------------------------
# options and the destination's state
# --------------------------------------------------------------------------------------------


def _check_meta(src: Source) -> None:
    """The reader's checks of the features and the statistics, on the source's, before any
    episode is converted: a problem there shows now, naming the source's file, not after the
    last episode (what is written is checked again before index.json)."""
    try:
        check_features(src.features, src.path(INFO_FILE))
        if src.stats is not None:
            check_stats(src.stats, src.features, src.path(STATS_FILE))
    except FormatError as exc:
        raise ConvertError(str(exc)) from exc


def _select(src: Source, episodes: Iterable[int] | None) -> list[int]:
    if episodes is None:
        return [ep.episode_index for ep in src.episodes]
    selected = sorted({int(i) for i in episodes})
    for i in selected:
        src.episode(i)  # SourceError naming the episode if it does not exist
    if not selected:
        raise ConvertError(f"{src.root}: no episodes selected")
    return selected


def _options(src: Source, selected: list[int]) -> dict:
    """What makes two conversions the same: the source's info.json, the episodes, the format."""
    info = hashlib.sha256(json.dumps(src.info, sort_keys=True).encode()).hexdigest()[:16]
    picked = hashlib.sha256(json.dumps(selected).encode()).hexdigest()[:16]
    return {
        "format_version": FORMAT_VERSION,
        "source_info": info,
        "episodes": picked,
        "episode_count": len(selected),
        "source_episode_count": len(src.episodes),
    }


def _check_dest(
    fs: fsspec.AbstractFileSystem, root: str, dest: str, src: Source, options: dict, overwrite: bool
) -> None:
    """Refuse a destination that is the source, holds another conversion (unless
    ``overwrite``) or holds anything else: before the lock creates a file there."""
    src_root = src.path("").rstrip("/")
    if type(fs) is type(src.fs) and posixpath.normpath(root) == posixpath.normpath(src_root):
        raise ConvertError(f"{dest}: the destination is the source itself")
    if overwrite:
        return
    options_path = join(root, OPTIONS_FILE)
    if fs.exists(options_path):
        with fs.open(options_path, "rb") as f:
            previous = json.load(f)
        if previous != options:
            raise ConvertError(
                f"{dest}: holds a conversion with different options "
                f"(recorded {previous}, now {options}); pass --overwrite to start afresh"
            )
    elif fs.exists(root) and (fs.isfile(root) or _entries(fs, root) - {STATE_DIR}):
        raise ConvertError(
            f"{dest}: exists and is not a lerobot-shards conversion; "
            "pass --overwrite to replace it, or choose an empty destination"
        )


def _prepare_dest(fs: fsspec.AbstractFileSystem, root: str, options: dict, overwrite: bool) -> None:
    """Under the lock: empty the destination (keeping the lock) if ``overwrite``, remove
    temporary files of earlier runs (dead: they held the lock) and record the options."""
    if overwrite and fs.exists(root):
        for name in _entries(fs, root):
            if name != STATE_DIR:
                fs.rm(join(root, name), recursive=True)
        for name in _entries(fs, join(root, STATE_DIR)):
            if f"{STATE_DIR}/{name}" != LOCK_FILE:
                fs.rm(join(root, f"{STATE_DIR}/{name}"), recursive=True)
    _remove_temp_files(fs, root)
    fs.makedirs(join(root, STATE_DIR), exist_ok=True)
    _put(fs, join(root, OPTIONS_FILE), json.dumps(options, indent=2, sort_keys=True).encode())


def _entries(fs: fsspec.AbstractFileSystem, path: str) -> set[str]:
    """Names in the folder ``path`` (none if it does not exist)."""
    try:
        return {posixpath.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)}
    except FileNotFoundError:
        return set()


def _remove_temp_files(fs: fsspec.AbstractFileSystem, root: str, run_id: str | None = None) -> None:
    """Temporary tars of the run ``run_id`` (or, under the lock at the start, of any run) that
    workers which died mid-write left behind (local destinations only have them)."""
    shards = join(root, SHARDS_DIR)
    if isinstance(fs, LocalFileSystem) and fs.exists(shards):
        for path in fs.find(shards):
            if is_temp_of(posixpath.basename(path), run_id):
                fs.rm_file(path)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _absolute(url: str) -> str:
    """A local path made absolute (workers may run in another directory); URLs as they are."""
    return url if "://" in url or "::" in url else os.path.abspath(url)


# --------------------------------------------------------------------------------------------
# converting episodes
# --------------------------------------------------------------------------------------------


MAX_BATCH = 64
"""Most episodes in one pool task."""


def batches(todo: list[int], workers: int, max_size: int = MAX_BATCH) -> list[list[int]]:
    """``todo`` cut into runs of consecutive episodes, one pool task each, largest first.

    Consecutive episodes share source files, which a worker keeps open from one episode to the
    next. Each run holds a ``2 * workers``-th of the episodes still to plan (guided
    self-scheduling), at most ``max_size``: few tasks, so scheduling costs nothing per
    episode, and small ones last, so the workers finish together.
    """
    out = []
    start = 0
    while start < len(todo):
        size = min(max_size, max(1, -(-(len(todo) - start) // (2 * max(1, workers)))))
        out.append(todo[start : start + size])
        start += size
    return out


def _run_local(
    args: JobArgs, src: Source, todo: list[int], workers: int, in_flight: int | None
) -> Iterator[Converted]:
    """Convert the episodes here or in a process pool, yielding each as it finishes; the first
    failure stops the run. ``in_flight`` bounds the episodes submitted and not yet collected
    (default: two tasks per worker)."""
    if not todo:
        return
    if workers <= 1:
        job_for(args, src)  # reuse the driver's open source
        try:
            for task in batches(todo, 1):
                for k, i in enumerate(task):
                    yield convert_episode(args, i, task[k + 1 :])
        finally:
            forget_job()
        return
    # Each worker opens its own source and destination (see ``forkserver`` for where it
    # comes from).
    ctx = worker_context()
    tasks = batches(todo, workers, max(1, in_flight // workers) if in_flight else MAX_BATCH)
    with ProcessPoolExecutor(max_workers=min(workers, len(tasks)), mp_context=ctx) as pool:
        pending: dict[Future, list[int]] = {}
        queue = iter(tasks)
        submitted = 0  # episodes in flight
        try:
            while True:
                # Bounded in flight: memory stays flat whatever the number of episodes.
                while (task := next(queue, None)) is not None:
                    pending[pool.submit(convert_episodes, args, task)] = task
                    submitted += len(task)
                    if len(pending) >= 2 * workers or (in_flight and submitted >= in_flight):
                        break
                if not pending:
                    break
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    task = pending.pop(fut)
                    submitted -= len(task)
                    exc = fut.exception()
                    if isinstance(exc, ConvertError):
                        raise ConvertError(str(exc)) from exc
                    if exc is not None:
                        where = (
                            f"episodes {task[0]}-{task[-1]}" if task[1:] else f"episode {task[0]}"
                        )
                        raise ConvertError(f"{where}: {exc}") from exc
                    yield from fut.result()
        finally:
            for fut in pending:
                fut.cancel()


# --------------------------------------------------------------------------------------------
# dataset-level files
# --------------------------------------------------------------------------------------------


def _write_dataset_files(
    fs: fsspec.AbstractFileSystem, root: str, src: Source, rows: ManifestColumns, poisons: bytes
) -> None:
    """meta/, manifest.parquet, poisons.json, then index.json (last: its presence marks a
    finished dataset).

    Each is replaced whole and only if its bytes change, so a rerun of a finished dataset
    writes nothing and a rerun killed at any point leaves it readable.
    """
    fs.makedirs(join(root, META_DIR), exist_ok=True)
    _put(fs, join(root, INFO_FILE), _read(src, INFO_FILE))
    if src.exists(STATS_FILE):
        _put(fs, join(root, STATS_FILE), _read(src, STATS_FILE))
    elif src.stats is not None:
        _put(fs, join(root, STATS_FILE), json.dumps(src.stats, indent=4).encode())
    if src.exists(TASKS_FILE):
        _put(fs, join(root, TASKS_FILE), _read(src, TASKS_FILE))
    else:
        _put(fs, join(root, TASKS_FILE), tasks_parquet(src.tasks))
    manifest_checksum = _put_manifest(fs, join(root, MANIFEST_FILE), rows)
    _put(fs, join(root, POISONS_FILE), poisons)
    index = DatasetIndex(
        codebase_version=src.codebase_version,
        fps=src.fps,
        features=src.features,
        total_episodes=len(rows),
        total_frames=rows.total_frames,
        total_bytes=rows.total_bytes,
        writer_version=__version__,
        camera_keys=list(src.camera_keys),
        video_keys=list(src.video_keys),
        manifest_checksum=manifest_checksum,
    )
    try:  # the reader's checks of what it will read, before index.json says it may
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MissingStatsWarning)  # _check_meta said it
            read_dataset(fs, root, root, index.to_json())
    except FormatError as exc:
        raise ConvertError(str(exc)) from exc
    _put(fs, join(root, INDEX_FILE), index.to_json())


def tasks_parquet(tasks: list[str]) -> bytes:
    """v3.0's ``meta/tasks.parquet`` layout: ``task_index`` and ``task``, the task as the
    pandas index (LeRobot reads it with pandas)."""
    pandas_meta = {
        "index_columns": ["task"],
        "column_indexes": [],
        "columns": [
            {"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
             "numpy_type": "int64", "metadata": None},
            {"name": "task", "field_name": "task", "pandas_type": "unicode",
             "numpy_type": "object", "metadata": None},
        ],
    }  # fmt: skip
    schema = pa.schema([("task_index", pa.int64()), ("task", pa.string())]).with_metadata(
        {"pandas": json.dumps(pandas_meta)}
    )
    table = pa.table({"task_index": list(range(len(tasks))), "task": tasks}, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _read(src: Source, relative: str) -> bytes:
    with src.open(relative, "rb") as f:
        return f.read()


def _put_manifest(fs: fsspec.AbstractFileSystem, path: str, rows: ManifestColumns) -> str:
    """Make ``path`` hold the manifest of ``rows`` as :func:`_put` does, and return its
    checksum: written to a local file first (beside ``path`` on a local disk, then renamed over
    it; uploaded elsewhere), never held whole in memory (a million rows' manifest is 141 MB)."""
    local = isinstance(fs, LocalFileSystem)
    with contextlib.ExitStack() as stack:
        folder = (
            os.path.dirname(path)
            if local
            else stack.enter_context(tempfile.TemporaryDirectory(prefix="lerobot-shards-"))
        )
        tmp = os.path.join(folder, f".{posixpath.basename(path)}.{uuid.uuid4().hex}{TMP_SUFFIX}")
        stack.callback(_discard, tmp)  # (renamed away on success)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        digest = rows.write(tmp)
        try:
            if fs.size(path) == os.path.getsize(tmp):
                same = file_checksum(path) if local else checksum(fs.cat_file(path))
                if same == digest:
                    return digest
        except FileNotFoundError:
            pass
        if local:
            os.replace(tmp, path)
        else:
            fs.put_file(tmp, path)
        return digest


def _discard(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _put(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Make ``path`` hold ``data``, unless it already does: replaced whole (a temporary file
    renamed over it on a local disk, created as any file is, ``0o666`` less the umask; one
    upload elsewhere), so a reader sees the old bytes or the new, never a part."""
    try:
        if fs.size(path) == len(data) and fs.cat_file(path) == data:
            return
    except FileNotFoundError:
        pass
    if not isinstance(fs, LocalFileSystem):
        fs.pipe_file(path, data)
        return
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
