"""Keep the memory of freed decoded frames in DataLoader workers instead of handing it back.

Why. Every decoded camera frame is a fresh allocation of about 1 MB (swscale's rgb24 output), and
frames live for different spans: a GOP's other frame waits for its draw, a batch's frames for its
collate. glibc's default, dynamic thresholds trim the top of the heap whenever twice the last
freed chunk lies free there, so the heap keeps shrinking and growing, and swscale writes each new
frame into pages the kernel must fault in and zero. ``perf record -e page-faults`` put 88% of the
reader's page faults in swscale's output, about 40 faults a frame. Fixing the two thresholds
(heap allocations up to 32 MiB, no trimming below 256 MiB free) lets the next frame reuse freed
memory. The heap still never holds more than its peak use, which the byte budget bounds.

Applied only in DataLoader worker processes (the reader is all they run; the training process is
left as it is), only with glibc, and not where the user set ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` themselves. ``LEROBOT_SHARDS_TUNE_MALLOC=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os

DISABLE = "LEROBOT_SHARDS_TUNE_MALLOC"
MMAP_THRESHOLD = 32 << 20
"""Largest allocation glibc serves from the heap once set (its maximum on 64-bit)."""
TRIM_THRESHOLD = 256 << 20
"""Free bytes at the heap's top before glibc hands them back to the kernel."""

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_tuned_pid: int | None = None


def tune_worker_malloc() -> bool:
    """Set this process's glibc malloc thresholds once (see the module docstring); True if they
    are set in this process now, False where they are left alone."""
    global _tuned_pid
    pid = os.getpid()
    if _tuned_pid == pid:
        return True
    if os.environ.get(DISABLE) == "0" or any(name in os.environ for name in _USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS, Windows)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting either threshold turns glibc's dynamic ones off.
    if not (
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ):
        return False
    _tuned_pid = pid
    return True
