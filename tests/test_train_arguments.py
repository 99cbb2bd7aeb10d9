"""``lerobot-shards train``'s argument check (pure, no LeRobot needed): arguments that cannot
apply to shards are refused naming the flag; streaming and a repo id are added; and LeRobot's
held-out split, checked here on hand-made cases (against LeRobot's own factory in
test_lerobot_train.py)."""

from __future__ import annotations

import pytest

from lerobot_shards.train.arguments import RefusedArgument, lerobot_arguments, parse


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
