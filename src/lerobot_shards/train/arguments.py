"""The arguments ``lerobot-shards train`` hands to LeRobot's trainer: the user's own
``lerobot-train`` arguments, checked and completed for shards. Pure: no LeRobot import.

Why a check here. LeRobot's trainer would take ``--dataset.root`` or ``--dataset.revision`` and
go on without them (the data comes from the shards), and with ``--dataset.streaming=false``
it would wrap the dataset in a map-style sampler it cannot have: an argument that cannot apply
to shards is refused, naming it, never ignored. What the shards need that a user does not type
is added: ``--dataset.streaming=true`` (LeRobot then builds a plain DataLoader without a sampler
or shuffling, the reader shuffles) and a ``--dataset.repo_id`` (LeRobot requires one; it names
the run and the model card) taken from the first shards' folder name.
"""

from __future__ import annotations

from collections.abc import Sequence

REFUSED = {
    "dataset.root": "the data comes from --shards",
    "dataset.revision": "shards hold one converted revision: convert the revision you want",
    "dataset.repo_type": "the data comes from --shards, not from a Hub repository or bucket",
    "sample_weighting.type": "sample weighting reads per-frame files beside a LeRobot dataset",
}
"""Arguments that cannot apply to shards, and why."""

FALSE = {"false", "0", "no", "off"}


class RefusedArgument(ValueError):
    """An argument or setting that cannot apply to shards; the message names its flag."""


def parse(arguments: Sequence[str]) -> dict[str, str]:
    """``--key=value`` and ``--key value`` pairs by key (without ``--``); a flag alone is
    ``"true"``. The last of a repeated key wins, as in draccus."""
    values: dict[str, str] = {}
    i = 0
    while i < len(arguments):
        token = arguments[i]
        i += 1
        if not token.startswith("--"):
            continue
        key, eq, value = token[2:].partition("=")
        if not eq:
            if i < len(arguments) and not arguments[i].startswith("--"):
                value = arguments[i]
                i += 1
            else:
                value = "true"
        values[key] = value
    return values


def lerobot_arguments(arguments: Sequence[str], first_root: str | None) -> list[str]:
    """The arguments for ``lerobot-train``: ``arguments`` after refusing those that cannot
    apply to shards (``RefusedArgument`` naming the flag), with ``--dataset.streaming=true`` and,
    unless given or resumed from a config, a ``--dataset.repo_id`` named after ``first_root``."""
    given = parse(arguments)
    if first_root is None and given.get("resume", "false").lower() in FALSE:
        raise RefusedArgument("lerobot-shards train needs --shards (the converted datasets)")
    for key, why in REFUSED.items():
        if key in given:
            raise RefusedArgument(f"--{key} cannot apply to lerobot-shards train: {why}")
    if given.get("dataset.streaming", "true").lower() in FALSE:
        raise RefusedArgument(
            "--dataset.streaming=false cannot apply to lerobot-shards train: shards are streamed "
            "(the reader shuffles them, with every frame exactly once per epoch); leave it out"
        )
    target = given.get("job.target", "local")
    if target not in ("", "local"):
        raise RefusedArgument(
            f"--job.target={target} cannot apply to lerobot-shards train: a remote job would "
            "run LeRobot's trainer without the shards; run lerobot-shards train on the machine"
        )
    completed = [*arguments, "--dataset.streaming=true"]
    if "dataset.repo_id" not in given and "config_path" not in given:
        name = (first_root or "").rstrip("/").rsplit("/", 1)[-1] or "shards"
        completed.append(f"--dataset.repo_id=lerobot-shards/{name}")
    return completed
