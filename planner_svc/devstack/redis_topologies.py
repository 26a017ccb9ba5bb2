"""Redis Cluster and Sentinel on loopback, for the tests and for trying the topologies
locally: real redis-server processes, made into a cluster by `redis-cli --cluster create`,
or a primary with replicas watched by Sentinels. Ports are chosen free (a cluster node's
bus port, port + 10000, too)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from planner_svc.devstack.processes import (
    ManagedProcess,
    RedisServer,
    ServerStartError,
    redis_binary,
    start_listening,
    start_redis,
)


def _port_pair_free() -> int:
    """A port p with p + 10000 free too (a cluster node's bus port)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise ServerStartError("no free port pair for a cluster node")


def redis_cli() -> str:
    found = shutil.which("redis-cli")
    if not found:
        raise ServerStartError("redis-cli not found: apt-get install -y redis-tools")
    return found


def cli(port: int, *args: str, timeout_s: float = 30.0) -> str:
    done = subprocess.run([redis_cli(), "-h", "127.0.0.1", "-p", str(port), *args],
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ServerStartError(f"redis-cli {' '.join(args)}: {done.stderr or done.stdout}")
    return done.stdout


@dataclass
class RedisClusterProcs:
    nodes: list[RedisServer]
    node_timeout_ms: int

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def node(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def stop(self) -> None:
        for n in self.nodes:
            n.process.stop()


def start_redis_cluster(workdir: Path, masters: int = 3, replicas: int = 1,
                        node_timeout_ms: int = 1000, timeout_s: float = 30.0
                        ) -> RedisClusterProcs:
    nodes: list[RedisServer] = []
    try:
        for _ in range(masters * (1 + replicas)):
            port = _port_pair_free()
            nodes.append(start_redis(workdir, port, extra_args=[
                "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(node_timeout_ms),
                # a replica may take over however long it was cut off (tests kill masters)
                "--cluster-replica-validity-factor", "0",
            ]))
        cli(nodes[0].port, "--cluster", "create",
            *[f"127.0.0.1:{n.port}" for n in nodes],
            "--cluster-replicas", str(replicas), "--cluster-yes", timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all("cluster_state:ok" in cli(n.port, "cluster", "info") for n in nodes):
                return RedisClusterProcs(nodes, node_timeout_ms)
            time.sleep(0.1)
        raise ServerStartError("the cluster did not reach cluster_state:ok")
    except BaseException:
        for n in nodes:
            n.process.stop()
        raise


@dataclass
class SentinelProcs:
    primary: RedisServer
    replicas: list[RedisServer]
    sentinels: list[ManagedProcess]
    sentinel_ports: list[int]
    service: str = "cacheroute"
    servers: list[RedisServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def master_port(self) -> int:
        out = cli(self.sentinel_ports[0], "sentinel", "get-master-addr-by-name", self.service)
        return int(out.split()[1])

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        for r in [self.primary, *self.replicas]:
            r.process.stop()


def start_redis_sentinel(workdir: Path, replicas: int = 2, sentinels: int = 3,
                         down_after_ms: int = 1000, failover_timeout_ms: int = 3000,
                         timeout_s: float = 30.0) -> SentinelProcs:
    from planner_svc.devstack.processes import free_port

    primary = start_redis(workdir)
    started: list[RedisServer] = [primary]
    procs: list[ManagedProcess] = []
    ports: list[int] = []
    try:
        for _ in range(replicas):
            started.append(start_redis(workdir, extra_args=[
                "--replicaof", "127.0.0.1", str(primary.port)]))
        for _ in range(sentinels):
            port = free_port()
            conf = workdir / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {workdir}\n"
                f"sentinel monitor cacheroute 127.0.0.1 {primary.port} {sentinels // 2 + 1}\n"
                f"sentinel down-after-milliseconds cacheroute {down_after_ms}\n"
                f"sentinel failover-timeout cacheroute {failover_timeout_ms}\n"
                "sentinel parallel-syncs cacheroute 1\n")
            procs.append(start_listening("redis-sentinel", [redis_binary(), str(conf),
                                                            "--sentinel"],
                                         workdir / f"sentinel-{port}.log", port, timeout_s))
            ports.append(port)
        out = SentinelProcs(primary, started[1:], procs, ports)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # every sentinel sees the replicas
            if all(f"num-slaves\n{replicas}" in cli(p, "sentinel", "master", "cacheroute")
                   for p in ports):
                return out
            time.sleep(0.1)
        raise ServerStartError("the sentinels did not discover the replicas")
    except BaseException:
        for s in procs:
            s.stop()
        for r in started:
            r.process.stop()
        raise
