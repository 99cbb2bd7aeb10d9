"""The selected episodes' manifest rows as the reader keeps them: arrays, no object per episode.

A million episodes' manifest is half a gigabyte as Arrow (the member names alone 212 MB, every
one of them ``episode-EEEEEE.<something>``), and a Python object per episode is worse. What the
reader needs of a row is its numbers, its checksum, its shard and its members' spans. So:

- numbers are numpy columns; checksums their 32 digest bytes (a third of their text);
- a shard path that is the format's (``format.shard_path``) is kept as nothing, any other
  (another writer's layout: pairs of episodes, all in one tar) as its text;
- a member named as the format names it, in the format's order (header, rows, then each
  camera of ``index.json``'s ``video_keys``), is kept as its span only; any other name (extra
  members, another order) as its text, beside its span.

Both are decided for the whole manifest at once by comparing its bytes with the names the
format would give (``format.formatted``). Arrays only, so DataLoader workers forked from the
process share them page for page (a Python object's reference count, written when it is read,
would copy its page into every worker), and pickling them (spawn and forkserver workers) costs
their own bytes, never the Arrow buffers they were read from, which pyarrow pickles whole with
every slice (apache/arrow#26685). ``table`` gives the rows back as the manifest had them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lerobot_shards.format import (
    MANIFEST_SCHEMA,
    MEMBER_TYPE,
    checksum_digests,
    checksum_texts,
    digit_counts,
    episode_key,
    equal_strings,
    formatted,
    join,
    manifest_fingerprint,
    shard_path,
    shard_paths,
    string_array,
)
from lerobot_shards.reader.fetch.ranged import Span


class Selection:
    """The manifest rows of the selected episodes, in episode order, as the arrays the planner
    and the fetcher use: ``episodes``, ``lengths`` (frames), ``sizes`` (shard bytes).

    Args:
        table: The selected rows of a checked manifest (``validate.check_manifest``).
        path: The dataset's root as its filesystem names it (shards are joined to it).
        video_keys: The dataset's cameras, in the order its shards hold them.
    """

    def __init__(self, table: pa.Table, path: str, video_keys: Sequence[str]) -> None:
        self.path = path
        self.episodes = _numbers(table, "episode_index")
        self.lengths = _numbers(table, "length")
        self.sizes = _numbers(table, "size")
        self._offsets = _numbers(table, "offset")
        self.starts = _numbers(table, "dataset_from_index")
        """Each row's ``dataset_from_index``: the global index of its first frame."""
        self.fingerprint = manifest_fingerprint(table)
        """``manifest_fingerprint`` of these rows: what a checkpoint is checked against."""
        self._digests = checksum_digests(table.column("checksum"))[0]
        shards = table.column("shard")
        self._other_shard_rows = np.flatnonzero(~equal_strings(shards, *shard_paths(self.episodes)))
        self._other_shards = (
            shards.take(self._other_shard_rows).combine_chunks().dictionary_encode()
        )
        tasks = table.column("tasks").chunks
        counts = [np.diff(chunk.offsets.to_numpy()) for chunk in tasks]
        self._task_bounds = np.concatenate([[0], np.cumsum(np.concatenate(counts or [[]]))])
        values = [chunk.flatten() for chunk in tasks]
        self._tasks = pa.concat_arrays(values or [pa.array([], pa.string())]).dictionary_encode()
        self._members = _Members(table.column("members"), self.episodes, self._offsets, video_keys)

    def __len__(self) -> int:
        return len(self.episodes)

    def _row(self, episode: int) -> int:
        row = int(np.searchsorted(self.episodes, episode))
        if row == len(self.episodes) or self.episodes[row] != episode:
            raise KeyError(f"episode {episode} is not selected")
        return row

    def lengths_of(self, episodes: np.ndarray) -> np.ndarray:
        """Frames of each of ``episodes`` (selected ones)."""
        return self.lengths[np.searchsorted(self.episodes, episodes)]

    def cost(self, episode: int, start: int, stop: int) -> int:
        """What a piece (rows ``start:stop``) costs the pool budget while resident: its
        episode's shard bytes, fetched whole whichever rows it draws (decoded frames are in the
        frame cache, budgeted apart)."""
        return int(self.sizes[self._row(episode)])

    def shard(self, row: int) -> str:
        """The shard path of row ``row``, relative to the root."""
        other = int(np.searchsorted(self._other_shard_rows, row))
        if other < len(self._other_shard_rows) and self._other_shard_rows[other] == row:
            return self._other_shards[other].as_py()
        return shard_path(int(self.episodes[row]))

    def checksum(self, row: int) -> str:
        """The manifest checksum of row ``row``."""
        return checksum_texts(self._digests[row : row + 1])[0].as_py()

    @property
    def checksums(self) -> list[str]:
        """Every row's checksum, in row order (made on each call)."""
        return checksum_texts(self._digests).to_pylist()

    def span(self, episode: int) -> Span:
        """The byte span of ``episode`` in its shard, with its checksum."""
        row = self._row(episode)
        return Span(
            episode,
            join(self.path, self.shard(row)),
            int(self._offsets[row]),
            int(self.sizes[row]),
            self.checksum(row),
        )

    def members(self, episode: int) -> dict[str, tuple[int, int]]:
        """``episode``'s tar members: name to (offset within its span, size)."""
        return self._members.of(self._row(episode), episode)

    def length(self, episode: int) -> int:
        """Frames of ``episode``."""
        return int(self.lengths[self._row(episode)])

    def start(self, episode: int) -> int:
        """The global index of ``episode``'s first frame (its ``dataset_from_index``)."""
        return int(self.starts[self._row(episode)])

    @property
    def table(self) -> pa.Table:
        """The rows as the manifest has them (``MANIFEST_SCHEMA``; made on each call)."""
        episodes = self.episodes
        shards = string_array(*shard_paths(episodes))
        if len(self._other_shard_rows):
            replaced = np.zeros(len(episodes), bool)
            replaced[self._other_shard_rows] = True
            shards = pc.replace_with_mask(shards, replaced, self._other_shards.cast(pa.string()))
        tasks = pa.ListArray.from_arrays(
            pa.array(self._task_bounds.astype(np.int32)),
            self._tasks.cast(pa.string()),
            type=MANIFEST_SCHEMA.field("tasks").type,
        )
        columns = [
            pa.array(episodes),
            shards,
            pa.array(self._offsets),
            pa.array(self.sizes),
            pa.array(self.lengths),
            pa.array(self.starts),
            pa.array(self.starts + self.lengths),
            tasks,
            self._members.column(episodes, self._offsets),
            checksum_texts(self._digests),
        ]
        return pa.table(columns, schema=MANIFEST_SCHEMA)


def select(table: pa.Table, episodes: Sequence[int] | None, root: str) -> pa.Table:
    """The rows of ``episodes`` (all with None) of a checked manifest; an episode the manifest
    lacks raises ``ValueError`` naming it and ``root``."""
    if episodes is None:
        return table
    present = table.column("episode_index").to_numpy()
    wanted = np.unique(np.asarray(list(episodes), dtype=np.int64))
    if not len(wanted):
        # An empty epoch would only show as a training loop that never steps.
        raise ValueError(f"episodes selects no episode of {root}: give None for all")
    rows = np.minimum(np.searchsorted(present, wanted), max(len(present) - 1, 0))
    missing = wanted[(len(present) == 0) | (present[rows] != wanted)]
    if len(missing):
        raise ValueError(f"episodes {missing.tolist()} are not in {root} ({len(present)} episodes)")
    return table.take(rows)


class _Members:
    """Every row's tar members: spans as numpy columns, row ``i``'s members at
    ``bounds[i]:bounds[i+1]``; names the format's (``roles``: which of ``suffixes``, after the
    episode's key, each is; None: each member's position in its row) or their text (``names``,
    by member: only where not the format's)."""

    def __init__(
        self,
        column: pa.ChunkedArray,
        episodes: np.ndarray,
        bases: np.ndarray,
        video_keys: Sequence[str],
    ) -> None:
        self.suffixes = [".json", ".parquet", *(f".{key}.mp4" for key in video_keys)]
        flat = [chunk.flatten().flatten() for chunk in column.chunks]  # [names, offsets, sizes]
        counts = np.concatenate(
            [np.diff(c.offsets.to_numpy()) for c in column.chunks] or [np.zeros(0, np.int64)]
        ).astype(np.int64)
        self.bounds = np.concatenate([[0], np.cumsum(counts)])
        names = pa.chunked_array([f[0] for f in flat], pa.string())
        bases = np.repeat(bases, counts)
        self.offsets = _narrow(_concatenated([f[1] for f in flat]) - bases)
        self.sizes = _narrow(_concatenated([f[2] for f in flat]))
        owners = np.repeat(episodes, counts)
        positions = np.arange(len(owners)) - np.repeat(self.bounds[:-1], counts)
        roles = np.full(len(owners), -1, np.int8)
        width = len(self.suffixes)
        if len(owners) and (counts == width).all():  # as many as the format's: all in one look
            parts = [
                part
                for suffix in self.suffixes
                for part in (b"episode-", (episodes, 6), suffix.encode())
            ]
            _, data = formatted(parts, len(episodes))
            suffix_lengths = np.array([len(s) for s in self.suffixes])
            lengths = np.repeat(8 + digit_counts(episodes, 6), width) + np.tile(
                suffix_lengths, len(episodes)
            )
            same = equal_strings(names, lengths, data)
            roles[same] = positions[same]
        for role, suffix in enumerate(self.suffixes):  # the rest, position by position
            at = np.flatnonzero((positions == role) & (roles < 0))
            if len(at):
                lengths, data = formatted([b"episode-", (owners[at], 6), suffix.encode()], len(at))
                roles[at[equal_strings(names.take(at), lengths, data)]] = role
        self.roles: np.ndarray | None = None
        self.names: dict[int, str] = {}
        if (roles != positions).any():
            self.roles = roles
            odd = np.flatnonzero(roles < 0)
            self.names = dict(zip(odd.tolist(), names.take(odd).to_pylist(), strict=True))

    def of(self, row: int, episode: int) -> dict[str, tuple[int, int]]:
        """Row ``row``'s members (of episode ``episode``): name to (offset in the span, size)."""
        lo, hi = int(self.bounds[row]), int(self.bounds[row + 1])
        key = episode_key(episode)
        out = {}
        for j in range(lo, hi):
            role = j - lo if self.roles is None else int(self.roles[j])
            name = key + self.suffixes[role] if role >= 0 else self.names[j]
            out[name] = (int(self.offsets[j]), int(self.sizes[j]))
        return out

    def column(self, episodes: np.ndarray, bases: np.ndarray) -> pa.Array:
        """The members as the manifest's column (of rows ``episodes`` at ``bases``)."""
        counts = np.diff(self.bounds)
        owners = np.repeat(episodes, counts)
        roles = self.roles
        if roles is None:
            roles = np.arange(len(owners)) - np.repeat(self.bounds[:-1], counts)
        pieces, where = [], []
        for role, suffix in enumerate(self.suffixes):
            at = np.flatnonzero(roles == role)
            parts = [b"episode-", (owners[at], 6), suffix.encode()]
            pieces.append(string_array(*formatted(parts, len(at))))
            where.append(at)
        odd = np.array(sorted(self.names), np.int64)
        pieces.append(pa.array([self.names[j] for j in odd.tolist()], pa.string()))
        where.append(odd)
        names = pa.concat_arrays(pieces).take(np.argsort(np.concatenate(where)))
        offsets = self.offsets.astype(np.int64) + np.repeat(bases, counts)
        values = pa.StructArray.from_arrays(
            [names, pa.array(offsets), pa.array(self.sizes.astype(np.int64))],
            fields=list(MEMBER_TYPE),
        )
        return pa.ListArray.from_arrays(
            pa.array(self.bounds.astype(np.int32)),
            values,
            type=MANIFEST_SCHEMA.field("members").type,
        )


def _numbers(table: pa.Table, name: str) -> np.ndarray:
    """An integer column as numpy (a view of a column read whole, shared with ``meta``)."""
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def _concatenated(arrays: list[pa.Array]) -> np.ndarray:
    return np.concatenate([a.to_numpy() for a in arrays] or [np.zeros(0, np.int64)])


def _narrow(values: np.ndarray) -> np.ndarray:
    """``values`` (non-negative) as uint32 where they fit: half the memory of member spans."""
    if not len(values) or (values.min() >= 0 and values.max() < 2**32):
        return values.astype(np.uint32)
    return values.astype(np.int64)
