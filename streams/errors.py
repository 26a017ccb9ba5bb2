"""Errors of the streams package.

    StreamsError
    ├── ConfigError        a setting is out of range (raised at the entry point)
    └── SnapshotError      a snapshot part contradicts the parts already held
"""

from __future__ import annotations


class StreamsError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(StreamsError, ValueError):
    """A setting is invalid; the message names it and the accepted range."""


class SnapshotError(StreamsError, ValueError):
    """A snapshot part is inconsistent (e.g. its part_count changed mid-window)."""
