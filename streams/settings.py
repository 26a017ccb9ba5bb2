"""Worker settings: command line over `CACHEROUTE_*` environment over defaults.

Built once at the entry point (`python -m streams worker ...`) and passed down;
nothing else reads the environment.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from streams.config import StreamConfig
from streams.dedup import DEFAULT_MAX_GAP, DEFAULT_MAX_JUMP
from streams.errors import ConfigError

ENV_PREFIX = "CACHEROUTE_"


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    bootstrap: str = "127.0.0.1:9092"
    events_topic: str = "cacheroute.events"
    snapshots_topic: str = "cacheroute.snapshots"
    deadletter_topic: str = "cacheroute.deadletter"
    app_id: str = "cacheroute-streams"
    web_port: int = 6066
    web_bind: str = "127.0.0.1"  # the metrics/web server's address (loopback unless set)
    data_dir: Path = Path(".cacheroute/streams")
    worker_id: str = ""
    # Ed25519 PEM the worker signs its snapshots with (streams.snapshot_signing); when
    # empty, data_dir/snapshot-signing-key.pem, created on first start with its public half
    # (snapshot-signing-key.pub.pem) beside it for the planner's `snapshot_keys`.
    signing_key_path: str = ""
    window_s: float = 60.0
    hop_s: float = 10.0
    grace_s: float = 0.5
    idle_s: float = 1.0
    eviction_s: float = 60.0
    ewma_alpha: float = 0.3
    max_tracked_keys: int = 262_144
    max_past_s: float = 6 * 3600.0
    # Events stamped further ahead than this are dead letters; nearer ones count as now.
    # 10 s tolerates clock skew between hosts; more lets a few forged events blind the
    # windows (every real event would be "late" until the forged time).
    max_future_s: float = 10.0
    # Extra event-time history replayed on recovery beyond window/eviction + grace,
    # to cover producer linger and clock skew.
    replay_margin_s: float = 30.0
    # Longest a fetch may wait on the broker when a partition has nothing new.
    # Faust hard-codes 1,500 ms; a broker that does not answer long polls as soon
    # as data arrives (Tansu polls its storage) then adds that much delay per hop.
    fetch_max_wait_ms: int = 100
    # Dedup's bounds (streams.config.StreamConfig.max_sequence_gap / max_sequence_jump).
    max_sequence_gap: int = DEFAULT_MAX_GAP
    max_sequence_jump: int = DEFAULT_MAX_JUMP

    def stream_config(self) -> StreamConfig:
        """The pure pipeline's config (validates ranges; raises ConfigError)."""
        return StreamConfig(
            window_ms=round(self.window_s * 1000),
            hop_ms=round(self.hop_s * 1000),
            grace_ms=round(self.grace_s * 1000),
            idle_ms=round(self.idle_s * 1000),
            eviction_ms=round(self.eviction_s * 1000),
            ewma_alpha=self.ewma_alpha,
            max_tracked_keys=self.max_tracked_keys,
            max_past_ms=round(self.max_past_s * 1000),
            max_future_ms=round(self.max_future_s * 1000),
            max_sequence_gap=self.max_sequence_gap,
            max_sequence_jump=self.max_sequence_jump,
        )

    @property
    def resolved_signing_key_path(self) -> Path:
        return Path(self.signing_key_path or self.data_dir / "snapshot-signing-key.pem")

    @property
    def resolved_worker_id(self) -> str:
        return self.worker_id or f"{socket.gethostname()}-{os.getpid()}"


_OPTIONS: tuple[tuple[str, type], ...] = (
    ("bootstrap", str), ("events_topic", str), ("snapshots_topic", str),
    ("deadletter_topic", str), ("app_id", str), ("web_port", int), ("web_bind", str),
    ("data_dir", Path), ("signing_key_path", str),
    ("worker_id", str), ("window_s", float), ("hop_s", float), ("grace_s", float),
    ("idle_s", float), ("eviction_s", float), ("ewma_alpha", float),
    ("max_tracked_keys", int), ("max_past_s", float), ("max_future_s", float),
    ("replay_margin_s", float), ("fetch_max_wait_ms", int),
    ("max_sequence_gap", int), ("max_sequence_jump", int),
)


def parse_settings(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """`--window-s 10` beats `CACHEROUTE_WINDOW_S=10` beats the default."""
    parser = argparse.ArgumentParser(prog="python -m streams worker")
    for name, kind in _OPTIONS:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=kind, default=None)
    args = parser.parse_args(list(argv))
    values = {}
    for name, kind in _OPTIONS:
        cli = getattr(args, name)
        from_env = env.get(ENV_PREFIX + name.upper())
        if cli is not None:
            values[name] = cli
        elif from_env is not None:
            values[name] = kind(from_env)
    settings = Settings(**values)
    settings.stream_config()  # fail fast on bad ranges
    if not 1 <= settings.fetch_max_wait_ms <= 60_000:
        raise ConfigError(
            f"fetch_max_wait_ms must be in [1, 60000], got {settings.fetch_max_wait_ms}")
    return settings
