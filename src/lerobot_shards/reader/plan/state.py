"""Epochs, checkpoints and resume of a :class:`ShardedLeRobotDataset`: where the next iteration
starts, the state dict that records it, and how a loaded state becomes a part and an offset.

Epochs. Every ``iter(ds)`` starts the next epoch unless ``set_epoch`` or ``load_state_dict``
said which; a DataLoader's persistent workers advance their own copies, so they see a new order
each epoch. Non-persistent workers are fresh copies of ``ds`` every epoch, of a position that
the main process never advanced: they skip the epochs that earlier iterations of fresh workers
began from it, as a record they share with the dataset tells (``worker_epochs.py``), so they
too run the next epoch (``set_epoch`` before an iteration still says which). Resuming replays
only the planner (``plan_part(start=...)``): nothing skipped is fetched or decoded.

- ``lerobot_shards.ShardedDataLoader`` (``loader.py``): ``loader.state_dict()`` and
  ``loader.load_state_dict(state)``. It knows its workers and batch size, counts what it
  delivered and keeps the epoch in step with its workers: the way that cannot go wrong.
- Iterating ``ds`` directly (or a DataLoader with ``num_workers=0``): ``ds.state_dict()`` knows
  what was taken.
- A DataLoader of one's own with workers: the copies that count live in the workers, so the
  training loop says how many samples it took since the DataLoader's iterator started,
  ``ds.state_dict(num_samples=n, batch_size=b)``, after setting ``ds.num_workers`` to the
  loader's (refused otherwise: a state that guessed would resume into repeated and missing
  frames; a worker refuses to start if ``ds.num_workers`` is set and differs from its loader's),
  and calls ``ds.set_epoch(epoch)`` before each epoch (or ``ds.begin_epoch()`` after each
  ``iter(loader)``): the main process's position is what the state counts from, and a state
  taken after fresh workers began a second iteration from it is refused. ``load_state_dict``
  then works out, from the DataLoader's round-robin over workers, what each worker had
  produced, and lets each worker take the role (part) whose batch comes next, so the resumed
  stream is the same sequence.
  Offsets at batch boundaries (multiples of ``batch_size``, or the end of the epoch) resume
  exactly.
- torchdata's ``StatefulDataLoader`` calls ``state_dict``/``load_state_dict`` inside each
  worker; the worker's state then carries its id, its part and its own offset.

The state format: a plain dict (JSON-serialisable).

- ``epoch``, ``offset``: the consumer took ``offset`` samples of the stream that starts at
  ``epoch`` (per rank: every rank of a DDP job is at the same step, so every rank's state is the
  same and any one of them is the checkpoint). With ``repeat=True`` the offset may run past the
  end of the epoch.
- ``batch_size``: the DataLoader's, for the round-robin arithmetic over workers.
- ``world_size``, ``num_workers``: the layout that produced it (``num_workers`` 0 when the rank
  iterated in process). A full state without them (``num_workers`` None, written by earlier
  versions when it was unknown) is refused: nothing can make its resume exact. ``nodes``: the
  nodes its order was shared out over, with node affinity: their count for equal nodes of
  consecutive ranks, else each rank's node (``[0, 0, 1, 1, 1, 1, 2, 2]``); 1 without node
  affinity and in states of earlier versions.
- ``mixed_batches``: the rank's batches took every DataLoader worker's samples one at a time in
  turn (``interleave.py``: a ``ShardedDataLoader``'s default), so the round robin that says what
  each worker had produced went sample by sample; False (or absent, in states of earlier
  versions): each batch came from one worker.
- ``seed``, ``shuffle``, ``buffer_size``, ``byte_budget`` (bytes or None), ``pad``, ``repeat``,
  ``node_affinity`` (False when absent): the settings that shape the order.
- ``draw_rule``: the version of the pool's draw rule the order was drawn by (``pool.py``:
  1, uniform picks to the end of each part, is what a state without it was drawn by; 2 shuffles
  each part's tail). A state of another rule whose layout and settings match resumes exactly,
  under its own rule, for the iteration it resumes (with ``repeat``, the whole endless stream);
  every iteration started afresh after it draws by the current rule, and the states record
  whichever rule their iteration draws by. A state of a rule this version does not know is
  refused. ``byte_budget`` is
  each part's pool budget for fetched episodes: the rank's ``byte_budget_gb`` split over the
  layout's DataLoader workers, less each worker's frame cache.
- ``fingerprint``: ``format.manifest_fingerprint`` of the selected episodes' manifest rows (of a
  mixture: a digest of every dataset's, in order, and of the samples each contributes per
  epoch). Loading a state of another dataset, episode selection or weighting is refused with a
  ``ValueError``.
- ``resumed_from`` (only while the rest of an elastically resumed epoch runs): the state the
  rest was planned from; ``epoch`` is then the rest's first epoch and ``offset`` counts the
  samples taken since the resume.
- ``worker_id``, ``role``: only in a StatefulDataLoader worker's own state.

A state of only ``{"epoch", "offset", "batch_size"}`` (the first format) resumes as before,
assuming the current layout and settings; having no fingerprint, it warns
(``UncheckedStateWarning``) that nothing checks its dataset. Without ``repeat``, any state whose
offset is past the end of its epoch is refused. A full state whose layout and settings match the
current ones resumes the very same stream. Otherwise (another world size, another number of
DataLoader workers, another seed, pool size, budget, padding or repeat, node affinity turned on
or off, or, with node affinity, another number of nodes, batches mixed or not) the resume is
elastic
(``elastic.py``): the frames the checkpoint consumed are found by replaying the old layout's
planner (first draws of each old part), and the rest of the epoch is split over the new layout,
every frame still exactly once, every part still yielding the same number of samples; the next
epoch starts fresh under the new layout (node affinity included: the rest is split over all the
new parts, the node shares return with the next fresh epoch). The resume is planned in the main
process (for the workers ``ds.num_workers`` says) and checked against the workers when they
start.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from lerobot_shards.reader.plan.elastic import (
    Checkpoint,
    Layout,
    Ordering,
    Part,
    Planner,
    consumed_per_worker,
)
from lerobot_shards.reader.plan.interleave import Interleave
from lerobot_shards.reader.plan.nodes import Nodes
from lerobot_shards.reader.plan.pool import RULES, UNIFORM_PICKS


@dataclass
class Cursor:
    """Where one iteration is in its part's stream: the next sample's epoch and offset."""

    role: int
    """Which of the rank's workers' parts this stream plays (its own unless resumed)."""
    epoch: int
    offset: int
    """Draws made in ``epoch``'s part."""
    per_epoch: int
    origin: Checkpoint | None
    """While streaming the rest of an epoch planned from an elastic resume: its checkpoint."""
    stream_epoch: int
    stream_offset: int
    """Samples since the stream began (at ``stream_epoch``, or at the rest's start)."""
    num_workers: int
    interleave: Interleave | None = None
    """With mixed batches: where this iteration's samples of every worker go (``interleave.py``);
    the iterating worker is its lane ``Context.worker``."""
    ordering: Ordering | None = None
    """What this iteration draws by: the context's, under a resumed state's draw rule."""

    def advance(self, part: Part) -> None:
        """Move to the start of ``part``, the next epoch's (the stream ran on into it)."""
        self.epoch, self.offset, self.per_epoch = part.epoch, 0, part.num_samples
        if part.positions is None:  # past the rest of an elastic resume: fresh epochs
            self.origin = None


def describe(
    epoch: int,
    offset: int,
    batch_size: int,
    world_size: int,
    num_workers: int,
    ordering: Ordering,
    fingerprint: str,
    origin: Checkpoint | None = None,
    nodes: Nodes | int = 1,
    mixed_batches: bool = False,
) -> dict[str, Any]:
    """A state dict in the format the module docstring describes."""
    state = {
        "epoch": epoch,
        "offset": offset,
        "batch_size": batch_size,
        "world_size": world_size,
        "num_workers": num_workers,
        "nodes": nodes.to_state() if isinstance(nodes, Nodes) else nodes,
        "seed": ordering.seed,
        "shuffle": ordering.shuffle,
        "buffer_size": ordering.buffer_size,
        "byte_budget": ordering.byte_budget,
        "pad": ordering.pad,
        "repeat": ordering.repeat,
        "node_affinity": ordering.node_affinity,
        "draw_rule": ordering.draw_rule,
        "mixed_batches": mixed_batches,
        "fingerprint": fingerprint,
    }
    if origin is not None:
        c = origin
        state["resumed_from"] = describe(
            c.epoch,
            c.offset,
            c.batch_size,
            c.layout.world_size,
            c.layout.num_workers,
            c.ordering,
            fingerprint,
            c.origin,
            c.layout.nodes,
            c.mixed_batches,
        )
    return state


def drawn_by(ordering: Ordering, rule: int | None) -> Ordering:
    """``ordering`` under draw rule ``rule`` (None: its own)."""
    return ordering if rule is None else replace(ordering, draw_rule=rule)


def checkpoint_of(state: Mapping[str, Any]) -> Checkpoint:
    """The checkpoint a full state describes; refused if it does not record its layout."""
    try:
        workers = state["num_workers"]
        if workers is None:
            raise ValueError(
                "this state does not record how many DataLoader workers produced it (it was "
                "taken by an older version with ds.num_workers unset), so no resume of it can "
                "be known to be exact; resume from a checkpoint taken with "
                "lerobot_shards.ShardedDataLoader or with ds.num_workers set"
            )
        origin = state.get("resumed_from")
        rule = int(state.get("draw_rule", UNIFORM_PICKS))
        if rule not in RULES:
            raise ValueError(
                f"this state was drawn by draw rule {rule}, which this version does not know "
                f"(it knows {list(RULES)}): resume it with the version of lerobot-shards that "
                "wrote it, or a newer one"
            )
        return Checkpoint(
            epoch=int(state["epoch"]),
            offset=int(state["offset"]),
            batch_size=max(1, int(state.get("batch_size") or 1)),
            layout=Layout(
                int(state["world_size"]),
                int(workers),
                Nodes.from_state(state.get("nodes", 1), int(state["world_size"])),
            ),
            ordering=Ordering(
                int(state["seed"]),
                bool(state["shuffle"]),
                int(state["buffer_size"]),
                None if state["byte_budget"] is None else int(state["byte_budget"]),
                bool(state["pad"]),
                bool(state["repeat"]),
                bool(state.get("node_affinity", False)),
                rule,
            ),
            origin=None if origin is None else checkpoint_of(origin),
            mixed_batches=bool(state.get("mixed_batches", False)),
        )
    except KeyError as exc:
        raise ValueError(f"this state lacks {exc.args[0]!r}: {dict(state)}") from None


class UncheckedStateWarning(UserWarning):
    """A state without a manifest fingerprint was loaded: nothing checks it belongs to the
    dataset (hand-written ``{"epoch", "offset", "batch_size"}`` states have none)."""


@dataclass(frozen=True)
class Context:
    """What a state is taken and loaded against: this process's layout and order settings."""

    world_size: int
    worker: int
    """This process's DataLoader worker id (0 in process)."""
    workers: int
    """DataLoader workers per rank, at least 1."""
    in_worker: bool
    ordering: Ordering
    nodes: Nodes | int = 1
    """The nodes the order is shared out over: the ranks' nodes with node affinity, else one
    node of every rank (an ``int``: equal nodes of consecutive ranks)."""
    mixed_batches: bool = False
    """The rank's batches take every worker's samples in turn (``interleave.py``): a
    ``ShardedDataLoader``'s, whose workers write their rows of every batch."""

    @property
    def layout(self) -> Layout:
        return Layout(self.world_size, self.workers, self.nodes)


class Position:
    """Where the next iteration of a dataset starts, and where the current one is.

    ``set_epoch``, ``load`` and ``state`` are the dataset's ``set_epoch``, ``load_state_dict``
    and ``state_dict``; ``start`` turns the position into the part this iteration streams.
    """

    def __init__(self) -> None:
        self.next = (0, 0)  # (epoch, offset) the next iteration starts at
        self.current = (0, 0)  # where the current (or last) iteration started
        self.next_origin: Checkpoint | None = None  # with an elastic rest: its checkpoint
        self.current_origin: Checkpoint | None = None
        self.next_rule: int | None = None  # a resumed state's draw rule (None: the current)
        self.current_rule: int | None = None
        self.batch_size = 1
        self.worker_state: dict | None = None  # a StatefulDataLoader worker's loaded state
        self.pending = False  # a loaded state not yet iterated
        self.check_workers: int | None = None  # workers a loaded state was planned for
        self.check_mixed: bool | None = None  # the batching a loaded state was planned for
        self.cursor: Cursor | None = None

    def set_epoch(self, epoch: int) -> None:
        """Start the next iteration at ``epoch``: at its start, or at the offset of a state
        loaded for that epoch and not yet iterated."""
        if self.pending and self.next[0] == int(epoch):
            return
        self.next = self.current = (int(epoch), 0)
        self.next_origin = self.current_origin = None
        self.next_rule = self.current_rule = None
        self.worker_state = None
        self.pending = False
        self.check_workers = None
        self.check_mixed = None
        self.cursor = None

    def begin_elsewhere(self) -> None:
        """An iteration from the next position began in other processes (DataLoader workers,
        which took this object's position when they started): record it as the current one,
        as :meth:`start` would, so that ``state(num_samples=...)`` counts from it."""
        self.current, self.current_origin = self.next, self.next_origin
        self.current_rule = self.next_rule
        self.next = (self.next[0] + 1, 0)
        self.next_origin = None
        self.next_rule = None
        self.worker_state = None
        self.pending = False
        self.check_workers = None
        self.check_mixed = None
        self.cursor = None

    def state(
        self,
        ctx: Context,
        fingerprint: str,
        num_samples: int | None,
        batch_size: int | None,
        num_workers: int,
    ) -> dict[str, Any]:
        """The state dict (``ds.state_dict``) of the dataset whose manifest rows have
        ``fingerprint``; ``num_workers`` is ``ds.num_workers``."""
        b = self.batch_size if batch_size is None else max(1, int(batch_size))
        cursor = self.cursor

        def describe_here(epoch, offset, workers, origin, rule):
            return describe(
                epoch,
                offset,
                b,
                ctx.world_size,
                workers,
                drawn_by(ctx.ordering, rule),
                fingerprint,
                origin,
                ctx.nodes,
                ctx.mixed_batches,
            )

        if num_samples is not None:
            epoch, offset = self.current
            if num_workers > 0:
                workers = num_workers
            elif cursor is not None:  # the DataLoader iterated this very object
                workers = cursor.num_workers
            else:
                raise ValueError(
                    "ds.state_dict(num_samples=...) cannot tell how many DataLoader workers "
                    "delivered those samples, and a state that guesses resumes into repeated and "
                    "missing frames: use lerobot_shards.ShardedDataLoader (it knows), or set "
                    "ds.num_workers to the DataLoader's num_workers"
                )
            offset += int(num_samples)
            return describe_here(epoch, offset, workers, self.current_origin, self.current_rule)
        if cursor is None:
            epoch, offset = self.next
            workers = ctx.workers if ctx.in_worker else num_workers
            return describe_here(epoch, offset, workers, self.next_origin, self.next_rule)
        origin = cursor.origin
        rule = None if cursor.ordering is None else cursor.ordering.draw_rule
        if origin is not None and (ctx.ordering.repeat or cursor.offset < cursor.per_epoch):
            epoch, offset = cursor.stream_epoch, cursor.stream_offset
        else:
            origin = None
            epoch, offset = cursor.epoch, cursor.offset
            if offset >= cursor.per_epoch and (cursor.per_epoch > 0 or cursor.origin):
                epoch, offset = epoch + 1, 0
                if not ctx.ordering.repeat:  # the next iteration's: it starts afresh
                    rule = None
        state = describe_here(epoch, offset, cursor.num_workers, origin, rule)
        if ctx.in_worker:
            state.update(worker_id=ctx.worker, role=cursor.role)
        return state

    def load(
        self,
        state: Mapping[str, Any],
        ctx: Context,
        fingerprint: str,
        planner: Planner,
        where: str,
        first_part: int,
    ) -> None:
        """Make the next iteration start where ``state`` says (``ds.load_state_dict``), for the
        dataset ``where`` whose manifest rows have ``fingerprint``; ``first_part`` is this
        rank's first part (its DataLoader worker 0's)."""
        epoch, offset = int(state["epoch"]), int(state["offset"])
        if offset < 0 or epoch < 0:
            raise ValueError(f"a state needs a non-negative epoch and offset, got {dict(state)}")
        theirs = state.get("fingerprint")
        if theirs is None:
            warnings.warn(
                f"this state has no manifest fingerprint, so nothing checks that it was taken on "
                f"{where}: resume only on the dataset and episode selection it was taken on "
                "(ds.state_dict() records the fingerprint)",
                UncheckedStateWarning,
                stacklevel=3,
            )
        elif theirs != fingerprint:
            raise ValueError(
                f"this state was taken on another dataset: its manifest fingerprint is {theirs}, "
                f"{where} has {fingerprint}; resume on the dataset and episode selection the "
                "checkpoint was taken on"
            )
        self.batch_size = max(1, int(state.get("batch_size") or 1))
        worker_state = "worker_id" in state
        self.check_workers = None
        self.next_origin = None
        self.worker_state = dict(state) if worker_state else None
        self.next = (epoch, offset)
        self.next_rule = None
        if "world_size" in state:  # a full state: the layout and settings are known
            checkpoint = checkpoint_of(state)
            theirs, ours = checkpoint.layout, ctx.layout
            same = (theirs.world_size, theirs.workers) == (ours.world_size, ours.workers)
            if same:
                shares = checkpoint.ordering.node_shares(theirs.nodes, theirs.num_parts)
                same = shares == ctx.ordering.node_shares(ours.nodes, ours.num_parts)
            same = same and checkpoint.mixed_batches == ctx.mixed_batches
            rule = checkpoint.ordering.draw_rule
            if same and checkpoint.ordering == drawn_by(ctx.ordering, rule):
                self.next_origin = checkpoint.origin
                if rule != ctx.ordering.draw_rule:  # resumed exactly, under its own rule
                    self.next_rule = rule
            elif worker_state:
                raise ValueError(
                    "this is a StatefulDataLoader worker's state, taken under another layout or "
                    "other settings (world size, workers, nodes, seed, shuffle, buffer, budget, "
                    "pad, repeat, node affinity, mixed batches): elastic resume needs the rank's "
                    "state, "
                    "ds.state_dict(num_samples=..., batch_size=...)"
                )
            else:
                self.next = (planner.rest_epoch(checkpoint), 0)
                self.next_origin = checkpoint
            if not worker_state:
                self.check_workers = ctx.workers
        self.check_mixed = None if worker_state else ctx.mixed_batches
        self._check_offset(state, ctx, planner, first_part, where)
        self.current, self.current_origin = self.next, self.next_origin
        self.current_rule = self.next_rule
        self.pending = True
        self.cursor = None

    def _check_offset(
        self,
        state: Mapping[str, Any],
        ctx: Context,
        planner: Planner,
        first_part: int,
        where: str,
    ) -> None:
        """Refuse an offset past the end of its epoch (without ``repeat``): it would resume
        into an iteration that yields nothing, with no sign why."""
        if ctx.ordering.repeat:
            return
        epoch, offset = self.next
        num_parts = ctx.world_size * ctx.workers
        roles = [int(state["role"])] if self.worker_state else range(ctx.workers)
        if self.next_origin is None:  # a fresh epoch: the counts alone
            fresh = planner.part_samples(ctx.ordering, num_parts, ctx.nodes)
            samples = sum(fresh[first_part + r] for r in roles)
        else:
            samples = sum(
                planner.locate(
                    self.next_origin, epoch, ctx.ordering, num_parts, first_part + r, 0, ctx.nodes
                )[0].num_samples
                for r in roles
            )
        if offset > samples:
            raise ValueError(
                f"this state's offset {offset} is past the end of epoch {epoch}, which holds "
                f"{samples} samples for this rank of {where}: was it taken on another dataset, "
                "selection or layout?"
            )

    def start(
        self, ctx: Context, planner: Planner, first_part: int, num_workers: int
    ) -> tuple[Part, Iterator[Part], Cursor]:
        """Begin an iteration: the part it streams (its rank's ``first_part + role``), the
        parts of the epochs after it, and its cursor. ``num_workers`` is what the state
        records (``ds.num_workers`` in process, the loader's in a worker)."""
        epoch, offset = self.next
        origin = self.next_origin
        rule, self.next_rule = self.next_rule, None
        self.next = (epoch + 1, 0)
        self.current, self.current_origin = (epoch, offset), origin
        self.current_rule = rule
        self.next_origin = None
        ordering = drawn_by(ctx.ordering, rule)
        workers = ctx.workers
        expected, self.check_workers = self.check_workers, None
        if expected is not None and expected != workers:
            raise ValueError(
                f"the state was loaded for {expected} DataLoader worker(s) per rank, but this "
                f"loader has {workers}: set ds.num_workers = {workers} before load_state_dict"
            )
        mixed, self.check_mixed = self.check_mixed, None
        if mixed is not None and mixed != ctx.mixed_batches:
            raise ValueError(
                f"the state was loaded for batches that {'mix' if mixed else 'do not mix'} "
                "every DataLoader worker's samples, and this loader's "
                f"{'do' if ctx.mixed_batches else 'do not'}: load it through the loader that "
                "iterates (loader.load_state_dict), which knows how it batches"
            )
        num_parts = ctx.world_size * workers
        resume, self.worker_state = self.worker_state, None
        self.pending = False
        interleave = None
        if resume is not None:
            if (resume["worker_id"], resume["num_workers"]) != (ctx.worker, workers):
                raise ValueError(
                    f"this state is DataLoader worker {resume['worker_id']}'s of "
                    f"{resume['num_workers']}, loaded into worker {ctx.worker} of {workers}: "
                    "load a StatefulDataLoader's state into a loader with the same num_workers"
                )
            role, taken = int(resume["role"]), offset
        elif workers == 1:
            role, taken = 0, offset
        else:
            if origin is None:  # a fresh epoch: the counts alone, no other worker's part made
                counts = planner.part_samples(ordering, num_parts, ctx.nodes)
                counts = counts[first_part : first_part + workers]
            else:
                counts = [
                    planner.locate(
                        origin, epoch, ordering, num_parts, first_part + w, 0, ctx.nodes
                    )[0].num_samples
                    for w in range(workers)
                ]
            unit = 1 if ctx.mixed_batches else self.batch_size
            consumed, nxt = consumed_per_worker(offset, counts, unit, ordering.repeat)
            role = (nxt + ctx.worker) % workers
            taken = consumed[role]
            if ctx.mixed_batches:  # lane w plays role nxt + w: the round robin goes on as it was
                roles = [(nxt + w) % workers for w in range(workers)]
                left = None if ordering.repeat else [counts[r] - consumed[r] for r in roles]
                interleave = Interleave(left, workers)
        part, k, following = planner.locate(
            origin, epoch, ordering, num_parts, first_part + role, taken, ctx.nodes
        )
        if origin is not None:
            self.next = (part.epoch + 1, 0)
        rest = origin if part.positions is not None else None
        cursor = Cursor(role, part.epoch, k, part.num_samples, rest, epoch, taken, num_workers)
        cursor.interleave = interleave
        cursor.ordering = ordering
        self.cursor = cursor
        return part, following, cursor
