"""Train a LeRobot policy from lerobot-shards, as LeRobot's own lerobot_train.py trains it.

Convert once, then train from local or object-storage shards with DataLoader workers,
checkpoint, resume, and run on several processes with torchrun:

    lerobot-shards convert path/to/lerobot_dataset shards/
    python examples/train_lerobot_policy.py shards/ --steps 200 --checkpoint ckpt.pt
    python examples/train_lerobot_policy.py shards/ --steps 400 --checkpoint ckpt.pt  # resumes
    torchrun --nproc_per_node=2 examples/train_lerobot_policy.py s3://bucket/shards \\
        --storage-options '{"endpoint_url": "http://..."}' --checkpoint ckpt.pt

Runs in LeRobot's environment (``pip install "lerobot[dataset]==0.6.1" lerobot-shards``). The
policy is a small ACT with no pretrained weights, on the CPU, so that the example runs anywhere;
the data path is the one a real run uses: ``ds.meta`` for ``make_policy`` and the processors,
``resolve_delta_timestamps``, uint8 frames made float as the training loop does, and a
``ShardedDataLoader`` whose ``state_dict`` goes into the checkpoint. Every rank reads its own
share of each epoch; the checkpoint (written by rank 0) resumes exactly, under the same or
another number of ranks and workers.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from lerobot.datasets.factory import resolve_delta_timestamps
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.factory import make_policy, make_pre_post_processors

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shards", help="a converted dataset: a folder or any fsspec URL")
    parser.add_argument("--storage-options", type=json.loads, default={}, help="JSON, for fsspec")
    parser.add_argument("--steps", type=int, default=100, help="train until this step")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader workers per process")
    parser.add_argument("--checkpoint", type=Path, help="saved every --save-every steps, resumed")
    parser.add_argument("--save-every", type=int, default=20)
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")  # "nccl" on GPUs
    rank = dist.get_rank() if distributed else 0
    torch.manual_seed(0)

    cfg = ACTConfig(
        chunk_size=10,
        n_action_steps=10,
        dim_model=64,
        n_heads=2,
        dim_feedforward=128,
        n_encoder_layers=1,
        n_decoder_layers=1,
        use_vae=False,
        pretrained_backbone_weights=None,
        device="cpu",
        push_to_hub=False,
    )
    meta = ShardedLeRobotDataset(args.shards, storage_options=args.storage_options).meta
    dataset = ShardedLeRobotDataset(
        args.shards,
        storage_options=args.storage_options,
        delta_timestamps=resolve_delta_timestamps(cfg, meta),
        return_uint8=True,  # as LeRobot's make_dataset asks; the loop makes them float
    )
    policy = make_policy(cfg, ds_meta=dataset.meta)
    preprocessor, _ = make_pre_post_processors(cfg, dataset_stats=dataset.meta.stats)
    model = torch.nn.parallel.DistributedDataParallel(policy) if distributed else policy
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    loader = ShardedDataLoader(
        dataset, batch_size=args.batch_size, num_workers=args.workers, persistent_workers=True
    )

    step = 0
    if args.checkpoint is not None and args.checkpoint.exists():
        saved = torch.load(args.checkpoint, weights_only=False)
        policy.load_state_dict(saved["policy"])
        optimizer.load_state_dict(saved["optimizer"])
        loader.load_state_dict(saved["data"])  # the same position, whatever the layout now
        step = saved["step"]
        if rank == 0:
            print(f"resumed at step {step}: epoch {saved['data']['epoch']}", flush=True)

    while step < args.steps:
        for batch in loader:
            for key in dataset.meta.camera_keys:  # what lerobot_train.py does
                if batch[key].dtype == torch.uint8:
                    batch[key] = batch[key].to(dtype=torch.float32) / 255.0
            loss, _ = model(preprocessor(batch))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
            if args.checkpoint is not None and step % args.save_every == 0 and rank == 0:
                state = {
                    "policy": policy.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "data": loader.state_dict(),  # every rank's is the same: rank 0 saves it
                    "step": step,
                }
                torch.save(state, args.checkpoint.with_suffix(".tmp"))
                os.replace(args.checkpoint.with_suffix(".tmp"), args.checkpoint)
            if step >= args.steps:
                break
    if rank == 0:
        print(f"done at step {step}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
