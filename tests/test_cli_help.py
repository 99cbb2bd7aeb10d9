"""Every command's --help says what each option does and its default, one meaning per option
name across commands, and the defaults that the command line shares with the Python API are
the same values."""

from __future__ import annotations

import inspect

import click
import pytest

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset, convert
from lerobot_shards.cli import main


def commands(group: click.Group = main, prefix: str = "") -> dict[str, click.Command]:
    """Every command of the CLI by its full name (``cache fill``), groups included."""
    found: dict[str, click.Command] = {prefix.strip() or "lerobot-shards": group}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found.update(commands(command, f"{prefix}{name} "))
        else:
            found[f"{prefix}{name}"] = command
    return found


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def help_text(command: click.Command, option: click.Option) -> str:
    """The option's line in ``--help``, as click prints it."""
    record = option.get_help_record(click.Context(command))
    return "" if record is None else record[1]


ALL = [(name, option.name) for name, c in commands().items() for option in options(c)]


@pytest.mark.parametrize(("command", "option"), ALL)
def test_every_option_says_what_it_does_and_its_default(command, option):
    """A flag that is off unless given needs no default; any other option shows one."""
    cmd = commands()[command]
    opt = next(o for o in options(cmd) if o.name == option)
    text = help_text(cmd, opt)
    assert opt.help, f"{command} {opt.opts[0]} has no help"
    single_flag = opt.is_flag and not opt.secondary_opts
    if not single_flag and opt.name not in ("help", "version"):
        assert "[default: " in text, f"{command} {opt.opts[0]}'s --help shows no default: {text}"


def test_one_meaning_per_option_name():
    """An option name means one thing on every command that takes it: the same help text
    (``--workers`` counts converter processes; DataLoader workers are ``--num-workers``)."""
    meanings: dict[str, dict[str, list[str]]] = {}
    for name, command in commands().items():
        for opt in options(command):
            meanings.setdefault(opt.opts[0], {}).setdefault(opt.help or "", []).append(name)
    several = {opt: by_help for opt, by_help in meanings.items() if len(by_help) > 1}
    assert not several, several
    assert "converter processes" in next(iter(meanings["--workers"])).lower()
    assert "dataloader worker" in next(iter(meanings["--num-workers"])).lower()


READS_A_DATASET = ["convert", "inspect", "verify", "stream", "train", "cache fill"]


@pytest.mark.parametrize("command", READS_A_DATASET)
def test_every_command_that_reads_a_dataset_takes_storage_options(command):
    names = {o.opts[0] for o in options(commands()[command])}
    assert "--storage-options" in names
    if command == "convert":
        assert "--dest-storage-options" in names


def default_of(command: str, option: str) -> object:
    opt = next(o for o in options(commands()[command]) if o.opts[0] == option)
    return opt.default


PYTHON_DEFAULTS = [
    ("stream", "--uint8", "return_uint8"),
    ("stream", "--buffer-size", "buffer_size"),
    ("stream", "--byte-budget-gb", "byte_budget_gb"),
    ("stream", "--seed", "seed"),
    ("stream", "--decode-threads", "decode_threads"),
    ("stream", "--cache", "cache"),
    ("stream", "--cache-dir", "cache_dir"),
    ("stream", "--cache-limit-gb", "cache_limit_gb"),
    ("stream", "--node-affinity", "node_affinity"),
    ("train", "--buffer-size", "buffer_size"),
    ("cache fill", "--buffer-size", "buffer_size"),
    ("cache fill", "--seed", "seed"),
]


@pytest.mark.parametrize(("command", "option", "parameter"), PYTHON_DEFAULTS)
def test_the_command_line_defaults_are_the_python_ones(command, option, parameter):
    """One set of defaults: an option that sets a ``ShardedLeRobotDataset`` parameter defaults
    to the parameter's default (``--uint8/--float``: float32, as LeRobot's LeRobotDataset)."""
    python = inspect.signature(ShardedLeRobotDataset).parameters[parameter].default
    cli = default_of(command, option)
    assert cli == python or (cli is click.core.UNSET and python is None), (cli, python)


def test_the_loaders_default_is_the_python_one():
    """``stream --mixed-batches`` (the default) sets ``ShardedDataLoader``'s ``mixed_batches``."""
    python = inspect.signature(ShardedDataLoader).parameters["mixed_batches"].default
    assert default_of("stream", "--mixed-batches") is python


def test_convert_defaults_are_the_python_ones():
    python = inspect.signature(convert).parameters
    assert default_of("convert", "--executor") == python["executor"].default
    given = commands()["convert"].make_context("convert", ["source", "dest"]).params
    for flag in ("strict", "decode_check", "trust_finished", "overwrite"):
        assert given[flag] is python[flag].default, flag  # off unless given, as in Python
    for option in ("--workers", "--ray-address", "--max-in-flight", "--episodes"):
        assert default_of("convert", option) in (None, click.core.UNSET)
        assert python[option.lstrip("-").replace("-", "_")].default is None
