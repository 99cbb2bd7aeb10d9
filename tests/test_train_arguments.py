"""``lerobot-shards train``'s argument check (pure, no LeRobot needed): arguments that cannot
apply to shards are refused naming the flag; streaming and a repo id are added; settings of
LeRobot's config that cannot apply to several ``--shards`` are refused; and LeRobot's held-out
split, checked here on hand-made cases (against LeRobot's own factory in
test_lerobot_train.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lerobot_shards.train.arguments import RefusedArgument, lerobot_arguments, parse
from lerobot_shards.train.datasets import Shards, check_config, split_by_task


def test_parse_takes_both_forms_and_flags():
    assert parse(["--a=1", "--b", "2", "--c", "--d=x=y", "stray"]) == {
        "a": "1",
        "b": "2",
        "c": "true",
        "d": "x=y",
    }


def test_streaming_and_repo_id_are_added():
    args = lerobot_arguments(["--policy.type=act"], "s3://bucket/pusht-shards/")
    assert args == [
        "--policy.type=act",
        "--dataset.streaming=true",
        "--dataset.repo_id=lerobot-shards/pusht-shards",
    ]


def test_a_given_repo_id_or_a_resumed_config_keeps_its_own():
    assert "--dataset.repo_id=me/x" in lerobot_arguments(["--dataset.repo_id=me/x"], "d")
    args = lerobot_arguments(["--resume=true", "--config_path=c.json"], None)
    assert args == ["--resume=true", "--config_path=c.json", "--dataset.streaming=true"]


@pytest.mark.parametrize(
    ("arguments", "flag"),
    [
        (["--dataset.root=/x"], "--dataset.root"),
        (["--dataset.root", "/x"], "--dataset.root"),
        (["--dataset.revision=v2.1"], "--dataset.revision"),
        (["--dataset.repo_type=bucket"], "--dataset.repo_type"),
        (["--sample_weighting.type=rabc"], "--sample_weighting.type"),
        (["--dataset.streaming=false"], "--dataset.streaming=false"),
        (["--dataset.streaming", "False"], "--dataset.streaming=false"),
        (["--job.target=hf"], "--job.target=hf"),
    ],
)
def test_what_cannot_apply_is_refused_naming_the_flag(arguments, flag):
    with pytest.raises(RefusedArgument, match="cannot apply") as refused:
        lerobot_arguments(arguments, "shards")
    assert flag in str(refused.value)


def test_shards_are_needed_unless_resuming():
    with pytest.raises(RefusedArgument, match="needs --shards"):
        lerobot_arguments(["--policy.type=act"], None)
    assert lerobot_arguments(["--dataset.streaming=true", "--job.target=local"], "d")


def config(eval_split: float = 0.0, episodes: list[int] | None = None) -> SimpleNamespace:
    """The fields of LeRobot's ``TrainPipelineConfig`` that ``check_config`` reads, as
    ``lerobot-train``'s defaults leave them."""
    dataset = SimpleNamespace(root=None, revision=None, eval_split=eval_split, episodes=episodes)
    return SimpleNamespace(dataset=dataset, max_eval_samples=0, sample_weighting=None)


@pytest.mark.parametrize(
    ("cfg", "flag"),
    [
        (config(eval_split=0.2), "--dataset.eval_split (with several --shards)"),
        (config(episodes=[0, 1]), "--dataset.episodes (with several --shards)"),
    ],
    ids=["eval_split", "episodes"],
)
def test_a_selection_or_split_of_several_shards_is_refused_naming_the_flag(cfg, flag):
    check_config(cfg, Shards(["a"]))  # one dataset: its episodes and split apply
    with pytest.raises(RefusedArgument, match="cannot apply") as refused:
        check_config(cfg, Shards(["a", "b"]))
    assert flag in str(refused.value)
    check_config(config(), Shards(["a", "b"]))  # neither asked: a mixture is fine


def test_split_holds_out_the_last_ceil_n_split_episodes_of_each_task():
    # task a: 0 2 3 6 -> ceil(1.2) = 2 held out; b: 1 4 -> ceil(0.6) = 1; c: 5 -> 1
    episodes = [0, 1, 2, 3, 4, 5, 6]
    tasks = ["a", "b", "a", "a", "b", "c", "a"]
    assert split_by_task(episodes, tasks, 0.3) == ([0, 1, 2], [3, 4, 5, 6])
    # a selection of episodes: the split is of those
    assert split_by_task([3, 7, 9], ["a", "a", "a"], 0.5) == ([3], [7, 9])
    assert split_by_task([2, 5], ["a", "a"], 0.0) == ([2, 5], [])


def test_a_split_that_leaves_nothing_to_train_on_is_refused():
    with pytest.raises(RefusedArgument, match=r"--dataset.eval_split=0.5 leaves no training"):
        split_by_task([0, 1], ["a", "b"], 0.5)  # one episode per task: each held out
