"""Keep a plan's worth of freed memory in the process instead of returning it to the OS.

Applying a 100,000-key plan allocates ~20 MB (the blob, its copies, 100k key
strings, the lookup dict) and frees the previous table's ~20 MB right after.
With glibc's defaults, large blocks are mmap'ed and unmapped on free and the top
of the heap is trimmed, so *every* apply page-faults all of it in again: measured
in a subscriber process, ~5,500 minor faults and 48 -> 26 ms of apply CPU
(bench/propagation.py, 1 subscriber) once the allocator keeps the memory.

`keep_freed_memory()` sets two glibc `mallopt` knobs (a fixed mmap threshold, so
blocks up to 32 MB come from the heap and are reused; a trim threshold, so up to
`trim_bytes` of free heap stays mapped). They are process-wide, which is why the
client lets its embedder switch this off (`tune_malloc=False`). On a libc
without `mallopt` (musl, macOS) it does nothing and returns False.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024  # glibc's maximum on 64-bit
TRIM_THRESHOLD_BYTES = 128 * 1024 * 1024

_done: bool | None = None


def keep_freed_memory(trim_bytes: int = TRIM_THRESHOLD_BYTES) -> bool:
    """Tune glibc malloc once per process; True if it took effect."""
    global _done
    if _done is None:
        _done = _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and _mallopt(
            M_TRIM_THRESHOLD, trim_bytes
        )
    return _done


def _mallopt(param: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(param, value))
