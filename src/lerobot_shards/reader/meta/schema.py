"""What a dataset's items hold, key by key (dtype and shape), known from its features alone; and
the check that a mixture's items batch together, made when the mixture is opened rather than
when ``default_collate`` meets the first odd item thousands of batches in.

The rules are LeRobot's: a feature of shape ``(1,)`` is a scalar column (a 0-dim tensor), floats
become float32, integers int64; a camera of shape ``(H, W, C)`` is a ``(C, H, W)`` float32 frame
(uint8 with ``return_uint8`` if it is a video: LeRobot's image features stay float32); a
``delta_timestamps`` key gains a leading dimension (one row per delta) and a boolean
``<key>_is_pad``; ``task`` is a string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lerobot_shards.items import ItemSpec
from lerobot_shards.validate import value_kind

Schema = dict[str, tuple[str, tuple[int, ...]]]
"""Item key to ``(dtype, shape)``; non-tensor values have dtype ``"str"`` or ``"object"``."""


def item_schema(features: Mapping[str, Mapping[str, Any]], spec: ItemSpec) -> Schema:
    """The dtype and shape of every value of the items a dataset with ``features`` yields under
    ``spec`` (its item keys, after ``spec.key_map``)."""
    schema: Schema = {}
    for key, feature in features.items():
        dtype, shape = value_kind(feature, spec.return_uint8)
        if feature.get("dtype") == "image" and spec.return_uint8 and spec.uint8_images:
            dtype = "uint8"
        if key in spec.deltas:
            steps = len(spec.deltas[key])
            shape = (steps, *shape)
            pad = spec.output_key(f"{key}_is_pad")
            if pad is not None:
                schema[pad] = ("bool", (steps,))
        name = spec.output_key(key)
        if name is not None:
            schema[name] = (dtype, shape)
    if spec.output_key("task") is not None:
        schema[spec.output_key("task")] = ("str", ())
    if spec.dataset_index is not None:
        schema["dataset_index"] = ("int64", ())
    return schema


def check_batchable(schemas: Sequence[Schema], names: Sequence[str]) -> None:
    """Refuse datasets whose items would not collate: naming the dataset, the key and what
    differs from the first dataset (``names[d]`` says which dataset ``d`` is)."""
    first = schemas[0]
    for d in range(1, len(schemas)):
        schema, where = schemas[d], f"dataset {d} ({names[d]})"
        missing, extra = sorted(set(first) - set(schema)), sorted(set(schema) - set(first))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"lacks {missing}")
            if extra:
                parts.append(f"has {extra} that dataset 0 ({names[0]}) lacks")
            raise ValueError(
                f"the mixture's items would not batch together: {where} "
                + " and ".join(parts)
                + "; map its keys onto common names with DatasetRoot(key_map=...) "
                "(None drops a key)"
            )
        for key in first:
            if schema[key] != first[key]:
                (d0, s0), (d1, s1) = first[key], schema[key]
                raise ValueError(
                    f"the mixture's items would not batch together: key {key!r} of {where} is "
                    f"{d1} of shape {s1}, of dataset 0 ({names[0]}) {d0} of shape {s0}"
                )
