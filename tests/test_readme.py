"""Every Python snippet of the README runs as a user pastes it: saved as a plain script (no
``if __name__ == "__main__":`` guard), run with ``python`` in one folder, in the README's order.

The folder holds what the snippets name: a LeRobot dataset at ``path/to/lerobot_dataset`` (the
convert snippet makes ``shards/aloha`` of it), two more converted datasets for the mixture, and
an S3 bucket ``my-bucket`` on the test's loopback server. The one edit is the S3 endpoint, the
test server's in place of the README's example host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lerobot_shards import convert
from lerobot_shards.testing.factory import make_dataset

README = Path(__file__).parent.parent / "README.md"
CAM_HIGH = {"observation.images.cam_high": (24, 32)}


def python_snippets() -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of the README."""
    text = README.read_text()
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


@pytest.fixture
def users_folder(tmp_path, s3_server) -> Path:
    """A folder holding what the README's snippets name."""
    make_dataset(tmp_path / "path/to/lerobot_dataset", episode_lengths=[20] * 12, cameras=CAM_HIGH)
    for name, lengths, cameras in [
        ("koch", [15] * 4, CAM_HIGH),
        ("so100", [3] * 60, {"observation.images.top": (24, 32)}),
    ]:
        make_dataset(tmp_path / "sources" / name, episode_lengths=lengths, cameras=cameras)
        convert(str(tmp_path / "sources" / name), str(tmp_path / "shards" / name), progress=False)
    s3_server.direct_filesystem.call_s3("create_bucket", Bucket="my-bucket")
    return tmp_path


def test_the_readme_has_the_snippets_this_test_prepares_for():
    codes = [code for _, code in python_snippets()]
    assert len(codes) == 6
    assert 'convert("path/to/lerobot_dataset", "shards/aloha", workers=2)' in codes[0]
    assert "https://s3.example.com" in codes[4]


def test_every_python_snippet_runs_as_a_plain_script(users_folder, s3_server):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for n, (line, code) in enumerate(python_snippets()):
        if "s3://my-bucket/" in code:  # the bucket holds what the convert snippet made
            s3_server.direct_filesystem.put(
                str(users_folder / "shards/aloha"), "my-bucket/shards/aloha", recursive=True
            )
            code = code.replace("https://s3.example.com", s3_server.endpoint_url)
        script = users_folder / f"snippet_{n}.py"
        script.write_text(code)
        result = subprocess.run(
            [sys.executable, script.name],
            cwd=users_folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, (
            f"README line {line}: the snippet failed as a script\n{code}\n{result.stderr[-3000:]}"
        )
    assert (users_folder / "shards/aloha/index.json").exists()
    assert (users_folder / "ckpt.pt").exists()
