"""How many epochs a plain DataLoader's fresh workers are past their dataset's position.

Why. With non-persistent workers every ``iter(loader)`` starts new workers holding copies of the
main process's dataset, whose position never moves (only the workers iterate). So that each
iteration still runs the next epoch, the workers of one iteration leave a record in one shared
64-bit word that the dataset owns (inherited by fork workers, passed to forkserver/spawn
workers with the pickled dataset): ``(generation, count, token)``.

- ``generation``: the main process's count of its own position changes (``set_epoch``,
  ``load_state_dict``, ``begin_epoch``, an iteration in process), copied into each worker. A
  record of another generation is stale: the workers start at the copied position.
- ``count``: iterations begun from that position (the epochs to skip are the count before one's
  own iteration).
- ``token``: the iteration's own (the DataLoader's base seed, shared by its workers and drawn
  anew for each iteration), so that a worker tells a sibling's record from an earlier
  iteration's.

Only worker 0 writes, in one store, and every worker of the iteration reads, before or after
that store: each sees either the previous iteration's record or its own iteration's, and both
give the same count. So the workers of one iteration always agree, whatever their number and
start order (every frame stays exactly once per iteration); an iteration whose worker 0 died
before writing is not counted, so the next one repeats its epoch rather than splitting. Two
successive iterations with the same base seed (``torch.manual_seed(s)`` before each) look like
one, and the second repeats the first's epoch. Iterations are sequential: a second iterator of
the same dataset started while the first's workers are still starting may count wrong.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import os
from typing import Any

GENERATION_BITS, COUNT_BITS, TOKEN_BITS = 16, 24, 24
_GEN_MASK = (1 << GENERATION_BITS) - 1
_COUNT_MASK = (1 << COUNT_BITS) - 1
_TOKEN_MASK = (1 << TOKEN_BITS) - 1


def pack(generation: int, count: int, token: int) -> int:
    """The record as one unsigned 64-bit word (each field reduced to its bits)."""
    return (
        (generation & _GEN_MASK) << (COUNT_BITS + TOKEN_BITS)
        | (count & _COUNT_MASK) << TOKEN_BITS
        | token & _TOKEN_MASK
    )


def unpack(word: int) -> tuple[int, int, int]:
    """``(generation, count, token)`` of a packed record."""
    return word >> (COUNT_BITS + TOKEN_BITS), (word >> TOKEN_BITS) & _COUNT_MASK, word & _TOKEN_MASK


def began(word: int, generation: int) -> int:
    """Iterations of fresh workers that the record ``word`` says began from the position of
    ``generation`` (0 if the record is of another generation)."""
    gen, count, _ = unpack(word)
    return count if gen == generation & _GEN_MASK else 0


def epochs_before(word: int, generation: int, token: int) -> int:
    """Iterations begun from the position of ``generation`` before the one of ``token``, as the
    record ``word`` (read at any point of that iteration's start) tells."""
    count = began(word, generation)
    if count and unpack(word)[2] == token & _TOKEN_MASK:
        return count - 1  # worker 0 of this very iteration wrote it
    return count


def claim(word: int, generation: int, token: int) -> tuple[int, int]:
    """Worker 0's step: the epochs to skip and the record to store in place of ``word``."""
    k = epochs_before(word, generation, token)
    return k, pack(generation, k + 1, token)


class WorkerEpochs:
    """A dataset's side of the record: the shared word, the generation of this copy's position
    and the process that last moved it (a copy whose position another process moved is fresh).

    Pickles the word as itself only while a process is being spawned (a DataLoader's forkserver
    or spawn workers); any other copy (``copy.deepcopy``, a pickle sent elsewhere) is an
    independent dataset and gets a fresh word of its own."""

    def __init__(self) -> None:
        self._word: Any = multiprocessing.RawValue("Q", 0)
        self.generation = 0
        self.owner = os.getpid()

    def moved_here(self) -> None:
        """This process changed the position: fresh workers copy it as it is now (a record of
        an older generation no longer counts), and this copy is no longer fresh."""
        self.generation += 1
        self.owner = os.getpid()

    @property
    def fresh(self) -> bool:
        """Whether this copy's position was last moved by another process (a new worker's)."""
        return self.owner != os.getpid()

    def catch_up(self, worker_id: int, token: int) -> int:
        """In a fresh worker of the iteration ``token``: the epochs that earlier iterations of
        fresh workers began from the copied position (worker 0 also records this iteration)."""
        word = int(self._word.value)
        if worker_id == 0:
            skip, self._word.value = claim(word, self.generation, token)
        else:
            skip = epochs_before(word, self.generation, token)
        self.owner = os.getpid()
        return skip

    def check_state(self) -> None:
        """Refuse a state counted from this process's position if fresh workers of more than
        one iteration began from it: it no longer says which epoch they run."""
        count = began(int(self._word.value), self.generation)
        if count > 1:
            raise ValueError(
                f"DataLoader workers began {count} iterations (epochs) from this dataset's "
                "position since it last changed here, so ds.state_dict(num_samples=...) cannot "
                "tell which one the samples belong to: call ds.set_epoch(epoch) before each "
                "epoch (or ds.begin_epoch() after each iter(loader)), or use "
                "lerobot_shards.ShardedDataLoader, which does"
            )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if multiprocessing.context.get_spawning_popen() is None:
            state["_word"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self._word is None:
            self._word = multiprocessing.RawValue("Q", 0)
