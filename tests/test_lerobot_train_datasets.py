"""``lerobot-shards train``'s datasets from LeRobot 0.6.1's own config (``TrainPipelineConfig``,
in this process): each setting LeRobot's factory reads reaches the readers. ``--dataset.episodes``
selects exactly the frames LeRobot's own dataset of those episodes holds; ``--seed`` is the
order, the same for the same seed; ``--dataset.video_backend``, ``--tolerance_s`` and
``--dataset.image_transforms.*`` reach the train and eval readers (the eval one untransformed,
unshuffled, unpadded, as LeRobot evaluates); ``--dataset.depth_output_unit`` is the depth maps'
unit and their stats'; a selection or split of several ``--shards`` is refused. The trainer
itself: test_lerobot_train.py. Needs LeRobot (CI's LeRobot env)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from support.required import importorskip

importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")

from lerobot.configs.default import DatasetConfig  # noqa: E402
from lerobot.configs.train import TrainPipelineConfig  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402
from lerobot.policies.act.configuration_act import ACTConfig  # noqa: E402
from lerobot.transforms import ImageTransforms, ImageTransformsConfig  # noqa: E402

from lerobot_shards.train import datasets  # noqa: E402
from lerobot_shards.train.arguments import RefusedArgument  # noqa: E402
from lerobot_shards.train.datasets import Shards, make_datasets  # noqa: E402

REPO = "golden/av1_multifile"


def config(**dataset) -> TrainPipelineConfig:
    """LeRobot's training config for ACT on the shards, with ``dataset`` settings."""
    return TrainPipelineConfig(
        dataset=DatasetConfig(repo_id=REPO, **dataset),
        policy=ACTConfig(device="cpu", push_to_hub=False),
    )


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The options of every reader ``make_datasets`` opens, in order."""
    calls: list[dict] = []
    real = datasets.ShardedLeRobotDataset

    def recorded(root, **options):
        calls.append(options)
        return real(root, **options)

    monkeypatch.setattr(datasets, "ShardedLeRobotDataset", recorded)
    return calls


def indices(ds) -> list[int]:
    return [int(item["index"]) for item in ds]


def test_episodes_select_exactly_the_frames_of_lerobots_own_selection(av1, golden_path):
    train, held_out = make_datasets(config(episodes=[4, 0, 2]), Shards([str(av1)]))
    theirs = LeRobotDataset(REPO, root=golden_path("av1_multifile"), episodes=[4, 0, 2])
    expected = theirs.hf_dataset.data.column("index").to_pylist()
    assert held_out is None
    assert train.episodes == [0, 2, 4]
    assert Counter(indices(train)) == Counter(expected)  # each once
    assert len(expected) == 12 + 30 + 17


@pytest.mark.parametrize("backend", ["pyav", "torchcodec"])
def test_video_backend_and_tolerance_reach_train_and_eval_readers(av1, opened, backend):
    cfg = config(video_backend=backend, eval_split=0.4)
    cfg.tolerance_s = 0.003
    train, held_out = make_datasets(cfg, Shards([str(av1)]))
    assert train.video_backend == held_out.video_backend == backend
    *_, train_options, eval_options = opened  # the last two opened: train, then eval
    assert train_options["tolerance_s"] == eval_options["tolerance_s"] == 0.003
    assert train_options["video_backend"] == eval_options["video_backend"] == backend


def test_seed_is_the_order_the_same_for_the_same_seed(av1):
    def order(seed: int | None) -> tuple[int, list[int]]:
        cfg = config()
        cfg.seed = seed
        train, _ = make_datasets(cfg, Shards([str(av1)], buffer_size=2))
        return train.seed, indices(train)

    (seven, first), (_, again), (eight, other) = order(7), order(7), order(8)
    assert (seven, eight) == (7, 8)
    assert first == again
    assert first != other
    assert sorted(first) == sorted(other) == list(range(74))
    assert order(None)[0] == 0  # LeRobot's seed=None: the reader's own default


def test_image_transforms_reach_the_train_reader_only(av1):
    cfg = config(
        eval_split=0.4, image_transforms=ImageTransformsConfig(enable=True, max_num_transforms=2)
    )
    train, held_out = make_datasets(cfg, Shards([str(av1)]))
    transforms = train.spec.image_transforms
    assert isinstance(transforms, ImageTransforms)
    assert transforms.tf.n_subset == 2  # the config given, not a default one
    assert held_out.spec.image_transforms is None  # LeRobot evaluates untransformed
    assert (held_out.shuffle, held_out.pad) == (False, False)
    plain, _ = make_datasets(config(), Shards([str(av1)]))
    assert plain.spec.image_transforms is None


@pytest.mark.parametrize("unit", ["mm", "m"])
def test_depth_output_unit_reaches_the_readers_and_their_stats(shards, golden_path, unit):
    """``--dataset.depth_output_unit``: depth in that unit, and the stats LeRobot's own dataset
    gives it (rescaled from the stored millimetres; ``use_imagenet_stats``, on by default,
    leaves them)."""
    cfg = TrainPipelineConfig(
        dataset=DatasetConfig(repo_id="golden/depth_video", depth_output_unit=unit),
        policy=ACTConfig(device="cpu", push_to_hub=False),
    )
    train, _ = make_datasets(cfg, Shards([str(shards("depth_video"))]))
    theirs = LeRobotDataset(
        "golden/depth_video",
        root=golden_path("depth_video"),
        depth_output_unit=unit,
        return_uint8=True,
        video_backend="pyav",
    )
    depth = "observation.images.depth"
    for stat, value in theirs.meta.stats[depth].items():
        assert np.array_equal(train.meta.stats[depth][stat], value), stat
    item = next(iter(train))
    assert torch.equal(item[depth], theirs[int(item["index"])][depth])


@pytest.mark.parametrize(
    ("dataset", "flag"),
    [
        ({"eval_split": 0.2}, "--dataset.eval_split (with several --shards)"),
        ({"episodes": [0]}, "--dataset.episodes (with several --shards)"),
    ],
)
def test_a_selection_or_split_of_several_shards_is_refused(av1, opened, dataset, flag):
    with pytest.raises(RefusedArgument, match="cannot apply") as refused:
        make_datasets(config(**dataset), Shards([str(av1), str(av1)]))
    assert flag in str(refused.value)
    assert not opened  # refused before any reader was opened
