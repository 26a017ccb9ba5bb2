"""router_client.memory: the malloc tuning takes effect on glibc and is idempotent."""

from __future__ import annotations

import platform

import pytest

from router_client import memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_keep_freed_memory_takes_effect_once_on_glibc() -> None:
    assert memory.keep_freed_memory() is True
    assert memory.keep_freed_memory() is True  # the second call does not re-tune

