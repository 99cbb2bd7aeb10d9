"""A damaged source mp4: errors name the episode, the camera and the file and say what is wrong;
what the converter checks of the bitstream (with ``decode_check``, each cut's first frame decodes)
and what is left to ``verify --deep``."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import av
import pytest
from click.testing import CliRunner

from lerobot_shards import convert
from lerobot_shards.cli import main
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.converter.run import ConvertError
from lerobot_shards.source import open_source
from lerobot_shards.testing.factory import make_dataset

CAMERA = "observation.images.cam_high"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(tmp_path_factory.mktemp("src") / "v30", version="v3.0")


@pytest.fixture
def source(pristine: Path, tmp_path: Path) -> Path:
    return shutil.copytree(pristine, tmp_path / "src")


def first_episode_of_a_file(root: Path) -> tuple[int, Path]:
    """An episode whose cut starts at the first frame of its camera's source file (not the
    dataset's first file, so the damage is not simply at the start of the data)."""
    for ep in open_source(str(root)).episodes:
        span = ep.videos[CAMERA]
        if span.from_timestamp == 0 and not span.path.endswith("file-000.mp4"):
            return ep.episode_index, root / span.path
    raise AssertionError("no episode starts a video file")


def packets(path: Path) -> list[av.Packet]:
    with av.open(str(path)) as container:
        return [(p.pos, p.size, p.is_keyframe) for p in container.demux(video=0) if p.size]


def flip(path: Path, start: int, stop: int) -> None:
    data = bytearray(path.read_bytes())
    for k in range(start, stop):
        data[k] ^= 0xFF
    path.write_bytes(bytes(data))


def frames_decoded(video: Path) -> int | None:
    """How many frames PyAV decodes from the file before one fails (None: every one decodes).
    The oracle of the damage, not the converter's code."""
    decoded = 0
    with av.open(str(video)) as container:
        try:
            for _ in container.decode(video=0):
                decoded += 1
        except av.error.InvalidDataError:
            return decoded
    return None


def damage(video: Path, pos: int, size: int, breaks: Callable[[int | None], bool]) -> None:
    """Flip the bytes of the packet at ``pos`` from the first sixteenth of it (never its
    first bytes) at which what PyAV decodes ``breaks``. Which bytes break a frame, rather than only
    blur it, is the encoder's choice and moves with SVT-AV1's version: the test finds them."""
    pristine = video.read_bytes()
    for sixteenth in range(1, 16):
        video.write_bytes(pristine)
        flip(video, pos + sixteenth * size // 16, pos + size)
        if breaks(frames_decoded(video)):
            return
    raise AssertionError(f"no flip of the packet at byte {pos} of {video} breaks it")


def expect_named_error(
    source: str, episode: int, video: Path, tmp_path: Path, what: str, decode_check: bool = False
) -> None:
    with pytest.raises(ConvertError) as err:
        convert(source, str(tmp_path / "out"), workers=0, progress=False, decode_check=decode_check)
    message = str(err.value)
    assert message.startswith(f"episode {episode} camera {CAMERA} (")
    assert str(video.relative_to(video.parents[3])) in message
    assert "the source video is damaged or not a video" in message and what in message
    assert "<none>" not in message


def test_a_truncated_source_mp4_names_episode_camera_and_file(source: Path, tmp_path: Path):
    episode, video = first_episode_of_a_file(source)
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    expect_named_error(str(source), episode, video, tmp_path, "cannot be opened")


def test_the_same_from_object_storage(source: Path, tmp_path: Path, to_memory):
    """Read through a file object (any fsspec source), where FFmpeg's own message names no file
    (``'<none>'``)."""
    episode, video = first_episode_of_a_file(source)
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    expect_named_error(to_memory(source), episode, video, tmp_path, "cannot be opened")


def test_a_damaged_frame_after_the_keyframe_fails_the_conversion(source: Path, tmp_path: Path):
    """Opening the cut parses its first packets (FFmpeg's probe, up to 5 s of them): a packet
    that does not parse is caught too."""
    episode, video = first_episode_of_a_file(source)
    pos, size, key = packets(video)[1]
    assert not key
    flip(video, pos, pos + size)
    expect_named_error(str(source), episode, video, tmp_path, "cannot be read back")


def test_with_the_decode_check_a_damaged_keyframe_fails_the_conversion(
    source: Path, tmp_path: Path
):
    episode, video = first_episode_of_a_file(source)
    pos, size, key = packets(video)[0]
    assert key
    damage(video, pos, size, lambda decoded: decoded == 0)  # the first frame fails
    what = "first frame that does not decode"
    expect_named_error(str(source), episode, video, tmp_path, what, decode_check=True)
    args = ["convert", str(source), str(tmp_path / "cli"), "--workers", "0", "--decode-check"]
    result = CliRunner().invoke(main, [*args, "--no-progress"])
    assert result.exit_code == 1 and what in result.output


def test_damage_past_the_first_frame_is_left_to_verify_deep(source: Path, tmp_path: Path):
    """Decoding every frame is ``verify --deep``'s job: the converter decodes one per cut."""
    episode, video = first_episode_of_a_file(source)
    assert open_source(str(source)).episode(episode).length > 20
    pos, size, key = packets(video)[15]  # mid-episode
    assert not key
    damage(video, pos, size, lambda decoded: decoded is not None and decoded > 1)
    dest = tmp_path / "out"
    convert(str(source), str(dest), workers=0, progress=False)
    assert verify_dataset(str(dest)) == []
    problems = verify_dataset(str(dest), deep=True)
    assert [p.episode_index for p in problems] == [episode]
    assert CAMERA in str(problems[0])


def test_by_default_a_damaged_keyframe_passes_and_the_summary_says_so(source: Path, tmp_path: Path):
    episode, video = first_episode_of_a_file(source)
    pos, size, _ = packets(video)[0]
    damage(video, pos, size, lambda decoded: decoded == 0)  # the first frame fails
    dest = tmp_path / "out"
    summary = convert(str(source), str(dest), workers=0, progress=False)
    assert "checked: frame counts and timestamps, no frame decoded" in summary.line()
    assert [p.episode_index for p in verify_dataset(str(dest), deep=True)] == [episode]
    other = tmp_path / "other"
    fine = convert(
        str(source), str(other), episodes=[0], workers=0, progress=False, decode_check=True
    )
    assert "each cut's first frame decoded (verify --deep decodes all)" in fine.line()
