"""A target layout: the one item shape every dataset of a mixture across robots is mapped into.

A 6-joint arm, a 14-joint bimanual robot and a 2-D pusher yield items that do not batch. A
:class:`TargetLayout` states the item a policy takes (vectors padded to a width, camera slots
at one size, normalisation per dataset), and an :class:`Embodiment` how one robot's datasets go
into it; ``placement.py`` resolves that for each dataset and maps its items. Pure: no I/O but
reading a layout file.

The same layout as a file (JSON, or YAML with PyYAML installed), for ``lerobot-shards train
--layout``::

    vectors:
      action: 32                     # a width: each dataset's dims go to the leading slots
      observation.state: [x, y, z]   # names: dims go to the slot of their feature's name
    cameras: [observation.images.base, observation.images.wrist]
    image_size: [224, 224]
    resize: pad                      # keep the aspect ratio, black bands (openpi); or stretch
    normalize: quantiles             # or mean_std, min_max, quantile10; or one per vector key
    embodiments:
      so100:
        key_map: {observation.images.laptop: observation.images.base}
        dims: {action: [0, 1, 2, 3, 4, 5]}
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lerobot_shards.reader.frames.resize import POLICIES, Resize

NORMALIZATIONS = ("mean_std", "min_max", "quantiles", "quantile10")
"""LeRobot 0.6.1's ``NormalizationMode`` names: ``(x - mean) / (std + eps)``, and ``2 (x - lo) /
(hi - lo) - 1`` with (lo, hi) = (min, max), (q01, q99) or (q10, q90)."""


@dataclass(frozen=True)
class VectorSlot:
    """A vector key of the layout: ``width`` float32 dims, optionally named.

    Args:
        width: Dims of the padded vector.
        names: A name per dim (None for a dim without one): a dataset whose feature has
            ``names`` puts each of its dims into the dim of the same name.
    """

    width: int
    names: tuple[str | None, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.width, int) or isinstance(self.width, bool) or self.width < 1:
            raise ValueError(f"a vector slot's width must be a positive int, got {self.width!r}")
        if self.names is not None:
            names = tuple(self.names)
            object.__setattr__(self, "names", names)
            if len(names) != self.width:
                raise ValueError(f"{len(names)} names for a vector slot of width {self.width}")
            named = [n for n in names if n is not None]
            if len(set(named)) != len(named) or not all(isinstance(n, str) for n in named):
                raise ValueError(f"a vector slot's names must be distinct strings: {names}")

    @classmethod
    def of(cls, key: str, value: Any) -> VectorSlot:
        """The slot ``value`` states: a width, a list of names, ``{"width", "names"}``."""
        if isinstance(value, VectorSlot):
            return value
        try:
            if isinstance(value, Mapping):
                names = value.get("names")
                width = value.get("width", len(names) if names is not None else None)
                return cls(width, tuple(names) if names is not None else None)
            if isinstance(value, Sequence) and not isinstance(value, str):
                return cls(len(value), tuple(value))
            return cls(value)
        except ValueError as exc:
            raise ValueError(f"layout vector {key!r}: {exc}") from exc


@dataclass(frozen=True)
class Embodiment:
    """How the datasets of one robot go into a layout.

    Args:
        key_map: Their keys renamed onto the layout's (a camera onto its slot, a vector onto a
            vector key; None drops a key), after each dataset's own ``DatasetRoot.key_map``.
        dims: Per vector key of the layout, the slot dim each of the dataset's dims goes to,
            in order (default: by name where the slot and the feature have names, else the
            leading dims).
    """

    key_map: Mapping[str, str | None] = field(default_factory=dict)
    dims: Mapping[str, Sequence[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_map", dict(self.key_map))
        dims = {}
        for key, values in dict(self.dims).items():
            values = list(values)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                raise ValueError(f"dims of {key!r} must be ints (slot dims), got {values}")
            dims[key] = tuple(values)
        object.__setattr__(self, "dims", dims)

    @classmethod
    def of(cls, name: str, value: Any) -> Embodiment:
        """The embodiment ``value`` states (an ``Embodiment``, or ``{"key_map", "dims"}``)."""
        if isinstance(value, Embodiment):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"embodiment {name!r}: expected a mapping, got {value!r}")
        _refuse_unknown(value, ("key_map", "dims"), f"embodiment {name!r}")
        try:
            return cls(value.get("key_map") or {}, value.get("dims") or {})
        except ValueError as exc:
            raise ValueError(f"embodiment {name!r}: {exc}") from exc


@dataclass(frozen=True)
class TargetLayout:
    """The item every dataset of a mixture is mapped into (``docs/embodiments.md``).

    Each vector key holds a float32 vector of its slot's width, the dataset's dims placed in
    it and the rest exactly zero, with ``<key>_mask`` (bool, per dim) saying which are real.
    Each camera slot holds the dataset's camera mapped onto it, or a zero image where it has
    none, with ``<slot>_mask`` (a bool) saying which. Items also say where they come from:
    ``dataset_index``, ``dataset`` (its name) and ``embodiment`` (its robot's name) with
    ``embodiment_index``. Other features of the datasets are left out (a dataset's camera must
    be placed or dropped: an unplaced camera is refused).

    Args:
        vectors: Vector key to its slot: a width, a list of names, or a :class:`VectorSlot`.
        cameras: The camera slots, in order.
        image_size: ``(height, width)`` every camera is resized to as it is decoded; None
            keeps the frames' own sizes (each slot's datasets must then agree).
        resize: ``"pad"`` (keep the aspect ratio, black bands, as openpi) or ``"stretch"``.
        normalize: Each dataset's vectors normalised with its own statistics (a mode of
            ``NORMALIZATIONS`` for every vector key, or one per key; None: not normalised).
        embodiments: By embodiment name, how its datasets go in (default: keys as they are).
    """

    vectors: Mapping[str, int | Sequence[str | None] | VectorSlot] = field(default_factory=dict)
    cameras: Sequence[str] = ()
    image_size: tuple[int, int] | None = None
    resize: str = "pad"
    normalize: str | Mapping[str, str | None] | None = None
    embodiments: Mapping[str, Embodiment] = field(default_factory=dict)

    def __post_init__(self) -> None:
        vectors = {str(k): VectorSlot.of(k, v) for k, v in dict(self.vectors).items()}
        cameras = tuple(self.cameras)
        if not vectors and not cameras:
            raise ValueError("a layout needs at least one vector key or camera slot")
        if len(set(cameras)) != len(cameras):
            raise ValueError(f"a layout's camera slots must be distinct: {list(cameras)}")
        both = sorted(set(cameras) & set(vectors))
        if both:
            raise ValueError(f"{both} are both camera slots and vector keys of the layout")
        size = self.image_size
        if size is not None:
            size = tuple(size)
            if len(size) != 2:
                raise ValueError(f"image_size is (height, width), got {self.image_size!r}")
            Resize(size[0], size[1], self.resize)  # checks the size
        if self.resize not in POLICIES:
            raise ValueError(f"unknown resize policy {self.resize!r}; expected one of {POLICIES}")
        modes = self.normalize
        if modes is None or isinstance(modes, str):
            modes = dict.fromkeys(vectors, modes)
        modes = dict(modes)
        unknown = sorted(set(modes) - set(vectors))
        if unknown:
            raise ValueError(f"normalize names {unknown}, which are not vector keys of the layout")
        for key, mode in modes.items():
            if mode is not None and mode not in NORMALIZATIONS:
                raise ValueError(
                    f"normalize {key!r}: unknown mode {mode!r}; expected one of {NORMALIZATIONS}"
                )
        embodiments = {str(n): Embodiment.of(n, e) for n, e in dict(self.embodiments).items()}
        for name, embodiment in embodiments.items():
            unknown = sorted(set(embodiment.dims) - set(vectors))
            if unknown:
                raise ValueError(f"embodiment {name!r}: dims of {unknown}, not vector keys")
        object.__setattr__(self, "vectors", vectors)
        object.__setattr__(self, "cameras", cameras)
        object.__setattr__(self, "image_size", size)
        object.__setattr__(self, "normalize", modes)
        object.__setattr__(self, "embodiments", embodiments)

    def normalization(self, key: str) -> str | None:
        """How vector ``key`` is normalised (None: not)."""
        return self.normalize.get(key)  # type: ignore[union-attr]

    def embodiment(self, name: str) -> Embodiment:
        """Embodiment ``name``'s mapping (an empty one where the layout names none)."""
        return self.embodiments.get(name) or Embodiment()

    @property
    def frame_resize(self) -> Resize | None:
        """What every placed camera's frames are resized to (None: not resized)."""
        if self.image_size is None:
            return None
        return Resize(self.image_size[0], self.image_size[1], self.resize)

    @classmethod
    def of(cls, value: TargetLayout | Mapping[str, Any] | str | os.PathLike) -> TargetLayout:
        """A layout from a :class:`TargetLayout`, a mapping (:meth:`to_dict`'s) or a file."""
        if isinstance(value, TargetLayout):
            return value
        if isinstance(value, (str, os.PathLike)):
            return cls.load(value)
        return cls.from_dict(value)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TargetLayout:
        """The layout a mapping states (the file format above); unknown keys are refused."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a layout is a mapping, got {type(data).__name__}")
        fields = ("vectors", "cameras", "image_size", "resize", "normalize", "embodiments")
        _refuse_unknown(data, fields, "the layout")
        return cls(**{k: data[k] for k in fields if k in data and data[k] is not None})

    @classmethod
    def load(cls, path: str | os.PathLike) -> TargetLayout:
        """The layout in the JSON or YAML (``.yaml``/``.yml``, needs PyYAML) file ``path``."""
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith((".yaml", ".yml")):
            try:
                import yaml
            except ImportError as exc:
                raise ImportError(f"{path}: a YAML layout needs pip install pyyaml") from exc
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
        try:
            return cls.from_dict(data)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        """The layout as plain data (JSON-ready; :meth:`from_dict` reads it back)."""
        return {
            "vectors": {
                k: {"width": s.width, "names": list(s.names) if s.names else None}
                for k, s in self.vectors.items()
            },
            "cameras": list(self.cameras),
            "image_size": list(self.image_size) if self.image_size else None,
            "resize": self.resize,
            "normalize": dict(self.normalize),
            "embodiments": {
                n: {"key_map": dict(e.key_map), "dims": {k: list(v) for k, v in e.dims.items()}}
                for n, e in self.embodiments.items()
            },
        }


def _refuse_unknown(data: Mapping[str, Any], known: Sequence[str], what: str) -> None:
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{what} has unknown keys {unknown}; it takes {list(known)}")
