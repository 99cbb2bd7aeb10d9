"""The cache folder's filesystem: a folder on NFS, Lustre, CIFS or a FUSE mount (a cluster's
home, often the default folder's) is warned about when a dataset opens its cache, with what to
do, since the cache's SQLite database in WAL mode is unsafe across hosts. The mounts are read
from ``/proc/self/mountinfo``; here a file written in its format stands in for it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.reader.fetch import cache_files
from lerobot_shards.reader.fetch.cache_files import network_filesystem


def mounts(monkeypatch, tmp_path: Path, *mounted: tuple[str, str]) -> None:
    """``/proc/self/mountinfo`` as it reads with ``/`` on ext4 and each ``(point, type)`` of
    ``mounted`` mounted over it, in order (each point made, as a mount point exists)."""
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    for n, (point, kind) in enumerate(mounted):
        Path(point).mkdir(parents=True, exist_ok=True)
        escaped = point.replace(" ", "\\040")
        lines.append(f"{30 + n} 22 0:{50 + n} / {escaped} rw,relatime - {kind} server:/x rw")
    info = tmp_path / "mountinfo"
    info.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(cache_files, "MOUNTINFO", info)


@pytest.mark.parametrize(
    ("mounted", "folder", "found"),
    [
        ([("/home", "nfs4")], "home/me/.cache/lerobot-shards", ("nfs4", "/home")),
        ([("/lustre", "lustre")], "lustre/scratch/cache", ("lustre", "/lustre")),
        ([("/mnt/share", "cifs")], "mnt/share/cache", ("cifs", "/mnt/share")),
        ([("/mnt/bucket", "fuse.s3fs")], "mnt/bucket/cache", ("fuse.s3fs", "/mnt/bucket")),
        ([("/mnt/my share", "nfs")], "mnt/my share/cache", ("nfs", "/mnt/my share")),
        ([("/home", "nfs4"), ("/home/me/scratch", "ext4")], "home/me/scratch/cache", None),
        ([("/home", "ext4"), ("/home", "nfs")], "home/me", ("nfs", "/home")),  # mounted over
        ([("/home", "nfs4")], "homework/cache", None),  # a prefix of the name is no parent
        ([("/", "fuse.fuse-overlayfs")], "tmp/cache", None),  # a container's root is local
        ([], "tmp/cache", None),
    ],
)
def test_the_filesystem_holding_a_folder(monkeypatch, tmp_path, mounted, folder, found):
    """The innermost mount holding the folder (its nearest existing parent, for a folder not
    made yet) decides. The folders are taken under ``tmp_path``, whose mounts are the fake's."""
    base = str(tmp_path)
    mounts(monkeypatch, tmp_path, *[(base + point, kind) for point, kind in mounted])
    (tmp_path / folder).parent.mkdir(parents=True, exist_ok=True)
    got = network_filesystem(tmp_path / folder)
    assert got == (None if found is None else (found[0], base + found[1]))


def test_unreadable_mounts_say_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(cache_files, "MOUNTINFO", tmp_path / "no-such-file")
    assert network_filesystem(tmp_path) is None


@pytest.mark.parametrize("kind", ["nfs4", "ext4"])
def test_a_cache_on_a_network_filesystem_is_warned_about(av1, monkeypatch, tmp_path, caplog, kind):
    """A dataset whose cache folder is on NFS warns, naming the folder, the mount and what to
    do; one on a local disk does not."""
    mounts(monkeypatch, tmp_path, (str(tmp_path / "home"), kind))
    folder = tmp_path / "home" / "me" / ".cache" / "lerobot-shards"
    with caplog.at_level(logging.WARNING, logger="lerobot_shards.reader.fetch"):
        ds = ShardedLeRobotDataset(str(av1), cache_dir=folder)
    assert ds.cache is not None
    warned = [r.getMessage() for r in caplog.records if "network filesystem" in r.getMessage()]
    if kind == "ext4":
        assert warned == []
        return
    assert len(warned) == 1, warned
    assert str(folder) in warned[0] and f"nfs4 at {tmp_path / 'home'}" in warned[0]
    assert "--cache-dir" in warned[0] and "local disk" in warned[0]
