"""LeRobot's language columns through ``ShardedDataLoader``'s worker processes (the reader's
shared-memory batch path): with a ``collate_fn`` that keeps them as lists, every batch holds
each item's values as LeRobot returned them (the golden ``language`` dataset's recorded items);
with torch's ``default_collate``, which cannot batch them, the loader refuses up front, naming
the columns. (LeRobot's own ``lerobot_collate_fn``: ``tests/test_lerobot_language.py``.)"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

LANGUAGE = ("language_persistent", "language_events")
DELTAS = {"action": [0.0, 0.1, 0.2]}  # the golden delta dump's (its __delta__)


def keep_language(batch: list[dict]) -> dict:
    """torch's default_collate for the tensors, the language columns kept as lists."""
    kept = {key: [item.pop(key) for item in batch] for key in LANGUAGE}
    return {**default_collate(batch), **kept}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["language", "language_none"])
def test_worker_batches_carry_the_language_values(golden_path, shards, name):
    recorded = np.load(golden_path(name).parent / f"{name}.delta.items.npz")
    ds = ShardedLeRobotDataset(shards(name), buffer_size=2, delta_timestamps=DELTAS)
    loader = ShardedDataLoader(ds, batch_size=4, num_workers=2, collate_fn=keep_language)
    seen = []
    for batch in loader:
        for row, index in enumerate(batch["index"].tolist()):
            for key in LANGUAGE:
                assert json.dumps(batch[key][row]) == str(recorded[f"{index}|{key}"]), (index, key)
            want = torch.from_numpy(recorded[f"{index}|action"])
            assert torch.equal(batch["action"][row], want), index
            seen.append(index)
    assert sorted(seen) == list(range(56))


def test_default_collate_is_refused_naming_the_columns(shards):
    ds = ShardedLeRobotDataset(shards("language_none"))
    for collate_fn in (None, default_collate):
        with pytest.raises(ValueError, match=r"language_persistent.*lerobot_collate_fn"):
            ShardedDataLoader(ds, batch_size=4, collate_fn=collate_fn)
    ShardedDataLoader(ds, batch_size=4, collate_fn=keep_language)  # any other: as it is
