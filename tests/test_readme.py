"""The README's tour and every Python snippet of the guides in docs/ run as a user pastes them,
on the data ``bash scripts/demo.sh`` leaves: ``demo-output/lerobot``, the demo's sample LeRobot
dataset (made here by the demo's own ``make_demo_dataset``), and ``demo-output/shards``, its
conversion.

The README's shell lines run in one folder with this environment's ``lerobot-shards`` first on
``PATH``: its setup lines (``bash scripts/...``, ``source .venv/bin/activate``) are this
environment, and a line of LeRobot 0.6.1's environment (``.venv-lerobot/bin/...``) runs in a
test of its own there. Python snippets run saved as plain scripts (no ``if __name__ ==
"__main__":`` guard) with ``python`` in that folder, page after page in ``PAGES``' order, each
page's code in its order. The one edit is the S3 endpoint, the test server's in place of the
guide's example host (the bucket ``my-bucket`` holds what the tour converted). A page with
Python snippets that is not in ``PAGES`` fails the test, so a new guide's code cannot go
untested.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.required import importorskip

from lerobot_shards import convert
from lerobot_shards.demo import make_demo_dataset

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
# The pages whose snippets run, in this order: the README's tour makes shards/demo.
PAGES = [
    "README.md",
    "docs/converting.md",
    "docs/streaming.md",
    "docs/checkpoints.md",
    "docs/mixtures.md",
    "docs/storage.md",
]
# Code that cannot run here, by a string it holds, and why.
NOT_RUN = {
    'executor="ray"': "reads the Hub on a Ray cluster; tests/test_ray.py converts on Ray",
    "mkdocs serve": "serves the site until stopped; scripts/test.sh builds it",
}
SETUP = ("bash scripts/", "source .venv/bin/activate")
"""Shell lines that make the environment these tests run in."""
LEROBOT_ENV = ".venv-lerobot/bin/"
BIN = Path(sys.executable).parent


def code_blocks(page: str, languages: tuple[str, ...] = ("python",)) -> list[tuple[int, str, str]]:
    """(line number, language, code) of each fenced block of a page in ``languages``."""
    text = (ROOT / page).read_text()
    return [
        (text.count("\n", 0, m.start()) + 2, m.group(1), m.group(2))
        for m in re.finditer(r"^```(\w+)\n(.*?)^```", text, re.S | re.M)
        if m.group(1) in languages
    ]


def python_snippets(page: str) -> list[tuple[int, str]]:
    """(line number, code) of each ```python block of a page."""
    return [(line, code) for line, _, code in code_blocks(page)]


def shell_lines(code: str) -> list[str]:
    """A shell block's commands, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def steps_to_run() -> list[tuple[str, int, str, str]]:
    """(page, line number, language, code) of everything that runs here, in order: the README's
    shell lines (but its first block, the two commands that make the environment, and the
    setup and LeRobot-environment lines) and Python snippets, then the guides' snippets."""
    steps = []
    for page in PAGES:
        languages = ("python", "bash") if page == "README.md" else ("python",)
        blocks = code_blocks(page, languages)
        if page == "README.md":
            blocks = blocks[1:]  # bash scripts/demo.sh and bash scripts/test.sh
        for line, language, code in blocks:
            if any(marker in code for marker in NOT_RUN):
                continue
            if language == "python":
                steps.append((page, line, language, code))
                continue
            for command in shell_lines(code):
                if not command.startswith(SETUP) and not command.startswith(LEROBOT_ENV):
                    steps.append((page, line, language, command))
    return steps


def lerobot_env_lines() -> list[str]:
    """The README's shell lines of LeRobot 0.6.1's environment."""
    return [
        command
        for _, _, code in code_blocks("README.md", ("bash",))
        for command in shell_lines(code)
        if command.startswith(LEROBOT_ENV)
    ]


@pytest.fixture
def users_folder(tmp_path, s3_server) -> Path:
    """A folder holding what ``bash scripts/demo.sh`` leaves: the demo's sample dataset and its
    conversion; and an S3 bucket ``my-bucket``."""
    make_demo_dataset(tmp_path / "demo-output/lerobot")
    convert(str(tmp_path / "demo-output/lerobot"), str(tmp_path / "demo-output/shards"),
            workers=0, progress=False)  # fmt: skip
    s3_server.direct_filesystem.call_s3("create_bucket", Bucket="my-bucket")
    return tmp_path


def run_step(folder: Path, n: int, page: str, line: int, language: str, code: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}:{os.environ['PATH']}"}
    if language == "python":
        script = folder / f"snippet_{n}.py"
        script.write_text(code)
        command = [sys.executable, script.name]
    else:
        command = ["bash", "-c", code]
    result = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (
        f"{page} line {line}: failed as pasted\n{code}\n{result.stdout[-2000:]}\n"
        f"{result.stderr[-3000:]}"
    )


def test_the_readme_is_a_front_page():
    assert len(README.read_bytes()) <= 10_000
    text = README.read_text()
    assert "bash scripts/demo.sh" in text
    assert "bash scripts/test.sh" in text


HISTORY = re.compile(
    r"version(s)? (before|ago)|the version before|previous version|earlier version|"
    r"\bmain's\b|\bthe issue's\b|before this change|\bbound (then|now)\b|"
    r"\bno longer\b|\bused to\b",
    re.I,
)
"""How a page speaks of the code's history rather than of the code (CHANGELOG.md's job)."""


def test_user_pages_speak_of_the_software_not_its_history():
    pages = [README, *sorted(ROOT.glob("docs/**/*.md"))]
    found = [
        f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m[0]!r}"
        for page in pages
        for text in [page.read_text()]
        for m in HISTORY.finditer(text)
    ]
    assert not found, "history belongs in CHANGELOG.md:\n" + "\n".join(found)


def test_every_page_with_python_snippets_is_run():
    pages = ["README.md", *(str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("docs/**/*.md")))]
    assert {page for page in pages if python_snippets(page)} == set(PAGES)


def test_the_pages_have_the_steps_this_test_prepares_for():
    steps = steps_to_run()
    readme = [code for page, _, _, code in steps if page == "README.md"]
    assert readme[:2] == [
        "lerobot-shards convert demo-output/lerobot shards/demo --workers 2",
        "lerobot-shards inspect shards/demo",
    ]
    codes = [code for _, _, _, code in steps]
    assert sum("https://s3.example.com" in code for code in codes) == 1
    assert sum('"ckpt.pt"' in code for code in codes) == 1
    assert len(python_snippets("docs/converting.md")) == 2  # one is Ray's
    assert [line.split()[0] for line in lerobot_env_lines()] == [f"{LEROBOT_ENV}lerobot-shards"]


def test_the_tour_and_the_guides_run_as_pasted(users_folder, s3_server):
    for n, (page, line, language, code) in enumerate(steps_to_run()):
        if "s3://my-bucket/" in code:  # the bucket holds what the tour converted
            s3_server.direct_filesystem.put(
                str(users_folder / "shards/demo"), "my-bucket/shards/demo", recursive=True
            )
            code = code.replace("https://s3.example.com", s3_server.endpoint_url)
        run_step(users_folder, n, page, line, language, code)
    assert (users_folder / "shards/demo/index.json").exists()
    assert (users_folder / "ckpt.pt").exists()


@pytest.mark.slow
def test_the_readmes_training_runs_in_lerobots_environment(request):
    """The tour's ``lerobot-shards train`` line, in LeRobot 0.6.1's environment (CI's
    .venv-lerobot run), on the shards the tour's convert line makes."""
    importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")
    users_folder = request.getfixturevalue("users_folder")
    steps = [s for s in steps_to_run() if s[0] == "README.md" and s[2] == "bash"]
    for n, (page, line, language, code) in enumerate(steps[:1]):  # the convert line
        run_step(users_folder, n, page, line, language, code)
    for command in lerobot_env_lines():
        run_step(users_folder, 99, "README.md", 0, "bash", command.replace(LEROBOT_ENV, ""))
    checkpoints = users_folder / "outputs/act_demo/checkpoints"
    assert (checkpoints / "last").exists(), sorted(users_folder.rglob("*"))[:50]
