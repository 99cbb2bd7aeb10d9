"""This process's place in the job: its rank, the world size and which ranks share its node.

Why one object. Node affinity shares each epoch out over the nodes, so a rank that counted the
nodes otherwise than the others would read another node's share: frames lost or read twice,
with every rank yielding as many batches, so no hang and no error. Every fact about the job is
therefore read here, once, and passed on (MosaicML streaming's ``World`` is the model).

How the nodes are known:

- With ``torch.distributed`` initialised, the ranks tell each other: one
  ``all_gather_object`` of each rank's node name, once per process, the first time a dataset
  that needs the nodes asks (a cache or node affinity; never per epoch). A node is the set of
  ranks with one name: the host name, with torchrun's ``GROUP_RANK`` (its node rank) where it is
  set, so several launches on one host are several nodes. Nodes of unequal sizes, and ranks not
  numbered node by node, are exact. (With NCCL the exchange runs on each rank's current CUDA
  device, which a DDP job has set, as ``all_gather_object`` needs.)
- Without a process group each rank knows only its own environment: ``LOCAL_WORLD_SIZE``
  consecutive ranks per node, as torchrun numbers them, checked against ``GROUP_WORLD_SIZE``,
  ``GROUP_RANK`` and ``LOCAL_RANK`` where they are set. Where the environment cannot describe
  the nodes consistently (unequal nodes, or ``WORLD_SIZE`` without ``LOCAL_WORLD_SIZE``, which
  another rank may have), the nodes are unknown and whatever needs them refuses with what to
  do (:meth:`World.require_nodes`); a job without a cache or node affinity never asks.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from lerobot_shards.reader.plan.nodes import Nodes

FIX = (
    "initialise torch.distributed before iterating (the ranks then tell each other their "
    "hosts), or launch with torchrun, which sets LOCAL_WORLD_SIZE, GROUP_RANK and "
    "GROUP_WORLD_SIZE on every rank"
)


@dataclass(frozen=True)
class World:
    """This process's rank among ``world_size`` ranks, and each rank's node.

    Args:
        rank: this process's rank (0 without distributed training).
        world_size: the job's ranks.
        nodes: each rank's node, None where they cannot be known (``unknown`` says why).
        unknown: why the nodes are not known (empty when they are).
    """

    rank: int
    world_size: int
    nodes: Nodes | None
    unknown: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"RANK {self.rank} is outside WORLD_SIZE {self.world_size}")

    def require_nodes(self, why: str) -> Nodes:
        """The nodes, or a ``ValueError`` saying that ``why`` needs them and how to give them."""
        if self.nodes is None:
            raise ValueError(f"{why} needs to know which ranks share a node, but {self.unknown}")
        return self.nodes

    def node_parts(self, workers: int) -> list[int]:
        """The parts of every rank and DataLoader worker on this rank's node; where the nodes
        are unknown, this rank's own (for what only saves downloads, never for the order)."""
        if self.nodes is None:
            first = self.rank * max(1, workers)
            return list(range(first, first + max(1, workers)))
        return self.nodes.node_parts(self.rank, workers)


_GATHERED: dict[tuple[int, int], World] = {}
"""The world each process gathered from its process group (one all-gather per process)."""


def current_world(need_nodes: bool) -> World:
    """The calling process's world: from the process group when ``torch.distributed`` is
    initialised (the nodes gathered once per process, if ``need_nodes``), else from the
    environment. Call it in the training process: a DataLoader worker cannot reach the group
    (:func:`worker_world`)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        group = torch.distributed.group.WORLD
        key = (os.getpid(), id(group))
        if key in _GATHERED:
            return _GATHERED[key]
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if not need_nodes:
            return World(rank, world_size, None, "the nodes were not needed")
        names: list[object] = [None] * world_size
        torch.distributed.all_gather_object(names, node_name(os.environ))
        _GATHERED.clear()  # one group per process at a time
        _GATHERED[key] = World(rank, world_size, Nodes.of_names(names))
        return _GATHERED[key]
    return environment_world(os.environ)


def worker_world() -> World:
    """The world as a DataLoader worker sees it when the training process passed it none:
    the environment's, or, where the training process has a process group (whose nodes a
    worker cannot gather), its rank without the nodes."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return World(
            torch.distributed.get_rank(),
            torch.distributed.get_world_size(),
            None,
            "the training process did not gather the nodes before its DataLoader workers "
            "started: iterate through lerobot_shards.ShardedDataLoader, or call "
            "ds.set_epoch(epoch) on every rank before iter(loader)",
        )
    return environment_world(os.environ)


def node_name(env: Mapping[str, str]) -> str:
    """This process's node: its host, and torchrun's node rank where set (``host#GROUP_RANK``)."""
    host = socket.gethostname()
    group = env.get("GROUP_RANK")
    return host if group is None else f"{host}#{group}"


def environment_world(env: Mapping[str, str]) -> World:
    """The world as ``RANK``, ``WORLD_SIZE`` and torchrun's node variables describe it."""
    rank, world_size = int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    if world_size == 1:
        return World(rank, world_size, Nodes.one(1))
    unknown = environment_problem(env, rank, world_size)
    if unknown:
        return World(rank, world_size, None, unknown)
    local = int(env["LOCAL_WORLD_SIZE"])
    return World(rank, world_size, Nodes.even(world_size, world_size // local))


def environment_problem(env: Mapping[str, str], rank: int, world_size: int) -> str:
    """Why the environment cannot say which ranks share a node ('' if it can): it says only
    how many ranks this rank's node has, so every node must have as many, numbered node by
    node, and whatever else torchrun says must agree."""
    where = f"this rank's environment (RANK={rank}, WORLD_SIZE={world_size}"
    local = env.get("LOCAL_WORLD_SIZE")
    if local is None:
        return (
            f"{where}) has no LOCAL_WORLD_SIZE, and another rank's may differ, and there is no "
            f"process group to ask: {FIX}"
        )
    local_world = int(local)
    where += f", LOCAL_WORLD_SIZE={local_world}"
    if local_world < 1 or world_size % local_world:
        return (
            f"{where}) is not a whole number of nodes of LOCAL_WORLD_SIZE ranks (nodes of "
            f"unequal sizes?), and there is no process group to ask: {FIX}"
        )
    nodes = world_size // local_world
    if "GROUP_WORLD_SIZE" in env and int(env["GROUP_WORLD_SIZE"]) != nodes:
        return (
            f"{where}, GROUP_WORLD_SIZE={env['GROUP_WORLD_SIZE']}) does not make "
            f"{env['GROUP_WORLD_SIZE']} nodes of LOCAL_WORLD_SIZE ranks (nodes of unequal "
            f"sizes?), and there is no process group to ask: {FIX}"
        )
    if "GROUP_RANK" in env and "LOCAL_RANK" in env:
        group, local_rank = int(env["GROUP_RANK"]), int(env["LOCAL_RANK"])
        if rank != group * local_world + local_rank:
            return (
                f"{where}, GROUP_RANK={group}, LOCAL_RANK={local_rank}) does not number the "
                f"ranks node by node in nodes of LOCAL_WORLD_SIZE (nodes of unequal sizes?), "
                f"and there is no process group to ask: {FIX}"
            )
    return ""
