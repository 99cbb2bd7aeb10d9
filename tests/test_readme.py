"""Every Python snippet of the README and the guides in docs/ runs as a user pastes it: saved as a
plain script (no ``if __name__ == "__main__":`` guard), run with ``python`` in one folder, page
after page in ``PAGES``' order, each page's snippets in its order.

The folder holds what the snippets name: a LeRobot dataset at ``path/to/lerobot_dataset`` (the
README's convert snippet makes ``shards/aloha`` of it), two more converted datasets for the
mixture, and an S3 bucket ``my-bucket`` on the test's loopback server. The one edit is the S3
endpoint, the test server's in place of the guide's example host. A page with Python snippets
that is not in ``PAGES`` fails the test, so a new guide's code cannot go untested.
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

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
# The pages whose snippets run, in this order: the README's convert snippet makes shards/aloha.
PAGES = [
    "README.md",
    "docs/converting.md",
    "docs/streaming.md",
    "docs/checkpoints.md",
    "docs/mixtures.md",
    "docs/embodiments.md",
    "docs/storage.md",
]
# Snippets that cannot run here, by a string they hold, and why.
NOT_RUN = {
    'executor="ray"': "reads the Hub on a Ray cluster; tests/test_ray.py converts on Ray",
}
CAM_HIGH = {"observation.images.cam_high": (24, 32)}
ROBOTS = {  # docs/embodiments.md's robots, small: (cameras, joints, fps, robot_type)
    "so100": (["laptop", "phone"], 6, 30, "so100"),
    "aloha": (["cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"], 14, 50, "aloha"),
    "pusht": ([None], 2, 10, ""),
}


def python_snippets(page: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of a page."""
    text = (ROOT / page).read_text()
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(1))
        for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


def snippets_to_run() -> list[tuple[str, int, str]]:
    """(page, line number, code) of every snippet that runs here, in order."""
    return [
        (page, line, code)
        for page in PAGES
        for line, code in python_snippets(page)
        if not any(marker in code for marker in NOT_RUN)
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
    for name, (cameras, joints, fps, robot) in ROBOTS.items():
        keys = [f"observation.images.{c}" if c else "observation.image" for c in cameras]
        names = [f"joint_{j}" for j in range(joints)]
        make_dataset(
            tmp_path / "robot-sources" / name, episode_lengths=[8] * 3, fps=fps, robot_type=robot,
            cameras=dict.fromkeys(keys, (24, 32)), state_names=names, action_names=names,
        )  # fmt: skip
        source = tmp_path / "robot-sources" / name
        convert(str(source), str(tmp_path / "robots" / name), progress=False)
    s3_server.direct_filesystem.call_s3("create_bucket", Bucket="my-bucket")
    return tmp_path


def test_the_readme_is_a_front_page():
    assert len(README.read_bytes()) <= 10_000
    text = README.read_text()
    assert "bash scripts/demo.sh" in text
    assert "bash scripts/test.sh" in text


def test_every_page_with_python_snippets_is_run():
    pages = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("docs/**/*.md")))]
    assert {page for page in pages if python_snippets(page)} == set(PAGES)


def test_the_pages_have_the_snippets_this_test_prepares_for():
    codes = [code for _, _, code in snippets_to_run()]
    assert len(codes) == 9
    assert 'convert("path/to/lerobot_dataset", "shards/aloha", workers=2)' in codes[0]
    assert sum("https://s3.example.com" in code for code in codes) == 1
    assert sum('"ckpt.pt"' in code for code in codes) == 1
    assert len([c for _, c in python_snippets("docs/converting.md")]) == 2  # one is Ray's


def test_every_python_snippet_runs_as_a_plain_script(users_folder, s3_server):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for n, (page, line, code) in enumerate(snippets_to_run()):
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
            f"{page} line {line}: the snippet failed as a script\n{code}\n{result.stderr[-3000:]}"
        )
    assert (users_folder / "shards/aloha/index.json").exists()
    assert (users_folder / "ckpt.pt").exists()
