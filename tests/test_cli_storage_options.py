"""``--storage-options`` (and convert's ``--dest-storage-options``) reach the filesystem of every
command that reads or writes a dataset, on an S3-compatible server on loopback.

The environment points clients straight at the server; the options point them at the recording
proxy in front of it instead, so a request the proxy saw is one made with the options given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lerobot_shards.cli import main


@pytest.fixture
def direct_by_default(s3_server, monkeypatch) -> None:
    """Clients without options reach the server directly, past the proxy."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.setenv(name, s3_server.direct_endpoint_url)


def run(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_every_command_reaches_s3_through_the_options(
    golden_dir: Path, s3_bucket, direct_by_default, tmp_path
):
    options = json.dumps(s3_bucket.storage_options)
    source = str(golden_dir / "av1_multifile")
    shards = s3_bucket.url("shards")
    run("convert", source, shards, "--workers", "0", "--no-progress",
        "--dest-storage-options", options)  # fmt: skip
    assert s3_bucket.proxy.requests("PUT", path_contains="/shards/")
    s3_bucket.server.direct_filesystem.put(source, f"{s3_bucket.name}/source", recursive=True)
    for command in [
        ["convert", s3_bucket.url("source"), str(tmp_path / "local"), "--workers", "0",
         "--no-progress"],
        ["inspect", shards],
        ["verify", shards],
        ["stream", shards, "--num-workers", "0", "--no-cache"],
        ["cache", "fill", shards, "--num-workers", "0", "--cache-dir", str(tmp_path / "cache")],
    ]:  # fmt: skip
        s3_bucket.proxy.clear()
        run(*command, "--storage-options", options)
        assert s3_bucket.proxy.requests("GET"), f"{command[0]} went past the options"
    s3_bucket.proxy.clear()
    run("inspect", shards)  # the control: without the options, past the proxy
    assert s3_bucket.proxy.log == []


def test_storage_options_must_be_a_json_object():
    result = CliRunner().invoke(main, ["inspect", "x", "--storage-options", "[1, 2]"])
    assert result.exit_code == 2
    assert "is not a JSON object" in result.output
    result = CliRunner().invoke(main, ["inspect", "x", "--storage-options", "{nope"])
    assert result.exit_code == 2 and "not JSON" in result.output
