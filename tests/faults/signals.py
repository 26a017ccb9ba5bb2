"""Signals aimed at one process by PID: crash, freeze, thaw, ask to stop."""

from __future__ import annotations

import os
import signal
import time


def kill(pid: int) -> None:
    """SIGKILL: a crash at whatever point the process has reached."""
    os.kill(pid, signal.SIGKILL)


def freeze(pid: int) -> None:
    """SIGSTOP: the process keeps its sockets open and answers nothing (half-open)."""
    os.kill(pid, signal.SIGSTOP)


def thaw(pid: int) -> None:
    os.kill(pid, signal.SIGCONT)


def terminate(pid: int) -> None:
    """SIGTERM: a polite stop."""
    os.kill(pid, signal.SIGTERM)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """True once `pid` no longer exists (reaped or not a child of ours and gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid) or _zombie(pid):
            return True
        time.sleep(0.01)
    return False


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
