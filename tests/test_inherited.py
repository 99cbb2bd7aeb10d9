"""reader.loading.inherited: a DataLoader worker freezes what it inherited, once, before its
first item; the training process is left alone."""

from __future__ import annotations

import gc

from torch.utils.data import DataLoader, IterableDataset


class _Probe(IterableDataset):
    """Counts this process's calls of ``gc.freeze`` over two iterations of the reader, and
    yields the count and the frozen objects after each item."""

    def __init__(self, root: str) -> None:
        self.root = root

    def __iter__(self):
        from lerobot_shards import ShardedLeRobotDataset

        calls = []
        freeze = gc.freeze
        gc.freeze = lambda: (calls.append(1), freeze())[1]
        try:
            for _ in range(2):  # two iterations, as a persistent worker's epochs
                stream = iter(ShardedLeRobotDataset(self.root, shuffle=False))
                for _ in range(2):
                    next(stream)
                    yield len(calls), gc.get_freeze_count()
        finally:
            gc.freeze = freeze


def test_a_worker_freezes_its_inherited_objects_once(av1):
    assert [n for n, _ in _Probe(str(av1))] == [0] * 4  # the training process is left alone
    seen = list(DataLoader(_Probe(str(av1)), batch_size=None, num_workers=1))
    assert [n for n, _ in seen] == [1] * 4  # before the first item, and never again
    assert seen[0][1] > 10_000  # what the worker inherited (torch's objects among it)
