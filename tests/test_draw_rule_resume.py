"""States written while the pool drew by rule 1 (uniform picks to the end of each part; before
the tail was shuffled, ``plan/pool.py``) resume into exactly the order that version yielded: the
orders it recorded (``tests/data/draw-rule-1/``) against the streams of states of that version
loaded here, whole orders compared, through every loader that takes states. The resumed
iteration draws by rule 1 and its states say so; every iteration started afresh after it draws
by the current rule, and the states taken then record it. An old state whose layout differs
resumes elastically, its consumed frames replayed under rule 1: every frame once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_elastic_resume import FRAMES, as_rank

from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset
from lerobot_shards.reader.plan.pool import DRAW_RULE, UNIFORM_PICKS
from lerobot_shards.reader.plan.state import checkpoint_of

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

OLD = json.loads(
    (Path(__file__).parent / "data" / "draw-rule-1" / "av1_multifile.orders.json").read_text()
)
BATCH = OLD["settings"]["batch_size"]


def dataset(root: Path) -> ShardedLeRobotDataset:
    return ShardedLeRobotDataset(
        root, buffer_size=OLD["settings"]["buffer_size"], seed=OLD["settings"]["seed"]
    )


def of_rule_1(state: Any) -> Any:
    """``state`` as the version drawing by rule 1 wrote it: every ``draw_rule`` left out (that
    version wrote everything else alike: ``test_an_old_state_is_todays_without_its_rule``)."""
    if isinstance(state, dict):
        return {k: of_rule_1(v) for k, v in state.items() if k != "draw_rule"}
    if isinstance(state, list):
        return [of_rule_1(v) for v in state]
    return state


def rules_in(state: Any) -> set[int]:
    """Every ``draw_rule`` a (nested) state records."""
    if isinstance(state, dict):
        found = {state["draw_rule"]} if "draw_rule" in state else set()
        return found.union(*(rules_in(v) for v in state.values()))
    if isinstance(state, list):
        return set().union(*(rules_in(v) for v in state))
    return set()


def indices(batches) -> list[int]:
    return [i for batch in batches for i in batch["index"].tolist()]


def test_an_old_state_is_todays_without_its_rule(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    loader = ShardedDataLoader(dataset(av1), batch_size=BATCH, num_workers=3)
    batches = iter(loader)
    next(batches), next(batches)
    state = loader.state_dict()
    assert state["draw_rule"] == DRAW_RULE != UNIFORM_PICKS
    old = OLD["mixed3_state_after_2_batches"]
    assert {k: v for k, v in of_rule_1(state).items() if k != "fingerprint"} == {
        k: v for k, v in old.items() if k != "fingerprint"
    }
    assert checkpoint_of(old).ordering.draw_rule == UNIFORM_PICKS
    with pytest.raises(ValueError, match="drawn by draw rule 9, which this version does not know"):
        checkpoint_of({**state, "draw_rule": 9})


def test_direct_iteration(av1, monkeypatch):
    """Every offset of the epoch; a state taken inside the resumed iteration records rule 1 and
    resumes exactly too; the iteration after it is today's epoch 1, and so are its states."""
    as_rank(monkeypatch, 0, 1)
    fresh = dataset(av1)
    today = [[int(item["index"]) for item in fresh] for _ in range(2)]
    assert today[0] != OLD["direct"]  # the rules differ on this dataset
    assert sorted(OLD["direct"]) == list(range(FRAMES))
    old = of_rule_1(dataset(av1).state_dict())
    for offset in range(FRAMES + 1):
        ds = dataset(av1)
        ds.load_state_dict({**old, "offset": offset})
        it = iter(ds)
        if offset == 5:  # a state inside the resumed iteration
            taken = [int(next(it)["index"]) for _ in range(10)]
            inside = ds.state_dict()
            assert inside["draw_rule"] == UNIFORM_PICKS and inside["offset"] == 15
            again = dataset(av1)
            again.load_state_dict(inside)
            assert [int(item["index"]) for item in again] == OLD["direct"][15:]
            rest = taken + [int(item["index"]) for item in it]
        else:
            rest = [int(item["index"]) for item in it]
        assert rest == OLD["direct"][offset:], offset
        after = ds.state_dict()
        assert (after["epoch"], after["offset"], after["draw_rule"]) == (1, 0, DRAW_RULE)
        if offset in (0, 40):
            assert [int(item["index"]) for item in ds] == today[1]


def test_mixed_batches_of_3_workers(av1, monkeypatch):
    """Persistent workers: the resumed epoch is rule 1's, the next one today's. A state taken
    inside the resumed epoch resumes it again exactly, on 3 workers; on 2 it resumes
    elastically with its consumed frames replayed under rule 1 (every frame once)."""
    as_rank(monkeypatch, 0, 1)
    fresh = ShardedDataLoader(
        dataset(av1), batch_size=BATCH, num_workers=3, persistent_workers=True
    )
    today = [indices(fresh) for _ in range(2)]
    assert today[0] != OLD["mixed3"]
    old = OLD["mixed3_state_after_2_batches"]
    loader = ShardedDataLoader(
        dataset(av1), batch_size=BATCH, num_workers=3, persistent_workers=True
    )
    loader.load_state_dict({**old, "fingerprint": loader.dataset.fingerprint})
    resumed = []
    for batch in loader:
        resumed += batch["index"].tolist()
        if len(resumed) == 5 * BATCH:
            inside = loader.state_dict()
    assert resumed == OLD["mixed3"][2 * BATCH :]
    assert inside["draw_rule"] == UNIFORM_PICKS and inside["offset"] == 7 * BATCH
    assert indices(loader) == today[1]
    assert loader.state_dict()["draw_rule"] == DRAW_RULE
    again = ShardedDataLoader(dataset(av1), batch_size=BATCH, num_workers=3)
    again.load_state_dict(inside)
    assert indices(again) == OLD["mixed3"][7 * BATCH :]
    fewer = ShardedDataLoader(dataset(av1), batch_size=BATCH, num_workers=2)
    fewer.load_state_dict(of_rule_1(inside))
    rest = indices(fewer)
    consumed = OLD["mixed3"][: 7 * BATCH]
    assert not set(consumed) & set(rest)
    assert set(consumed) | set(rest) == set(range(FRAMES))


def test_batches_of_one_worker_each(av1, monkeypatch):
    as_rank(monkeypatch, 0, 1)
    loader = ShardedDataLoader(dataset(av1), batch_size=BATCH, num_workers=2, mixed_batches=False)
    state = of_rule_1(loader.state_dict())
    loader.load_state_dict({**state, "offset": 3 * BATCH})
    assert indices(loader) == OLD["unmixed2"][3 * BATCH :]


def test_stateful_dataloader(av1, monkeypatch):
    """torchdata's StatefulDataLoader: its workers' own states, of rule 1, resume so."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    as_rank(monkeypatch, 0, 1)

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(dataset(av1), batch_size=BATCH, num_workers=2)

    # Today's states at the same place, less their rule, are rule 1's: take them from a loader
    # that draws by rule 1 itself, resumed from the start of the epoch.
    first = loader()
    first.load_state_dict(of_rule_1(first.state_dict()))
    taken = []
    for batch in first:
        taken += batch["index"].tolist()
        if len(taken) == 6 * BATCH:
            state = first.state_dict()
            break
    assert taken == OLD["stateful2"][: 6 * BATCH]
    assert rules_in(state) == {UNIFORM_PICKS}
    second = loader()
    second.load_state_dict(of_rule_1(state))
    assert indices(second) == OLD["stateful2"][6 * BATCH :]
