"""The converter at many episodes: what makes 100,000 of them feasible, at a size CI can afford.

``scripts/bench_convert.py`` converts, kills and resumes 100,000 tiny episodes and times it;
here the same path runs on a thousand (a few hundred per data and video file), and what keeps
the cost per episode flat is checked by counting: each source video opened once per process,
rows read a run of episodes at a time, a few pool tasks and record files rather than one per
episode. The manifest of 100,000 episodes round-trips in full.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import fsspec
import pyarrow.parquet as pq
import pytest

from lerobot_shards import convert
from lerobot_shards.converter import cut
from lerobot_shards.converter.job import DONE_DIR, read_records
from lerobot_shards.converter.run import MAX_BATCH, batches
from lerobot_shards.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    ManifestRow,
    Member,
    manifest_rows,
    shard_path,
    write_manifest,
)
from lerobot_shards.testing.factory import make_dataset
from lerobot_shards.validate import read_manifest

CLI = [sys.executable, "-m", "lerobot_shards.cli"]
EPISODES = 1000


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(
        tmp_path_factory.mktemp("many") / "ds",
        episode_lengths=[(2, 3, 4)[i % 3] for i in range(EPISODES)],
        cameras={"observation.images.cam": (32, 32)},
        data_files_size_in_mb=0.1,
        video_files_size_in_mb=0.1,
        video_variants=4,
    )


@pytest.mark.parametrize("workers", [1, 2, 8])
@pytest.mark.parametrize("todo", [[], [7], list(range(5)), list(range(0, 3000, 3)),
                                  list(range(100_000))])  # fmt: skip
def test_batches_are_runs_in_order_largest_first(todo: list[int], workers: int):
    tasks = batches(todo, workers)
    assert [i for task in tasks for i in task] == todo
    sizes = [len(task) for task in tasks]
    assert all(0 < s <= MAX_BATCH for s in sizes)
    assert sizes == sorted(sizes, reverse=True)
    # Few tasks (scheduling costs nothing per episode), yet several per worker to balance.
    assert len(tasks) <= len(todo) // MAX_BATCH + 2 * workers * 8
    assert len(tasks) >= min(len(todo), 2 * workers)


def test_files_are_opened_once_and_rows_read_a_run_at_a_time(
    many: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    opened: list[object] = []
    row_reads: list[list[int]] = []
    real_init = cut.SourceVideo.__init__
    real_read = pq.ParquetFile.read_row_groups

    def counting_init(self, file, where="video"):
        opened.append(file)
        real_init(self, file, where)

    def counting_read(self, row_groups, *args, **kwargs):
        row_groups = list(row_groups)
        row_reads.append(row_groups)
        return real_read(self, row_groups, *args, **kwargs)

    monkeypatch.setattr(cut.SourceVideo, "__init__", counting_init)
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", counting_read)
    summary = convert(str(many), str(tmp_path / "out"), workers=0, progress=False)
    assert summary.episodes == EPISODES
    videos = sorted(many.glob("videos/*/*/*.mp4"))
    data = sorted(many.glob("data/*/*.parquet"))
    assert len(videos) > 2 and len(data) > 2, "the dataset must span several files"
    assert sorted(opened) == [str(p) for p in videos]
    assert len(row_reads) <= EPISODES // MAX_BATCH + 2 * len(data)
    assert sum(len(groups) for groups in row_reads) == EPISODES  # each row group read once


def test_many_episodes_convert_resume_after_a_kill_and_verify(many: Path, tmp_path: Path):
    dest = tmp_path / "out"
    fs = fsspec.filesystem("file")
    argv = [*CLI, "convert", str(many), str(dest), "--workers", "2", "--no-progress"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while True:
        # Stopped while its records are read: reading them takes longer than converting the
        # rest did on a fast machine, so a kill after the read could come after the last one.
        os.killpg(proc.pid, signal.SIGSTOP)
        if len(read_records(fs, str(dest))) >= EPISODES // 4:
            break
        os.killpg(proc.pid, signal.SIGCONT)
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "a quarter of the episodes took over 120 s"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (dest / INDEX_FILE).exists(), "the conversion finished before it was killed"
    finished = read_records(fs, str(dest))
    assert EPISODES // 4 <= len(finished) < EPISODES
    before = {i: (dest / row.shard).stat() for i, row in finished.items()}

    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert (
        f"{EPISODES} episodes ({EPISODES - len(finished)} converted, "
        f"{len(finished)} already done)" in result.stdout
    )
    for i, st in before.items():
        now = (dest / shard_path(i)).stat()
        assert (now.st_ino, now.st_mtime_ns) == (st.st_ino, st.st_mtime_ns), f"episode {i} redone"
    # Resume records: a log per process and run, not a file per episode.
    assert len(list((dest / DONE_DIR).iterdir())) <= 2 * 3
    table = read_manifest(fs, str(dest / MANIFEST_FILE))
    assert table.column("episode_index").to_pylist() == list(range(EPISODES))
    verify = subprocess.run([*CLI, "verify", str(dest)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr


def test_a_manifest_of_100000_episodes_round_trips(tmp_path: Path):
    rows = [
        ManifestRow(
            episode_index=i,
            shard=shard_path(i),
            offset=0,
            size=4096 + i,
            length=2 + i % 3,
            dataset_from_index=4 * i,  # disjoint ranges, as a real manifest has them
            dataset_to_index=4 * i + 2 + i % 3,
            tasks=["stack the blocks"] if i % 5 else [],
            members=[Member(f"episode-{i:06d}.json", 512, 300 + i % 7)]
            + [Member(f"episode-{i:06d}.cam.mp4", 1536, 900)] * (i % 2),
            checksum=f"sha256:{i:064x}",
        )
        for i in range(100_000)
    ]
    fs = fsspec.filesystem("file")
    path = str(tmp_path / MANIFEST_FILE)
    write_manifest(fs, path, rows[::-1])  # written sorted by episode whatever the order given
    assert manifest_rows(read_manifest(fs, path)) == rows
