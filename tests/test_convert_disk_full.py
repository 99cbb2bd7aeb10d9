"""A destination that runs out of space: a clear error, nothing half-written counted as done,
and once space is freed the rerun finishes into the bytes of a clean conversion.

The destination is a small tmpfs mounted for the test in a mount namespace of its own
(``unshare -rm``: no root needed where user namespaces are allowed); it starts nearly full
(a filler file) and the filler is deleted to free space. Everything that must see the mount
runs inside the namespace, in one script, and reports back as JSON.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lerobot_shards import convert

AV1 = "av1_multifile"

SCENARIO = textwrap.dedent(
    """
    import json, os, subprocess, sys
    from pathlib import Path
    import fsspec
    from lerobot_shards.converter.job import read_records
    from lerobot_shards.converter.resume import finished_rows

    src, mnt, free, clean, report = sys.argv[1:6]
    free = int(free)
    stat = os.statvfs(mnt)
    filler = Path(mnt) / "filler"
    filler.write_bytes(bytes(stat.f_bavail * stat.f_frsize - free))
    dest = Path(mnt) / "out"
    cli = [sys.executable, "-m", "lerobot_shards.cli"]
    argv = [*cli, "convert", src, str(dest), "--workers", "0", "--no-progress"]
    out = {"full": subprocess.run(argv, capture_output=True, text=True).__dict__}
    fs = fsspec.filesystem("file")
    records = read_records(fs, str(dest))
    out["records"] = len(records)
    out["intact_records"] = len(finished_rows(fs, str(dest), sorted(records)))
    out["temp_files"] = [str(p) for p in dest.rglob("*.tmp")]
    out["index_exists"] = (dest / "index.json").exists()
    filler.unlink()
    out["rerun"] = subprocess.run(argv, capture_output=True, text=True).__dict__
    out["verify"] = subprocess.run([*cli, "verify", str(dest), "--deep"],
                                   capture_output=True, text=True).__dict__
    files = lambda root: {p.relative_to(root).as_posix(): p.read_bytes().hex()
                          for p in sorted(Path(root).rglob("*")) if p.is_file()
                          and not p.relative_to(root).as_posix().startswith(".convert/")}
    out["identical"] = files(dest) == files(clean)
    for run in ("full", "rerun", "verify"):
        out[run] = {k: out[run][k] for k in ("returncode", "stdout", "stderr")}
    Path(report).write_text(json.dumps(out))
    """
)


def _namespace_mounts() -> str | None:
    """Why a tmpfs cannot be mounted in a new mount namespace here, or None if it can."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
        capture_output=True, text=True,
    )  # fmt: skip
    return None if probe.returncode == 0 else f"unshare -rm + mount tmpfs: {probe.stderr.strip()}"


def test_disk_full_fails_clearly_and_the_rerun_completes(golden_dir: Path, tmp_path: Path):
    reason = _namespace_mounts()
    if reason:
        pytest.skip(f"cannot mount a small filesystem for the test: {reason}")
    src = golden_dir / AV1
    clean = tmp_path / "clean"
    convert(str(src), str(clean), workers=0, progress=False)
    shard_bytes = sum(p.stat().st_size for p in clean.glob("shards/*/*.tar"))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    report = tmp_path / "report.json"
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    # Room for about half the shards (tmpfs counts whole pages): the conversion runs out.
    free = (shard_bytes // 2) // 4096 * 4096
    inner = (
        f"mount -t tmpfs -o size={8 * shard_bytes // 1024 + 64}k tmpfs {mnt} && "
        f"{sys.executable} {script} {src} {mnt} {free} {clean} {report}"
    )
    subprocess.run(["unshare", "-rm", "sh", "-c", inner], check=True, timeout=600)
    out = json.loads(report.read_text())

    full = out["full"]
    assert full["returncode"] == 1, full
    message = " ".join(full["stderr"].split())
    assert f"{mnt}/out: no space left on device" in message, message
    assert "free some space and rerun" in message
    assert "Traceback" not in full["stderr"]
    assert 0 < out["records"] < 6, "the filesystem was not small enough, or far too small"
    assert out["intact_records"] == out["records"], "a partial shard was recorded as done"
    assert out["temp_files"] == []
    assert not out["index_exists"]

    rerun = out["rerun"]
    assert rerun["returncode"] == 0, rerun
    done = out["records"]
    assert f"6 episodes ({6 - done} converted, {done} already done)" in rerun["stdout"]
    assert out["verify"]["returncode"] == 0, out["verify"]
    assert out["identical"]
