"""``lerobot-shards train``: LeRobot 0.6.1's own trainer (``lerobot.scripts.lerobot_train``), on
the CPU, as real processes (plain, ``torchrun``, ``accelerate launch``; gloo), recording per
step what ``update_policy`` received (``support/train_recorder.py``). Coverage is checked
against the golden datasets' frame counts, never against the reader: every frame exactly once
per epoch across ranks, new orders each epoch, a run killed after a checkpoint resumed with
``--resume=true`` consuming what the uninterrupted run consumed (on 2 processes, and the rest of
that epoch on 1), a diffusion policy, a weighted mixture, LeRobot's eval split (the frames
trained on and evaluated against LeRobot's own split), the camera frames the policy is fed
against LeRobot's recorded items (equal untransformed, changed by
``--dataset.image_transforms.*``), every reader option and LeRobot dataset setting reaching the
reader, refusals. Needs LeRobot with its training extra (CI's LeRobot env)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.required import importorskip

from lerobot_shards import ShardedLeRobotDataset

importorskip("lerobot", reason="LeRobot is optional; CI's LeRobot env runs this")
importorskip("accelerate", reason="lerobot[training] is optional; CI's LeRobot env runs this")

RECORDER = Path(__file__).parent / "support" / "train_recorder.py"
BIN = Path(sys.executable).parent
GOLDEN_FRAMES = 74  # av1_multifile and v21_video, by their meta/info.json
CAMERAS = ["observation.images.cam_high", "observation.images.cam_left_wrist"]
BATCH = 8
TINY_ACT = [
    "--policy.type=act",
    "--policy.dim_model=32",
    "--policy.n_heads=2",
    "--policy.dim_feedforward=64",
    "--policy.n_encoder_layers=1",
    "--policy.n_decoder_layers=1",
    "--policy.use_vae=false",
    "--policy.pretrained_backbone_weights=null",
    "--policy.chunk_size=4",
    "--policy.n_action_steps=4",
    "--policy.device=cpu",
    "--policy.push_to_hub=false",
    "--wandb.enable=false",
    f"--batch_size={BATCH}",
    "--log_freq=5",
]
LAUNCHERS = {
    1: [sys.executable],
    "torchrun": [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2"],
    # accelerate's --cpu launches one process; --multi_gpu runs torchrun's launcher, and
    # --policy.device=cpu makes LeRobot's Accelerator use the CPU (gloo) in each process.
    "accelerate": [
        str(BIN / "accelerate"),
        "launch",
        "--multi_gpu",
        "--num_processes=2",
        "--num_machines=1",
        "--mixed_precision=no",
        "--dynamo_backend=no",
    ],
}


def train(
    workdir: Path, *args: str, launcher: int | str = 1, kill_at: int = 0, check: bool = True
) -> tuple[list[list[dict]], subprocess.CompletedProcess]:
    """Run the recorder under ``launcher``; returns each rank's records (one per step)."""
    records = workdir / f"records-{len(list(workdir.glob('records-*')))}"
    records.mkdir(parents=True)
    env = {**os.environ, "RECORD_DIR": str(records), "KILL_AT_STEP": str(kill_at)}
    proc = subprocess.run(
        [*LAUNCHERS[launcher], str(RECORDER), *args],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
    ranks = sorted(records.glob("rank-*.jsonl"))
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in ranks], proc


def epochs_of(steps: list[dict], samples_per_epoch: int) -> list[list[int]]:
    """One rank's indices cut into epochs of ``samples_per_epoch`` (batches never straddle:
    the last batch of an epoch is short)."""
    epochs: list[list[int]] = [[]]
    for step in steps:
        if len(epochs[-1]) == samples_per_epoch:
            epochs.append([])
        epochs[-1].extend(step["index"])
        assert len(epochs[-1]) <= samples_per_epoch, "a batch straddles an epoch"
    return epochs


def flat(steps: list[dict]) -> list[int]:
    return [i for step in steps for i in step["index"]]


def last_records(workdir: Path) -> Path:
    """The records folder of the last run in ``workdir``."""
    return max(workdir.glob("records-*"), key=lambda path: int(path.name.split("-")[1]))


def datasets_of(workdir: Path) -> dict:
    """The readers the last run built (support/train_recorder.py), as the reader holds them."""
    return json.loads((last_records(workdir) / "datasets-rank-0.json").read_text())


def eval_passes(workdir: Path) -> dict[int, list[int]]:
    """Each pass of the last run through its eval loader: the indices it gave, in order."""
    passes: dict[int, list[int]] = {}
    for line in (last_records(workdir) / "eval-rank-0.jsonl").read_text().splitlines():
        batch = json.loads(line)
        passes.setdefault(batch["pass"], []).extend(batch["index"])
    return passes


@pytest.fixture(scope="module")
def lerobots_items(golden_dir: Path) -> dict:
    """What LeRobot's own dataset returned for av1_multifile (recorded with LeRobot 0.6.1):
    index -> its episode and, per camera, the frame as the trainer gets it (uint8, as
    LeRobot's factory asks) described by dtype, shape and SHA-1."""
    recorded = np.load(golden_dir / "av1_multifile.items.npz")
    items: dict[int, dict] = {}
    for i in range(GOLDEN_FRAMES):
        items[i] = {"episode": int(recorded[f"{i}|episode_index"])}
        for key in CAMERAS:
            frame = np.round(recorded[f"{i}|{key}"] * 255).astype(np.uint8)  # float32 u / 255
            items[i][key] = ["torch.uint8", list(frame.shape), hashlib.sha1(frame).hexdigest()]
    return items


def camera_samples(steps: list[dict], key: str) -> list[tuple[int, list]]:
    """(index, [dtype, shape, digest]) of every sample the trainer took, for camera ``key``."""
    return [(i, frame) for step in steps for i, frame in zip(step["index"], step[key], strict=True)]


@pytest.fixture(scope="module")
def two_process_run(av1, tmp_path_factory):
    """``accelerate launch``, 2 processes, 1 worker each, 10 steps (two epochs), a checkpoint
    every 3 steps: the uninterrupted run."""
    workdir = tmp_path_factory.mktemp("uninterrupted")
    out = workdir / "out"
    args = ["--shards", str(av1), *TINY_ACT, "--steps=10", "--num_workers=1", "--save_freq=3"]
    records, _ = train(workdir, *args, f"--output_dir={out}", launcher="accelerate")
    return args, records, out


def test_one_process_every_frame_once_per_epoch_new_order_each(av1, lerobots_items, tmp_path):
    records, _ = train(
        tmp_path, "--shards", str(av1), *TINY_ACT, "--steps=20", "--num_workers=2",
        "--save_freq=10", f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    (steps,) = records
    assert len(steps) == 20
    epochs = epochs_of(steps, GOLDEN_FRAMES)
    assert len(epochs) == 2
    for epoch in epochs:
        assert sorted(epoch) == list(range(GOLDEN_FRAMES))
    assert epochs[0] != epochs[1]
    saved = tmp_path / "out/checkpoints/000010/training_state/lerobot_shards.json"
    assert json.loads(saved.read_text())["data"]["epoch"] == 0  # 10 batches: epoch 0, all of it
    for key in CAMERAS:  # no transforms: the policy is fed LeRobot's own frames
        for index, frame in camera_samples(steps, key):
            assert frame == lerobots_items[index][key], (index, key)


def test_two_processes_every_frame_once_per_epoch(two_process_run):
    _, records, _ = two_process_run
    assert len(records) == 2 and all(len(steps) == 10 for steps in records)
    per_rank = [epochs_of(steps, GOLDEN_FRAMES // 2) for steps in records]
    for epoch in range(2):
        both = per_rank[0][epoch] + per_rank[1][epoch]
        assert sorted(both) == list(range(GOLDEN_FRAMES)), f"epoch {epoch}"
    assert per_rank[0][0] != per_rank[0][1]


@pytest.fixture(scope="module")
def killed_run(av1, two_process_run, tmp_path_factory):
    """The same run under torchrun, killed (SIGKILL) as step 5 begins: after the checkpoint
    of step 3."""
    args, _, _ = two_process_run
    workdir = tmp_path_factory.mktemp("killed")
    out = workdir / "out"
    records, proc = train(
        workdir, *args, f"--output_dir={out}", launcher="torchrun", kill_at=5, check=False
    )
    assert proc.returncode != 0
    assert os.path.realpath(out / "checkpoints/last").endswith("000003")
    return records, out


def step_3_config(out: Path) -> Path:
    """The killed run's step-3 checkpoint (each resume writes to its own --output_dir, so that
    no test moves the killed run's ``last``)."""
    return out / "checkpoints/000003/pretrained_model/train_config.json"


def test_killed_run_resumed_on_two_processes_consumes_what_the_uninterrupted_run_did(
    two_process_run, killed_run, tmp_path
):
    _, uninterrupted, _ = two_process_run
    killed, out = killed_run
    for rank in range(2):  # the same stream until the kill
        assert killed[rank][:3] == uninterrupted[rank][:3]
    resumed, _ = train(  # no --shards: the checkpoint names them
        tmp_path, "--resume=true", f"--config_path={step_3_config(out)}",
        f"--output_dir={tmp_path / 'out'}", launcher="torchrun",
    )  # fmt: skip
    for rank in range(2):
        assert resumed[rank] == uninterrupted[rank][3:], f"rank {rank}"


def test_killed_run_resumed_on_one_process_finishes_the_epoch_exactly(
    two_process_run, killed_run, tmp_path
):
    _, uninterrupted, _ = two_process_run
    _, out = killed_run
    taken = flat(uninterrupted[0][:3]) + flat(uninterrupted[1][:3])
    rest = GOLDEN_FRAMES - len(taken)
    # 1 process, 2 workers now: the rest of epoch 0 (26 samples, 13 per worker: 8, 8, 5, 5),
    # then epoch 1 (37 per worker: 10 batches); 14 steps after step 3.
    resumed, _ = train(
        tmp_path, "--resume=true", f"--config_path={step_3_config(out)}", "--num_workers=2",
        "--steps=17", f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    (steps,) = resumed
    indices = flat(steps)
    assert len(steps) == 14 and len(indices) == rest + GOLDEN_FRAMES
    assert Counter(indices[:rest]) == Counter(range(GOLDEN_FRAMES)) - Counter(taken)
    assert sorted(indices[rest:]) == list(range(GOLDEN_FRAMES))


def test_mixture_of_two_datasets_by_weight(av1, shards, tmp_path):
    v21 = shards("v21_video")
    # 148 frames in all, weights 2:1 -> 98.67 and 49.33 -> 99 and 49 samples (largest
    # remainder); 1 worker: 18 batches of 8 and one of 4.
    records, _ = train(
        tmp_path, "--shards", str(av1), "--shards", str(v21), "--weights", "2,1", *TINY_ACT,
        "--steps=19", "--num_workers=1", f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    (steps,) = records
    datasets = [d for step in steps for d in step["dataset_index"]]
    indices = flat(steps)
    assert len(indices) == 2 * GOLDEN_FRAMES
    assert Counter(datasets) == {0: 99, 1: 49}
    of_first = Counter(i for i, d in zip(indices, datasets, strict=True) if d == 0)
    assert set(of_first) == set(range(GOLDEN_FRAMES))  # every frame of dataset 0 once or twice
    assert set(of_first.values()) == {1, 2}
    of_second = [i for i, d in zip(indices, datasets, strict=True) if d == 1]
    assert len(set(of_second)) == 49  # dataset 1: 49 of its frames, none twice


def test_diffusion_policy_trains_with_image_transforms(tmp_path):
    from lerobot_shards import convert
    from lerobot_shards.testing.factory import make_dataset

    source = tmp_path / "source"
    make_dataset(source, episode_lengths=(20, 16, 24), cameras={"observation.images.top": (32, 32)})
    convert(str(source), str(tmp_path / "shards"), workers=0, progress=False)
    records, proc = train(
        tmp_path, "--shards", str(tmp_path / "shards"), "--policy.type=diffusion",
        "--policy.n_obs_steps=2", "--policy.horizon=8", "--policy.n_action_steps=4",
        "--policy.down_dims=[16,32]", "--policy.crop_shape=null",
        "--policy.pretrained_backbone_weights=null", "--policy.use_group_norm=true",
        "--policy.diffusion_step_embed_dim=16",
        "--policy.num_train_timesteps=10", "--policy.device=cpu", "--policy.push_to_hub=false",
        "--dataset.image_transforms.enable=true", "--wandb.enable=false", "--batch_size=4",
        "--steps=15", "--num_workers=0",
        "--log_freq=5", f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    (steps,) = records
    assert sorted(flat(steps)) == list(range(60))  # 15 batches of 4: one epoch of 60 frames
    assert "loss:" in proc.stderr + proc.stdout


def test_eval_split_holds_out_the_episodes_lerobot_holds_out(av1, golden_dir, tmp_path):
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_train_eval_datasets
    from lerobot.policies.act.configuration_act import ACTConfig

    from lerobot_shards.train.datasets import Shards, make_datasets

    cfg = TrainPipelineConfig(
        dataset=DatasetConfig(
            repo_id="golden/av1_multifile", root=str(golden_dir / "av1_multifile"),
            eval_split=0.4, video_backend="pyav",
        ),
        policy=ACTConfig(device="cpu", push_to_hub=False),
    )  # fmt: skip
    theirs_train, theirs_eval = make_train_eval_datasets(cfg)
    cfg.dataset.root = None
    ours_train, ours_eval = make_datasets(cfg, Shards([str(av1)]))
    assert ours_train.episodes == sorted(theirs_train.episodes)
    assert ours_eval.episodes == sorted(theirs_eval.episodes)
    assert ours_train.meta.stats["observation.images.cam_high"]["mean"].tolist() == (
        theirs_train.meta.stats["observation.images.cam_high"]["mean"].tolist()
    )  # ImageNet's, as LeRobot sets them

    theirs_train_frames = theirs_train.hf_dataset.data.column("index").to_pylist()
    theirs_eval_frames = theirs_eval.hf_dataset.data.column("index").to_pylist()

    # 0.4 of av1's tasks: episodes 0 and 1 trained on (13 frames: 2 batches of 8 per epoch),
    # 2 to 5 held out; 4 steps are 2 epochs, evaluated after steps 2 and 4
    records, proc = train(
        tmp_path, "--shards", str(av1), *TINY_ACT, "--steps=4", "--num_workers=1",
        "--dataset.eval_split=0.4", "--eval_steps=2", f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    assert "eval_loss=" in proc.stderr + proc.stdout
    (steps,) = records
    epochs = epochs_of(steps, len(theirs_train_frames))
    assert len(epochs) == 2
    for epoch in epochs:  # every frame of LeRobot's train split once, none held out
        assert Counter(epoch) == Counter(theirs_train_frames)
    assert not set(flat(steps)) & set(theirs_eval_frames)
    passes = eval_passes(tmp_path)
    assert sorted(passes) == [1, 2]
    for indices in passes.values():  # every held-out frame once per evaluation
        assert Counter(indices) == Counter(theirs_eval_frames)
    built = datasets_of(tmp_path)
    assert built["train"]["episodes"] == sorted(theirs_train.episodes)
    assert built["eval"]["episodes"] == sorted(theirs_eval.episodes)
    assert (built["eval"]["shuffle"], built["eval"]["pad"]) == (False, False)


def test_reader_options_and_lerobots_dataset_settings_reach_the_reader(
    av1, lerobots_items, tmp_path
):
    """One run with every reader option and LeRobot dataset setting away from its default:
    each reaches the reader the trainer streams from, and the policy is fed what they say."""
    records, _ = train(
        tmp_path, "--shards", str(av1), "--buffer-size", "2", "--byte-budget-gb", "0.5",
        "--storage-options", '{"auto_mkdir": true}', *TINY_ACT, "--dataset.episodes=[4,0,2]",
        "--dataset.video_backend=pyav", "--tolerance_s=0.001", "--seed=7",
        "--dataset.image_transforms.enable=true", "--steps=8", "--num_workers=1",
        f"--output_dir={tmp_path / 'out'}",
    )  # fmt: skip
    (steps,) = records
    built = datasets_of(tmp_path)["train"]
    assert built["root"] == str(av1)
    assert built["buffer_size"] == 2
    assert built["byte_budget"] == 500_000_000
    assert built["storage_options"] == [{"auto_mkdir": True}]
    assert built["video_backend"] == "pyav"  # LeRobot's default here is torchcodec
    assert built["seed"] == 7
    assert built["episodes"] == [0, 2, 4]
    assert built["image_transforms"] == "ImageTransforms"

    # episodes 0, 2 and 4 (LeRobot's recorded items say which frames): 59 frames, 8 batches
    selected = [i for i, item in lerobots_items.items() if item["episode"] in (0, 2, 4)]
    consumed = flat(steps)
    assert sorted(consumed) == selected
    # --seed and --buffer-size are the order: the reader's for seed 7 and 2 episodes resident
    order = {
        (seed, buffer): [
            int(item["index"])
            for item in ShardedLeRobotDataset(av1, episodes=[0, 2, 4], seed=seed,
                                              buffer_size=buffer)
        ]
        for seed, buffer in [(7, 2), (8, 2), (7, 64)]
    }  # fmt: skip
    assert consumed == order[7, 2]
    assert order[7, 2] != order[8, 2] and order[7, 2] != order[7, 64]

    # the transforms change what the policy is fed: same dtype and shape, other pixels
    for key in CAMERAS:
        samples = camera_samples(steps, key)
        assert all(frame[:2] == lerobots_items[i][key][:2] for i, frame in samples), key
        changed = sum(frame[2] != lerobots_items[i][key][2] for i, frame in samples)
        assert changed > len(samples) / 2, (key, changed, len(samples))


@pytest.mark.parametrize(
    ("argument", "named"),
    [
        ("--dataset.streaming=false", "--dataset.streaming=false"),
        ("--dataset.root=/data/x", "--dataset.root"),
        ("--dataset.revision=v2.0", "--dataset.revision"),
        ("--job.target=hf", "--job.target=hf"),
    ],
)
def test_arguments_that_cannot_apply_are_refused(av1, tmp_path, argument, named):
    proc = subprocess.run(
        [str(BIN / "lerobot-shards"), "train", "--shards", str(av1), *TINY_ACT, argument],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    assert named in proc.stderr and "cannot apply" in proc.stderr
    assert not (tmp_path / "outputs").exists()  # refused before LeRobot started


def test_max_eval_samples_is_refused_not_ignored(av1, tmp_path):
    _, proc = train(
        tmp_path, "--shards", str(av1), *TINY_ACT, "--dataset.eval_split=0.4",
        "--max_eval_samples=4", f"--output_dir={tmp_path / 'out'}", check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--max_eval_samples cannot apply" in proc.stderr


def test_resume_of_a_checkpoint_without_data_state_is_refused(av1, tmp_path):
    out = tmp_path / "out"
    train(tmp_path, "--shards", str(av1), *TINY_ACT, "--steps=2", f"--output_dir={out}")
    (out / "checkpoints/last/training_state/lerobot_shards.json").unlink()
    config = out / "checkpoints/last/pretrained_model/train_config.json"
    _, proc = train(tmp_path, "--resume=true", f"--config_path={config}", check=False)
    assert proc.returncode != 0
    assert "lerobot_shards.json not found" in proc.stderr
