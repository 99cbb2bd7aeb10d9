"""The converter: stream-copied cuts, tar shards and manifest round trips, resume and options."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import av
import fsspec
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import webdataset

from lerobot_shards import convert
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.converter.cut import CutError, cut_episode
from lerobot_shards.converter.run import ConvertError
from lerobot_shards.format import (
    INDEX_FILE,
    MANIFEST_FILE,
    episode_key,
    header_member,
    manifest_rows,
    rows_member,
    shard_path,
    video_member,
)
from lerobot_shards.source import LeRobotSource, open_source
from lerobot_shards.testing.factory import make_dataset
from lerobot_shards.validate import parse_header, read_index, read_manifest

# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def sha256(data: bytes) -> str:
    """The manifest's ``algo:hexdigest`` of ``data`` by hashlib, not by ``format.checksum``
    (which the converter uses to write it)."""
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def decode(data: bytes) -> list[torch.Tensor]:
    """Every frame of an in-memory mp4 as CHW uint8 (rgb24)."""
    with av.open(io.BytesIO(data)) as container:
        return [
            torch.from_numpy(f.to_ndarray(format="rgb24")).permute(2, 0, 1)
            for f in container.decode(video=0)
        ]


def encode(codec: str, n: int, options: dict[str, str], fps: int = 10) -> bytes:
    """An mp4 of ``n`` distinct 64x48 frames."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as out:
        stream = out.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        stream.options = options
        for i in range(n):
            img = np.zeros((48, 64, 3), np.uint8)
            img[..., 0] = (np.arange(64) * 4 + i * 7) % 256
            img[..., 1] = i * 9 % 256
            img[i % 48, :, 2] = 255
            out.mux(stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")))
        out.mux(stream.encode())
    return buf.getvalue()


H264_BFRAMES = ("libx264", {"bf": "2", "x264-params": "keyint=8:min-keyint=8:scenecut=0"})
AV1_GOP4 = ("libsvtav1", {"g": "4"})


@pytest.fixture(scope="module")
def factory_v30(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The factory's defaults roll data and video files over at different episodes.
    return make_dataset(tmp_path_factory.mktemp("src") / "v30", version="v3.0")


@pytest.fixture(scope="module")
def factory_v21(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("src") / "v21", version="v2.1")


@pytest.fixture(scope="module")
def sources(golden_dir: Path, factory_v30: Path, factory_v21: Path) -> dict[str, Path]:
    return {
        "golden_av1_multifile": golden_dir / "av1_multifile",
        "golden_image": golden_dir / "image",
        "factory_v30": factory_v30,
        "factory_v21": factory_v21,
    }


# --------------------------------------------------------------------------------------------
# cutting
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", [H264_BFRAMES, AV1_GOP4], ids=["h264-bframes", "av1"])
@pytest.mark.parametrize(("start", "length"), [(0, 10), (3, 10), (13, 9), (30, 10)])
def test_cut_is_bit_identical_and_starts_at_the_keyframe_before(codec, start, length):
    data = encode(codec[0], 40, codec[1])
    reference = decode(data)
    cut = cut_episode(
        io.BytesIO(data),
        from_timestamp=start / 10,
        timestamps=[k / 10 for k in range(length)],
        fps=10,
    )
    gop = 8 if codec is H264_BFRAMES else 4
    assert cut.camera.skip_frames == start % gop
    assert cut.camera.frames == length + start % gop
    frames = decode(cut.data)
    assert len(frames) == cut.camera.frames
    got = frames[cut.camera.skip_frames :]
    want = reference[start : start + length]
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_cut_matches_a_drifted_start_to_the_nearest_frame():
    data = encode(AV1_GOP4[0], 12, AV1_GOP4[1])
    # LeRobot's from_timestamp is a float sum: a little off the frame's pts.
    cut = cut_episode(io.BytesIO(data), from_timestamp=0.4 + 3e-5, timestamps=[0.0, 0.1], fps=10)
    assert torch.equal(decode(cut.data)[cut.camera.skip_frames], decode(data)[4])


def test_cut_errors_name_the_episode_and_camera():
    data = encode(AV1_GOP4[0], 12, AV1_GOP4[1])
    where = "episode 7 camera cam_high"
    with pytest.raises(CutError, match=r"episode 7 camera cam_high.*holds 2 frames"):
        cut_episode(io.BytesIO(data), from_timestamp=1.0, timestamps=[0.0, 0.1, 0.2], fps=10,
                    where=where)  # fmt: skip
    with pytest.raises(CutError, match=r"episode 7 camera cam_high: frame 2"):
        cut_episode(io.BytesIO(data), from_timestamp=0.0, timestamps=[0.0, 0.1, 0.25], fps=10,
                    where=where)  # fmt: skip
    with pytest.raises(CutError, match=r"episode 7 camera cam_high: no frame within"):
        cut_episode(io.BytesIO(data), from_timestamp=0.05, timestamps=[0.0], fps=10, where=where)


# --------------------------------------------------------------------------------------------
# round trip
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["golden_av1_multifile", "golden_image", "factory_v30", "factory_v21"]
)
def test_round_trip(name: str, sources: dict[str, Path], tmp_path: Path):
    root = sources[name]
    dest = tmp_path / "out"
    summary = convert(str(root), str(dest), workers=0, progress=False)
    src = open_source(str(root))
    reference = LeRobotSource(str(root), return_uint8=True)
    fs = fsspec.filesystem("file")

    index = read_index(fs, str(dest))
    rows = manifest_rows(read_manifest(fs, str(dest / MANIFEST_FILE)))
    assert [r.episode_index for r in rows] == [ep.episode_index for ep in src.episodes]
    assert (index.total_episodes, index.total_frames) == (len(src.episodes), src.total_frames)
    assert index.total_bytes == sum(r.size for r in rows) == summary.bytes
    assert index.manifest_checksum == sha256((dest / MANIFEST_FILE).read_bytes())
    assert (dest / "meta/info.json").read_bytes() == (root / "meta/info.json").read_bytes()
    if (root / "meta/stats.json").exists():
        assert (dest / "meta/stats.json").read_bytes() == (root / "meta/stats.json").read_bytes()
    tasks = pq.read_table(dest / "meta/tasks.parquet").to_pandas()
    assert tasks.index.name == "task"
    assert list(tasks.index) == src.tasks
    assert list(tasks["task_index"]) == list(range(len(src.tasks)))

    for row, ep in zip(rows, src.episodes, strict=True):
        i = ep.episode_index
        assert row.shard == shard_path(i)
        data = (dest / row.shard).read_bytes()
        assert (row.offset, row.size) == (0, len(data))
        assert row.checksum == sha256(data)
        assert (row.length, row.dataset_from_index, row.dataset_to_index, row.tasks) == (
            ep.length, ep.dataset_from_index, ep.dataset_to_index, ep.tasks,
        )  # fmt: skip
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = [m.name for m in tar.getmembers()]
            contents = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        expected = [header_member(i), rows_member(i)] + [video_member(i, k) for k in src.video_keys]
        assert names == expected == [m.name for m in row.members]
        for m in row.members:
            assert data[m.offset : m.offset + m.size] == contents[m.name]

        rows_table = pq.read_table(io.BytesIO(contents[rows_member(i)]))
        source_rows = src.read_rows(i)
        assert rows_table.schema.equals(source_rows.schema, check_metadata=True)
        assert rows_table.equals(source_rows)

        header = parse_header(contents[header_member(i)])
        assert (header.episode_index, header.length, header.tasks) == (i, ep.length, ep.tasks)
        assert list(header.cameras) == src.video_keys
        for key, cam in header.cameras.items():
            frames = decode(contents[video_member(i, key)])
            assert len(frames) == cam.frames == ep.length + cam.skip_frames
            for k, frame in enumerate(frames[cam.skip_frames :]):
                expected_frame = reference[ep.dataset_from_index + k][key]
                assert torch.equal(frame, expected_frame), f"episode {i} {key} frame {k}"

    samples = list(webdataset.WebDataset([str(dest / r.shard) for r in rows], shardshuffle=False))
    assert [s["__key__"] for s in samples] == [episode_key(r.episode_index) for r in rows]
    for s in samples:
        assert {k for k in s if not k.startswith("__")} == {"json", "parquet"} | {
            f"{k}.mp4" for k in src.video_keys
        }
    assert verify_dataset(str(dest), deep=True) == []


def test_process_pool_gives_the_same_shards(factory_v30: Path, tmp_path: Path):
    convert(str(factory_v30), str(tmp_path / "a"), workers=0, progress=False)
    convert(str(factory_v30), str(tmp_path / "b"), workers=2, progress=False)
    fs = fsspec.filesystem("file")
    a = read_manifest(fs, str(tmp_path / "a" / MANIFEST_FILE))
    b = read_manifest(fs, str(tmp_path / "b" / MANIFEST_FILE))
    assert a.equals(b)


# --------------------------------------------------------------------------------------------
# options, resume, destinations
# --------------------------------------------------------------------------------------------


def test_episode_selection(golden_dir: Path, tmp_path: Path):
    summary = convert(str(golden_dir / "av1_multifile"), str(tmp_path), episodes=[4, 0, 2, 2],
                      workers=0, progress=False)  # fmt: skip
    table = read_manifest(fsspec.filesystem("file"), str(tmp_path / MANIFEST_FILE))
    assert table.column("episode_index").to_pylist() == [0, 2, 4]
    assert (summary.episodes, summary.frames) == (3, 12 + 30 + 17)
    assert sorted(p.name for p in tmp_path.glob("shards/*/*")) == [
        "episode-000000.tar", "episode-000002.tar", "episode-000004.tar",
    ]  # fmt: skip
    with pytest.raises(Exception, match="no episode 9"):
        convert(str(golden_dir / "av1_multifile"), str(tmp_path / "x"), episodes=[9], workers=0,
                progress=False)  # fmt: skip


def test_rerun_is_a_no_op_other_options_are_refused_and_overwrite_starts_afresh(
    golden_dir: Path, tmp_path: Path
):
    src = str(golden_dir / "av1_multifile")
    convert(src, str(tmp_path), episodes=[0, 1], workers=0, progress=False)
    again = convert(src, str(tmp_path), episodes=[0, 1], workers=0, progress=False)
    assert (again.converted, again.episodes) == (0, 2)
    with pytest.raises(ConvertError, match=r"different options.*--overwrite"):
        convert(src, str(tmp_path), workers=0, progress=False)
    fresh = convert(src, str(tmp_path), workers=0, overwrite=True, progress=False)
    assert (fresh.converted, fresh.episodes) == (6, 6)
    assert verify_dataset(str(tmp_path)) == []


def test_refuses_a_foreign_destination(golden_dir: Path, tmp_path: Path):
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(ConvertError, match="not a lerobot-shards conversion"):
        convert(str(golden_dir / "image"), str(tmp_path), workers=0, progress=False)
    assert (tmp_path / "precious.txt").exists()


def test_rerun_redoes_a_broken_shard_only(golden_dir: Path, tmp_path: Path):
    src = str(golden_dir / "av1_multifile")
    convert(src, str(tmp_path), workers=0, progress=False)
    broken = tmp_path / shard_path(3)
    broken.write_bytes(broken.read_bytes()[:1000])
    (tmp_path / shard_path(5)).unlink()
    (tmp_path / INDEX_FILE).unlink()
    untouched = (tmp_path / shard_path(0)).stat()
    summary = convert(src, str(tmp_path), workers=0, progress=False)
    assert summary.converted == 2
    assert (tmp_path / shard_path(0)).stat().st_mtime_ns == untouched.st_mtime_ns
    assert verify_dataset(str(tmp_path), deep=True) == []


def test_memory_source_and_destination(golden_dir: Path, to_memory):
    src = to_memory(golden_dir / "av1_multifile")
    dest = src.replace("memory://", "memory://converted-")
    try:
        summary = convert(src, dest, workers=2, progress=False)  # memory: runs in-process
        assert (summary.episodes, summary.frames) == (6, 74)
        fs = fsspec.filesystem("memory")
        index = json.loads(fs.cat_file(dest + "/" + INDEX_FILE))
        assert index["total_frames"] == 74
        assert verify_dataset(dest, deep=True) == []
    finally:
        fsspec.filesystem("memory").rm(dest.removeprefix("memory://"), recursive=True)
