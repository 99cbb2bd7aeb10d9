"""lerobot_shards.arrow: numeric columns to numpy and back as pyarrow's own conversions give
them, and a reader that never imports pandas (0.4 s before its first item) where it is
installed."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lerobot_shards.arrow import arrow_array, as_numpy

KINDS = [pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.float32(), pa.float64()]


@given(
    kind=st.sampled_from(KINDS),
    pieces=st.lists(st.lists(st.integers(0, 100), max_size=6), max_size=4),
    cut=st.integers(0, 3),
)
def test_as_numpy_is_to_numpy(kind, pieces, cut):
    chunks = [pa.array(p, kind).slice(min(cut, len(p))) for p in pieces]
    for values in [pa.chunked_array(chunks, kind), *chunks]:
        got, want = as_numpy(values), values.to_numpy()
        assert got.dtype == want.dtype and got.tolist() == want.tolist()


def test_as_numpy_leaves_everything_else_to_pyarrow():
    with_null = pa.array([1, None], pa.int64())
    with pytest.raises(pa.ArrowInvalid):  # what to_numpy() says of it
        as_numpy(with_null)
    assert np.isnan(as_numpy(with_null, zero_copy_only=False)[1])
    assert as_numpy(pa.array([True, False]), zero_copy_only=False).tolist() == [True, False]


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float32])
def test_arrow_array_is_pa_array(dtype):
    values = np.arange(7, dtype=dtype)[::2]
    assert arrow_array(values).equals(pa.array(values))
    with pytest.raises(TypeError):
        arrow_array(np.zeros((2, 2), dtype))


# The first batch of a loader with two workers: is pandas imported, here and in the workers?
READ_FIRST_BATCH = textwrap.dedent(
    """
    import sys
    import torch
    from lerobot_shards import ShardedDataLoader, ShardedLeRobotDataset

    class Probe(torch.utils.data.IterableDataset):
        def __init__(self, ds):
            self.ds = ds
        def __iter__(self):
            next(iter(self.ds))
            yield "pandas" in sys.modules

    ds = ShardedLeRobotDataset(sys.argv[1], return_uint8=True)
    next(iter(ShardedDataLoader(ds, batch_size=4, num_workers=2)))
    workers = list(torch.utils.data.DataLoader(Probe(ds), batch_size=None, num_workers=2))
    print("pandas" in sys.modules, *workers)
    """
)


def test_the_reader_never_imports_pandas(av1):
    import importlib.util

    assert importlib.util.find_spec("pandas") is not None  # installed: the test means something
    out = subprocess.run(
        [sys.executable, "-c", READ_FIRST_BATCH, str(av1)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.split() == ["False", "False", "False"]
