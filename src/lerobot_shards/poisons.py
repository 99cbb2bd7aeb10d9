"""What in an episode's numbers poisons a training run while LeRobot reads it without a word.

Three things, found by ``convert`` in the rows it reads anyway and kept beside the shards
(``poisons.json``) for ``inspect``:

- **non-finite values** (NaN, Inf) in any float feature: one NaN in an action or a state turns
  the loss into NaN, hours into a run. Each episode's count per feature, and the global index
  (``index``) of the first row holding one.
- **frozen dimensions**: an action or state dimension (by LeRobot's rule: a feature whose key
  starts with ``observation`` or ``action``, cameras and text aside) constant over a whole
  episode of more than one frame: a dead joint sensor or a stuck gripper; over a whole dataset,
  a normalisation that divides by a deviation of zero.
- **one-frame episodes**: nothing moves; with ``delta_timestamps`` every other step is padding.

They are warnings: LeRobot reads these datasets, so the converter does too; ``convert --strict``
refuses non-finite values.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

NON_FINITE = "non_finite"
CONSTANT = "constant"
ONE_FRAME = "one_frame"
KINDS = (NON_FINITE, CONSTANT, ONE_FRAME)
STATE_PREFIXES = ("observation", "action")
"""Keys LeRobot treats as states and actions (``dataset_to_policy_features``)."""
NUMERIC = tuple(f"float{n}" for n in (16, 32, 64)) + tuple(
    f"{sign}int{n}" for sign in ("", "u") for n in (8, 16, 32, 64)
)


@dataclass(frozen=True)
class Poison:
    """One finding in one episode (and, but for one-frame episodes, one feature).

    Args:
        kind: ``non_finite``, ``constant`` or ``one_frame``.
        episode_index: the episode.
        feature: the feature's key (None for a one-frame episode).
        count: non-finite values: how many (values, not rows).
        first_index: non-finite values: the global ``index`` of the first row holding one.
        dimensions: constant dimensions: which (positions in the flattened feature).
        names: constant dimensions: their names, where the features name them.
    """

    kind: str
    episode_index: int
    feature: str | None = None
    count: int | None = None
    first_index: int | None = None
    dimensions: tuple[int, ...] = ()
    names: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The finding as a JSON object (only the fields its kind has)."""
        out: dict[str, Any] = {"kind": self.kind, "episode_index": self.episode_index}
        if self.feature is not None:
            out["feature"] = self.feature
        if self.kind == NON_FINITE:
            out.update(count=self.count, first_index=self.first_index)
        if self.kind == CONSTANT:
            out["dimensions"] = list(self.dimensions)
            if self.names:
                out["names"] = list(self.names)
        return out

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Poison:
        """A finding read back (``poisons.json``, a resume record); ValueError if it is none."""
        if not isinstance(raw, dict) or raw.get("kind") not in KINDS:
            raise ValueError(f"{where}: not a finding: {raw!r}")
        try:
            poison = cls(
                kind=raw["kind"],
                episode_index=raw["episode_index"],
                feature=raw.get("feature"),
                count=raw.get("count"),
                first_index=raw.get("first_index"),
                dimensions=tuple(raw.get("dimensions", ())),
                names=tuple(raw.get("names", ())),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{where}: not a finding: {raw!r}") from exc
        numbers = [poison.episode_index, poison.count or 0, poison.first_index or 0]
        numbers += list(poison.dimensions)
        if (
            poison.to_json() != raw
            or not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers)
            or not isinstance(poison.feature, str | None)
            or not all(isinstance(n, str) for n in poison.names)
        ):
            raise ValueError(f"{where}: not a finding: {raw!r}")
        return poison

    def __str__(self) -> str:
        where = f"episode {self.episode_index}"
        if self.kind == NON_FINITE:
            return (
                f"{where}: {self.feature}: {self.count} non-finite value(s), the first at index "
                f"{self.first_index}"
            )
        if self.kind == CONSTANT:
            named = f" ({', '.join(self.names)})" if self.names else ""
            return f"{where}: {self.feature}: dimension(s) {list(self.dimensions)}{named} constant"
        return f"{where}: one frame"


def find_poisons(
    table: pa.Table, features: Mapping[str, Mapping[str, Any]], episode_index: int
) -> list[Poison]:
    """The findings in one episode's rows (``table``), feature by feature, in the features'
    order."""
    episodes = np.full(table.num_rows, episode_index, dtype=np.int64)
    return scan_poisons(table, features, episodes).get(episode_index, [])


def scan_poisons(
    table: pa.Table, features: Mapping[str, Mapping[str, Any]], episodes: np.ndarray
) -> dict[int, list[Poison]]:
    """The findings of every episode in ``table`` (the rows of many, each episode's rows
    together: ``episodes`` says whose each row is), by episode, each episode's in the features'
    order. Columnar over the whole table: what a search costs is a few vectorised passes per
    column, however many episodes the table holds (a converter reads rows many episodes at a
    time). ValueError if an episode's rows are not together."""
    boundaries = np.flatnonzero(episodes[1:] != episodes[:-1]) + 1
    starts = np.concatenate([[0], boundaries]) if len(episodes) else np.zeros(0, np.int64)
    lengths = np.diff(np.append(starts, len(episodes)))
    ids = [int(e) for e in episodes[starts]]
    if len(set(ids)) != len(ids):
        raise ValueError("an episode's rows are not together")
    found: dict[int, list[Poison]] = {e: [] for e in ids}
    for e, n in zip(ids, lengths.tolist(), strict=True):
        if n == 1:
            found[e].append(Poison(ONE_FRAME, e))
    index = None
    for key, feature in features.items():
        dtype = str(feature.get("dtype"))
        floats = dtype.startswith("float")
        state = key.startswith(STATE_PREFIXES)
        if dtype not in NUMERIC or not (floats or state) or key not in table.column_names:
            continue
        values = _matrix(table.column(key), len(episodes))
        if values is None:
            continue
        if floats and not np.isfinite(values).all():
            bad = (~np.isfinite(values)).sum(axis=1)  # per row
            if index is None:
                index = _index_column(table)
            counts = np.add.reduceat(bad, starts)
            for k in np.flatnonzero(counts).tolist():
                first = starts[k] + int(np.flatnonzero(bad[starts[k] : starts[k] + lengths[k]])[0])
                found[ids[k]].append(
                    Poison(
                        NON_FINITE, ids[k], key, count=int(counts[k]),
                        first_index=None if index is None else int(index[first]),
                    )
                )  # fmt: skip
        if state:  # constant: lowest equals highest (a NaN makes both NaN: not frozen)
            lowest = np.minimum.reduceat(values, starts, axis=0)
            frozen = lowest == np.maximum.reduceat(values, starts, axis=0)
            frozen &= (lengths > 1)[:, None]
            found_frozen = np.flatnonzero(frozen.any(axis=1)).tolist()
            names = _names(feature, values.shape[1]) if found_frozen else None
            for k in found_frozen:
                dims = tuple(np.flatnonzero(frozen[k]).tolist())
                found[ids[k]].append(
                    Poison(
                        CONSTANT, ids[k], key, dimensions=dims,
                        names=tuple(names[d] for d in dims) if names else (),
                    )
                )  # fmt: skip
    return found


def _index_column(table: pa.Table) -> np.ndarray | None:
    """Each row's index in the dataset (its ``index`` column), if it has one."""
    if "index" not in table.column_names:
        return None
    return table.column("index").to_numpy()


def _matrix(column: pa.ChunkedArray, rows: int) -> np.ndarray | None:
    """A numeric column as ``(rows, values per row)``, in its stored dtype; None if its rows
    are not all of one size (the reader's checks say why)."""
    flat = column.chunks[0] if column.num_chunks == 1 else column.combine_chunks()
    while True:
        if isinstance(flat, pa.FixedSizeListArray) and not flat.offset and not flat.null_count:
            flat = flat.values  # its rows' values, no copy (flatten's cost is in its call)
        elif isinstance(flat, pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray):
            flat = flat.flatten()
        else:
            break
    if flat.null_count or not (pa.types.is_floating(flat.type) or pa.types.is_integer(flat.type)):
        return None
    values = flat.to_numpy(zero_copy_only=False)
    if rows == 0 or len(values) % rows:
        return None
    return values.reshape(rows, -1)


def _names(feature: Mapping[str, Any], size: int) -> list[str] | None:
    """The feature's names of its flattened values, where it has one per value."""
    names = feature.get("names")
    if isinstance(names, dict) and len(names) == 1:  # LeRobot v2's {"motors": [...]}
        names = next(iter(names.values()))
    if isinstance(names, list) and len(names) == size and all(isinstance(n, str) for n in names):
        return names
    return None


def summary_lines(poisons: Sequence[Poison], unchecked: int = 0, shown: int = 5) -> list[str]:
    """Readable lines: one per kind and feature (and frozen dimensions), with how many
    episodes and the first ``shown`` of them."""
    groups: dict[tuple, list[Poison]] = {}
    for p in poisons:
        groups.setdefault((KINDS.index(p.kind), p.feature or "", p.dimensions), []).append(p)
    lines = []
    for (kind, feature, dimensions), found in sorted(groups.items()):
        episodes = sorted({p.episode_index for p in found})
        listed = ", ".join(str(e) for e in episodes[:shown]) + (
            f", ... ({len(episodes) - shown} more)" if len(episodes) > shown else ""
        )
        plural = "episode" if len(episodes) == 1 else "episodes"
        if KINDS[kind] == NON_FINITE:
            first = min(found, key=lambda p: (p.first_index is None, p.first_index or 0))
            lines.append(
                f"{feature}: {sum(p.count or 0 for p in found)} non-finite value(s) in "
                f"{len(episodes)} {plural} ({listed}); the first at index {first.first_index}"
            )
        elif KINDS[kind] == CONSTANT:
            named = f" ({', '.join(found[0].names)})" if found[0].names else ""
            lines.append(
                f"{feature}: dimension(s) {list(dimensions)}{named} constant over the whole of "
                f"{len(episodes)} {plural} ({listed})"
            )
        else:
            lines.append(f"one-frame episodes: {len(episodes)} ({listed})")
    if unchecked:
        lines.append(f"{unchecked} episode(s) not checked (converted by an earlier version)")
    return lines


POISONS_FILE = "poisons.json"
"""Beside a converted dataset's ``index.json``: what ``convert`` found, for ``inspect``."""


def poisons_json(poisons: Sequence[Poison], unchecked: Sequence[int] = ()) -> bytes:
    """``POISONS_FILE``'s bytes: every finding, and the episodes not checked (converted by an
    earlier version, resumed without their findings)."""
    raw = {"poisons": [p.to_json() for p in poisons], "unchecked_episodes": list(unchecked)}
    return json.dumps(raw, indent=1).encode()


def parse_poisons(data: bytes, where: str) -> tuple[list[Poison], list[int]]:
    """``POISONS_FILE`` read back: the findings and the unchecked episodes; ValueError naming
    ``where`` if it is not that file."""
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ValueError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("poisons"), list):
        raise ValueError(f"{where}: holds no list of poisons")
    unchecked = raw.get("unchecked_episodes", [])
    if not isinstance(unchecked, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in unchecked
    ):
        raise ValueError(f"{where}: unchecked_episodes must be a list of episode indices")
    return [Poison.from_json(p, where) for p in raw["poisons"]], unchecked
