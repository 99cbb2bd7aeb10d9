"""Datasets made by LeRobot's own tools are read as LeRobot reads them (issue 41).

Users merge, split and edit their datasets with LeRobot's tools, and those write what a
recording does not: vectors as ``list<float>`` (through pandas), re-encoded or re-cut videos,
no statistics of added features, episode tables without tasks, statistics of a feature of two
axes along its last. Each tool runs here in LeRobot 0.6.1's own code, on local paths only: the
handlers of ``lerobot-edit-dataset`` (every operation), ``aggregate_datasets``, its
``add_features``, the computation of ``augment_dataset_quantile_stats`` (the script itself ends
in a Hub push) and the v2.1 to v3.0 script, on the golden recordings and on a factory dataset
(three cameras, longer episodes, several data and video files). For each dataset made: it
converts, ``verify --deep`` passes, and a whole shuffled epoch, with and without
``delta_timestamps``, holds every index once, each item equal (``torch.equal``, key for key) to
what LeRobot's ``LeRobotDataset`` returns (pyav).

Runs where LeRobot 0.6.1 is installed (``scripts/test.sh`` runs it in LeRobot's environment).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from support.required import importorskip

from lerobot_shards import MissingStatsWarning, ShardedLeRobotDataset, convert
from lerobot_shards.converter.check import verify_dataset
from lerobot_shards.testing import make_dataset

REASON = "LeRobot is optional; CI's LeRobot env runs this"
lerobot_dataset = importorskip("lerobot.datasets.lerobot_dataset", reason=REASON)
aggregate = importorskip("lerobot.datasets.aggregate", reason=REASON)
tools = importorskip("lerobot.datasets.dataset_tools", reason=REASON)
edit = importorskip("lerobot.scripts.lerobot_edit_dataset", reason=REASON)
quantiles = importorskip("lerobot.scripts.augment_dataset_quantile_stats", reason=REASON)
v21_to_v30 = importorskip("lerobot.scripts.convert_dataset_v21_to_v30", reason=REASON)
io_utils = importorskip("lerobot.datasets.io_utils", reason=REASON)
video_config = importorskip("lerobot.configs.video", reason=REASON)

DATA = Path(__file__).parent / "data"
CAMERAS = {
    "observation.images.top": (24, 32),
    "observation.images.wrist": (16, 32),
    "observation.images.side": (24, 32),
}
FACTORY = {"episode_lengths": [14, 3, 30, 7], "cameras": CAMERAS}
"""Longer episodes than the golden's, over several data and video files (the limits below)."""
LIMITS_MB = {"data_files_size_in_mb": 0.004, "video_files_size_in_mb": 0.003}
SMALL = {"episode_lengths": [6, 4], "cameras": CAMERAS, "seed": 1, "tasks": ["sort", "sort"]}


class Bases:
    """The datasets the tools start from, made once per module: copies of the golden
    recordings (some tools edit in place) and two factory datasets."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.count = 0

    def copy(self, name: str) -> Path:
        """A fresh copy of the golden dataset ``name`` (v3.0 by LeRobot 0.6.1, v2.1 by 0.3.3)."""
        self.count += 1
        source = DATA / ("lerobot-0.3.3-v2.1" if name.startswith("v21") else "lerobot-0.6.1")
        return Path(shutil.copytree(source / name, self.folder / f"{name}-{self.count}"))

    @property
    def factory(self) -> Path:
        root = self.folder / "factory"
        if not root.exists():
            make_dataset(root, **FACTORY, **LIMITS_MB)
            for pattern in ("data/*/*.parquet", *(f"videos/{c}/*/*.mp4" for c in CAMERAS)):
                assert len(list(root.glob(pattern))) > 1, pattern  # several files, as promised
        return root

    @property
    def small(self) -> Path:
        root = self.folder / "small"
        if not root.exists():
            make_dataset(root, **SMALL)
        return root


def out(bases: Bases, name: str) -> Path:
    return bases.folder / "made" / name


def edited(bases: Bases, name: str, operation: object, source: Path) -> list[Path]:
    """``lerobot-edit-dataset`` with ``operation`` on ``source``, into a new folder."""
    dest = out(bases, name)
    config = edit.EditDatasetConfig(
        operation=operation, repo_id=f"local/{source.name}", root=str(source),
        new_repo_id=f"local/{name}", new_root=str(dest),
    )  # fmt: skip
    getattr(edit, f"handle_{operation.type}")(config)
    return [dest]


def merged(bases: Bases, name: str, roots: list[Path], **options: bool) -> list[Path]:
    dest = out(bases, name)
    operation = edit.MergeConfig(
        repo_ids=[f"local/part-{i}" for i in range(len(roots))], roots=[str(r) for r in roots],
        **options,
    )  # fmt: skip
    edit.handle_merge(edit.EditDatasetConfig(operation, new_repo_id="local/m", new_root=str(dest)))
    return [dest]


def aggregated(bases: Bases) -> list[Path]:
    """``aggregate_datasets`` itself, with small file limits: the merged files roll over."""
    dest = out(bases, "aggregate_datasets")
    aggregate.aggregate_datasets(
        ["local/factory", "local/small"], "local/aggregated", roots=[bases.factory, bases.small],
        aggr_root=dest, **LIMITS_MB,
    )  # fmt: skip
    for pattern in ("data/*/*.parquet", *(f"videos/{c}/*/*.mp4" for c in CAMERAS)):
        assert len(list(dest.glob(pattern))) > 1, pattern
    return [dest]


def split(bases: Bases) -> list[Path]:
    dest = out(bases, "split")
    operation = edit.SplitConfig(splits={"train": [0, 2, 4], "val": [1, 3, 5]})
    source = bases.copy("av1_multifile")
    edit.handle_split(
        edit.EditDatasetConfig(operation, repo_id="local/av1", root=str(source), new_root=str(dest))
    )
    return [dest / "train", dest / "val"]


def features_added(bases: Bases) -> list[Path]:
    """``add_features`` (no ``lerobot-edit-dataset`` operation): a scalar from an array, a
    vector, and a bool from a function of the row."""
    source = bases.copy("image")
    dataset = lerobot_dataset.LeRobotDataset("local/image", root=source)
    n = dataset.meta.total_frames
    added = {
        "reward": (
            np.arange(n, dtype=np.float32) / 7,
            {"dtype": "float32", "shape": [1], "names": None},
        ),
        "embedding": (
            np.arange(3 * n, dtype=np.float32).reshape(n, 3) / 3,
            {"dtype": "float32", "shape": [3], "names": None},
        ),
        "success": (
            lambda row, episode, frame: frame % 2 == 1,
            {"dtype": "bool", "shape": [1], "names": None},
        ),
    }
    dest = out(bases, "add_features")
    tools.add_features(dataset, added, output_dir=dest, repo_id="local/added")
    return [dest]


def tasks_modified(bases: Bases) -> list[Path]:
    """``modify_tasks`` works in place (and sorts the tasks: every task_index changes)."""
    source = bases.copy("av1_multifile")
    operation = edit.ModifyTasksConfig(new_task="do it", episode_tasks={"1": "zz", "4": "aa"})
    edit.handle_modify_tasks(edit.EditDatasetConfig(operation, "local/t", root=str(source)))
    return [source]


def quantiles_added(bases: Bases) -> list[Path]:
    """A v2.1 dataset (statistics without quantiles) converted to v3.0 by LeRobot's script,
    then given quantiles by ``augment_dataset_quantile_stats``'s computation."""
    root = converted_from_v21(bases, "v21_video")[0]
    dataset = lerobot_dataset.LeRobotDataset("local/q", root=root)
    assert not quantiles.has_quantile_stats(dataset.meta.stats)
    io_utils.write_stats(quantiles.compute_quantile_stats_for_dataset(dataset), root)
    return [root]


def reencoded(bases: Bases) -> list[Path]:
    """``reencode_videos`` to H.264 (libx264's B-frames: frames decoded out of order)."""
    encoder = video_config.RGBEncoderConfig(vcodec="h264", crf=23, g=4)
    operation = edit.ReencodeVideosConfig(rgb_encoder=encoder)
    return edited(bases, "reencode", operation, bases.small)


def converted_from_v21(bases: Bases, name: str) -> list[Path]:
    source = bases.copy(name)
    v21_to_v30.convert_dataset(f"local/{name}", root=source, push_to_hub=False)
    return [source]


def recorded_with_two_axes(bases: Bases) -> list[Path]:
    """Not a tool: LeRobot's recorder with a feature of two axes (Hugging Face's Array2D:
    nested ``list`` rows, statistics along the last axis)."""
    root = out(bases, "two_axes")
    features = {
        "observation.state": {"dtype": "float32", "shape": (4,), "names": None},
        "observation.grid": {"dtype": "float32", "shape": (2, 3), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
    }
    recorder = lerobot_dataset.LeRobotDataset.create(
        "local/grid", fps=10, root=root, use_videos=False, features=features
    )
    for episode, length in enumerate([5, 3]):
        for frame in range(length):
            recorder.add_frame({
                "observation.state": np.full(4, 10 * episode + frame, np.float32),
                "observation.grid": np.arange(6, dtype=np.float32).reshape(2, 3) + frame / 4,
                "action": np.full(4, -frame, np.float32),
                "task": "look",
            })  # fmt: skip
        recorder.save_episode()
    recorder.finalize()
    return [root]


TOOLS: dict[str, Callable[[Bases], list[Path]]] = {
    "aggregate_datasets": aggregated,
    "merge": lambda b: merged(b, "merge", [b.small, b.small]),
    "merge unconcatenated": lambda b: merged(
        b, "merge_files", [b.small, b.small], concatenate_videos=False, concatenate_data=False
    ),
    "delete_episodes": lambda b: edited(
        b, "delete", edit.DeleteEpisodesConfig(episode_indices=[1, 3]), b.factory
    ),
    "split": split,
    "remove_feature": lambda b: edited(
        b, "remove", edit.RemoveFeatureConfig(["observation.images.top", "action"]), b.factory
    ),
    "add_features": features_added,
    "modify_tasks": tasks_modified,
    "convert_image_to_video": lambda b: edited(
        b, "to_video", edit.ConvertImageToVideoConfig(num_workers=1), b.copy("image")
    ),
    "reencode_videos": reencoded,
    "recompute_stats": lambda b: edited(
        b, "stats", edit.RecomputeStatsConfig(relative_action=True, chunk_size=4), b.copy("image")
    ),
    "augment_dataset_quantile_stats": quantiles_added,
    "convert_dataset_v21_to_v30": lambda b: converted_from_v21(b, "v21_image"),
    "recorder, two axes": recorded_with_two_axes,
}
WITHOUT_STATS = {"add_features", "convert_image_to_video"}
"""Tools that leave features without statistics (read with a ``MissingStatsWarning``)."""


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> Bases:
    return Bases(tmp_path_factory.mktemp("lerobot-tools"))


def assert_same_item(ours: dict, theirs: dict) -> None:
    """The same keys in the same order; tensors of the same dtype, shape and values (ours are
    typed for ``default_collate``, so their class is not compared); the rest equal."""
    assert list(ours) == list(theirs), int(theirs["index"])
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            got = ours[key]
            assert got.dtype == value.dtype and got.shape == value.shape, (key, got.dtype)
            assert torch.equal(got, value), (int(theirs["index"]), key)
        else:
            assert ours[key] == value, (int(theirs["index"]), key)


def delta_timestamps(features: dict, cameras: list[str]) -> dict[str, list[float]]:
    """Neighbours of the first camera and of the vectors the dataset has, across episode ends."""
    wanted = {"action": [0.0, 0.1, 0.2], "observation.state": [-0.1, 0.0]}
    delta = {key: value for key, value in wanted.items() if key in features}
    if cameras:
        delta[cameras[0]] = [-0.2, 0.0]
    return delta


@pytest.mark.timeout(300)
@pytest.mark.parametrize("tool", list(TOOLS))
def test_tool_output_reads_as_lerobot(bases, tool, tmp_path):
    for root in TOOLS[tool](bases):
        dest = tmp_path / root.name
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            convert(str(root), str(dest), workers=0, progress=False)
        warned = any(issubclass(w.category, MissingStatsWarning) for w in caught)
        assert warned == (tool in WITHOUT_STATS), [str(w.message) for w in caught]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MissingStatsWarning)
            assert verify_dataset(str(dest), deep=True) == []
            meta = lerobot_dataset.LeRobotDatasetMetadata("local/x", root=root)
            for delta in (None, delta_timestamps(meta.features, meta.camera_keys)):
                theirs = lerobot_dataset.LeRobotDataset(
                    "local/x", root=root, video_backend="pyav", delta_timestamps=delta
                )
                seen = []
                for item in ShardedLeRobotDataset(str(dest), buffer_size=3, delta_timestamps=delta):
                    seen.append(int(item["index"]))
                    assert_same_item(item, theirs[seen[-1]])
                assert sorted(seen) == list(range(len(theirs))) and len(seen) > 1, root
