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

The manifest is read a checked batch at a time (``validate.ManifestFile``) and each batch's
names compared at once with the names the format would give (``format.Formatted``), so the
whole table never exists. Arrays only, so DataLoader workers forked from the process share
them page for page (a Python object's reference count, written when it is read, would copy
its page into every worker), and pickling them (spawn and forkserver workers) costs their own
bytes, never the Arrow buffers they were read from, which pyarrow pickles whole with every
slice (apache/arrow#26685). ``table`` gives the rows back as the manifest had them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lerobot_shards.arrow import arrow_array, as_numpy, system_allocator
from lerobot_shards.format import (
    MANIFEST_SCHEMA,
    MEMBER_TYPE,
    Formatted,
    checksum_texts,
    digests_fingerprint,
    digit_counts,
    episode_key,
    equal_strings,
    formatted,
    join,
    shard_path,
    shard_paths,
    string_array,
)
from lerobot_shards.reader.fetch.ranged import Span
from lerobot_shards.validate import CheckedRows, ManifestFile, checked_manifest


class Selection:
    """The manifest rows of the selected episodes, in episode order, as the arrays the planner
    and the fetcher use: ``episodes``, ``lengths`` (frames), ``sizes`` (shard bytes).

    Args:
        tables: The selected rows of a checked manifest (``validate.checked_manifest``), in
            order, in as many parts as they come.
        rows: How many rows ``tables`` hold at most.
        path: The dataset's root as its filesystem names it (shards are joined to it).
        video_keys: The dataset's cameras, in the order its shards hold them.
    """

    def __init__(
        self, tables: Iterable[CheckedRows], rows: int, path: str, video_keys: Sequence[str]
    ) -> None:
        self.path = path
        numbers = {name: np.zeros(rows, np.int64) for name in _NUMBERS}
        digests = np.zeros((rows, 32), np.uint8)
        shards = _OtherShards()
        tasks: list[tuple[np.ndarray, pa.Array]] = []
        members = _MembersBuilder(video_keys)
        row = 0
        for checked in tables:
            table = checked.table
            end = row + table.num_rows
            for name, column in numbers.items():
                column[row:end] = as_numpy(table.column(name))
            digests[row:end] = checked.digests
            episodes = numbers["episode_index"][row:end]
            shards.add(table.column("shard"), checked.other_shards, row)
            for chunk in table.column("tasks").chunks:
                tasks.append((np.diff(as_numpy(chunk.offsets)), chunk.flatten()))
            members.add(table.column("members"), episodes, numbers["offset"][row:end])
            row = end
        self.episodes = numbers["episode_index"][:row]
        self.lengths = numbers["length"][:row]
        self.sizes = numbers["size"][:row]
        self.starts = numbers["dataset_from_index"][:row]
        """Each row's ``dataset_from_index``: the global index of its first frame."""
        self._offsets = numbers["offset"][:row]
        self._digests = digests[:row]
        self._shards = shards
        counts = np.concatenate([c for c, _ in tasks] or [np.zeros(0, np.int64)])
        self._task_bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = pa.concat_arrays([v for _, v in tasks] or [pa.array([], pa.string())])
        self._tasks = values.dictionary_encode()
        self._members = members.finish()

    @cached_property
    def fingerprint(self) -> str:
        """``manifest_fingerprint`` of these rows: what a checkpoint is checked against (made
        when first asked for: a pass over every checksum that opening the dataset skips)."""
        return digests_fingerprint(self.episodes, self.lengths, self._digests)

    @classmethod
    def of(cls, table: pa.Table, path: str, video_keys: Sequence[str]) -> Selection:
        """The rows of ``table`` (a manifest, or some of its rows: checked here)."""
        return cls([checked_manifest(table, path)], table.num_rows, path, video_keys)

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
        return self._shards.of(row, int(self.episodes[row]))

    def checksum(self, row: int) -> str:
        """The manifest checksum of row ``row``."""
        return checksum_texts(self._digests[row : row + 1])[0].as_py()

    @property
    def digests(self) -> np.ndarray:
        """Every row's checksum digest, an ``(n, 32)`` byte matrix (read-only)."""
        view = self._digests.view()
        view.flags.writeable = False
        return view

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
        tasks = pa.ListArray.from_arrays(
            arrow_array(self._task_bounds.astype(np.int32)),
            self._tasks.cast(pa.string()),
            type=MANIFEST_SCHEMA.field("tasks").type,
        )
        columns = [
            arrow_array(episodes),
            self._shards.column(episodes),
            arrow_array(self._offsets),
            arrow_array(self.sizes),
            arrow_array(self.lengths),
            arrow_array(self.starts),
            arrow_array(self.starts + self.lengths),
            tasks,
            self._members.column(episodes, self._offsets),
            checksum_texts(self._digests),
        ]
        return pa.table(columns, schema=MANIFEST_SCHEMA)


_NUMBERS = ["episode_index", "length", "size", "offset", "dataset_from_index"]


@dataclass(frozen=True)
class ManifestRows:
    """The numbers of every row of a manifest, selected or not: what its totals and the
    metadata are checked against (``check_totals``, ``read_meta``)."""

    episodes: np.ndarray
    lengths: np.ndarray
    sizes: np.ndarray
    starts: np.ndarray
    shard: Callable[[int], str]
    """Row ``row``'s shard path."""

    @classmethod
    def read(cls, file: ManifestFile) -> ManifestRows:
        """The numbers of every row of ``file``, its rows checked as they are read."""
        every = _EveryRow(file.num_rows)
        for checked in file.batches():
            every.add(checked)
        return every.rows()

    def table(self) -> pa.Table:
        """The numbers as a table (``episode_index``, ``length``, ``size``,
        ``dataset_from_index``, ``dataset_to_index``), the arrays' own memory."""
        return pa.table(
            {
                "episode_index": arrow_array(self.episodes),
                "length": arrow_array(self.lengths),
                "size": arrow_array(self.sizes),
                "dataset_from_index": arrow_array(self.starts),
                "dataset_to_index": arrow_array(self.starts + self.lengths),
            }
        )


def read_selection(
    data: bytes | pa.Buffer,
    where: str,
    path: str,
    episodes: Sequence[int] | None,
    root: str,
    video_keys: Sequence[str],
) -> tuple[Selection, ManifestRows]:
    """The rows of ``episodes`` (all with None) of the manifest file ``data`` (read from
    ``where``), checked as they are read, and the numbers of every row; an episode the manifest
    lacks raises ``ValueError`` naming it and ``root``."""
    with system_allocator():  # (``lerobot_shards.arrow`` says why)
        try:
            return _read_selection(data, where, path, episodes, root, video_keys)
        finally:  # the batches' memory, which an allocator may keep for later: 190 MB at 1M
            pa.default_memory_pool().release_unused()


def _read_selection(
    data: bytes | pa.Buffer,
    where: str,
    path: str,
    episodes: Sequence[int] | None,
    root: str,
    video_keys: Sequence[str],
) -> tuple[Selection, ManifestRows]:
    file = ManifestFile(data, where)
    if episodes is None:
        selection = Selection(file.batches(), file.num_rows, path, video_keys)
        every = ManifestRows(
            selection.episodes, selection.lengths, selection.sizes, selection.starts,
            selection.shard,
        )  # fmt: skip
        return selection, every
    wanted = np.unique(np.asarray(list(episodes), dtype=np.int64))
    if not len(wanted):
        # An empty epoch would only show as a training loop that never steps.
        raise ValueError(f"episodes selects no episode of {root}: give None for all")
    every = _EveryRow(file.num_rows)

    def selected() -> Iterable[CheckedRows]:
        for checked in file.batches():
            every.add(checked)
            present = as_numpy(checked.table.column("episode_index"))
            at = np.minimum(np.searchsorted(wanted, present), len(wanted) - 1)
            keep = wanted[at] == present
            if keep.any():
                yield checked.filter(keep)

    selection = Selection(selected(), len(wanted), path, video_keys)
    rows = every.rows()
    if len(selection) < len(wanted):
        missing = np.setdiff1d(wanted, rows.episodes)
        raise ValueError(
            f"episodes {missing.tolist()} are not in {root} ({len(rows.episodes)} episodes)"
        )
    return selection, rows


class _EveryRow:
    """The numbers and odd shards of every row of a manifest, a batch at a time."""

    def __init__(self, rows: int) -> None:
        self.numbers = {name: np.zeros(rows, np.int64) for name in _NUMBERS if name != "offset"}
        self.shards = _OtherShards()
        self.row = 0

    def add(self, checked: CheckedRows) -> None:
        table, end = checked.table, self.row + checked.table.num_rows
        for name, column in self.numbers.items():
            column[self.row : end] = as_numpy(table.column(name))
        self.shards.add(table.column("shard"), checked.other_shards, self.row)
        self.row = end

    def rows(self) -> ManifestRows:
        n = self.numbers
        episodes = n["episode_index"][: self.row]
        shards = self.shards
        return ManifestRows(
            episodes, n["length"][: self.row], n["size"][: self.row],
            n["dataset_from_index"][: self.row], lambda row: shards.of(row, int(episodes[row])),
        )  # fmt: skip


class _OtherShards:
    """The shard paths that are not ``format.shard_path``'s, by row (usually none)."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []
        self._paths: list[pa.Array] = []

    def add(self, column: pa.ChunkedArray, other: np.ndarray, first_row: int) -> None:
        """Rows ``first_row...`` of the shard column, ``other`` of them not shard_path's."""
        if len(other):
            self._rows.append(other + first_row)
            self._paths.append(column.take(other).combine_chunks().dictionary_encode())

    @property
    def rows(self) -> np.ndarray:
        if len(self._rows) > 1:  # one array of each, on first use after the last batch
            self._rows = [np.concatenate(self._rows)]
            paths = pa.chunked_array(self._paths).cast(pa.string()).combine_chunks()
            self._paths = [paths.dictionary_encode()]
        return self._rows[0] if self._rows else np.zeros(0, np.int64)

    def of(self, row: int, episode: int) -> str:
        rows = self.rows
        at = int(np.searchsorted(rows, row))
        if at < len(rows) and rows[at] == row:
            return self._paths[0][at].as_py()
        return shard_path(episode)

    def column(self, episodes: np.ndarray) -> pa.Array:
        """Every row's shard path."""
        paths = shard_paths(episodes)
        column = string_array(paths.lengths, paths.data())
        rows = self.rows
        if not len(rows):
            return column
        replaced = np.zeros(len(episodes), bool)
        replaced[rows] = True
        return pc.replace_with_mask(column, replaced, self._paths[0].cast(pa.string()))


class _MembersBuilder:
    """Rows' tar members, a batch at a time (:class:`_Members`)."""

    def __init__(self, video_keys: Sequence[str]) -> None:
        self.suffixes = [".json", ".parquet", *(f".{key}.mp4" for key in video_keys)]
        self.counts: list[np.ndarray] = []
        self.offsets: list[np.ndarray] = []
        self.sizes: list[np.ndarray] = []
        self.roles: list[np.ndarray | None] = []
        self.names: dict[int, str] = {}
        self.members = 0

    def add(self, column: pa.ChunkedArray, episodes: np.ndarray, bases: np.ndarray) -> None:
        """Rows of ``episodes`` (their spans at ``bases``): their members ``column``."""
        row = 0
        for chunk in column.chunks:
            counts = np.diff(as_numpy(chunk.offsets)).astype(np.int64)
            rows = slice(row, row + len(chunk))
            names, offsets, sizes = chunk.flatten().flatten()
            self.counts.append(counts)
            self.offsets.append(_small(as_numpy(offsets) - np.repeat(bases[rows], counts)))
            self.sizes.append(_small(as_numpy(sizes)))
            self.roles.append(self._roles(names, episodes[rows], counts))
            self.members += len(names)
            row += len(chunk)

    def _roles(
        self, names: pa.Array, episodes: np.ndarray, counts: np.ndarray
    ) -> np.ndarray | None:
        """Which format's name each of ``names`` is (None: each its position in its row, as
        the format writes them; -1: another name, kept in ``self.names``)."""
        width = len(self.suffixes)
        parts = [p for s in self.suffixes for p in (b"episode-", (episodes, 6), s.encode())]
        regular = len(names) and (counts == width).all()
        if regular:
            key_lengths = 8 + digit_counts(episodes, 6)
            suffix_lengths = np.array([len(s) for s in self.suffixes])
            lengths = (key_lengths[:, None] + suffix_lengths).ravel()
            same = equal_strings(names, Formatted(parts, len(episodes)), lengths)
            if same.all():
                return None
        positions = np.arange(len(names)) - np.repeat(np.cumsum(counts) - counts, counts)
        owners = np.repeat(episodes, counts)
        roles = np.full(len(names), -1, np.int8)
        for role, suffix in enumerate(self.suffixes):  # position by position
            at = np.flatnonzero(positions == role)
            if len(at):
                parts = [b"episode-", (owners[at], 6), suffix.encode()]
                roles[at[equal_strings(names.take(at), Formatted(parts, len(at)))]] = role
        odd = np.flatnonzero(roles < 0)
        self.names.update(
            zip((odd + self.members).tolist(), names.take(odd).to_pylist(), strict=True)
        )
        return roles

    def finish(self) -> _Members:
        counts = np.concatenate(self.counts or [np.zeros(0, np.int64)])
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        roles = None
        if any(r is not None for r in self.roles):
            roles = np.concatenate(
                [
                    np.arange(len(o)) - np.repeat(np.cumsum(c) - c, c) if r is None else r
                    for r, o, c in zip(self.roles, self.offsets, self.counts, strict=True)
                ]
            ).astype(np.int8)
        return _Members(
            self.suffixes,
            bounds,
            _narrow(self.offsets),
            _narrow(self.sizes),
            roles,
            self.names,
        )


@dataclass(frozen=True)
class _Members:
    """Every row's tar members: spans as numpy columns, row ``i``'s members at
    ``bounds[i]:bounds[i+1]``; names the format's (``roles``: which of ``suffixes``, after the
    episode's key, each is; None: each member's position in its row) or their text (``names``,
    by member: only where not the format's)."""

    suffixes: list[str]
    bounds: np.ndarray
    offsets: np.ndarray
    sizes: np.ndarray
    roles: np.ndarray | None
    names: dict[int, str]

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
        bounds = pa.array(self.bounds.astype(np.int32))
        return pa.ListArray.from_arrays(bounds, values, type=MANIFEST_SCHEMA.field("members").type)


def _small(values: np.ndarray) -> np.ndarray:
    """``values`` as uint32 where they fit (member spans: half the memory), else as they are."""
    if not len(values) or (values.min() >= 0 and values.max() < 2**32):
        return values.astype(np.uint32)
    return values


def _narrow(pieces: list[np.ndarray]) -> np.ndarray:
    """``pieces`` (each :func:`_small`) end to end, uint32 where all are."""
    dtype = np.uint32 if all(p.dtype == np.uint32 for p in pieces) else np.int64
    return np.concatenate([p.astype(dtype, copy=False) for p in pieces] or [np.zeros(0, dtype)])
