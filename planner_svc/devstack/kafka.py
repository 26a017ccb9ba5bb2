"""Apache Kafka in KRaft mode on loopback: one broker for the stack and the tests, or a cluster.

The broker's jars come from Maven Central through `deploy/kafka/pom.xml` (resolved into
`deploy/kafka/target/lib` by `deploy/local/run.sh`), and Java from the machine. Each node
is one JVM acting as broker and controller: its storage is formatted with Kafka's own
`kafka.tools.StorageTool`, its `server.properties` and log are in the workdir, and it
stops with its process group like every other server here (`ManagedProcess`).

A single broker listens on a port it picks itself (listener port 0) and the port is read
back from its log; controller ports have to be known before the start (every node's
`controller.quorum.voters` names them), so they are found free and retried if taken.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from planner_svc.devstack.processes import (
    Broker,
    ManagedProcess,
    ServerStartError,
    _on_a_free_port,
    free_port,
    stop_all,
)

KAFKA_DIR = Path(__file__).resolve().parents[2] / "deploy" / "kafka"
# Class-data archives of the two JVMs (`write_class_archives`, run by deploy/local/run.sh).
CLASS_ARCHIVES = KAFKA_DIR / "target" / "cds"
BROKER_MAIN = "kafka.Kafka"
FORMAT_MAIN = "kafka.tools.StorageTool"
INSTALL_HINT = "run: mvn -q -f deploy/kafka/pom.xml dependency:copy-dependencies"
JAVA_HINT = "java not found: apt-get install -y openjdk-17-jre-headless"

# At most 512 MB resident per broker, and a start in seconds: a small heap, the serial
# collector (no GC threads on 2 cores) and only the C1 compiler, which reaches steady
# speed sooner than C2 on a broker that lives for one test session.
JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx384m",
    "-XX:MaxDirectMemorySize=64m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-Xss512k",
    "-Djava.awt.headless=true",
)

# One node on loopback: every internal topic on one replica, no wait for more members
# before a consumer group's first rebalance, and the log cleaner's dedupe buffer (heap,
# 128 MB by default) small enough for the heap above.
SINGLE_NODE_CONFIG: Mapping[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # A node started again must wait out its previous registration's session before the
    # controller takes the new one (9 s by default); on loopback 2 s is plenty.
    "broker.session.timeout.ms": "2000",
    "broker.heartbeat.interval.ms": "500",
    "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    "num.io.threads": "4",
    "num.network.threads": "2",
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
}

_BOUND = re.compile(r"Awaiting socket connections on [^\s:]+:(\d+)\.")
_STARTED = "Kafka Server started"


@dataclass
class KafkaBroker(Broker):
    """One KRaft node (broker and controller) of a local Apache Kafka."""

    node_id: int
    controller_port: int
    datadir: Path
    config_path: Path


def kafka_lib() -> Path:
    """The directory holding the broker's jars ($CACHEROUTE_KAFKA_LIB or the pom's output)."""
    lib = Path(os.environ.get("CACHEROUTE_KAFKA_LIB") or KAFKA_DIR / "target" / "lib")
    if not any(lib.glob("kafka_2.13-*.jar")):
        raise ServerStartError(f"Apache Kafka's jars are not in {lib}: {INSTALL_HINT}")
    return lib


def java_binary() -> str:
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not found or not Path(found).exists():
        raise ServerStartError(JAVA_HINT)
    return found


def _java(main: str, *args: str, dump: Path | None = None) -> list[str]:
    """The JVM's command line for `main`. With `dump`, the classes it loads are archived
    there when it exits; else the archive written for `main` (if any) is mapped in, which
    roughly halves the CPU a start takes. A stale or foreign archive is ignored by the JVM."""
    log4j = KAFKA_DIR / "log4j2.properties"
    archive = CLASS_ARCHIVES / f"{main}.jsa"
    if dump is not None:
        sharing = [f"-XX:ArchiveClassesAtExit={dump}"]
    else:
        sharing = [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []
    return [java_binary(), *JVM_OPTIONS, *sharing, f"-Dlog4j2.configurationFile={log4j}",
            "-cp", f"{kafka_lib()}/*", main, *args]


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def server_properties(*, node_id: int, port: int, controller_port: int, voters: str,
                      datadir: Path, overrides: Mapping[str, str]) -> str:
    """The node's server.properties: broker and controller in one process, plaintext on
    127.0.0.1 (`port` 0 lets the broker pick its own)."""
    config = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(datadir),
        **overrides,
    }
    return "".join(f"{k}={v}\n" for k, v in config.items())


def format_storage(config_path: Path, cluster_id: str, log: Path,
                   dump: Path | None = None) -> None:
    """`kafka.tools.StorageTool format`: meta.properties and the bootstrap metadata."""
    argv = _java(FORMAT_MAIN, "format", "-t", cluster_id, "-c", str(config_path), dump=dump)
    with open(log, "ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, timeout=120, check=False)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
        raise ServerStartError(f"formatting Kafka storage failed:\n{tail}")


def _wait_started(proc: ManagedProcess, log_offset: int, controller_port: int,
                  timeout_s: float) -> int:
    """Until the node logs that it started; returns the broker listener's bound port."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(proc.log_path, "rb") as f:
            f.seek(log_offset)
            text = f.read().decode(errors="replace")
        if _STARTED in text:
            ports = [int(p) for p in _BOUND.findall(text) if int(p) != controller_port]
            if ports:
                return ports[-1]
        if not proc.alive():
            break
        time.sleep(0.05)
    proc.stop()
    raise ServerStartError(
        f"{proc.name} did not start in {timeout_s:.0f} s:\n{proc.log_tail()}")


def _launch(broker: KafkaBroker, timeout_s: float) -> None:
    """Start (or start again) the node's JVM on its config and wait until it serves."""
    _wait_launched(broker, _spawn(broker), timeout_s)


def _spawn(broker: KafkaBroker) -> int:
    """Start the node's JVM; returns where its log's new lines begin."""
    log = broker.process.log_path
    offset = log.stat().st_size if log.exists() else 0
    broker.process.start()
    return offset


def _wait_launched(broker: KafkaBroker, log_offset: int, timeout_s: float) -> None:
    broker.port = _wait_started(broker.process, log_offset, broker.controller_port, timeout_s)


def start_kafka(workdir: Path, port: int | None = None, timeout_s: float = 60.0,
                config: Mapping[str, str] | None = None) -> KafkaBroker:
    """A one-node Apache Kafka on 127.0.0.1 with fresh storage under `workdir`; on
    `port` if given, else on one it picks. `config` overrides server.properties."""
    overrides = {**SINGLE_NODE_CONFIG, **(config or {})}

    def start(controller_port: int) -> KafkaBroker:
        node = _prepare_node(workdir, node_id=1, port=port or 0,
                             controller_port=controller_port,
                             voters=f"1@127.0.0.1:{controller_port}",
                             cluster_id=new_cluster_id(), overrides=overrides)
        _launch(node, timeout_s)
        return node

    return _on_a_free_port(start)


def _prepare_node(workdir: Path, *, node_id: int, port: int, controller_port: int,
                  voters: str, cluster_id: str, overrides: Mapping[str, str]) -> KafkaBroker:
    """The node's directory, config and formatted storage, and its (unstarted) process."""
    node_dir = Path(tempfile.mkdtemp(prefix=f"kafka-{node_id}-", dir=workdir))
    datadir = node_dir / "data"
    config_path = node_dir / "server.properties"
    config_path.write_text(server_properties(
        node_id=node_id, port=port, controller_port=controller_port, voters=voters,
        datadir=datadir, overrides=overrides))
    log = workdir / f"{node_dir.name}.log"
    format_storage(config_path, cluster_id, log)
    process = ManagedProcess(f"kafka-{node_id}", _java(BROKER_MAIN, str(config_path)), log)
    return KafkaBroker(port, process, node_id, controller_port, datadir, config_path)


def restart_kafka(broker: KafkaBroker, timeout_s: float = 60.0) -> None:
    """Start a stopped (or killed) node again on its port, config and storage: it keeps
    its topics and offsets, and rejoins its cluster."""
    broker.process.stop()
    text = broker.config_path.read_text()
    broker.config_path.write_text(re.sub(r"PLAINTEXT://127\.0\.0\.1:\d+",
                                         f"PLAINTEXT://127.0.0.1:{broker.port}", text))
    _launch(broker, timeout_s)


# Production's shape on loopback: every topic and internal topic on three replicas, a
# write acknowledged by at least two (acks=all), and no replica that missed writes elected.
CLUSTER_CONFIG: Mapping[str, str] = {
    **SINGLE_NODE_CONFIG,
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "false",
}


@dataclass
class KafkaCluster:
    """Several KRaft nodes (each broker and controller) on loopback, one cluster."""

    nodes: list[KafkaBroker]

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def stop(self) -> None:
        stop_all([n.process for n in self.nodes])


def start_kafka_cluster(workdir: Path, nodes: int = 3, timeout_s: float = 90.0,
                        config: Mapping[str, str] | None = None,
                        attempts: int = 3) -> KafkaCluster:
    """`nodes` brokers that are also the controller quorum (a majority must be up for
    either to serve), with CLUSTER_CONFIG and `config` over it. A controller port taken
    between finding it free and the bind fails the node: the cluster starts again on new
    ports."""
    overrides = {**CLUSTER_CONFIG, **(config or {})}
    for attempt in range(attempts):
        cports = [free_port() for _ in range(nodes)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, c in enumerate(cports))
        cluster_id = new_cluster_id()
        members = [_prepare_node(workdir, node_id=i + 1, port=0, controller_port=c,
                                 voters=voters, cluster_id=cluster_id, overrides=overrides)
                   for i, c in enumerate(cports)]
        cluster = KafkaCluster(members)
        offsets = [_spawn(n) for n in members]  # together: none serves without a quorum
        try:
            for node, offset in zip(members, offsets, strict=True):
                _wait_launched(node, offset, timeout_s)
            return cluster
        except ServerStartError:
            cluster.stop()
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def write_class_archives(workdir: Path) -> None:
    """Start one node the way the devstack does, with each JVM archiving the classes it
    loads (formatting, then the broker through its start and stop), into
    CLASS_ARCHIVES. Later starts map them in instead of loading and verifying ~9,000
    classes from the jars again."""
    CLASS_ARCHIVES.mkdir(parents=True, exist_ok=True)
    for old in CLASS_ARCHIVES.glob("*.jsa"):
        old.unlink()  # the JVM writes them read-only and would not replace them
    controller_port = free_port()
    node_dir = workdir / "class-archive-node"
    node_dir.mkdir()
    config_path = node_dir / "server.properties"
    config_path.write_text(server_properties(
        node_id=1, port=0, controller_port=controller_port,
        voters=f"1@127.0.0.1:{controller_port}", datadir=node_dir / "data",
        overrides=SINGLE_NODE_CONFIG))
    log = workdir / "class-archive-node.log"
    format_storage(config_path, new_cluster_id(), log, dump=CLASS_ARCHIVES / f"{FORMAT_MAIN}.jsa")
    argv = _java(BROKER_MAIN, str(config_path), dump=CLASS_ARCHIVES / f"{BROKER_MAIN}.jsa")
    node = KafkaBroker(0, ManagedProcess("kafka-archive", argv, log), 1, controller_port,
                       node_dir / "data", config_path)
    _launch(node, 120.0)
    node.process.stop(timeout_s=60.0)  # the archive is written as the JVM exits


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="kafka-class-archives-") as tmp:
        write_class_archives(Path(tmp))
    print(f"class archives in {CLASS_ARCHIVES}: "
          f"{sorted(p.name for p in CLASS_ARCHIVES.glob('*.jsa'))}")
