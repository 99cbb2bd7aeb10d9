"""The test-dataset factory writes LeRobot 0.6.1's layout and exactly the content it promises."""

from __future__ import annotations

import io
import json
from pathlib import Path

import av
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from lerobot_shards.testing import (
    DEFAULT_CAMERAS,
    action_value,
    default_tasks,
    frame_content,
    make_dataset,
    state_value,
)

GOLDEN = Path(__file__).parent / "data" / "lerobot-0.6.1"
LENGTHS = [12, 1, 30, 9, 17, 5]
CAMERAS = list(DEFAULT_CAMERAS)
TASKS = ["stack the blocks", "push the T", "fold the towel", "open the lid"]


@pytest.fixture(scope="module")
def v30(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("v30") / "ds")


@pytest.fixture(scope="module")
def v21(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("v21") / "ds", version="v2.1")


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("img") / "ds", video=False)


def _info(root: Path) -> dict:
    return json.loads((root / "meta/info.json").read_text())


def _episodes(root: Path) -> list[dict]:
    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def _hf_info(schema) -> dict:
    return json.loads(schema.metadata[b"huggingface"])["info"]


def _decode(path: Path) -> list[tuple[int, np.ndarray]]:
    with av.open(str(path)) as container:
        return [(f.pts, f.to_ndarray(format="rgb24")) for f in container.decode(video=0)]


def _packets(path: Path) -> list[tuple[int, bytes]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [(p.pts, bytes(p)) for p in container.demux(stream) if p.size]


@pytest.mark.parametrize(("name", "golden"), [("v30", "av1_multifile"), ("image", "image")])
def test_layout_matches_golden(name, golden, request):
    root, gold = request.getfixturevalue(name), GOLDEN / golden
    info, gold_info = _info(root), _info(gold)
    assert list(info) == list(gold_info)
    assert info["features"] == gold_info["features"]
    for key in ("data_path", "video_path", "chunks_size", "fps", "splits", "total_episodes"):
        assert info[key] == gold_info[key], key
    assert (info["total_frames"], info["total_tasks"]) == (74, 4)

    data = pq.read_schema(root / "data/chunk-000/file-000.parquet")
    gold_data = pq.read_schema(gold / "data/chunk-000/file-000.parquet")
    assert data.remove_metadata() == gold_data.remove_metadata()
    assert _hf_info(data) == _hf_info(gold_data)

    episodes = pq.read_schema(root / "meta/episodes/chunk-000/file-000.parquet")
    gold_episodes = pq.read_schema(gold / "meta/episodes/chunk-000/file-000.parquet")
    assert episodes.names == gold_episodes.names
    assert episodes == gold_episodes

    tasks = pq.read_schema(root / "meta/tasks.parquet")
    assert tasks == pq.read_schema(gold / "meta/tasks.parquet")
    stats = json.loads((root / "meta/stats.json").read_text())
    gold_stats = json.loads((gold / "meta/stats.json").read_text())
    assert {k: list(v) for k, v in stats.items()} == {k: list(v) for k, v in gold_stats.items()}
    assert all(v["count"] == [74] for v in stats.values())


def test_image_rows_equal_golden_recording(tmp_path):
    """With one data file, the image dataset's rows (PNG bytes included) are LeRobot's own."""
    root = make_dataset(tmp_path / "ds", video=False, data_files_size_in_mb=100)
    ours = pq.read_table(root / "data/chunk-000/file-000.parquet")
    gold = pq.read_table(GOLDEN / "image/data/chunk-000/file-000.parquet")
    assert ours.equals(gold)
    assert pq.ParquetFile(root / "data/chunk-000/file-000.parquet").metadata.num_row_groups == 6
    for row in ours.slice(0, 13).to_pylist():
        for key, (h, w) in DEFAULT_CAMERAS.items():
            decoded = np.asarray(Image.open(io.BytesIO(row[key]["bytes"])))
            expected = frame_content(row["episode_index"], row["frame_index"], h, w)
            assert np.array_equal(decoded, expected), (key, row["index"])


def test_rows_are_what_was_promised_one_row_group_per_episode(v30, image):
    for root in (v30, image):
        episodes = _episodes(root)
        by_file: dict[str, list[dict]] = {}
        for ep in episodes:
            path = (
                f"data/chunk-{ep['data/chunk_index']:03d}/file-{ep['data/file_index']:03d}.parquet"
            )
            by_file.setdefault(path, []).append(ep)
        assert len(by_file) > 1
        index = 0
        for path, eps in sorted(by_file.items()):
            meta = pq.ParquetFile(root / path).metadata
            groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            assert groups == [ep["length"] for ep in eps], path
            for row in pq.read_table(root / path).to_pylist():
                ep, frame = row["episode_index"], row["frame_index"]
                assert row["index"] == index
                assert np.array_equal(np.float32(row["observation.state"]), state_value(ep, frame))
                assert np.array_equal(np.float32(row["action"]), action_value(ep, frame))
                assert np.float32(row["timestamp"]) == np.float32(frame / 10)
                assert row["task_index"] == TASKS.index(default_tasks(6)[ep])
                index += 1
        assert index == 74
        assert [ep["length"] for ep in episodes] == LENGTHS
        assert [ep["tasks"] for ep in episodes] == [[t] for t in default_tasks(6)]


def test_tasks_parquet_reads_with_pandas_index(v30):
    tasks = pd.read_parquet(v30 / "meta/tasks.parquet")
    assert tasks.index.name == "task"
    assert list(tasks.index) == TASKS
    assert tasks["task_index"].tolist() == [0, 1, 2, 3]


def test_files_roll_over_at_different_episodes(v30):
    episodes = _episodes(v30)

    def starts(column: str) -> list[int]:
        return [
            e["episode_index"]
            for i, e in enumerate(episodes)
            if i and e[column] != episodes[i - 1][column]
        ]

    data = starts("data/file_index")
    cams = [starts(f"videos/{key}/file_index") for key in CAMERAS]
    assert data and all(cams)
    assert all(set(c) != set(data) for c in cams)
    shared = [e for e in episodes if e[f"videos/{CAMERAS[0]}/from_timestamp"] > 0]
    assert shared, "some episode must start inside a video file"


def test_chunk_folders_after_chunks_size_files(tmp_path):
    root = make_dataset(
        tmp_path / "ds",
        episode_lengths=(3, 4, 2, 3, 2),
        chunks_size=2,
        cameras={"observation.images.cam": (32, 32)},
        data_files_size_in_mb=1e-6,
        video_files_size_in_mb=1e-6,
    )
    episodes = _episodes(root)
    assert [(e["data/chunk_index"], e["data/file_index"]) for e in episodes] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
    ]
    cam = "observation.images.cam"
    assert [(e[f"videos/{cam}/chunk_index"], e[f"videos/{cam}/file_index"]) for e in episodes] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (2, 0),
    ]
    assert (root / f"videos/{cam}/chunk-002/file-000.mp4").is_file()
    assert (root / "data/chunk-002/file-000.parquet").is_file()


def test_videos_decode_to_the_written_frames(v30):
    episodes = _episodes(v30)
    for key, (h, w) in DEFAULT_CAMERAS.items():
        files: dict[int, list[dict]] = {}
        for ep in episodes:
            files.setdefault(ep[f"videos/{key}/file_index"], []).append(ep)
        for file_index, eps in files.items():
            path = v30 / f"videos/{key}/chunk-000/file-{file_index:03d}.mp4"
            decoded, packets = _decode(path), _packets(path)
            written = [(e["episode_index"], f) for e in eps for f in range(e["length"])]
            assert len(decoded) == len(written) == len(packets), path
            candidates = np.stack([frame_content(e, f, h, w) for e, f in written]).astype(np.int16)
            for position, (_, pixels) in enumerate(decoded):
                errors = np.abs(candidates - pixels.astype(np.int16)).mean(axis=(1, 2, 3))
                assert int(np.argmin(errors)) == position, (path, written[position])
            with av.open(str(path)) as container:
                time_base = container.streams.video[0].time_base
            first = 0
            for e in eps:
                pts_s = float(packets[first][0] * time_base)
                assert abs(e[f"videos/{key}/from_timestamp"] - pts_s) < 1e-4, (
                    path,
                    e["episode_index"],
                )
                first += e["length"]


def test_v21_layout_and_content_match_v30(v21, v30):
    info = _info(v21)
    assert info["codebase_version"] == "v2.1"
    assert info["data_path"] == "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    assert info["video_path"] == (
        "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
    )
    assert (info["total_episodes"], info["total_frames"], info["total_videos"]) == (6, 74, 12)
    assert not (v21 / "meta/stats.json").exists()
    lines = lambda name: [json.loads(x) for x in (v21 / "meta" / name).read_text().splitlines()]  # noqa: E731
    assert lines("tasks.jsonl") == [{"task_index": i, "task": t} for i, t in enumerate(TASKS)]
    assert lines("episodes.jsonl") == [
        {"episode_index": i, "tasks": [t], "length": n}
        for i, (t, n) in enumerate(zip(default_tasks(6), LENGTHS, strict=True))
    ]
    stats = lines("episodes_stats.jsonl")
    assert [s["episode_index"] for s in stats] == list(range(6))
    assert all(list(s["stats"]) == list(info["features"]) for s in stats)
    assert all(
        list(f) == ["min", "max", "mean", "std", "count"]
        for s in stats
        for f in s["stats"].values()
    )

    episodes = _episodes(v30)
    for ep in episodes:
        i = ep["episode_index"]
        own_path = v21 / f"data/chunk-000/episode_{i:06d}.parquet"
        assert pq.ParquetFile(own_path).metadata.num_row_groups == 1
        rows = pq.read_table(own_path)
        assert _hf_info(rows.schema)["features"]["action"]["_type"] == "Sequence"
        data = pq.read_table(v30 / f"data/chunk-000/file-{ep['data/file_index']:03d}.parquet")
        start = ep["dataset_from_index"] - data.column("index")[0].as_py()
        shared = data.slice(start, ep["length"]).replace_schema_metadata(None)
        assert rows.replace_schema_metadata(None).equals(shared)
        for key in CAMERAS:
            file_index = ep[f"videos/{key}/file_index"]
            concatenated = _packets(v30 / f"videos/{key}/chunk-000/file-{file_index:03d}.mp4")
            before = sum(
                e["length"] for e in episodes[:i] if e[f"videos/{key}/file_index"] == file_index
            )
            own = _packets(v21 / f"videos/chunk-000/{key}/episode_{i:06d}.mp4")
            stream_copied = concatenated[before : before + ep["length"]]
            assert [data for _, data in own] == [data for _, data in stream_copied], (key, i)


def test_v21_image_rows_equal_golden_recording(tmp_path):
    root = make_dataset(tmp_path / "ds", version="v2.1", video=False)
    info = _info(root)
    assert (info["video_path"], info["total_videos"]) == (None, 0)
    assert [info["features"][key]["dtype"] for key in CAMERAS] == ["image", "image"]
    assert not (root / "videos").exists()
    rows = pa.concat_tables(
        pq.read_table(root / f"data/chunk-000/episode_{i:06d}.parquet").replace_schema_metadata(
            None
        )
        for i in range(6)
    )
    gold = pq.read_table(GOLDEN / "image/data/chunk-000/file-000.parquet")
    assert rows.equals(gold.replace_schema_metadata(None))


def test_realistic_content_is_smooth_moving_and_decodable(tmp_path):
    a, b = frame_content(0, 0, 48, 64, "realistic"), frame_content(0, 1, 48, 64, "realistic")
    assert a.shape == (48, 64, 3) and a.dtype == np.uint8
    assert np.array_equal(a, frame_content(0, 0, 48, 64, "realistic"))
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, frame_content(0, 0, 48, 64, "realistic", seed=1))
    root = make_dataset(
        tmp_path / "ds",
        episode_lengths=(4, 3),
        cameras={"observation.images.top": (48, 64)},
        content="realistic",
        data_files_size_in_mb=100,
        video_files_size_in_mb=200,
    )
    decoded = _decode(root / "videos/observation.images.top/chunk-000/file-000.mp4")
    written = [(e, f) for e, n in enumerate((4, 3)) for f in range(n)]
    candidates = np.stack([frame_content(e, f, 48, 64, "realistic") for e, f in written]).astype(
        np.int16
    )
    assert len(decoded) == len(written)
    for position, (_, pixels) in enumerate(decoded):
        errors = np.abs(candidates - pixels.astype(np.int16)).mean(axis=(1, 2, 3))
        assert int(np.argmin(errors)) == position


def test_bad_arguments_are_refused(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(FileExistsError, match="full"):
        make_dataset(tmp_path / "full")
    with pytest.raises(ValueError, match="version"):
        make_dataset(tmp_path / "a", version="v2.0")
    with pytest.raises(ValueError, match="2 tasks given for 6 episodes"):
        make_dataset(tmp_path / "b", tasks=["a", "b"])
    with pytest.raises(ValueError, match="even sizes"):
        make_dataset(tmp_path / "c", cameras={"observation.images.x": (15, 16)})
    with pytest.raises(ValueError, match="unknown frame content"):
        frame_content(0, 0, 8, 8, "noise")
    for bad in ({"version": "v2.1"}, {"video": False}, {"video_variants": 2}):
        with pytest.raises(ValueError, match="continuous_video"):
            make_dataset(tmp_path / "d", continuous_video=True, **bad)


def test_video_variants_share_encodings_between_equal_length_episodes(tmp_path):
    from lerobot_shards.source import LeRobotSource

    key = "observation.images.a"
    root = make_dataset(
        tmp_path / "v",
        episode_lengths=[6, 6, 6, 8, 6],
        cameras={key: (32, 48)},
        content="realistic",
        video_variants=2,
    )
    source = LeRobotSource(str(root), return_uint8=True)
    starts = [0, 6, 12, 18, 26]

    def frames(episode: int) -> np.ndarray:
        return np.stack([source[starts[episode] + f][key].numpy() for f in range(6)])

    # Episodes 0, 2 and 4 are variant 0 of length 6: one encoding, episode 0's frames.
    assert np.array_equal(frames(2), frames(0)) and np.array_equal(frames(4), frames(0))
    assert not np.array_equal(frames(1), frames(0))  # variant 1: its own
    # Episode 3 is variant 1 but 8 frames long: its own encoding, all 8 frames there.
    assert source[starts[3] + 7][key].shape == (3, 32, 48)
    assert int(source[starts[2] + 1]["frame_index"]) == 1  # rows still the episode's own
    stats = [{k: v for k, v in e.items() if k.startswith(f"stats/{key}/")} for e in _episodes(root)]
    assert stats[2] == stats[0] and stats[1] != stats[0]  # statistics of the frames shown
    with pytest.raises(ValueError, match="video_variants"):
        make_dataset(tmp_path / "w", version="v2.1", video_variants=2)


def test_an_av1_encoder_leaves_the_test_process_scheduling_alone(tmp_path):
    """SVT-AV1 makes the thread that opens an encoder real-time (SCHED_FIFO 99) where it may, as
    root, and every process the test starts after would inherit it: the session takes that
    capability away (conftest). The encoder is PyAV's own, as a LeRobot recorder opens it."""
    import os

    import av

    before = os.sched_getscheduler(0), os.sched_getparam(0)
    with av.open(str(tmp_path / "episode.mp4"), "w") as out:
        stream = out.add_stream("libsvtav1", rate=10, options={"preset": "12"})
        stream.width = stream.height = 64
        stream.pix_fmt = "yuv420p"
        for i in range(4):
            frame = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 16 * i, np.uint8), "rgb24")
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    assert (tmp_path / "episode.mp4").stat().st_size > 0


def test_scheduling_kept_puts_the_threads_policy_back():
    """What the factory's recorder does for a process that keeps the capability (a script run
    as root): whatever the block sets, the thread's policy is as before after it."""
    import os

    from lerobot_shards.testing.video import scheduling_kept

    before = os.sched_getscheduler(0), os.sched_getparam(0)
    with scheduling_kept():
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        assert os.sched_getscheduler(0) == os.SCHED_BATCH
    assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
