"""A million episodes: what the reader keeps and does per episode, never per frame or per
dataset where a worker's own episodes would do (issue 49). No timings: allocations, calls and
bytes, with bounds that code whose cost does not grow with the dataset meets at any scale.

Datasets are made at scale in seconds from the golden one (``testing.scale``: the manifest of
every episode, shards only where read); ``scripts/bench_scale.py`` measures the times."""

from __future__ import annotations

import json
import pickle
import shutil
import tracemalloc
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data._utils.worker import WorkerInfo

import lerobot_shards.format as format_module
import lerobot_shards.reader.loading.dataset as dataset_module
import lerobot_shards.reader.plan.partition as partition_module
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.cli import main
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    MANIFEST_SCHEMA,
    FormatError,
    ManifestColumns,
    ManifestRow,
    Member,
    episode_key,
    manifest_table,
    shard_path,
)
from lerobot_shards.reader.meta.catalog import Catalog
from lerobot_shards.reader.meta.selection import Selection
from lerobot_shards.reader.plan.elastic import consumed_per_worker
from lerobot_shards.reader.plan.partition import (
    Pieces,
    samples_per_part,
    split_part,
    split_parts,
)
from lerobot_shards.testing.scale import make_scaled_dataset
from lerobot_shards.validate import check_manifest, read_manifest

VIDEO_KEYS = ["observation.images.cam_high", "observation.images.cam_left_wrist"]


# ------------------------------------------------------------------ epoch start


def reference_consumed(offset, per_worker, batch_size, repeat):
    """The DataLoader's round-robin replayed batch by batch (what ``consumed_per_worker``
    computed before: an array entry per batch of the rank, so per sample at batch size 1)."""
    workers = len(per_worker)
    b = max(1, batch_size)
    if repeat:
        batches, partial = divmod(offset, b)
        rounds, nxt = divmod(batches, workers)
        taken = [rounds * b + (b if w < nxt else 0) for w in range(workers)]
        taken[nxt] += partial
        return taken, nxt
    counts = np.asarray(per_worker, dtype=np.int64)
    rounds = int(-(-counts.max() // b)) if len(counts) and counts.max() > 0 else 0
    sizes = np.clip(counts[None, :] - b * np.arange(rounds)[:, None], 0, b).ravel()
    ends = np.cumsum(sizes)
    done = int(np.searchsorted(ends, offset, side="right"))
    taken = np.bincount(np.arange(done) % workers, weights=sizes[:done], minlength=workers)
    taken = taken.astype(np.int64)
    rest = np.flatnonzero(sizes[done:] > 0)
    if not len(rest):
        return counts.tolist(), 0
    nxt = int((done + rest[0]) % workers)
    taken[nxt] += offset - (int(ends[done - 1]) if done else 0)
    return taken.tolist(), nxt


@settings(max_examples=300)
@given(
    per_worker=st.lists(st.integers(0, 60), min_size=1, max_size=6),
    batch_size=st.integers(1, 9),
    offset=st.integers(0, 400),
    repeat=st.booleans(),
)
def test_consumed_per_worker_is_the_round_robin_replayed(per_worker, batch_size, offset, repeat):
    got = consumed_per_worker(offset, per_worker, batch_size, repeat)
    assert got == reference_consumed(offset, per_worker, batch_size, repeat)


def peak_bytes(work) -> int:
    """The most memory Python and numpy held at once while ``work()`` ran, above the start."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        work()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("offset", [0, 1_234_567, 2_000_000])
def test_consumed_per_worker_allocates_nothing_per_sample(offset):
    """At a fresh start (batch size 1, offset 0) it built an int64 per sample of the rank,
    several times over: 3.8 GB in each worker at a million episodes."""
    workers = [1_000_000, 1_000_000, 999_999]
    assert peak_bytes(lambda: consumed_per_worker(offset, workers, 1, False)) < 64_000


@pytest.fixture(scope="module")
def long_episodes(av1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """300 episodes of 20,000 frames each (unread: no shard)."""
    dest = tmp_path_factory.mktemp("scale") / "long"
    return make_scaled_dataset(av1, dest, 300, length=20_000)


def test_a_workers_epoch_start_allocates_per_episode_not_per_frame(long_episodes, monkeypatch):
    """What a DataLoader worker allocates when its iteration starts (before its first fetch)
    is in its episodes' number: 6 million frames here, 300 episodes."""
    ds = ShardedLeRobotDataset(str(long_episodes))
    ds.num_workers = 2
    info = WorkerInfo(id=1, num_workers=2, seed=7, dataset=ds)
    monkeypatch.setattr(dataset_module, "get_worker_info", lambda: info)
    monkeypatch.setattr(dataset_module, "tune_worker_malloc", lambda: None)
    ds.load_state_dict({"epoch": 0, "offset": 0, "batch_size": 1})  # a fresh start's state
    peak = peak_bytes(lambda: iter(ds))
    assert peak < 2_000_000, f"{peak} bytes at epoch start"


def test_a_workers_epoch_start_makes_its_own_part_alone(many_episodes, monkeypatch):
    """A worker's epoch start works in its own episodes' number: one of four workers
    allocates less than one worker alone, whose part is every episode (it split every
    worker's part to learn their sizes: more than the lone worker, at 1M 56-61 MB)."""
    monkeypatch.setattr(dataset_module, "tune_worker_malloc", lambda: None)
    peaks = {}
    for workers in (1, 4):
        ds = ShardedLeRobotDataset(str(many_episodes))
        ds.num_workers = workers
        info = WorkerInfo(id=workers - 1, num_workers=workers, seed=7, dataset=ds)
        monkeypatch.setattr(dataset_module, "get_worker_info", lambda info=info: info)
        peaks[workers] = peak_bytes(lambda ds=ds: iter(ds))
    assert peaks[4] < 0.8 * peaks[1], peaks


# ------------------------------------------------------------------ the first item


def test_the_first_item_looks_up_only_the_episodes_it_fetches(av1, tmp_path, monkeypatch):
    """A part's first item looked up the dataset of each of the part's episodes, one call
    each (a million calls, 3.7 s, at a million episodes); now it looks up what it fetches."""
    root = make_scaled_dataset(av1, tmp_path / "ds", 400, read=range(400))
    ds = ShardedLeRobotDataset(str(root), buffer_size=2, shuffle=False, decode_threads=0)
    calls = []
    locate = Catalog.locate
    monkeypatch.setattr(Catalog, "locate", lambda self, e: calls.append(e) or locate(self, e))
    first = next(iter(ds))
    assert int(first["index"]) == 0
    assert len(calls) <= 2 * (ds.buffer_size + ds.prefetch_depth), calls


# ------------------------------------------------------------------ what a process keeps


@pytest.fixture(scope="module")
def many_episodes(av1: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """140,000 episodes: a manifest parquet reads back in two chunks (of 131,072 rows)."""
    return make_scaled_dataset(av1, tmp_path_factory.mktemp("scale") / "many", 140_000)


def test_a_pickled_dataset_is_about_its_manifests_size(many_episodes):
    """What a spawn or forkserver DataLoader worker receives. The manifest read in chunks
    that share buffers pickled every chunk with all of them (apache/arrow#26685), and the
    table beside per-episode lists: 3.98 GB at a million episodes, 29x the file."""
    manifest = many_episodes / MANIFEST_FILE
    read = read_manifest(fsspec.filesystem("file"), str(manifest))
    assert read.column("members").num_chunks > 1  # the case that blew up
    ds = ShardedLeRobotDataset(str(many_episodes))
    pickled = pickle.dumps(ds)
    assert len(pickled) < 2 * manifest.stat().st_size
    again = pickle.loads(pickled)
    assert again.selection.span(139_999) == ds.selection.span(139_999)
    assert again.fingerprint == ds.fingerprint


def test_the_kept_manifest_gives_back_every_row(many_episodes):
    """The selection keeps numbers, digests and spans, and gives back the manifest's rows."""
    table = read_manifest(fsspec.filesystem("file"), str(many_episodes / MANIFEST_FILE))
    selection = ShardedLeRobotDataset(str(many_episodes)).selection
    assert selection.table.equals(table)
    for episode in (0, 1, 77_777, 139_999):
        row = table.slice(episode, 1).to_pylist()[0]
        base = row["offset"]
        assert selection.members(episode) == {
            m["name"]: (m["offset"] - base, m["size"]) for m in row["members"]
        }
        assert selection.span(episode).checksum == row["checksum"]
        assert selection.span(episode).path.endswith(row["shard"])


def plain_row(episode: int, start: int) -> ManifestRow:
    key = episode_key(episode)
    names = [f"{key}.json", f"{key}.parquet", *(f"{key}.{k}.mp4" for k in VIDEO_KEYS)]
    members = [Member(name, 512 + 1024 * i, 100 + i) for i, name in enumerate(names)]
    return ManifestRow(
        episode, shard_path(episode), 0, 1024 * len(names), 3, start, start + 3,
        ["a task"], members, f"sha256:{episode:064x}",
    )  # fmt: skip


ODDITIES = st.sampled_from(
    ["swapped", "extra", "renamed", "missing", "one tar", "another key", "no tasks", "two tasks"]
)


def odd(row: ManifestRow, oddity: str) -> ManifestRow:
    """``row`` as another writer might have written it (a lie or not: the reader's checks of
    each episode decide; its selection must keep what the manifest says)."""
    members = list(row.members)
    if oddity == "swapped":
        members[0], members[1] = members[1], members[0]
    elif oddity == "extra":
        members.append(Member(f"{episode_key(row.episode_index)}.txt", 600, 1))
    elif oddity == "renamed":
        members[2] = Member("camera.mp4", members[2].offset, members[2].size)
    elif oddity == "missing":
        members = members[:3]
    elif oddity == "one tar":
        row.shard = "shards/all.tar"
    elif oddity == "another key":
        members[0] = Member(f"{episode_key(row.episode_index + 1)}.json", 512, 100)
    elif oddity == "no tasks":
        row.tasks = []
    else:
        row.tasks = ["a task", "another"]
    row.members = members
    return row


@settings(max_examples=60)
@given(
    episodes=st.lists(st.integers(0, 2_000_000), min_size=1, max_size=40, unique=True).map(sorted),
    oddities=st.dictionaries(st.integers(0, 39), ODDITIES, max_size=6),
)
def test_the_kept_manifest_is_the_manifest(episodes, oddities):
    """Whatever the rows say (the format's names, or others: below and above a million, whose
    keys have seven digits), the selection's members, spans and rows are the manifest's."""
    rows = [plain_row(e, 3 * i) for i, e in enumerate(episodes)]
    for i, oddity in oddities.items():
        if i < len(rows):
            rows[i] = odd(rows[i], oddity)
    table = check_manifest(manifest_table(rows), "manifest")
    selection = Selection.of(table, "root", VIDEO_KEYS)
    assert selection.table.equals(table)
    for row in rows:
        assert selection.members(row.episode_index) == {
            m.name: (m.offset - row.offset, m.size) for m in row.members
        }
        span = selection.span(row.episode_index)
        assert (span.path, span.offset, span.size, span.checksum) == (
            f"root/{row.shard}",
            row.offset,
            row.size,
            row.checksum,
        )
    again = pickle.loads(pickle.dumps(selection))
    assert again.table.equals(table)


def test_a_manifest_written_with_parquets_defaults_reads_the_same(av1, tmp_path):
    """The converter writes the manifest LZ4-coded without statistics (it decodes in half the
    time); one written with parquet's defaults (snappy, statistics), as converters wrote
    them before, opens, inspects and verifies to the same rows and fingerprint."""
    new = make_scaled_dataset(av1, tmp_path / "new", 300, read=range(300))
    old = tmp_path / "old"
    shutil.copytree(new, old)
    table = pq.read_table(new / MANIFEST_FILE)
    pq.write_table(table, old / MANIFEST_FILE)  # parquet's defaults
    index = json.loads((old / INDEX_FILE).read_text())
    index["manifest_checksum"] = format_module.checksum((old / MANIFEST_FILE).read_bytes())
    (old / INDEX_FILE).write_text(json.dumps(index))
    codecs = {
        root: pq.ParquetFile(root / MANIFEST_FILE).metadata.row_group(0).column(0).compression
        for root in (new, old)
    }
    assert codecs == {new: "LZ4", old: "SNAPPY"}
    datasets = [ShardedLeRobotDataset(str(root)) for root in (new, old)]
    assert datasets[0].selection.table.equals(datasets[1].selection.table)
    assert datasets[0].fingerprint == datasets[1].fingerprint
    summaries = [CliRunner().invoke(main, ["inspect", "--json", str(root)]) for root in (new, old)]
    assert [r.exit_code for r in summaries] == [0, 0], summaries[1].output
    first, second = (json.loads(r.output) for r in summaries)
    assert {**first, "root": None} == {**second, "root": None}
    assert verify_dataset(str(old), sample=0) == []


def test_a_manifest_read_in_chunks_is_kept_as_one(av1):
    """Rows read in several chunks (or sliced out of a larger table) are the same rows."""
    table = read_manifest(fsspec.filesystem("file"), str(av1 / MANIFEST_FILE))
    chunked = pa.Table.from_batches(table.to_batches(max_chunksize=2))
    assert chunked.column("members").num_chunks > 1
    one, several = (Selection.of(t, "root", VIDEO_KEYS) for t in (table, chunked))
    assert several.table.equals(one.table)
    assert several.fingerprint == one.fingerprint
    sink = pa.BufferOutputStream()
    pq.write_table(several.table, sink)
    assert pq.read_table(pa.BufferReader(sink.getvalue())).equals(table)


# ------------------------------------------------------------------ verify


def test_verify_samples_shards_and_checks_the_manifest_side_alone(av1, tmp_path):
    """``sample=N`` checks N shards drawn at random (here every one is missing but the first
    ten), ``sample=0`` the manifest side alone; without it, every shard."""
    root = make_scaled_dataset(av1, tmp_path / "ds", 60, read=range(10))
    assert verify_dataset(str(root), sample=0) == []
    every = verify_dataset(str(root))
    assert [p.episode_index for p in every] == list(range(10, 60))
    assert {p.message for p in every} == {"shard file missing"}
    sampled = verify_dataset(str(root), sample=25)
    episodes = [p.episode_index for p in sampled]
    assert episodes == sorted(set(episodes)) and set(episodes) <= set(range(10, 60))
    assert len(episodes) >= 25 - 10  # at most the ten present shards drawn without a problem


def test_verify_in_worker_processes_finds_what_one_process_finds(av1, tmp_path):
    """Shards checked in two processes: the same problems, in episode order."""
    root = make_scaled_dataset(av1, tmp_path / "ds", 80, read=range(0, 80, 2))
    flipped = root / shard_path(40)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 1
    flipped.write_bytes(bytes(data))
    alone = verify_dataset(str(root))
    assert len(alone) == 41
    assert [(p.episode_index, p.message) for p in alone if p.episode_index == 40] == [
        (40, "checksum mismatch: the shard's bytes differ from the manifest")
    ]
    assert verify_dataset(str(root), workers=2) == alone


def test_verify_starts_no_more_processes_than_it_has_tasks(av1, tmp_path, monkeypatch):
    """A dataset of one task's episodes is checked in this process, whatever ``workers`` says:
    starting a pool (imports in each worker) would cost more than the checks."""
    import lerobot_shards.converter.check as check

    asked = []
    real = check.run_tasks

    def recording(*args, **kwargs):
        asked.append(kwargs["workers"])
        return real(*args, **kwargs)

    monkeypatch.setattr(check, "run_tasks", recording)
    small = make_scaled_dataset(av1, tmp_path / "small", check.VERIFY_TASK, read=range(4))
    large = make_scaled_dataset(av1, tmp_path / "large", 2 * check.VERIFY_TASK + 1, read=range(4))
    for root in (small, large):  # shards of 4 episodes: the rest reported missing, alike
        assert verify_dataset(str(root), workers=8) == verify_dataset(str(root), workers=0)
    assert asked == [1, 0, 3, 0]


def test_verify_command_line_options(av1, tmp_path):
    root = make_scaled_dataset(av1, tmp_path / "ds", 30, read=range(30))
    ok = CliRunner().invoke(main, ["verify", str(root), "--sample", "0", "--no-progress"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.strip() == f"{root}: ok (the manifest side)"
    (root / shard_path(7)).unlink()
    bad = CliRunner().invoke(main, ["verify", str(root), "--workers", "0", "--no-progress"])
    assert bad.exit_code == 1
    assert f"episode 7 {shard_path(7)}: shard file missing" in bad.output
    refused = CliRunner().invoke(main, ["verify", str(root), "--ray-address", "x"])
    assert refused.exit_code == 2 and "--ray-address needs --executor ray" in refused.output


# ------------------------------------------------------------------ the converter's rows


def reference_table(rows: list[ManifestRow]) -> pa.Table:
    """The manifest of ``rows`` built row by row: the last row of an episode wins."""
    last = {row.episode_index: row for row in rows}
    records = [
        {**vars(row), "members": [vars(m) for m in row.members]}
        for row in sorted(last.values(), key=lambda r: r.episode_index)
    ]
    return pa.Table.from_pylist(records, schema=MANIFEST_SCHEMA)


@settings(max_examples=40)
@given(
    episodes=st.lists(st.integers(0, 2_000_000), min_size=1, max_size=30),
    oddities=st.dictionaries(st.integers(0, 29), ODDITIES, max_size=6),
    chunk=st.sampled_from([2, 7, 8192]),
)
def test_collected_rows_make_the_manifest(episodes, oddities, chunk):
    """Rows in any order, an episode given again (a retried one): the manifest of the last row
    of each episode, sorted, whatever the rows' names, and however they were packed."""
    rows = [plain_row(e, 3 * i) for i, e in enumerate(episodes)]
    for i, oddity in oddities.items():
        if i < len(rows):
            rows[i] = odd(rows[i], oddity)
    columns = ManifestColumns()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(format_module, "MANIFEST_CHUNK", chunk)
        for row in rows:
            columns.add(row)
    assert columns.table().equals(reference_table(rows))
    assert len(columns) == len(rows)


# ------------------------------------------------------------------ the split of an epoch


def reference_split(episodes, lengths, num_parts, seed, epoch, shuffle):
    """``split_parts`` as it was: every piece laid out in the epoch's order, then cut."""
    keep = np.flatnonzero(np.asarray(lengths) > 0)
    keep = keep[np.argsort(np.asarray(episodes)[keep], kind="stable")]
    episodes, lengths = np.asarray(episodes)[keep], np.asarray(lengths)[keep]
    if num_parts == 1:
        return [Pieces(episodes, np.zeros_like(lengths), lengths)]
    if shuffle:
        rng = np.random.default_rng([seed, epoch, 0xFFFF_FFFF, num_parts])
        order = rng.permutation(len(episodes))
        episodes, lengths = episodes[order], lengths[order]
    ends = np.cumsum(lengths)
    begins = ends - lengths
    total = int(ends[-1]) if len(ends) else 0
    bounds = np.concatenate([[0], np.cumsum(samples_per_part(total, num_parts, pad=False))])
    parts = []
    for p in range(num_parts):
        lo, hi = int(bounds[p]), int(bounds[p + 1])
        first = int(np.searchsorted(ends, lo, side="right"))
        last = int(np.searchsorted(begins, hi, side="left"))
        eps = episodes[first:last]
        starts = np.maximum(begins[first:last], lo) - begins[first:last]
        stops = np.minimum(ends[first:last], hi) - begins[first:last]
        sort = np.argsort(eps, kind="stable")
        parts.append(Pieces(eps[sort], starts[sort], stops[sort]))
    return parts


@settings(max_examples=300)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=60),
    num_parts=st.integers(1, 9),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    shuffle=st.booleans(),
    unsorted=st.booleans(),
)
def test_an_epochs_split_is_the_split_it_was(lengths, num_parts, seed, epoch, shuffle, unsorted):
    """The split an epoch starts from, made from the order and the running frame count alone
    (a third of the memory at a million episodes), is the one every earlier epoch had: the same
    parts, pieces and order, so checkpoints resume as before."""
    episodes = np.arange(len(lengths)) * 3 + 1
    if unsorted:
        episodes = episodes[::-1]
    got = split_parts(episodes, lengths, num_parts, seed=seed, epoch=epoch, shuffle=shuffle)
    want = reference_split(episodes, lengths, num_parts, seed, epoch, shuffle)
    assert got == want


@settings(max_examples=300)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    num_parts=st.integers(1, 9),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    shuffle=st.booleans(),
    block=st.sampled_from([1, 4, 65536]),
)
def test_one_part_made_alone_is_that_part_of_the_split(
    lengths, num_parts, seed, epoch, shuffle, block
):
    """What a DataLoader worker streams, made without the other parts (its order summed a
    ``block`` at a time), is its part of the epoch's split."""
    want = reference_split(np.arange(len(lengths)), lengths, num_parts, seed, epoch, shuffle)
    saved, partition_module._ORDER_BLOCK = partition_module._ORDER_BLOCK, block
    try:
        for part in range(num_parts):
            got = split_part(lengths, num_parts, part, seed=seed, epoch=epoch, shuffle=shuffle)
            assert got == want[part], part
    finally:
        partition_module._ORDER_BLOCK = saved


def test_a_million_episodes_split_in_a_fraction_of_their_arrays():
    """At a million episodes the split's peak is under 64 MB: the order, the running frame
    count and the parts themselves, not every piece laid out beside them."""
    lengths = np.full(1_000_000, 150)
    peak = peak_bytes(lambda: split_parts(np.arange(1_000_000), lengths, 2, seed=0, epoch=0))
    assert peak < 64_000_000, peak


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 12),
    liar=st.integers(0, 11),
    member=st.integers(0, 4),
    lie=st.sampled_from(["before", "past the end", "negative size"]),
    irregular=st.booleans(),
    chunk=st.integers(1, 5),
)
def test_a_member_outside_its_span_is_refused_naming_its_episode(
    count, liar, member, lie, irregular, chunk
):
    """Each member lies inside its episode's span, checked row by row in a manifest read in
    several chunks (as many members each, or not): the first row that lies is named."""
    rows = [plain_row(10 + e, 3 * e) for e in range(count)]
    for row in rows:
        row.offset = 4096 * (row.episode_index - 10)  # each span its own
        row.members = [Member(m.name, m.offset + row.offset, m.size) for m in row.members]
    if irregular:
        rows[0] = odd(rows[0], "missing")
    liar %= count
    row = rows[liar]
    member %= len(row.members)
    m = row.members[member]
    changed = {
        "before": Member(m.name, row.offset - 1, m.size),
        "past the end": Member(m.name, m.offset, row.offset + row.size - m.offset + 1),
        "negative size": Member(m.name, m.offset, -1),
    }[lie]
    row.members = [changed if i == member else x for i, x in enumerate(row.members)]
    table = manifest_table(rows)
    pieces = [table.slice(i, chunk) for i in range(0, count, chunk)]
    chunked = pa.Table.from_batches([b for p in pieces for b in p.to_batches()])
    assert chunked.column("members").num_chunks == len(pieces)
    with pytest.raises(FormatError, match=rf"episode {row.episode_index} \(row {liar},"):
        check_manifest(chunked, "manifest")
    rows[liar].members = [m if i == member else x for i, x in enumerate(row.members)]
    check_manifest(manifest_table(rows), "manifest")  # the same rows without the lie pass
