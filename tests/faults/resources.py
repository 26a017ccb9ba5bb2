"""Open file descriptors and resident memory of a process (Linux /proc)."""

from __future__ import annotations

import os


def open_fds(pid: int | None = None) -> int:
    """Number of open file descriptors of `pid` (default: this process)."""
    return len(os.listdir(f"/proc/{pid or os.getpid()}/fd"))


def rss_mb(pid: int | None = None) -> float:
    """Current resident set size in MiB."""
    with open(f"/proc/{pid or os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0
