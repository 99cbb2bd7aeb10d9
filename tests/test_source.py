"""open_source and LeRobotSource: layout, fsspec URLs, item options and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from lerobot_shards.source import (
    FrameNotFoundError,
    LeRobotSource,
    SourceError,
    VideoSpan,
    open_source,
)
from lerobot_shards.source.video import PyAVDecoder
from lerobot_shards.testing.content import action_value, frame_content, state_value
from lerobot_shards.testing.factory import make_dataset

CAM_HIGH = "observation.images.cam_high"
CAM_WRIST = "observation.images.cam_left_wrist"
LENGTHS = [12, 1, 30, 9, 17, 5]
TASKS = ["stack the blocks", "push the T", "fold the towel", "open the lid"]


def assert_items_equal(a: dict, b: dict, where: str) -> None:
    assert list(a) == list(b), where
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype, f"{where}: {key}"
            assert torch.equal(a[key], b[key]), f"{where}: {key}"
        else:
            assert a[key] == b[key], f"{where}: {key}"


# ------------------------------------------------------------------------------- layout


def test_open_source_reads_v30_metadata_and_episode_table(golden_dir):
    source = open_source(str(golden_dir / "av1_multifile"))
    assert source.codebase_version == "v3.0"
    assert source.fps == 10
    assert source.video_keys == [CAM_HIGH, CAM_WRIST]
    assert source.image_keys == []
    assert source.camera_keys == [CAM_HIGH, CAM_WRIST]
    assert source.tasks == TASKS
    assert source.stats is not None and set(source.stats["action"]) >= {"min", "max", "mean"}
    assert source.total_frames == 74
    assert [ep.episode_index for ep in source.episodes] == list(range(6))
    assert [ep.length for ep in source.episodes] == LENGTHS
    starts = np.cumsum([0, *LENGTHS])
    assert [ep.dataset_from_index for ep in source.episodes] == starts[:-1].tolist()
    assert [ep.dataset_to_index for ep in source.episodes] == starts[1:].tolist()
    assert [ep.tasks for ep in source.episodes] == [[TASKS[t]] for t in (0, 1, 0, 2, 1, 3)]
    assert [ep.data_path[-16:] for ep in source.episodes] == ["file-000.parquet"] * 2 + [
        "file-001.parquet"
    ] * 4
    assert source.episode(5).videos[CAM_WRIST] == VideoSpan(
        f"videos/{CAM_WRIST}/chunk-000/file-002.mp4", 2.6, 3.1
    )
    assert source.episode(1).videos[CAM_HIGH] == VideoSpan(
        f"videos/{CAM_HIGH}/chunk-000/file-000.mp4", 1.2, 1.3
    )
    with pytest.raises(SourceError, match="no episode 6"):
        source.episode(6)


@pytest.mark.parametrize("name", ["av1_multifile", "image"])
def test_read_rows_keeps_the_exact_schema_and_only_the_episode(golden_dir, name):
    source = open_source(str(golden_dir / name))
    for ep in source.episodes:
        table = source.read_rows(ep.episode_index)
        whole = pq.read_table(golden_dir / name / ep.data_path)
        assert table.schema.equals(whole.schema, check_metadata=True)
        expected = whole.filter(pc.equal(whole.column("episode_index"), ep.episode_index))
        assert table.equals(expected)
        assert table.column("index").to_pylist() == list(
            range(ep.dataset_from_index, ep.dataset_to_index)
        )


def test_memory_url_gives_the_same_source(golden_dir, to_memory):
    local = open_source(str(golden_dir / "av1_multifile"))
    remote = open_source(to_memory(golden_dir / "av1_multifile"))
    assert remote.episodes == local.episodes
    assert remote.tasks == local.tasks and remote.stats == local.stats
    assert remote.local_path("meta/info.json") is None
    for ep in local.episodes:
        assert remote.read_rows(ep.episode_index).equals(local.read_rows(ep.episode_index))


# ------------------------------------------------------------------------------- items


@pytest.mark.parametrize("name", ["av1_multifile", "image"])
def test_memory_url_gives_the_same_items(golden_dir, golden_delta_timestamps, to_memory, name):
    local = LeRobotSource(str(golden_dir / name), delta_timestamps=golden_delta_timestamps)
    remote = LeRobotSource(to_memory(golden_dir / name), delta_timestamps=golden_delta_timestamps)
    assert len(remote) == len(local)
    for index in range(len(local)):
        assert_items_equal(remote[index], local[index], f"index {index}")


@pytest.mark.parametrize("name", ["av1_multifile", "image"])
def test_return_uint8(golden_dir, golden_delta_timestamps, name):
    as_float = LeRobotSource(str(golden_dir / name), delta_timestamps=golden_delta_timestamps)
    as_uint8 = LeRobotSource(
        str(golden_dir / name), delta_timestamps=golden_delta_timestamps, return_uint8=True
    )
    for index in range(len(as_float)):
        f, u = as_float[index], as_uint8[index]
        assert list(u) == list(f)
        for key in f:
            if key in as_float.video_keys:
                assert u[key].dtype == torch.uint8
                assert torch.equal(u[key], (f[key] * 255).round().to(torch.uint8)), (index, key)
            elif key != "task":  # image features stay float32 as in LeRobot, like other columns
                assert u[key].dtype == f[key].dtype and torch.equal(u[key], f[key]), (index, key)


@pytest.mark.parametrize("name", ["av1_multifile", "image"])
def test_image_transforms_apply_to_every_camera_key(golden_dir, golden_delta_timestamps, name):
    calls: list[tuple[int, ...]] = []

    def transform(image: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(image.shape))
        return 1.0 - image.flip(-1)

    plain = LeRobotSource(str(golden_dir / name), delta_timestamps=golden_delta_timestamps)
    transformed = LeRobotSource(
        str(golden_dir / name),
        delta_timestamps=golden_delta_timestamps,
        image_transforms=transform,
    )
    for index in (0, 13, 73):
        calls.clear()
        p, t = plain[index], transformed[index]
        assert calls == [tuple(p[CAM_HIGH].shape), tuple(p[CAM_WRIST].shape)]
        for key in p:
            expected = 1.0 - p[key].flip(-1) if key in plain.camera_keys else p[key]
            if key == "task":
                assert t[key] == expected
            else:
                assert torch.equal(t[key], expected), (index, key)


def test_delta_timestamps_stack_clamped_neighbours_with_pad_masks(
    golden_dir, golden_delta_timestamps
):
    """Every index: each delta key stacks the plain items at the clamped neighbour indices."""
    root = str(golden_dir / "av1_multifile")
    plain = LeRobotSource(root)
    delta = LeRobotSource(root, delta_timestamps=golden_delta_timestamps)
    plain_items = [plain[i] for i in range(len(plain))]
    for index in range(len(delta)):
        ep, _ = delta.locate(index)
        item = delta[index]
        for key, seconds in golden_delta_timestamps.items():
            raw = [index + round(s * delta.fps) for s in seconds]
            clamped = [min(max(i, ep.dataset_from_index), ep.dataset_to_index - 1) for i in raw]
            expected = torch.stack([plain_items[i][key] for i in clamped])
            assert torch.equal(item[key], expected), (index, key)
            pad = [not ep.dataset_from_index <= i < ep.dataset_to_index for i in raw]
            assert item[f"{key}_is_pad"].tolist() == pad, (index, key)


def test_delta_padding_at_both_episode_edges(golden_dir, golden_delta_timestamps):
    source = LeRobotSource(
        str(golden_dir / "av1_multifile"), delta_timestamps=golden_delta_timestamps
    )
    first, last = source[13], source[42]  # episode 2: indices 13..42
    assert first["observation.state_is_pad"].tolist() == [True, False]
    assert first[f"{CAM_HIGH}_is_pad"].tolist() == [True, True, False]
    assert first["action_is_pad"].tolist() == [False] * 4
    assert torch.equal(first["observation.state"][0], first["observation.state"][1])
    assert torch.equal(first[CAM_HIGH][0], first[CAM_HIGH][2])
    assert last["observation.state_is_pad"].tolist() == [False, False]
    assert last["action_is_pad"].tolist() == [False, True, True, True]
    assert all(torch.equal(last["action"][0], a) for a in last["action"])
    assert last["action"][0].tolist() == [228.75, 229.0, 229.25, 229.5]  # frame 29: state - 0.25
    one = source[12]  # episode 1 has a single frame: every neighbour is padding
    assert one["action_is_pad"].tolist() == [False, True, True, True]
    assert one["observation.state_is_pad"].tolist() == [True, False]
    assert one[f"{CAM_HIGH}_is_pad"].tolist() == [True, True, False]


def test_metadata_like_lerobot_meta(golden_dir):
    source = LeRobotSource(str(golden_dir / "image"))
    assert source.meta.fps == 10 and source.total_episodes == 6 and source.total_frames == 74
    assert source.camera_keys == [CAM_HIGH, CAM_WRIST] and source.video_keys == []
    assert source.tasks == TASKS and source.stats is not None
    assert len(source.episodes) == 6 and len(source) == 74
    assert source[-1]["index"].item() == 73
    with pytest.raises(IndexError):
        source[74]


def test_drift_of_from_timestamp_within_tolerance_is_tolerated(golden_copy, golden_dir):
    """v3.0's from_timestamp is a float sum that may drift: frames are found by true pts."""
    root = golden_copy("av1_multifile")
    shift_from_timestamp(root, episode=1, camera=CAM_HIGH, by=4e-5)
    drifted, golden = LeRobotSource(str(root)), LeRobotSource(str(golden_dir / "av1_multifile"))
    assert_items_equal(drifted[12], golden[12], "episode 1")
    shift_from_timestamp(root, episode=1, camera=CAM_HIGH, by=0.02)
    with pytest.raises(FrameNotFoundError, match=r"episode 1, camera observation\.images\.cam_h"):
        LeRobotSource(str(root))[12]


def test_decoder_reads_forward_and_seeks_only_when_needed(golden_dir):
    path = str(golden_dir / f"av1_multifile/videos/{CAM_WRIST}/chunk-000/file-002.mp4")
    forward = PyAVDecoder(path, path)  # episodes 3, 4 and 5: 31 frames at 10 fps
    frames = [forward.frames_at([f / 10], 1e-4, "test") for f in range(31)]
    assert forward.frames_decoded == 31  # sequential items decode each frame once
    far = PyAVDecoder(path, path, max_forward_s=0.5)
    assert torch.equal(far.frames_at([2.6], 1e-4, "test"), frames[26])
    assert far.frames_decoded <= 3  # sought the keyframe before 2.6 s (GOP 2) instead
    back = far.frames_at([0.5, 0.3, 0.5], 1e-4, "test")
    assert torch.equal(back, torch.cat([frames[5], frames[3], frames[5]]))
    assert torch.equal(far.frames_at([3.0], 1e-4, "test"), frames[30])
    with pytest.raises(FrameNotFoundError, match=r"\[3\.1\]"):
        far.frames_at([3.1], 1e-4, "test")
    forward.close()
    far.close()


# ------------------------------------------------------------------------------- factory data


@pytest.fixture(scope="module")
def factory_datasets(tmp_path_factory) -> dict[tuple[str, bool], Path]:
    """The factory's default content as v3.0 and v2.1, with videos and as PNG images."""
    base = tmp_path_factory.mktemp("factory")
    return {
        (version, video): make_dataset(
            base / f"{version}-{'video' if video else 'image'}", version=version, video=video
        )
        for version in ("v3.0", "v2.1")
        for video in (True, False)
    }


@pytest.mark.parametrize("video", [True, False], ids=["video", "image"])
def test_v30_and_v21_give_identical_items(factory_datasets, golden_delta_timestamps, video):
    v30 = LeRobotSource(
        str(factory_datasets["v3.0", video]), delta_timestamps=golden_delta_timestamps
    )
    v21 = LeRobotSource(
        str(factory_datasets["v2.1", video]), delta_timestamps=golden_delta_timestamps
    )
    assert v21.source.codebase_version == "v2.1" and v30.source.codebase_version == "v3.0"
    assert len(v21) == len(v30) == 74
    assert [(e.length, e.tasks) for e in v21.episodes] == [
        (e.length, e.tasks) for e in v30.episodes
    ]
    for index in range(len(v30)):
        assert_items_equal(v21[index], v30[index], f"index {index}")


@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_tabular_values_are_what_was_written(factory_datasets, version):
    source = LeRobotSource(str(factory_datasets[version, True]))
    index = 0
    for ep in source.episodes:
        for frame in range(ep.length):
            item = source[index]
            i = ep.episode_index
            assert torch.equal(item["observation.state"], torch.from_numpy(state_value(i, frame)))
            assert torch.equal(item["action"], torch.from_numpy(action_value(i, frame)))
            assert item["timestamp"].dtype == torch.float32
            assert item["timestamp"].item() == np.float32(frame / source.fps)
            assert item["frame_index"].item() == frame and item["episode_index"].item() == i
            assert item["index"].item() == index
            assert item["task"] == ep.tasks[0] == source.tasks[item["task_index"].item()]
            index += 1
    assert index == len(source)


@pytest.mark.parametrize("video", [True, False], ids=["video", "image"])
@pytest.mark.parametrize("version", ["v3.0", "v2.1"])
def test_each_decoded_frame_is_the_frame_written(factory_datasets, version, video):
    """Nearest by content among every frame of the dataset: an off-by-one cannot pass."""
    source = LeRobotSource(str(factory_datasets[version, video]), return_uint8=True)
    for key in source.camera_keys:
        height, width = source.features[key]["shape"][:2]
        written = [(ep.episode_index, f) for ep in source.episodes for f in range(ep.length)]
        truth = (
            torch.stack([torch.from_numpy(frame_content(e, f, height, width)) for e, f in written])
            .permute(0, 3, 1, 2)
            .to(torch.float32)
        )
        for index, expected in enumerate(written):
            frame = source[index][key]  # uint8 video; image features are float32 in [0, 1]
            frame = frame.to(torch.float32) if video else (frame * 255).round()
            error = (truth - frame).abs().mean(dim=(1, 2, 3))
            assert written[int(error.argmin())] == expected, (key, index)
            if video:
                assert error.min() < 8, (key, index, float(error.min()))  # lossy AV1
            else:
                assert error.min() == 0, (key, index)  # PNG is lossless


def test_v21_stats_aggregate_the_episode_stats(factory_datasets):
    """v2.1 may ship only per-episode stats: the aggregate matches v3.0's stats.json."""
    v30 = open_source(str(factory_datasets["v3.0", True])).stats
    v21 = open_source(str(factory_datasets["v2.1", True])).stats
    assert v30 is not None and v21 is not None
    for key in ("observation.state", "action", "frame_index", "index"):
        assert v21[key]["min"] == v30[key]["min"] and v21[key]["max"] == v30[key]["max"]
        assert v21[key]["count"] == v30[key]["count"]
        np.testing.assert_allclose(v21[key]["mean"], v30[key]["mean"], rtol=1e-9)
        np.testing.assert_allclose(v21[key]["std"], v30[key]["std"], rtol=1e-6)


# ------------------------------------------------------------------------------- errors


def test_error_not_a_lerobot_dataset(tmp_path):
    with pytest.raises(SourceError, match=r"not a LeRobot dataset \(meta/info\.json not found"):
        open_source(str(tmp_path))
    with pytest.raises(SourceError, match="not a LeRobot dataset"):
        LeRobotSource(str(tmp_path))


def test_error_unknown_codebase_version(golden_copy):
    root = golden_copy("image")
    info = json.loads((root / "meta/info.json").read_text())
    info["codebase_version"] = "v9.9"
    (root / "meta/info.json").write_text(json.dumps(info))
    with pytest.raises(SourceError, match=r"unsupported LeRobot codebase_version 'v9\.9'"):
        open_source(str(root))


def test_error_missing_data_file(golden_copy):
    root = golden_copy("av1_multifile")
    (root / "data/chunk-000/file-001.parquet").unlink()
    source = LeRobotSource(str(root))
    source[0]
    with pytest.raises(SourceError, match=r"file-001\.parquet \(episode 2\): data file not found"):
        source[13]


def test_error_missing_video_file(golden_copy):
    root = golden_copy("av1_multifile")
    (root / f"videos/{CAM_WRIST}/chunk-000/file-002.mp4").unlink()
    source = LeRobotSource(str(root))
    source[42]
    with pytest.raises(
        SourceError,
        match=rf"file-002\.mp4: video file not found \(episode 3, camera {CAM_WRIST}\)",
    ):
        source[43]


def test_error_video_with_fewer_frames_than_the_episode(golden_copy):
    root = golden_copy("av1_multifile")
    video = root / f"videos/{CAM_HIGH}/chunk-000/file-002.mp4"  # episode 3 alone, 9 frames
    keep_first_packets(video, 6)
    source = LeRobotSource(str(root))
    for index in range(43, 49):
        source[index]
    with pytest.raises(
        FrameNotFoundError, match=rf"file-002\.mp4 \(episode 3, camera {CAM_HIGH}\).*\[0\.6"
    ):
        source[49]


def test_error_bad_delta_timestamps(golden_dir):
    root = str(golden_dir / "av1_multifile")
    with pytest.raises(ValueError, match="not features"):
        LeRobotSource(root, delta_timestamps={"nope": [0.0]})
    with pytest.raises(ValueError, match="multiples of 1/fps"):
        LeRobotSource(root, delta_timestamps={"action": [0.05]})


def test_torchcodec_backend_says_how_to_install(golden_dir):
    try:
        from torchcodec import decoders  # noqa: F401
    except (ImportError, OSError, RuntimeError):
        pass
    else:
        pytest.skip("torchcodec imports here")
    with pytest.raises(ImportError, match="pip install"):
        LeRobotSource(str(golden_dir / "av1_multifile"), video_backend="torchcodec")
    with pytest.raises(ValueError, match="video_backend"):
        LeRobotSource(str(golden_dir / "av1_multifile"), video_backend="opencv")


# ------------------------------------------------------------------------------- helpers


def shift_from_timestamp(root: Path, episode: int, camera: str, by: float) -> None:
    """Rewrite the episode table with one episode's from_timestamp moved by ``by`` seconds."""
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    name = f"videos/{camera}/from_timestamp"
    values = table.column(name).to_pylist()
    values[episode] += by
    i = table.column_names.index(name)
    table = table.set_column(i, table.field(i), pa.array(values, table.field(i).type))
    pq.write_table(table, path)


def keep_first_packets(path: Path, count: int) -> None:
    """Replace an mp4 by a stream copy of its first ``count`` video packets."""
    tmp = path.with_suffix(".tmp.mp4")
    with av.open(str(path)) as src, av.open(str(tmp), "w", format="mp4") as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream, opaque=True)
        kept = 0
        for packet in src.demux(stream):
            if packet.dts is None or kept == count:
                continue
            packet.stream = out
            dst.mux(packet)
            kept += 1
    tmp.replace(path)
