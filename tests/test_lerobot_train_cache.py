"""``lerobot-shards train --cache-dir`` with LeRobot 0.6.1's own trainer, shards on a real
S3-compatible server behind the counting proxy: the first run downloads each episode once, and
a run resumed from its checkpoint reads the warm cache, downloading no shard again. Needs LeRobot
with its training extra (CI's LeRobot env)."""

from __future__ import annotations

import json
from pathlib import Path

import fsspec
from support.required import importorskip
from test_lerobot_train import GOLDEN_FRAMES, TINY_ACT, flat, train

import lerobot_shards
from lerobot_shards.format import MANIFEST_FILE
from lerobot_shards.validate import read_manifest

importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")
importorskip("accelerate", reason="lerobot[training] is optional; CI's LeRobot env runs this")


def test_a_resumed_run_reads_the_warm_cache(golden_dir: Path, s3_server, tmp_path: Path):
    from support.s3 import S3Bucket

    s3_server.proxy.set_faults(0.0)
    bucket = S3Bucket(s3_server, s3_server.new_bucket("train-cache"))
    url = bucket.url("av1")
    lerobot_shards.convert(
        str(golden_dir / "av1_multifile"), url, dest_storage_options=bucket.storage_options,
        workers=0, progress=False,
    )  # fmt: skip
    manifest = read_manifest(
        fsspec.filesystem("s3", **bucket.storage_options), f"{bucket.name}/av1/{MANIFEST_FILE}"
    )
    total = int(manifest.column("size").to_numpy().sum())
    shards = f"/{bucket.name}/av1/shards/"
    cache = tmp_path / "cache"
    out = tmp_path / "out"
    options = json.dumps(bucket.storage_options)

    s3_server.proxy.clear()
    (steps,), _ = train(
        tmp_path, "--shards", url, "--storage-options", options, "--cache-dir", str(cache),
        *TINY_ACT, "--steps=12", "--num_workers=1", "--save_freq=10", f"--output_dir={out}",
    )  # fmt: skip
    assert sorted(flat(steps[:10])) == list(range(GOLDEN_FRAMES))  # epoch 0, then on
    assert s3_server.proxy.body_bytes("GET", path_contains=shards) == total

    s3_server.proxy.clear()
    config = out / "checkpoints/000010/pretrained_model/train_config.json"
    (resumed,), _ = train(  # no --shards: the checkpoint names them, and the cache
        tmp_path, "--resume=true", f"--config_path={config}", "--steps=20",
        f"--output_dir={tmp_path / 'resumed'}",
    )  # fmt: skip
    assert len(resumed) == 10 and resumed[:2] == steps[10:12]
    assert s3_server.proxy.body_bytes("GET", path_contains=shards) == 0
