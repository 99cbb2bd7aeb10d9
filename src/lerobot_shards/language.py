"""LeRobot's language columns (``language_persistent``, ``language_events``): each row's value
as LeRobot 0.6.1 returns it, whatever Arrow types the dataset's writer used.

Why. LeRobot reads the rows through Hugging Face ``datasets`` with the features it declares for
these two columns, so what a writer stored comes back cast: each message's fields in LeRobot's
order, a field the writer left out as None, ``timestamp`` as float32, ``tool_calls`` entries
decoded from JSON; a row left empty (a dataset recorded for annotation and not annotated yet)
as None. LeRobot's recorder writes its own types; ``lerobot-annotate`` lets pyarrow infer them
(a ``camera`` that is always None is of type null there, tool calls are structs). Both read the
same here. What LeRobot cannot cast (a field it does not know, a message that is not a struct)
is refused, naming the column.

One thing LeRobot returns that this module does not reproduce is refused too: a float inside a
tool call. LeRobot passes tool calls through pandas' JSON codec, which keeps 10 decimals and
parses them back approximately (``0.6000000238418579`` comes back ``0.6000000238000001``); a
reader that returned the stored value would differ from LeRobot's item.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

LANGUAGE_PERSISTENT = "language_persistent"
LANGUAGE_EVENTS = "language_events"
LANGUAGE_COLUMNS = (LANGUAGE_PERSISTENT, LANGUAGE_EVENTS)
"""The columns LeRobot reads as language, by name (its ``is_language_column``)."""
TOOL_CALLS = "tool_calls"
MESSAGE_FIELDS: dict[str, list[tuple[str, pa.DataType]]] = {
    LANGUAGE_PERSISTENT: [
        ("role", pa.string()),
        ("content", pa.string()),
        ("style", pa.string()),
        ("timestamp", pa.float32()),
        ("camera", pa.string()),
    ],
    LANGUAGE_EVENTS: [
        ("role", pa.string()),
        ("content", pa.string()),
        ("style", pa.string()),
        ("camera", pa.string()),
    ],
}
"""A message's fields as LeRobot 0.6.1 declares them (``lerobot.datasets.language``), in its
order, each followed by ``tool_calls``: a list of JSON values."""


class LanguageColumn:
    """One episode's language column, cast once as LeRobot casts it; :meth:`value` makes a
    row's value (fresh objects on every call, as LeRobot's ``__getitem__`` makes them).

    Raises ValueError, saying what is wrong, for a column LeRobot could not read or whose
    values the reader would not return as LeRobot does.

    Args:
        column: the column as stored (any Arrow list of message structs, or nulls).
        key: its name, ``language_persistent`` or ``language_events``.
    """

    def __init__(self, column: pa.ChunkedArray | pa.Array, key: str) -> None:
        self.key = key
        array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        self.messages = _cast(array, key)
        self._json_calls = _check_tool_calls(self.messages, key)

    def value(self, position: int) -> list[dict[str, Any]] | None:
        """Row ``position``'s messages (a list of dicts), or None for an empty row."""
        messages = self.messages[position].as_py()
        if messages is not None and self._json_calls:
            for message in messages:
                calls = message[TOOL_CALLS]
                if calls is not None:
                    message[TOOL_CALLS] = [None if c is None else json.loads(c) for c in calls]
        return messages


def _cast(array: pa.Array, key: str) -> pa.ListArray:
    """``array`` as a list of LeRobot's message structs (tool calls kept as stored: JSON text,
    or the values themselves)."""
    where = f"the rows' {key!r}"
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), pa.list_(_message_type(key, pa.list_(pa.string()))))
    if not (
        pa.types.is_list(array.type)
        or pa.types.is_large_list(array.type)
        or pa.types.is_fixed_size_list(array.type)
    ):
        raise ValueError(f"{where} is {array.type}, not a list of messages per row")
    if not pa.types.is_list(array.type):
        array = array.cast(pa.list_(array.type.value_type))
    stored = array.values
    if pa.types.is_null(stored.type):  # every row None or []: pyarrow infers no struct
        stored = pa.nulls(len(stored), pa.struct([]))
    if not pa.types.is_struct(stored.type):
        raise ValueError(f"{where} holds {stored.type} messages, not structs")
    names = [stored.type.field(i).name for i in range(stored.type.num_fields)]
    known = [name for name, _ in MESSAGE_FIELDS[key]] + [TOOL_CALLS]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ValueError(
            f"{where}: messages have fields {unknown} that LeRobot's {key} does not (it has "
            f"{known})"
        )
    children, fields = [], []
    for name, typ in [*MESSAGE_FIELDS[key], (TOOL_CALLS, None)]:
        child = stored.field(name) if name in names else None
        if typ is None:
            child, typ = _tool_calls(child, len(stored), where)
        elif child is None:
            child = pa.nulls(len(stored), typ)
        else:
            try:
                child = child.cast(typ)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ValueError(
                    f"{where}: the messages' {name!r} ({child.type}) is not {typ}: {exc}"
                ) from exc
        children.append(child)
        fields.append(pa.field(name, typ))
    messages = pa.StructArray.from_arrays(children, fields=fields, mask=stored.is_null())
    return pa.ListArray.from_arrays(array.offsets, messages, mask=array.is_null())


def _message_type(key: str, tool_calls: pa.DataType) -> pa.StructType:
    return pa.struct([*MESSAGE_FIELDS[key], (TOOL_CALLS, tool_calls)])


def _tool_calls(child: pa.Array | None, length: int, where: str) -> tuple[pa.Array, pa.DataType]:
    """The messages' ``tool_calls``: a list per message (JSON text as strings)."""
    if child is None or pa.types.is_null(child.type):
        return pa.nulls(length, pa.list_(pa.string())), pa.list_(pa.string())
    if not (pa.types.is_list(child.type) or pa.types.is_large_list(child.type)):
        raise ValueError(f"{where}: the messages' 'tool_calls' is {child.type}, not a list")
    entry = child.type.value_type
    if hasattr(entry, "storage_type"):  # an extension type (arrow.json: JSON text)
        entry = entry.storage_type
    if pa.types.is_string(entry) or pa.types.is_large_string(entry):
        entry = pa.string()
    child = child.cast(pa.list_(entry))
    return child, child.type


def _check_tool_calls(messages: pa.ListArray, key: str) -> bool:
    """Whether the tool calls are JSON text (decoded per row); refuses text that is not JSON,
    and floats (see the module's docstring)."""
    fields = messages.flatten()  # the rows' messages, then their fields (nulls kept)
    calls = fields.flatten()[fields.type.get_field_index(TOOL_CALLS)]
    as_text = pa.types.is_string(calls.type.value_type)
    for entry in calls.flatten().to_pylist():
        if entry is None:
            continue
        if as_text:
            try:
                entry = json.loads(entry)
            except ValueError:
                raise ValueError(
                    f"the rows' {key!r}: a tool call is not JSON text ({entry!r}), which "
                    "LeRobot reads as JSON"
                ) from None
        if _holds_float(entry):
            raise ValueError(
                f"the rows' {key!r}: a tool call holds a float ({entry!r}); LeRobot 0.6.1 "
                "returns tool calls through pandas' JSON codec, which rounds floats to 10 "
                "decimals, and the reader does not reproduce that rounding"
            )
    return as_text


def _holds_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_holds_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_holds_float(v) for v in value)
    return False
