"""Local shard bytes mapped, not read: the same bytes, and pages given back once used."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from lerobot_shards.reader.fetch import mapped

pytestmark = pytest.mark.skipif(
    not mapped.SUPPORTED, reason="madvise(MADV_DONTNEED) is not available on this platform"
)


def mapping_rss_kb(view: memoryview) -> int:
    """Resident kB of the mapping ``view`` lies in, from /proc/self/smaps."""
    base = mapped._address(memoryview(view.obj))
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and ":" not in fields[0]:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            inside = start <= base < end
        elif inside and fields[0] == "Rss:":
            return int(fields[1])
    raise AssertionError("mapping not found")


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "shard.tar"
    data = os.urandom(5 * mapped.WINDOW + 12345)
    path.write_bytes(data)
    return path, data


def test_the_mapped_span_is_the_files_bytes(shard):
    path, data = shard
    for offset, size in [(0, len(data)), (4097, 3 * mapped.WINDOW), (len(data) - 10, 10)]:
        view = mapped.map_span(str(path), offset, size)
        assert mapped.is_mapped(view) and bytes(view) == data[offset : offset + size]


def test_a_span_past_the_end_is_not_mapped(shard):
    path, data = shard
    assert mapped.map_span(str(path), len(data) - 10, 11) is None
    assert mapped.map_span(str(path), 0, 0) is None


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/smaps")
def test_release_gives_pages_back_and_the_bytes_stay(shard):
    path, data = shard
    view = mapped.map_span(str(path), 1000, len(data) - 1000)
    assert bytes(view) == data[1000:]  # every page read: resident
    assert mapping_rss_kb(view) >= (len(data) - 1000) // 1024 - 8
    middle = view[2 * mapped.WINDOW : 3 * mapped.WINDOW]
    mapped.release(middle, 100, 200)
    assert mapping_rss_kb(view) <= (len(data) - mapped.WINDOW) // 1024 + 8  # a window dropped
    mapped.release(view)
    assert mapping_rss_kb(view) == 0
    assert bytes(view) == data[1000:]  # read back from the page cache


def test_release_leaves_ordinary_memory_alone():
    data = bytearray(os.urandom(3 * mapped.WINDOW))
    before = bytes(data)
    view = memoryview(data)
    assert not mapped.is_mapped(view) and not mapped.is_mapped(before)
    mapped.release(view)
    assert bytes(data) == before


def test_local_shards_are_read_when_mapping_is_turned_off(tmp_path, monkeypatch):
    import fsspec

    from lerobot_shards.format import checksum
    from lerobot_shards.reader.fetch.ranged import Span, read_span

    path = tmp_path / "shard.tar"
    data = os.urandom(10_000)
    path.write_bytes(data)
    span = Span(0, str(path), 100, 5000, checksum(data[100:5100]))
    fs = fsspec.filesystem("file")
    assert mapped.is_mapped(read_span(fs, span))
    monkeypatch.setenv(mapped.DISABLE, "0")
    read = read_span(fs, span)
    assert not mapped.is_mapped(read) and bytes(read) == data[100:5100]
