"""Each dataset of a mixture placed into a target layout (``embodiment.py``): where its keys
go, checked when the mixture is opened, and its items mapped as they are built.

Opening resolves, per dataset, its key map under the layout (:func:`layout_key_map`: cameras
onto slots, vectors onto vector keys, everything else left out) and then a :class:`Placement`:
for each vector key, the slot dim of each of the dataset's dims and the normaliser of its own
statistics; for each camera slot, whether the dataset fills it. Anything that would not fit is
refused there, naming the dataset and the key: a vector wider than its slot, a dim placed
twice or outside the slot, a name the slot lacks, a camera mapped twice or onto no slot, a
dtype that cannot be padded into float32, statistics a normaliser needs and the dataset lacks.
Nothing is truncated.

Items are then mapped in the DataLoader workers, after they are built as LeRobot builds them
(``Placement.apply``): vectors normalised and scattered into zeros (padded dims are exactly
zero, whatever the normalisation), zero images for the slots a dataset lacks (written into the
batch's shared slots where it has them), the masks, and the names of the dataset and its robot.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from lerobot_shards.reader.batches.collate import typed_item
from lerobot_shards.reader.meta.embodiment import TargetLayout, VectorSlot
from lerobot_shards.reader.meta.schema import Schema
from lerobot_shards.validate import frame_size

if TYPE_CHECKING:
    from lerobot_shards.reader.meta.catalog import Member

INDEX_COLUMNS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
"""Columns every LeRobot dataset has, kept in a layout's items as they are."""
EPS = 1e-8
"""LeRobot 0.6.1's normaliser's epsilon (``NormalizerProcessorStep.eps``)."""
CAMERA_DTYPES = ("video", "image")


def is_camera(feature: Mapping[str, Any]) -> bool:
    return feature.get("dtype") in CAMERA_DTYPES


def default_name(root: str | os.PathLike) -> str:
    """A dataset's name when none is given: the last part of its root."""
    return str(root).rstrip("/").rsplit("/", 1)[-1] or str(root)


def feature_names(feature: Mapping[str, Any]) -> list[str] | None:
    """A vector feature's dim names: its ``names`` list, or the one list of a ``{"motors":
    [...]}`` mapping (older LeRobot datasets); None where it has none."""
    names = feature.get("names")
    if isinstance(names, Mapping) and len(names) == 1:
        names = next(iter(names.values()))
    if isinstance(names, list) and all(isinstance(n, str) for n in names):
        return list(names)
    return None


def layout_key_map(
    layout: TargetLayout,
    embodiment: str,
    features: Mapping[str, Mapping[str, Any]],
    own_key_map: Mapping[str, str | None],
    where: str,
) -> dict[str, str | None]:
    """The dataset's key map under ``layout``: its own (``DatasetRoot.key_map``), then its
    embodiment's, composed; every feature the layout does not place mapped to None.

    Raises ValueError naming ``where`` and the key: a camera onto no slot, two cameras onto one
    slot, a non-camera onto a slot, two features onto one vector key.
    """
    renames = layout.embodiment(embodiment).key_map
    composed: dict[str, str | None] = {}
    slots: dict[str, str] = {}
    vectors: dict[str, str] = {}
    for key, feature in features.items():
        name = own_key_map.get(key, key)
        if name is not None:
            name = renames.get(name, name)
        if name is None:
            composed[key] = None
            continue
        if is_camera(feature):
            if name not in layout.cameras:
                raise ValueError(
                    f"{where}: camera {key!r} has no slot in the layout (slots "
                    f"{list(layout.cameras)}): map it onto one (the embodiment's or the "
                    "dataset's key_map) or drop it (None)"
                )
            if name in slots:
                raise ValueError(
                    f"{where}: cameras {slots[name]!r} and {key!r} are both mapped to slot {name!r}"
                )
            slots[name] = key
        elif name in layout.cameras:
            raise ValueError(f"{where}: {key!r} is not a camera but is mapped to slot {name!r}")
        elif name in layout.vectors:
            if name in vectors:
                raise ValueError(
                    f"{where}: {vectors[name]!r} and {key!r} are both mapped to vector {name!r}"
                )
            vectors[name] = key
        elif name not in INDEX_COLUMNS:
            name = None  # left out of the layout's items
        composed[key] = name
    if "task" in own_key_map:
        composed["task"] = own_key_map["task"]
    return composed


@dataclass
class _Vector:
    """One vector key of the layout as one dataset fills it."""

    key: str
    width: int
    source: str | None
    """The dataset's own feature placed here (None: the dataset has none)."""
    dims: np.ndarray
    """Slot dim of each of the source's dims (int64)."""
    mask: np.ndarray
    """Which slot dims are real (bool, ``width``)."""
    mode: str | None
    shift: np.ndarray | None = None
    """float32, as LeRobot's normaliser holds its statistics (and as the items' values are:
    numpy's float32 arithmetic is torch's, operation for operation)."""
    scale: np.ndarray | None = None


class Placement:
    """How one dataset's items become the layout's (built at opening: :func:`place_members`).

    Args:
        layout: The target layout.
        key_map: The dataset's key map under it (:func:`layout_key_map`).
        features: The dataset's own features.
        stats: Its statistics (``DatasetMeta.stats``; None: it has none).
        steps: Steps of each item key with ``delta_timestamps`` or ``delta_indices`` (a key
            the dataset lacks included: its zeros and ``_is_pad`` have as many).
        slot_shapes: ``(height, width)`` of every camera slot.
        return_uint8: Camera slots are uint8 (else float32 in [0, 1]).
        dataset_index: The dataset's position in the mixture.
        name: The dataset's name, in items and ``meta.stats_by_dataset``.
        embodiment: Its robot's name.
        embodiment_index: That name's position in ``meta.embodiment_names``.
        where: The dataset, for errors.
    """

    def __init__(
        self,
        layout: TargetLayout,
        *,
        key_map: Mapping[str, str | None],
        features: Mapping[str, Mapping[str, Any]],
        stats: Mapping[str, Mapping[str, np.ndarray]] | None,
        steps: Mapping[str, int],
        slot_shapes: Mapping[str, tuple[int, int]],
        return_uint8: bool,
        dataset_index: int,
        name: str,
        embodiment: str,
        embodiment_index: int,
        where: str,
    ) -> None:
        self.layout = layout
        self.key_map = dict(key_map)
        self.name = name
        self.embodiment = embodiment
        self.embodiment_index = embodiment_index
        self.dataset_index = dataset_index
        self.where = where
        self.steps = dict(steps)
        self.slot_shapes = dict(slot_shapes)
        self.camera_dtype = torch.uint8 if return_uint8 else torch.float32
        self._numpy_dtype = np.uint8 if return_uint8 else np.float32
        self.source_of = {item: own for own, item in self.key_map.items() if item is not None}
        self.present = {slot: slot in self.source_of for slot in layout.cameras}
        """Whether the dataset fills each camera slot."""
        # what every item holds alike, made once (each item gets a copy: cheaper than anew)
        self._flags = {present: torch.tensor(present) for present in (False, True)}
        self._index = torch.tensor(embodiment_index)
        self.features = features
        self.stats = stats
        self.vectors = [self._vector(key, slot) for key, slot in layout.vectors.items()]

    # ------------------------------------------------------------------ resolution

    def _vector(self, key: str, slot: VectorSlot) -> _Vector:
        source = self.source_of.get(key)
        mode = self.layout.normalization(key)
        if source is None:
            return _Vector(key, slot.width, None, np.zeros(0, np.int64),
                           np.zeros(slot.width, bool), mode)  # fmt: skip
        feature = self.features[source]
        what = f"{self.where}: vector {key!r}" + (f" (its {source!r})" if source != key else "")
        dtype, shape = str(feature.get("dtype")), tuple(feature.get("shape", ()))
        if not dtype.startswith("float"):
            raise ValueError(
                f"{what} is {dtype}, which cannot be padded into the layout's float32 slot"
            )
        if len(shape) != 1:
            raise ValueError(f"{what} has shape {shape}: only 1-d vectors can be placed")
        dims = self._dims(key, slot, shape[0], feature_names(feature), what)
        mask = np.zeros(slot.width, bool)
        mask[dims] = True
        vector = _Vector(key, slot.width, source, np.asarray(dims, np.int64), mask, mode)
        if mode is not None:
            vector.shift, vector.scale = self._normaliser(source, mode, shape[0], what)
        return vector

    def _dims(
        self, key: str, slot: VectorSlot, n: int, names: list[str] | None, what: str
    ) -> list[int]:
        """The slot dim of each of the source's ``n`` dims: the embodiment's ``dims``, else by
        name (a named slot), else the leading dims."""
        given = self.layout.embodiment(self.embodiment).dims.get(key)
        if given is not None:
            dims = list(given)
            if len(dims) != n:
                raise ValueError(
                    f"{what} has {n} dims; embodiment {self.embodiment!r} places {len(dims)}"
                )
        elif slot.names is not None:
            if names is None or len(names) != n:
                raise ValueError(
                    f"{what}: the layout places it by name, but its feature has no names for "
                    f"its {n} dims: give embodiment {self.embodiment!r} dims for {key!r}"
                )
            missing = [name for name in names if name not in slot.names]
            if missing:
                raise ValueError(
                    f"{what}: names {missing} are not in the slot's names {list(slot.names)}"
                )
            dims = [slot.names.index(name) for name in names]
        else:
            if n > slot.width:
                raise ValueError(
                    f"{what} has {n} dims, wider than its slot of {slot.width}: widen the "
                    "layout's slot (nothing is truncated)"
                )
            dims = list(range(n))
        outside = [d for d in dims if not 0 <= d < slot.width]
        if outside:
            raise ValueError(f"{what}: dims {outside} are outside its slot of {slot.width}")
        if len(set(dims)) != len(dims):
            raise ValueError(f"{what}: two of its dims are placed in the same slot dim: {dims}")
        return dims

    def _normaliser(
        self, source: str, mode: str, n: int, what: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """(shift, scale) of ``mode`` from the dataset's own stats of ``source``, as LeRobot's
        normaliser makes them (float32; a zero range becomes ``EPS``)."""
        names = {"mean_std": ("mean", "std"), "min_max": ("min", "max"),
                 "quantiles": ("q01", "q99"), "quantile10": ("q10", "q90")}[mode]  # fmt: skip
        feature_stats = (self.stats or {}).get(source)
        if feature_stats is None or any(s not in feature_stats for s in names):
            raise ValueError(
                f"{what}: normalize={mode!r} needs its stats {list(names)}, which the "
                "dataset's meta/stats.json lacks"
                + (" (LeRobot 0.4 and later write quantiles)" if mode.startswith("q") else "")
            )
        low, high = (torch.as_tensor(feature_stats[s], dtype=torch.float32) for s in names)
        if low.shape != (n,) or high.shape != (n,):
            raise ValueError(f"{what}: its stats {list(names)} are not of shape ({n},)")
        if mode == "mean_std":
            return low.numpy(), (high + EPS).numpy()
        denominator = high - low
        return low.numpy(), torch.where(denominator == 0, torch.tensor(EPS), denominator).numpy()

    # ------------------------------------------------------------------ items

    def apply(self, item: dict[str, Any], slots: Mapping[str, torch.Tensor] | None) -> dict:
        """``item`` (the dataset's, as built, keys under :attr:`key_map`) in the layout.
        ``slots``: the batch slots of the DataLoader worker (``transfer.BatchArena``), where a
        missing camera's zero image is written, as the decoder writes a present one's."""
        out: dict[str, Any] = {}
        for slot in self.layout.cameras:
            present = self.present[slot]
            out[slot] = item.pop(slot) if present else self._blank(slot, slots)
            out[f"{slot}_mask"] = self._flags[present].clone()
            self._pad(out, item, slot, present)
        for vector in self.vectors:
            out[vector.key] = self._padded(vector, item.pop(vector.key, None))
            out[f"{vector.key}_mask"] = torch.from_numpy(vector.mask.copy())
            self._pad(out, item, vector.key, vector.source is not None)
        out.update(item)  # the index columns, task, dataset_index
        out["dataset"] = self.name
        out["embodiment"] = self.embodiment
        out["embodiment_index"] = self._index.clone()
        return typed_item(out, self.layout.cameras)

    def _pad(self, out: dict, item: dict, key: str, present: bool) -> None:
        """``key``'s ``_is_pad`` where it has steps: the dataset's, or every step (it has
        nothing there)."""
        if key in self.steps:
            pad = f"{key}_is_pad"
            out[pad] = item.pop(pad) if present else torch.ones(self.steps[key], dtype=torch.bool)

    def _padded(self, vector: _Vector, value: torch.Tensor | None) -> torch.Tensor:
        """``value`` normalised (LeRobot's formulas, in float32) in its slot dims of zeros;
        numpy, as its small operations cost a tenth of torch's."""
        steps = self.steps.get(vector.key)
        lead = () if steps is None else (steps,)
        out = np.zeros((*lead, vector.width), np.float32)
        if value is not None:
            x = value.as_subclass(torch.Tensor).numpy().reshape(*lead, len(vector.dims))
            if vector.mode == "mean_std":
                x = (x - vector.shift) / vector.scale
            elif vector.mode is not None:
                x = 2 * (x - vector.shift) / vector.scale - 1
            out[..., vector.dims] = x
        return torch.from_numpy(out)

    def _blank(self, slot: str, slots: Mapping[str, torch.Tensor] | None) -> torch.Tensor:
        """A zero image (channel-first view of channel-last memory, as decoded frames are) for
        slot ``slot``: in the batch slot where there is one."""
        steps = self.steps.get(slot)
        height, width = self.slot_shapes[slot]
        shape = (1 if steps is None else steps, height, width, 3)
        given = None if slots is None else slots.get(slot)
        # numpy, on this thread: torch.zeros of a frame wakes torch's intra-op pool (collate.py)
        if given is not None and given.shape == shape and given.dtype == self.camera_dtype:
            given.numpy().fill(0)
            frames = given
        else:  # calloc'd: pages are zeroed as they are first touched
            frames = torch.from_numpy(np.zeros(shape, dtype=self._numpy_dtype))
        frames = frames.permute(0, 3, 1, 2)
        return frames.squeeze(0) if steps is None else frames

    # ------------------------------------------------------------------ what it gives

    def schema(self, own: Schema) -> Schema:
        """The placed items' schema, from the dataset's own (``schema.item_schema``)."""
        resize = self.layout.frame_resize
        out: Schema = {}
        consumed: set[str] = set()
        for slot in self.layout.cameras:
            steps = self.steps.get(slot)
            lead = () if steps is None else (steps,)
            if self.present[slot]:
                dtype, shape = own[slot]
                if resize is not None:
                    shape = (*shape[:-2], resize.height, resize.width)
            else:
                dtype = str(self.camera_dtype).removeprefix("torch.")
                shape = (*lead, 3, *self.slot_shapes[slot])
            out[slot], out[f"{slot}_mask"] = (dtype, shape), ("bool", ())
            consumed.add(slot)
            if steps is not None:
                out[f"{slot}_is_pad"] = ("bool", (steps,))
                consumed.add(f"{slot}_is_pad")
        for vector in self.vectors:
            steps = self.steps.get(vector.key)
            lead = () if steps is None else (steps,)
            out[vector.key] = ("float32", (*lead, vector.width))
            out[f"{vector.key}_mask"] = ("bool", (vector.width,))
            consumed.add(vector.key)
            if steps is not None:
                out[f"{vector.key}_is_pad"] = ("bool", (steps,))
                consumed.add(f"{vector.key}_is_pad")
        out.update({k: v for k, v in own.items() if k not in consumed})
        out["dataset"], out["embodiment"] = ("str", ()), ("str", ())
        out["embodiment_index"] = ("int64", ())
        return out

    def slot_stats(self) -> dict[str, dict[str, np.ndarray]]:
        """The dataset's statistics of each vector key in its slot dims (float64); padded dims
        hold the identity of every normalisation (mean 0, std 1, min and quantiles below the
        median -1, max and those above 1, q50 0), so they stay zero either way."""
        out: dict[str, dict[str, np.ndarray]] = {}
        for vector in self.vectors:
            own = (self.stats or {}).get(vector.source) if vector.source else None
            if own is None:
                continue
            dims = vector.dims
            placed: dict[str, np.ndarray] = {}
            for stat, value in own.items():
                if stat == "count":
                    placed[stat] = np.asarray(value).copy()
                    continue
                array = np.full(vector.width, identity(stat), dtype=np.float64)
                array[dims] = np.asarray(value, dtype=np.float64).reshape(-1)
                placed[stat] = array
            out[vector.key] = placed
        return out


def identity(stat: str) -> float:
    """The value of statistic ``stat`` under which every normalisation leaves 0 at 0: mean
    and median 0, std 1, min and quantiles below the median -1, max and those above it 1."""
    if stat.startswith("q") and stat[1:].isdigit():
        percent = int(stat[1:])
        return 0.0 if percent == 50 else (1.0 if percent > 50 else -1.0)
    return {"mean": 0.0, "std": 1.0, "max": 1.0}.get(stat, -1.0)


def slot_shapes(
    layout: TargetLayout, placed: Sequence[tuple[str, Mapping[str, str | None], Mapping]]
) -> dict[str, tuple[int, int]]:
    """Every camera slot's ``(height, width)``: the layout's ``image_size``, else the one size
    of the cameras mapped onto it. ``placed``: per dataset, (where, key map, features)."""
    if layout.image_size is not None:
        return dict.fromkeys(layout.cameras, layout.image_size)
    shapes: dict[str, dict[tuple[int, int], str]] = {slot: {} for slot in layout.cameras}
    for where, key_map, features in placed:
        for own, slot in key_map.items():
            if slot in shapes and own in features:
                shapes[slot].setdefault(frame_size(features[own]), f"{where} ({own!r})")
    out = {}
    for slot, sizes in shapes.items():
        if len(sizes) != 1:
            seen = "; ".join(f"{w}: {h}x{v}" for (h, v), w in sizes.items()) or "none fills it"
            raise ValueError(
                f"camera slot {slot!r} has no one size ({seen}): give the layout an image_size"
            )
        out[slot] = next(iter(sizes))
    return out


def check_embodiment_maps(
    layout: TargetLayout, used: Mapping[str, set[str]], names: Mapping[str, list[str]]
) -> None:
    """Refuse an embodiment's key_map naming a key none of its datasets has (a typo would
    otherwise leave a slot empty): ``used[e]``, the keys of embodiment ``e``'s datasets;
    ``names[e]`` those datasets."""
    for embodiment, keys in used.items():
        unknown = sorted(set(layout.embodiment(embodiment).key_map) - keys)
        if unknown:
            raise ValueError(
                f"embodiment {embodiment!r}: its key_map names {unknown}, which none of its "
                f"datasets ({', '.join(names[embodiment])}) has"
            )


def place_members(
    layout: TargetLayout, members: Sequence[Member], steps: Mapping[str, int], return_uint8: bool
) -> list[Placement]:
    """Each opened member's :class:`Placement` in ``layout`` (their key maps already under it:
    ``Member``). ``steps``: steps of each key with ``delta_timestamps`` or ``delta_indices``.
    Refuses two datasets of one name, and what :func:`slot_shapes` and
    :func:`check_embodiment_maps` refuse."""
    names = [m.name for m in members]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(
            f"datasets {repeated} appear more than once by name: give each its own "
            "(DatasetRoot(name=...)); items and stats name them"
        )
    embodiments = list(dict.fromkeys(m.embodiment for m in members))
    used: dict[str, set[str]] = {e: set() for e in embodiments}
    of: dict[str, list[str]] = {e: [] for e in embodiments}
    for member in members:
        own = member.own_key_map
        used[member.embodiment] |= {own.get(k, k) for k in member.meta.features} - {None}
        of[member.embodiment].append(member.root)
    check_embodiment_maps(layout, used, of)
    shapes = slot_shapes(layout, [(m.root, m.spec.key_map, m.meta.features) for m in members])
    return [
        Placement(
            layout,
            key_map=member.spec.key_map,
            features=member.meta.features,
            stats=member.meta.stats,
            steps=steps,
            slot_shapes=shapes,
            return_uint8=return_uint8,
            dataset_index=d,
            name=member.name,
            embodiment=member.embodiment,
            embodiment_index=embodiments.index(member.embodiment),
            where=f"dataset {d} ({member.root})",
        )
        for d, member in enumerate(members)
    ]
