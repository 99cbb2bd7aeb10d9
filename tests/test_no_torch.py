"""Converting, inspecting and verifying need no torch: they neither import it nor need it there.

Importing torch took most of the command line's start-up, and a conversion machine (a CPU box,
a Ray cluster) may not have it installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lerobot_shards.testing.factory import make_dataset

CLI = [sys.executable, "-m", "lerobot_shards.cli"]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_dataset(
        tmp_path_factory.mktemp("src") / "ds",
        episode_lengths=[4, 2, 5],
        cameras={"observation.images.cam": (24, 32)},
    )


def test_commands_import_no_torch(source: Path, tmp_path: Path):
    """Each command, run in this interpreter as the console script runs it, leaves torch out of
    ``sys.modules`` (torch is installed here)."""
    dest = tmp_path / "out"
    script = f"""
import json, sys
from click.testing import CliRunner
from lerobot_shards.cli import main
seen = {{}}
for args in (["convert", {str(source)!r}, {str(dest)!r}, "--workers", "0"],
             ["inspect", {str(dest)!r}], ["verify", "--deep", {str(dest)!r}]):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    seen[args[0]] = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen == {"convert": [], "inspect": [], "verify": []}
    import torch  # noqa: F401  (the check above means something only where torch imports)


def test_commands_work_where_torch_is_not_installed(source: Path, tmp_path: Path):
    """With an importable ``torch`` that fails (as if not installed) first on the path of every
    process, pool workers included, the commands still succeed."""
    blocker = tmp_path / "no-torch" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("torch is not installed here")\n')
    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    probe = subprocess.run(
        [sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True
    )
    assert "torch is not installed here" in probe.stderr
    dest = tmp_path / "out"
    outputs = {}
    for args in (
        ["convert", str(source), str(dest), "--workers", "2", "--no-progress"],
        ["inspect", str(dest)],
        ["verify", "--deep", str(dest)],
    ):
        result = subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, (args[0], result.stderr)
        outputs[args[0]] = result.stdout
    assert "3 episodes (3 converted, 0 already done), 11 frames" in outputs["convert"]
    assert "episodes: 3" in outputs["inspect"]
    assert outputs["verify"].strip().endswith(": ok")
