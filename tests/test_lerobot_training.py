"""A LeRobot policy trained from ShardedLeRobotDataset the way LeRobot 0.6.1's lerobot_train.py
does it: meta, resolve_delta_timestamps, make_policy(ds_meta=ds.meta),
make_pre_post_processors(dataset_stats=ds.meta.stats), a DataLoader, uint8 frames to float as the
loop does, the preprocessor, forward, backward. The batch and the loss equal those from LeRobot's
own LeRobotDataset at the same indices; the loss goes down; a checkpoint mid-epoch resumes
exactly. Needs LeRobot (optional here): CI's LeRobot environment runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support.required import importorskip
from torch.utils.data import default_collate

lerobot = importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")
from lerobot.datasets.factory import resolve_delta_timestamps  # noqa: E402
from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402
from lerobot.policies.act.configuration_act import ACTConfig  # noqa: E402
from lerobot.policies.factory import make_policy, make_pre_post_processors  # noqa: E402

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset  # noqa: E402

AV1 = "av1_multifile"
BATCH = 8


def tiny_act() -> ACTConfig:
    return ACTConfig(
        chunk_size=4,
        n_action_steps=4,
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_decoder_layers=1,
        use_vae=False,
        dropout=0.0,
        pretrained_backbone_weights=None,
        device="cpu",
        push_to_hub=False,
    )


def as_training_loop(batch: dict, camera_keys: list[str]) -> dict:
    """What lerobot_train.py does to a batch before its preprocessor."""
    batch = dict(batch)
    for key in camera_keys:
        if key in batch and batch[key].dtype == torch.uint8:
            batch[key] = batch[key].to(dtype=torch.float32) / 255.0
    return batch


@pytest.fixture(scope="module")
def setup(av1):
    cfg = tiny_act()
    meta = ShardedLeRobotDataset(av1).meta
    delta_timestamps = resolve_delta_timestamps(cfg, meta)
    torch.manual_seed(0)
    policy = make_policy(cfg, ds_meta=meta)
    preprocessor, _ = make_pre_post_processors(cfg, dataset_stats=meta.stats)
    return delta_timestamps, policy, preprocessor


def sharded(av1, delta_timestamps) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(av1, delta_timestamps=delta_timestamps, return_uint8=True, seed=3)


def test_batch_and_loss_equal_lerobots_own(av1, golden_dir, setup):
    delta_timestamps, policy, preprocessor = setup
    ds = sharded(av1, delta_timestamps)
    batch = next(iter(ShardedDataLoader(ds, batch_size=BATCH, num_workers=2)))
    theirs_ds = LeRobotDataset(
        f"golden/{AV1}",
        root=golden_dir / AV1,
        delta_timestamps=delta_timestamps,
        video_backend="pyav",
        return_uint8=True,
    )
    theirs = default_collate([theirs_ds[i] for i in batch["index"].tolist()])
    assert set(batch) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), key
        else:
            assert batch[key] == value, key

    def loss_on(b: dict) -> torch.Tensor:
        torch.manual_seed(1)
        return policy.forward(preprocessor(as_training_loop(b, ds.meta.camera_keys)))[0]

    # The loss is a computed float. Our frames are channels_last and LeRobot's contiguous, and a
    # CPU may run other convolution kernels for each layout (an Intel Xeon with AVX-512 gave
    # 0.74200398 against 0.74200392). Made contiguous, our batch is the same bytes in the same
    # layout as LeRobot's, so the same kernels run on the same inputs: bit-equal is fair there.
    contiguous = {k: v.contiguous() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    ours, lerobots = loss_on(contiguous), loss_on(theirs)
    assert torch.isfinite(ours) and torch.equal(ours, lerobots)
    # As delivered (channels_last), the same loss up to float32 rounding of another summation
    # order (relative 1e-7 seen); a wrong frame or row is caught above, by the batch itself.
    assert torch.allclose(loss_on(batch), lerobots, rtol=1e-5, atol=0)


def test_loss_goes_down_and_a_checkpoint_resumes_exactly(av1, setup):
    delta_timestamps, policy, preprocessor = setup
    cameras = ShardedLeRobotDataset(av1).meta.camera_keys
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    loader = ShardedDataLoader(
        sharded(av1, delta_timestamps), batch_size=BATCH, num_workers=2, persistent_workers=True
    )
    fixed = as_training_loop(next(iter(loader)), cameras)

    def loss_on_fixed() -> float:
        with torch.no_grad():
            return float(policy.forward(preprocessor(dict(fixed)))[0])

    before = loss_on_fixed()
    steps, state, after_state = 0, None, []
    while steps < 30:
        for batch in loader:
            loss, _ = policy.forward(preprocessor(as_training_loop(batch, cameras)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == 13:  # mid-epoch (10 batches an epoch): checkpoint
                state = loader.state_dict()
            elif state is not None and len(after_state) < 4:
                after_state.append(batch)
    assert loss_on_fixed() < 0.8 * before
    assert state is not None and state["offset"] % BATCH == 0 and 0 < state["offset"] < 74
    resumed = ShardedDataLoader(sharded(av1, delta_timestamps), batch_size=BATCH, num_workers=2)
    resumed.load_state_dict(state)
    resumed_batches = []
    for batch in resumed:
        resumed_batches.append(batch)
        if len(resumed_batches) == len(after_state):
            break
    assert len(after_state) == 4
    for ours, theirs in zip(resumed_batches, after_state, strict=True):
        for key, value in theirs.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(ours[key], value), key
            else:
                assert ours[key] == value, key


EXAMPLE = Path(__file__).parent.parent / "examples" / "train_lerobot_policy.py"


def run(*cmd: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env)
    assert result.returncode == 0, f"{cmd} failed\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.slow
def test_the_example_trains_checkpoints_resumes_and_runs_under_torchrun(av1, tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    common = ["--batch-size", "8", "--save-every", "5", "--checkpoint", str(checkpoint)]
    out = run(sys.executable, str(EXAMPLE), str(av1), "--steps", "10", *common)
    assert "step 10: loss" in out and "done at step 10" in out
    out = run(sys.executable, str(EXAMPLE), str(av1), "--steps", "20", *common)
    assert "resumed at step 10" in out and "done at step 20" in out
    out = run(  # 2 ranks resume the 1-rank checkpoint (an elastic resume)
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(EXAMPLE),
        str(av1),
        "--steps",
        "26",
        *common,
    )
    assert "resumed at step 20" in out and "done at step 26" in out


def test_a_mixture_trains_with_its_aggregated_stats_and_items_equal_lerobots_own(
    av1, shards, golden_dir
):
    """A weighted mixture of a video and an image dataset: make_policy and the processors take
    its meta (stats aggregated over both), each row of a batch equals LeRobot's own item of its
    dataset, and training steps run."""
    from lerobot.datasets.compute_stats import aggregate_stats

    image = shards("image")
    cfg = tiny_act()
    mixture = ShardedLeRobotDataset([av1, image], weights=[1, 1], seed=2)
    delta_timestamps = resolve_delta_timestamps(cfg, mixture.meta)
    mixture = ShardedLeRobotDataset(
        [av1, image], weights=[1, 1], delta_timestamps=delta_timestamps, seed=2
    )
    own = [
        LeRobotDataset(
            f"golden/{name}",
            root=golden_dir / name,
            delta_timestamps=delta_timestamps,
            video_backend="pyav",
        )
        for name in (AV1, "image")
    ]
    expected_stats = aggregate_stats([ds.meta.stats for ds in own])
    for key, stats in expected_stats.items():
        for name, value in stats.items():
            assert torch.equal(
                torch.as_tensor(mixture.meta.stats[key][name]), torch.as_tensor(value)
            )
    torch.manual_seed(0)
    policy = make_policy(cfg, ds_meta=mixture.meta)
    preprocessor, _ = make_pre_post_processors(cfg, dataset_stats=mixture.meta.stats)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
    loader = ShardedDataLoader(mixture, batch_size=BATCH, num_workers=2)
    sources = set()
    for step, batch in enumerate(loader):
        for row, (d, index) in enumerate(
            zip(batch["dataset_index"].tolist(), batch["index"].tolist(), strict=True)
        ):
            sources.add(d)
            theirs = own[d][index]
            for key, value in theirs.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(batch[key][row], value), (d, index, key)
                else:
                    assert batch[key][row] == value, (d, index, key)
        loss, _ = policy.forward(preprocessor(as_training_loop(batch, mixture.meta.camera_keys)))
        assert torch.isfinite(loss)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 3:
            break
    assert sources == {0, 1}
