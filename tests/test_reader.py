"""ShardedLeRobotDataset on converted datasets: items, coverage, ranks, workers, errors, resume."""

from __future__ import annotations

import json
import multiprocessing
import re
import shutil
import warnings
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from support.required import import_error
from torch.utils.data import DataLoader

from lerobot_shards import ShardedLeRobotDataset, UncheckedStateWarning
from lerobot_shards.format import (
    MANIFEST_FILE,
    checksum,
    manifest_rows,
    shard_path,
    video_member,
    write_manifest,
)
from lerobot_shards.reader.plan.elastic import consumed_per_worker
from lerobot_shards.source import LeRobotSource
from lerobot_shards.validate import read_manifest

AV1 = "av1_multifile"
FRAMES = 74
EPISODE_LENGTHS = (12, 1, 30, 9, 17, 5)
HAS_TORCHCODEC = import_error("torchcodec") is None


def indices(items) -> list[int]:
    return [int(item["index"]) for item in items]


def flat_indices(batches) -> list[int]:
    """Global indices of a DataLoader's output, in order (batched or not)."""
    out: list[int] = []
    for batch in batches:
        out += torch.atleast_1d(batch["index"]).tolist()
    return out


def assert_same_item(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def position(state: dict) -> dict:
    """The part of a state that says where the stream stands (the rest records the layout)."""
    return {key: state[key] for key in ("epoch", "offset", "batch_size")}


def flip_channels(frames: torch.Tensor) -> torch.Tensor:
    """A deterministic image transform (module level, so DataLoader workers can pickle it)."""
    return frames.flip(-3) * 0.5


# ------------------------------------------------------------------ items


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"delta_timestamps": "golden"},
        {"image_transforms": flip_channels},
        {"return_uint8": True, "delta_timestamps": "golden"},
    ],
    ids=["plain", "delta", "transforms", "uint8-delta"],
)
def test_epoch_is_every_index_once_and_equals_source(
    av1, golden_dir, golden_delta_timestamps, options
):
    if options.get("delta_timestamps") == "golden":
        options = {**options, "delta_timestamps": golden_delta_timestamps}
    ds = ShardedLeRobotDataset(av1, buffer_size=3, **options)
    source = LeRobotSource(str(golden_dir / AV1), **options)
    items = list(ds)
    order = indices(items)
    assert sorted(order) == list(range(FRAMES))
    assert order != sorted(order)  # shuffled
    for item in items:
        assert_same_item(item, source[int(item["index"])])


@pytest.mark.parametrize("delta", [False, True])
def test_decoding_ahead_on_threads_changes_nothing(av1, golden_delta_timestamps, delta):
    """GOPs decoded ahead on a thread pool give the very items, in the very order, of decoding
    each GOP in the iterating thread when its first frame is drawn."""
    options = {"buffer_size": 2, "delta_timestamps": golden_delta_timestamps if delta else None}
    inline = list(ShardedLeRobotDataset(av1, decode_threads=0, **options))
    ahead = ShardedLeRobotDataset(av1, decode_threads=3, **options)
    ahead.decode_ahead = 5
    threaded = list(ahead)
    assert indices(threaded) == indices(inline)
    assert sorted(indices(inline)) == list(range(FRAMES))
    for a, b in zip(threaded, inline, strict=True):
        assert_same_item(a, b)


def test_negative_decode_threads_is_refused(av1):
    with pytest.raises(ValueError, match="decode_threads"):
        ShardedLeRobotDataset(av1, decode_threads=-1)


@pytest.mark.skipif(not HAS_TORCHCODEC, reason="torchcodec does not import here")
def test_torchcodec_items_equal_source(av1, golden_dir):
    ds = ShardedLeRobotDataset(av1, video_backend="torchcodec")
    source = LeRobotSource(str(golden_dir / AV1), video_backend="torchcodec")
    items = list(ds)
    assert sorted(indices(items)) == list(range(FRAMES))
    for item in items:
        assert_same_item(item, source[int(item["index"])])


@pytest.mark.skipif(HAS_TORCHCODEC, reason="torchcodec imports here")
def test_torchcodec_missing_is_a_clear_error(av1):
    with pytest.raises(ImportError, match="torchcodec"):
        ShardedLeRobotDataset(av1, video_backend="torchcodec")


def test_meta(av1, golden_dir):
    ds = ShardedLeRobotDataset(av1)
    info = json.loads((golden_dir / AV1 / "meta" / "info.json").read_text())
    assert ds.meta.fps == 10
    assert ds.meta.features == {  # shapes as tuples, as LeRobot loads them
        key: {**ft, "shape": tuple(ft["shape"])} for key, ft in info["features"].items()
    }
    assert (
        ds.meta.camera_keys
        == ds.meta.video_keys
        == [
            "observation.images.cam_high",
            "observation.images.cam_left_wrist",
        ]
    )
    assert ds.meta.task_names == [
        "stack the blocks",
        "push the T",
        "fold the towel",
        "open the lid",
    ]
    assert ds.meta.total_frames == FRAMES and ds.meta.total_episodes == 6
    stats = json.loads((golden_dir / AV1 / "meta" / "stats.json").read_text())
    assert set(ds.meta.stats) == set(stats)
    for key, values in stats.items():
        assert set(ds.meta.stats[key]) == set(values), key
        for name, value in values.items():
            ours = ds.meta.stats[key][name]
            assert isinstance(ours, np.ndarray) and np.array_equal(ours, value), (key, name)
    assert len(ds) == FRAMES and ds.padding == 0


def test_shuffle_false_is_ascending(av1):
    assert indices(ShardedLeRobotDataset(av1, shuffle=False, buffer_size=2)) == list(range(74))


def test_order_is_a_function_of_seed_and_epoch(av1):
    def order(seed, epoch):
        ds = ShardedLeRobotDataset(av1, seed=seed)
        ds.set_epoch(epoch)
        return indices(ds)

    assert order(0, 0) == order(0, 0)
    assert order(0, 0) != order(0, 1)
    assert order(0, 0) != order(1, 0)
    ds = ShardedLeRobotDataset(av1)
    first, second = indices(ds), indices(ds)  # each iteration is the next epoch
    assert first == order(0, 0) and second == order(0, 1)


# ------------------------------------------------------------------ selection, roots, budget


def test_episodes_restricts_to_their_frames(av1):
    starts = np.cumsum((0, *EPISODE_LENGTHS))
    chosen = [0, 2, 5]
    want = sorted(i for e in chosen for i in range(starts[e], starts[e + 1]))
    ds = ShardedLeRobotDataset(av1, episodes=[5, 0, 2])
    items = list(ds)
    assert sorted(indices(items)) == want
    assert {int(item["episode_index"]) for item in items} == set(chosen)
    assert len(ds) == len(want) and ds.episodes == chosen
    with pytest.raises(ValueError, match=r"episodes \[9\] are not in"):
        ShardedLeRobotDataset(av1, episodes=[0, 9])


def test_memory_root(av1, to_memory):
    root = to_memory(av1)
    assert root.startswith("memory://")
    assert sorted(indices(ShardedLeRobotDataset(root))) == list(range(FRAMES))


# ------------------------------------------------------------------ ranks and workers


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_disjointly_with_equal_lengths(av1, monkeypatch, world_size):
    streams, paddings = [], []
    for rank in range(world_size):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", str(world_size))
        ds = ShardedLeRobotDataset(av1)
        stream = indices(ds)
        assert len(stream) == len(ds) == -(-FRAMES // world_size)
        assert ds.padding == len(stream) - len(set(stream)) < world_size
        streams.append(stream)
        paddings.append(ds.padding)
    owned = [set(s) for s in streams]
    assert set().union(*owned) == set(range(FRAMES))
    assert sum(len(s) for s in owned) == FRAMES  # disjoint
    assert sum(paddings) == world_size * -(-FRAMES // world_size) - FRAMES


def test_no_padding_for_evaluation(av1, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    streams = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        ds = ShardedLeRobotDataset(av1, pad=False, shuffle=False)
        streams.append(indices(ds))
        assert len(ds) == len(streams[-1]) and ds.padding == 0
    # Contiguous ranges of the global order, sizes differing by at most one.
    assert streams[0] + streams[1] + streams[2] == list(range(FRAMES))
    assert [len(s) for s in streams] == [25, 25, 24]


@pytest.mark.parametrize("num_workers", [2, 3])
def test_dataloader_workers_split_disjointly(av1, num_workers):
    ds = ShardedLeRobotDataset(av1)
    ds.num_workers = num_workers
    loader = DataLoader(ds, batch_size=None, num_workers=num_workers)
    stream = flat_indices(loader)
    per_worker = -(-FRAMES // num_workers)
    assert len(stream) == len(ds) == num_workers * per_worker
    assert set(stream) == set(range(FRAMES))
    assert ds.padding == len(stream) - FRAMES < num_workers
    # Round-robin: worker w's samples are every num_workers-th; each part is its own.
    parts = [set(stream[w::num_workers]) for w in range(num_workers)]
    assert sum(len(p) for p in parts) == FRAMES


def test_persistent_workers_reshuffle_each_epoch(av1):
    ds = ShardedLeRobotDataset(av1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    first, second = flat_indices(loader), flat_indices(loader)
    assert sorted(first) == sorted(second) == list(range(FRAMES))
    assert first != second
    ds.set_epoch(1)  # fresh workers told the epoch see the same order
    assert flat_indices(DataLoader(ds, batch_size=None, num_workers=2)) == second


# ------------------------------------------------------------------ corrupt shards


def _corrupt_copy(av1: Path, tmp_path: Path) -> Path:
    root = tmp_path / "corrupt"
    shutil.copytree(av1, root)
    return root


def _assert_workers_stop_after_error(loader: DataLoader, match: str) -> None:
    """Iterate like a training loop: the error must come out, and once the loop's exception is
    dropped (its traceback holds the loader's iterator) every worker must be gone."""
    before = set(multiprocessing.active_children())
    message = None
    try:
        for _ in loader:
            pass
    except Exception as exc:
        message = str(exc)
        exc.__traceback__ = None
    assert message is not None and re.search(match, message), message
    left = [p for p in multiprocessing.active_children() if p not in before]
    assert not left


def test_corrupt_shard_raises_in_the_loop_and_stops_workers(av1, tmp_path):
    root = _corrupt_copy(av1, tmp_path)
    tar = root / "shards" / "000" / "episode-000003.tar"
    data = bytearray(tar.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tar.write_bytes(bytes(data))
    loader = DataLoader(ShardedLeRobotDataset(root), batch_size=4, num_workers=2)
    _assert_workers_stop_after_error(
        loader, r"episode-000003\.tar \(episode 3\): checksum mismatch"
    )


def _rewrite_member(root: Path, episode: int, member: str, payload: bytes) -> None:
    """Replace a member's bytes (same size, padded) and fix the manifest checksum, so only the
    content check can catch it."""
    fs = fsspec.filesystem("file")
    rows = manifest_rows(read_manifest(fs, str(root / MANIFEST_FILE)))
    row = next(r for r in rows if r.episode_index == episode)
    m = next(m for m in row.members if m.name == member)
    tar = root / row.shard
    data = bytearray(tar.read_bytes())
    data[m.offset : m.offset + m.size] = payload[: m.size].ljust(m.size, b"\0")
    tar.write_bytes(bytes(data))
    row.checksum = checksum(bytes(data[row.offset : row.offset + row.size]))
    write_manifest(fs, str(root / MANIFEST_FILE), rows)


def test_content_errors_name_shard_and_episode(av1, tmp_path):
    root = _corrupt_copy(av1, tmp_path)
    _rewrite_member(root, 4, "episode-000004.parquet", b"PAR1 this is not parquet")
    with pytest.raises(Exception, match=r"episode-000004\.tar \(episode 4\).*parquet does not"):
        list(ShardedLeRobotDataset(root, episodes=[4]))
    # Episode 5's first camera replaced by episode 1's one-frame video: 1 frame, not 5.
    one_frame = (av1 / "shards/000/episode-000001.tar").read_bytes()
    rows = manifest_rows(read_manifest(fsspec.filesystem("file"), str(av1 / MANIFEST_FILE)))
    cam = "observation.images.cam_high"
    m = next(m for m in rows[1].members if m.name == video_member(1, cam))
    _rewrite_member(root, 5, video_member(5, cam), one_frame[m.offset : m.offset + m.size])
    loader = DataLoader(ShardedLeRobotDataset(root, episodes=[5]), batch_size=None, num_workers=1)
    _assert_workers_stop_after_error(
        loader, r"episode-000005\.tar \(episode 5\) camera .*holds 1 frames"
    )


# ------------------------------------------------------------------ resume


def test_consumed_per_worker_arithmetic():
    # Two workers of 5 samples, batches of 2: w0 [2,2,1], w1 [2,2,1] in round-major order.
    assert consumed_per_worker(0, [5, 5], 2, False) == ([0, 0], 0)
    assert consumed_per_worker(2, [5, 5], 2, False) == ([2, 0], 1)
    assert consumed_per_worker(8, [5, 5], 2, False) == ([4, 4], 0)
    assert consumed_per_worker(9, [5, 5], 2, False) == ([5, 4], 1)
    assert consumed_per_worker(10, [5, 5], 2, False) == ([5, 5], 0)
    # Uneven (no padding): w1 runs out first and is skipped.
    assert consumed_per_worker(7, [5, 2], 2, False) == ([5, 2], 0)
    assert consumed_per_worker(6, [5, 2], 2, False) == ([4, 2], 0)
    # Endless streams: full batches across the epoch boundary.
    assert consumed_per_worker(14, [5, 5], 2, True) == ([8, 6], 1)


def test_resume_direct(av1):
    full = indices(ShardedLeRobotDataset(av1, buffer_size=4))
    for n in (0, 1, 17, 73, 74):
        ds = ShardedLeRobotDataset(av1, buffer_size=4)
        ds.load_state_dict({"epoch": 0, "offset": n, "batch_size": 1})
        assert indices(ds) == full[n:]
    # The next iteration after a resumed one is the next epoch, whole.
    ds.set_epoch(1)
    assert sorted(indices(ds)) == list(range(FRAMES))


def test_bad_settings_are_refused_at_construction(av1):
    with pytest.raises(ValueError, match="seed must be non-negative, got -1"):
        ShardedLeRobotDataset(av1, seed=-1)
    with pytest.raises(ValueError, match=r"episodes selects no episode of .*av1_multifile"):
        ShardedLeRobotDataset(av1, episodes=[])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_past_the_end_of_its_epoch_is_refused(av1, num_workers):
    ds = ShardedLeRobotDataset(av1, episodes=[0, 2])  # 42 frames: even, no padding
    ds.num_workers = num_workers
    ds.load_state_dict({"epoch": 3, "offset": 42, "batch_size": 1})  # the whole epoch taken
    assert flat_indices(DataLoader(ds, batch_size=None, num_workers=num_workers)) == []
    with pytest.raises(ValueError, match="offset 43 is past the end of epoch 3, which holds 42"):
        ds.load_state_dict({"epoch": 3, "offset": 43, "batch_size": 1})
    # With repeat the stream runs on into the next epochs: the offset may pass the epoch's end.
    endless = ShardedLeRobotDataset(av1, episodes=[0, 2], repeat=True)
    endless.load_state_dict({"epoch": 3, "offset": 43, "batch_size": 1})


def test_state_without_fingerprint_warns(av1):
    ds = ShardedLeRobotDataset(av1)
    with pytest.warns(UncheckedStateWarning, match="no manifest fingerprint"):
        ds.load_state_dict({"epoch": 0, "offset": 10, "batch_size": 1})
    other = ShardedLeRobotDataset(av1, episodes=[0, 1])
    it = iter(other)
    next(it)
    state = other.state_dict()
    with pytest.raises(ValueError, match="taken on another dataset"):
        ds.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a state with its fingerprint loads without a word
        other.load_state_dict(state)


def test_resume_from_state_dict_mid_epoch(av1):
    ds = ShardedLeRobotDataset(av1)
    it = iter(ds)
    head = [int(next(it)["index"]) for _ in range(30)]
    state = ds.state_dict()
    assert position(state) == {"epoch": 0, "offset": 30, "batch_size": 1}
    tail = indices(it)
    resumed = ShardedLeRobotDataset(av1)
    resumed.load_state_dict(state)
    assert indices(resumed) == tail
    assert sorted(head + tail) == list(range(FRAMES))
    assert position(ds.state_dict()) == {"epoch": 1, "offset": 0, "batch_size": 1}


@pytest.mark.parametrize("num_workers", [1, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_resume_dataloader(av1, num_workers, batch_size):
    def run(state=None):
        ds = ShardedLeRobotDataset(av1, buffer_size=3)
        if state is not None:
            ds.load_state_dict(state)
        return flat_indices(DataLoader(ds, batch_size=batch_size, num_workers=num_workers))

    full = run()
    assert sorted(full) == list(range(FRAMES))
    b = batch_size or 1
    for n in (3 * b, 5 * b, len(full)):
        assert run({"epoch": 0, "offset": n, "batch_size": batch_size}) == full[n:]


def test_resume_dataloader_from_state_dict(av1):
    ds = ShardedLeRobotDataset(av1)
    ds.num_workers = 2  # what a state taken from a DataLoader of one's own needs
    ds.set_epoch(2)
    taken = []
    for batch in DataLoader(ds, batch_size=4, num_workers=2):
        taken += batch["index"].tolist()
        if len(taken) == 28:
            break
    state = ds.state_dict(num_samples=len(taken), batch_size=4)
    assert position(state) == {"epoch": 2, "offset": 28, "batch_size": 4}
    ds.set_epoch(2)
    full = flat_indices(DataLoader(ds, batch_size=4, num_workers=2))
    resumed = ShardedLeRobotDataset(av1)
    resumed.num_workers = 2
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # a loop that calls set_epoch every epoch keeps the loaded offset
    assert taken == full[:28]
    assert flat_indices(DataLoader(resumed, batch_size=4, num_workers=2)) == full[28:]


def test_resume_past_epoch_boundary_with_repeat(av1):
    def stream(ds, count):
        it = iter(ds)
        return [int(next(it)["index"]) for _ in range(count)]

    endless = stream(ShardedLeRobotDataset(av1, repeat=True), 2 * FRAMES + 10)
    assert sorted(endless[:FRAMES]) == sorted(endless[FRAMES : 2 * FRAMES]) == list(range(74))
    assert endless[:FRAMES] != endless[FRAMES : 2 * FRAMES]
    ds = ShardedLeRobotDataset(av1, repeat=True)
    ds.load_state_dict({"epoch": 0, "offset": FRAMES + 20, "batch_size": 1})
    assert stream(ds, FRAMES - 10) == endless[FRAMES + 20 :]
    state = ds.state_dict()
    assert position(state) == {"epoch": 2, "offset": 10, "batch_size": 1}

    # Through a DataLoader with two workers and batches of 4.
    def loader_stream(state, batches):
        ds = ShardedLeRobotDataset(av1, repeat=True)
        if state:
            ds.load_state_dict(state)
        out = []
        for batch in DataLoader(ds, batch_size=4, num_workers=2):
            out += batch["index"].tolist()
            if len(out) == 4 * batches:
                return out
        raise AssertionError("an endless stream ended")

    endless = loader_stream(None, 45)
    # Worker w's samples are its batches (every other one) joined; 37 per epoch each.
    batches = [endless[i : i + 4] for i in range(0, len(endless), 4)]
    workers = [[i for batch in batches[w::2] for i in batch] for w in range(2)]
    for epoch in range(2):
        span = slice(37 * epoch, 37 * (epoch + 1))
        assert sorted(workers[0][span] + workers[1][span]) == list(range(FRAMES))
    assert loader_stream({"epoch": 0, "offset": 84, "batch_size": 4}, 24) == endless[84:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_stateful_dataloader(av1, num_workers):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader():
        ds = ShardedLeRobotDataset(av1, buffer_size=3)
        return StatefulDataLoader(ds, batch_size=4, num_workers=num_workers)

    full = flat_indices(loader())
    first = loader()
    taken = []
    for batch in first:
        taken += batch["index"].tolist()
        if len(taken) == 24:
            state = first.state_dict()
            break
    assert taken == full[:24]
    second = loader()
    second.load_state_dict(state)
    assert flat_indices(second) == full[24:]


# ------------------------------------------------------------------ training


def test_one_optimizer_step(av1):
    torch.manual_seed(0)
    cam = "observation.images.cam_high"
    batch = next(iter(DataLoader(ShardedLeRobotDataset(av1), batch_size=8, num_workers=2)))
    assert batch[cam].shape == (8, 3, 40, 56) and batch[cam].dtype == torch.float32
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 40 * 56 + 4, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.cat([batch[cam].flatten(1), batch["observation.state"]], dim=1)
    before = [p.detach().clone() for p in model.parameters()]
    loss = torch.nn.functional.mse_loss(model(inputs), batch["action"])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


# ------------------------------------------------------------------ object store


@pytest.fixture
def s3_av1(s3_bucket, av1) -> str:
    """The converted golden dataset uploaded to a fresh bucket; returns its URL."""
    fs = s3_bucket.server.direct_filesystem
    for path in sorted(av1.rglob("*")):
        if path.is_file() and ".convert" not in path.parts:
            fs.pipe_file(
                f"{s3_bucket.name}/av1/{path.relative_to(av1).as_posix()}", path.read_bytes()
            )
    s3_bucket.proxy.clear()
    return s3_bucket.url("av1")


def test_s3_with_dataloader_workers(s3_av1, s3_bucket, av1):
    """DataLoader workers (started from the forkserver, the dataset pickled to them) of a
    dataset opened on s3 in the test process make their own client and stream alike."""

    def run(root, **kw):
        ds = ShardedLeRobotDataset(root, buffer_size=3, **kw)
        return flat_indices(DataLoader(ds, batch_size=4, num_workers=2))

    assert run(s3_av1, storage_options=s3_bucket.storage_options) == run(av1)


def test_resume_fetches_nothing_skipped(s3_av1, s3_bucket):
    def dataset():
        return ShardedLeRobotDataset(  # uncached: the store's reads are what is counted
            s3_av1, buffer_size=2, storage_options=s3_bucket.storage_options, cache=False
        )

    full = list(dataset())
    ds = dataset()
    ds.load_state_dict({"epoch": 0, "offset": 40, "batch_size": 1})
    s3_bucket.proxy.clear()
    rest = list(ds)
    assert indices(rest) == indices(full)[40:]
    fetched = [r.path for r in s3_bucket.proxy.requests("GET", path_contains="/shards/")]
    wanted = {int(item["episode_index"]) for item in rest}
    assert sorted(fetched) == sorted(f"/{s3_bucket.name}/av1/{shard_path(e)}" for e in wanted)
