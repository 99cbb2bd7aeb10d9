"""Frames do not depend on which x86 SIMD kernels FFmpeg picks, from SSSE3 to AVX-512: the
golden items, recorded by LeRobot on another machine, are what this machine decodes at every
instruction-set level it can run, so the golden tests hold on any x86-64 CPU of CI's kind.

Each level runs in its own process, FFmpeg's CPU flags forced (``av_force_cpu_flags``) before
any decoder or scaler is made: the source's items (LeRobotSource) and the converted shards'
(ShardedLeRobotDataset, whose rgb24 path calls swscale itself) are compared with the recorded
ones. Found while writing this: with SSE2 alone (FFmpeg's plain C conversion to rgb24) every
frame differs from LeRobot's in some pixels; SSSE3 is on every x86-64 CPU made since 2011.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64"), reason="FFmpeg's x86 CPU flags"
)

# FFmpeg's AV_CPU_FLAG_* (libavutil/cpu.h), each level with all below it.
_SSSE3 = 0x1 | 0x2 | 0x8 | 0x10 | 0x40 | 0x80 | 0x1000  # MMX(EXT), SSE, SSE2, SSE3, SSSE3, CMOV
_SSE42 = _SSSE3 | 0x100 | 0x200
_AVX2 = _SSE42 | 0x4000 | 0x8000 | 0x10000 | 0x20000 | 0x40000  # AVX, AVX2, FMA3, BMI1, BMI2
_AVX512 = _AVX2 | 0x100000
_AVX512ICL = _AVX512 | 0x200000
LEVELS = {
    "ssse3": _SSSE3,
    "sse4.2": _SSE42,
    "avx2": _AVX2,
    "avx512": _AVX512,
    "avx512icl": _AVX512ICL,
}

CHECK = """
import ctypes, json, sys
import av, numpy as np, torch
libs = {line.split()[-1] for line in open("/proc/self/maps") if "libavutil" in line}
assert libs, "PyAV's libavutil is not loaded"
for lib in libs:
    ctypes.CDLL(lib).av_force_cpu_flags(int(sys.argv[1]))
from lerobot_shards import ShardedLeRobotDataset
from lerobot_shards.source import LeRobotSource
for golden, shards in json.loads(sys.argv[2]):
    recorded = np.load(golden + ".items.npz")
    keys = [k for k in json.loads(str(recorded["__keys__"])) if k != "task"]
    items = [LeRobotSource(golden)[i] for i in range(len(LeRobotSource(golden)))]
    items += list(ShardedLeRobotDataset(shards))
    for item in items:
        i = int(item["index"])
        expected = {k: torch.from_numpy(recorded[f"{i}|{k}"]) for k in keys}
        differ = [k for k in keys if not torch.equal(item[k], expected[k])]
        assert not differ, f"{golden} index {i}: {differ} differ from LeRobot's"
    print(golden, len(items), "items equal")
"""


def cpu_flags() -> int:
    """The flags FFmpeg detects on this CPU."""
    code = (
        "import ctypes, av\n"
        "lib = next(l.split()[-1] for l in open('/proc/self/maps') if 'libavutil' in l)\n"
        "print(ctypes.CDLL(lib).av_get_cpu_flags())"
    )
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)


@pytest.mark.parametrize("level", LEVELS)
def test_golden_frames_at_every_simd_level(level, golden_path, shards):
    mask = LEVELS[level]
    if cpu_flags() & mask != mask:
        pytest.skip(f"this CPU has no {level}")
    pairs = [(str(golden_path(name)), str(shards(name))) for name in ("av1_multifile", "v21_video")]
    result = subprocess.run(
        [sys.executable, "-c", CHECK, str(mask), json.dumps(pairs)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parent,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("items equal") == 2
