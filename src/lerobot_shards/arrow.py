"""Arrow as this project uses it: columns to numpy and back without pyarrow's pandas bridge,
and the large one-off reads and writes (a million episodes' manifest) on the C library's
allocator.

Why the bridge is avoided. ``Array.to_numpy`` and ``pa.array`` go through pyarrow's pandas
conversion layer, which imports pandas wherever it is installed: 0.4 s of CPU in a process that
has imported torch, before a reader's first item, in a process that never uses pandas
otherwise. The manifest's and the episodes' numeric columns need none of it: a primitive column
without nulls is a numpy view of its buffer. Anything else (nulls, booleans, nested or string
types) takes pyarrow's own conversion.

Why the allocator. pyarrow's default pool (mimalloc in its Linux wheels) hands memory back to
the system and maps it again as a manifest is decoded or encoded a row group at a time: at a
million episodes, on a 2-core cloud VM, that cost 0.8-2.2 s of kernel CPU time on top of
about 1 s of decoding (0.25 s with glibc's malloc), and as much again on top of the
converter's write (see ``docs/performance.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pyarrow as pa


def as_numpy(values: pa.Array | pa.ChunkedArray, **to_numpy: bool) -> np.ndarray:
    """``values.to_numpy(**to_numpy)``, the same array, without the pandas bridge where a view
    serves: a primitive column without nulls (a read-only view of one chunk, or the chunks
    joined)."""
    chunks = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    kind = values.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)) or values.null_count:
        return values.to_numpy(**to_numpy)
    dtype = np.dtype(kind.to_pandas_dtype())
    views = [
        np.frombuffer(
            chunk.buffers()[1], dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize
        )
        for chunk in chunks
        if len(chunk)
    ]
    if len(views) == 1:
        return views[0]
    return np.concatenate(views) if views else np.empty(0, dtype)


def arrow_array(values: np.ndarray) -> pa.Array:
    """A one-dimensional numeric numpy array as an Arrow array sharing its memory."""
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype.kind not in "iuf":
        raise TypeError(f"arrow_array takes a 1-D numeric array, not {values.dtype} {values.shape}")
    kind = pa.from_numpy_dtype(values.dtype)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


_pool_lock = threading.Lock()
_pool_users = 0
_pool_before: pa.MemoryPool | None = None


@contextmanager
def system_allocator() -> Iterator[None]:
    """Arrow's allocations in this block (in any thread) from the C library's malloc, then the
    default pool as it was: for a large read or write done once (the module docstring says
    why). Blocks may nest or overlap across threads; the last one out restores the pool."""
    global _pool_users, _pool_before
    with _pool_lock:
        if _pool_users == 0:
            _pool_before = pa.default_memory_pool()
            pa.set_memory_pool(pa.system_memory_pool())
        _pool_users += 1
    try:
        yield
    finally:
        with _pool_lock:
            _pool_users -= 1
            if _pool_users == 0:
                pa.set_memory_pool(_pool_before)
                _pool_before = None
