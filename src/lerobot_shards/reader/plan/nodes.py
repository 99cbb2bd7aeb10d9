"""Which ranks share a node: the groups of parts a node-affine epoch is shared out over.

Why. With node affinity each node reads the same share of the episodes every epoch, so every
rank must count the nodes exactly as every other rank does: a rank that saw other nodes would
read another node's share, and frames would be lost or read twice without any error. Nodes may
hold unequal numbers of ranks (torchrun takes a ``--nproc-per-node`` per node) and a node's
ranks need not be numbered consecutively. Pure: the ranks' node names are gathered elsewhere
(``reader/loading/world.py``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Nodes:
    """The node each rank runs on: ``of_rank[r]`` is rank ``r``'s node, nodes numbered in the
    order of their first rank (so rank 0 is on node 0).

    Args:
        of_rank: each rank's node, ``0 <= node < count``, every node holding a rank.
    """

    of_rank: tuple[int, ...]

    def __post_init__(self) -> None:
        of_rank = tuple(int(n) for n in self.of_rank)
        object.__setattr__(self, "of_rank", of_rank)
        if not of_rank:
            raise ValueError("a job has at least one rank")
        seen = -1
        for rank, node in enumerate(of_rank):
            if node > seen + 1 or node < 0:
                raise ValueError(
                    f"rank {rank} is on node {node}: nodes are numbered 0, 1, ... in the order "
                    f"of their first rank ({list(of_rank)})"
                )
            seen = max(seen, node)

    @classmethod
    def even(cls, world_size: int, count: int) -> Nodes:
        """``count`` nodes of ``world_size / count`` consecutive ranks each (torchrun's
        numbering with the same ``--nproc-per-node`` everywhere)."""
        if count < 1 or world_size < 1 or world_size % count:
            raise ValueError(
                f"{world_size} ranks cannot run on {count} nodes of equally many ranks"
            )
        local = world_size // count
        return cls(tuple(r // local for r in range(world_size)))

    @classmethod
    def one(cls, world_size: int) -> Nodes:
        """Every rank on one node (what a job without node affinity is planned as)."""
        return cls((0,) * world_size)

    @classmethod
    def of_names(cls, names: Sequence[Hashable]) -> Nodes:
        """The ranks whose names are equal share a node (``names[r]`` is rank ``r``'s)."""
        numbers: dict[Hashable, int] = {}
        return cls(tuple(numbers.setdefault(name, len(numbers)) for name in names))

    @property
    def world_size(self) -> int:
        return len(self.of_rank)

    @property
    def count(self) -> int:
        return max(self.of_rank) + 1

    def ranks(self, node: int) -> list[int]:
        """The ranks of ``node``, ascending."""
        return [r for r, n in enumerate(self.of_rank) if n == node]

    def sizes(self) -> list[int]:
        """Ranks per node."""
        return [len(self.ranks(n)) for n in range(self.count)]

    def is_even(self) -> bool:
        """Equal nodes of consecutive ranks: what an ``int`` node count describes."""
        if self.world_size % self.count:
            return False
        return self == Nodes.even(self.world_size, self.count)

    def part_groups(self, workers: int) -> tuple[tuple[int, ...], ...]:
        """Each node's parts (``part_index``: rank ``r``'s workers hold ``r * workers ...``),
        its ranks' in rank order."""
        workers = max(1, workers)
        return tuple(
            tuple(r * workers + w for r in self.ranks(n) for w in range(workers))
            for n in range(self.count)
        )

    def node_parts(self, rank: int, workers: int) -> list[int]:
        """The parts of every rank and DataLoader worker on the node of ``rank``."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside world_size {self.world_size}")
        return list(self.part_groups(workers)[self.of_rank[rank]])

    def to_state(self) -> int | list[int]:
        """What a state dict records: the node count for equal nodes of consecutive ranks (the
        form earlier versions wrote), else each rank's node."""
        return self.count if self.is_even() else list(self.of_rank)

    @classmethod
    def from_state(cls, value: int | Sequence[int], world_size: int) -> Nodes:
        """The nodes a state dict recorded (:meth:`to_state`) for ``world_size`` ranks."""
        if isinstance(value, int):
            return cls.even(world_size, value)
        nodes = cls(tuple(value))
        if nodes.world_size != world_size:
            raise ValueError(
                f"a state records the nodes of {nodes.world_size} ranks, not {world_size}"
            )
        return nodes


def as_nodes(nodes: Nodes | int, num_parts: int) -> Nodes:
    """``nodes`` as a :class:`Nodes` over the ``num_parts`` parts' ranks; an ``int`` is that
    many equal nodes of consecutive parts (what a node count meant before unequal nodes)."""
    if isinstance(nodes, Nodes):
        return nodes
    if nodes < 1 or num_parts % nodes:
        raise ValueError(f"{num_parts} parts cannot be shared out over {nodes} nodes")
    return Nodes.even(num_parts, nodes)


def part_groups(nodes: Nodes | int, num_parts: int) -> tuple[tuple[int, ...], ...]:
    """The parts of each node when an epoch has ``num_parts`` parts (a whole number per rank)."""
    nodes = as_nodes(nodes, num_parts)
    if num_parts % nodes.world_size:
        raise ValueError(f"{num_parts} parts cannot be shared out over {nodes.world_size} ranks")
    return nodes.part_groups(num_parts // nodes.world_size)
