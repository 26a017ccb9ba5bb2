"""The local stack on loopback: broker, Redis, stream worker(s) and the planner.

`cacheroute up` runs it until Ctrl-C; `cacheroute demo` runs it under the demo fleet;
the end-to-end tests run it exactly the same way. Every process is a child in its own
process group and `LocalStack.stop` ends them all (also on errors and signals), so
nothing outlives the command.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from cacheroute.v1 import planner_pb2, planner_pb2_grpc
from planner_svc.adapters.kafka_history import ensure_topic
from planner_svc.devstack.processes import (
    Broker,
    ManagedProcess,
    RedisServer,
    ServerStartError,
    free_port,
    lost_its_port,
    restart_broker,
    restart_redis,
    start_broker,
    start_redis,
    stop_all,
    until_bound,
)
from planner_svc.settings import PlannerSettings
from router_client.plan import parse_destinations
from streams.snapshot_signing import load_or_create_private_key, public_key_path


@dataclass(frozen=True)
class StackPorts:
    broker: int = 0
    redis: int = 0
    planner: int = 0
    metrics: int = 0


@dataclass(frozen=True)
class GatewayOptions:
    host: str = "127.0.0.1"
    port: int = 8000


@dataclass(frozen=True)
class StackOptions:
    destinations: int = 8
    event_partitions: int = 4
    workers: int = 1
    window_s: float = 10.0
    hop_s: float = 2.0
    interval_s: float = 5.0
    q_cap: float = 60.0
    warm_slots_per_destination: int = 64
    events_topic: str = "cacheroute.events"
    snapshots_topic: str = "cacheroute.snapshots"
    deadletter_topic: str = "cacheroute.deadletter"
    workdir: str = ""  # empty: a fresh temporary directory, removed at stop
    operator_token: str = ""
    reader_token: str = ""
    # The planner's --destinations as given (id=address[*weight],...); empty: ids only.
    destination_specs: str = ""
    # The guard's validated p99 (ms; 0 = none): `plan report` checks q_cap against it.
    p99_ms_max: float = 0.0
    # Tunables.rate_noise_z (0 = plan on the raw window rates)
    rate_noise_z: float = 0.0
    # Plan with W and q_cap learned from the engines' own signals (Tunables.learn_*).
    learn: bool = False
    # With `learn`: the engines' TTFT p99 target q_cap is learned against (s; 0 = none).
    q_cap_ttft_slo_s: float = 0.0
    # The engines' signals, read beside the stack by `python -m streams engines`:
    # (--kv "id=tcp://pub/replay,...", --metrics "id=http://engine,..."); empty: not run.
    engine_watch: tuple[str, str] = ("", "")
    # Fixed ports (0: any free one): broker, Redis, planner gRPC, planner metrics.
    ports: StackPorts = field(default_factory=StackPorts)
    # A gateway in front of `destination_specs`' engines, started after the planner
    # (None: no gateway). Its port 0 lets it pick a free one.
    gateway: GatewayOptions | None = None

    @property
    def destination_ids(self) -> list[str]:
        if self.destination_specs:
            return [d.id for d in parse_destinations(self.destination_specs)]
        return [f"engine-{i:02d}" for i in range(self.destinations)]


@dataclass
class LocalStack:
    options: StackOptions
    workdir: Path
    broker: Broker | None = None
    redis: RedisServer | None = None
    workers: list[ManagedProcess] = field(default_factory=list)
    planner: ManagedProcess | None = None
    watcher: ManagedProcess | None = None  # the engines' signals (StackOptions.engine_watch)
    gateway: ManagedProcess | None = None  # StackOptions.gateway
    gateway_url: str = ""
    grpc_port: int = 0
    metrics_port: int = 0
    _owns_workdir: bool = False

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None
        return self.broker.bootstrap

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def public_key_path(self) -> Path:
        return self.workdir / "planner" / "planner-signing-key.pub.pem"

    @property
    def worker_key_path(self) -> Path:
        """The key every worker of the stack signs its snapshots with; the planner is given
        its public half (streams.snapshot_signing)."""
        return self.workdir / "streams-signing-key.pem"

    def clients(self) -> list[ManagedProcess]:
        return [p for p in (self.gateway, self.planner, self.watcher, *self.workers)
                if p is not None]

    def processes(self) -> list[ManagedProcess]:
        procs = self.clients()
        procs += [s.process for s in (self.redis, self.broker) if s is not None]
        return procs

    def stop(self) -> None:
        # The clients first, together (their shutdown may still talk to broker and Redis),
        # then the servers, together.
        stop_all(self.clients())
        stop_all([s.process for s in (self.redis, self.broker) if s is not None])
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)


def start_stack(options: StackOptions) -> LocalStack:
    """Start everything; on any failure stop what was started and re-raise."""
    owns = not options.workdir
    workdir = Path(options.workdir or tempfile.mkdtemp(prefix="cacheroute-"))
    workdir.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(options, workdir, _owns_workdir=owns)
    try:
        stack.broker = start_broker(workdir, port=options.ports.broker or None)
        stack.redis = start_redis(workdir, port=options.ports.redis or None)
        create_topics(stack.bootstrap, options)
        stack.workers = [start_worker(stack, i) for i in range(options.workers)]
        stack.planner = start_planner(stack)
        if any(options.engine_watch):
            stack.watcher = start_watcher(stack)
        until_bound(lambda: wait_for_planner(stack), lambda: [stack.planner],
                    lambda: _restart_planner(stack))
        until_bound(lambda: wait_for_workers(stack), lambda: stack.workers,
                    lambda: _restart_workers(stack))
        if options.gateway is not None:
            stack.gateway = start_gateway(stack, options.gateway)
            stack.gateway_url = wait_for_gateway(stack.gateway)
    except BaseException:
        stack.stop()
        raise
    return stack


def _restart_planner(stack: LocalStack) -> None:
    stack.planner = start_planner(stack)  # new ports, the same data dir


def _restart_workers(stack: LocalStack) -> None:
    stack.workers = [start_worker(stack, i) if lost_its_port(w) else w
                     for i, w in enumerate(stack.workers)]


def create_topics(bootstrap: str, options: StackOptions) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [
        NewTopic(
            options.events_topic, num_partitions=options.event_partitions, replication_factor=1
        ),
        NewTopic(options.snapshots_topic, num_partitions=1, replication_factor=1),
        NewTopic(options.deadletter_topic, num_partitions=1, replication_factor=1),
        NewTopic(PlannerSettings().engine_signals_topic, num_partitions=1,
                 replication_factor=1),
    ]
    for topic, future in admin.create_topics(wanted).items():
        try:
            future.result(15)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise ServerStartError(f"could not create topic {topic}: {exc}") from exc
    # The planner creates its compacted history topic at start; a broker that lost its
    # storage under a running planner would otherwise auto-create it uncompacted.
    ensure_topic(bootstrap, PlannerSettings().state_topic)


def start_worker(stack: LocalStack, index: int) -> ManagedProcess:
    o = stack.options
    argv = [
        sys.executable,
        "-m",
        "streams",
        "worker",
        "--bootstrap",
        stack.bootstrap,
        "--web-port",
        str(free_port()),
        "--events-topic",
        o.events_topic,
        "--snapshots-topic",
        o.snapshots_topic,
        "--deadletter-topic",
        o.deadletter_topic,
        "--window-s",
        str(o.window_s),
        "--hop-s",
        str(o.hop_s),
        "--data-dir",
        str(stack.workdir / f"worker-{index}"),
        "--signing-key-path",
        str(stack.worker_key_path),
    ]
    load_or_create_private_key(stack.worker_key_path)  # once, before workers share it
    proc = ManagedProcess(f"worker-{index}", argv, stack.workdir / f"worker-{index}.log")
    proc.start()
    return proc


def start_planner(stack: LocalStack) -> ManagedProcess:
    o = stack.options
    stack.grpc_port = o.ports.planner or free_port()
    stack.metrics_port = o.ports.metrics or free_port()
    argv = [
        sys.executable,
        "-m",
        "planner_svc",
        "--bootstrap",
        stack.bootstrap,
        "--snapshots-topic",
        o.snapshots_topic,
        "--events-topic",
        o.events_topic,
        "--stream-window-s",
        str(o.window_s),
        "--stream-hop-s",
        str(o.hop_s),
        "--snapshot-keys",
        str(public_key_path(stack.worker_key_path)),
        "--redis-url",
        stack.redis_url,
        "--grpc-port",
        str(stack.grpc_port),
        "--metrics-port",
        str(stack.metrics_port),
        "--data-dir",
        str(stack.workdir / "planner"),
        "--destinations",
        o.destination_specs or ",".join(o.destination_ids),
        "--q-cap",
        str(o.q_cap),
        "--warm-slots-per-destination",
        str(o.warm_slots_per_destination),
        "--interval-s",
        str(o.interval_s),
    ]
    if o.p99_ms_max > 0:
        argv += ["--validated-p99-ms-max", str(o.p99_ms_max)]
    if o.rate_noise_z > 0:
        argv += ["--rate-noise-z", str(o.rate_noise_z)]
    if o.learn:
        argv += ["--learn-warm-slots", "true", "--learn-q-cap", "true"]
        if o.q_cap_ttft_slo_s > 0:
            argv += ["--q-cap-ttft-slo-s", str(o.q_cap_ttft_slo_s)]
    # Only tokens that are set: an empty flag would override the planner's environment.
    for flag, token in (("--operator-token", o.operator_token), ("--reader-token", o.reader_token)):
        if token:
            argv += [flag, token]
    proc = ManagedProcess("planner", argv, stack.workdir / "planner.log")
    proc.start()
    return proc


def start_watcher(stack: LocalStack) -> ManagedProcess:
    """The engines' KV events and /metrics to the planner (streams.engines.watch)."""
    kv, metrics = stack.options.engine_watch
    argv = [sys.executable, "-m", "streams", "engines", "--bootstrap", stack.bootstrap]
    if kv:
        argv += ["--kv", kv]
    if metrics:
        argv += ["--metrics", metrics]
    proc = ManagedProcess("engine-watch", argv, stack.workdir / "engine-watch.log")
    proc.start()
    return proc


def start_gateway(stack: LocalStack, gw: GatewayOptions) -> ManagedProcess:
    """`cacheroute gateway` in front of the engines, following the planner's plan (Redis,
    pinned to its key) and reporting to the stream (the broker), so plans are made from
    the traffic it routes."""
    argv = [sys.executable, "-m", "planner_svc.cli.main", "gateway",
            "--host", gw.host, "--port", str(gw.port), "--router-id", "up-gateway",
            "--destinations", stack.options.destination_specs,
            "--redis-url", stack.redis_url, "--public-key", str(stack.public_key_path),
            "--bootstrap", stack.bootstrap, "--events-topic", stack.options.events_topic]
    proc = ManagedProcess("gateway", argv, stack.workdir / "gateway.log")
    proc.start()
    return proc


def wait_for_gateway(gateway: ManagedProcess, timeout_s: float = 30.0) -> str:
    """The gateway's URL once it listens (it prints `CACHEROUTE_GATEWAY=<url>` then)."""
    marker = "CACHEROUTE_GATEWAY="
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in gateway.log_tail(50).splitlines():
            if line.startswith(marker):
                return line[len(marker):].strip()
        if not gateway.alive():
            raise ServerStartError(f"the gateway exited:\n{gateway.log_tail()}")
        time.sleep(0.1)
    raise ServerStartError(f"the gateway did not listen in {timeout_s:.0f} s:\n"
                           f"{gateway.log_tail()}")


def worker_web_port(worker: ManagedProcess) -> int:
    return int(worker.argv[worker.argv.index("--web-port") + 1])


def stream_metrics(port: int) -> dict[str, float]:
    """A stream worker's /metrics by sample name (without the `cacheroute_streams_` prefix;
    labelled series summed); empty while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    prefix = "cacheroute_streams_"
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                name = sample.name[len(prefix):]
                out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def wait_for_workers(stack: LocalStack, timeout_s: float = 60.0) -> None:
    """Until the stream workers together own every events partition and have replayed
    their history: before that, events are produced but no window counts them yet (a
    consumer group's first rebalance takes seconds), so a run started earlier would lose
    its first window to start-up."""
    if not stack.workers:
        return  # nothing consumes the events: nothing to wait for
    deadline = time.monotonic() + timeout_s
    wanted = stack.options.event_partitions
    while time.monotonic() < deadline:
        for worker in stack.workers:
            if not worker.alive():
                raise ServerStartError(f"{worker.name} exited:\n{worker.log_tail()}")
        states = [stream_metrics(worker_web_port(w)) for w in stack.workers]
        if (sum(m.get("assigned_partitions", 0.0) for m in states) >= wanted
                and not any(m.get("recovering_partitions", 0.0) for m in states)):
            return
        time.sleep(0.2)
    raise ServerStartError(
        f"the stream workers did not own the {wanted} events partitions in {timeout_s:.0f} s"
    )


def wait_for_planner(stack: LocalStack, timeout_s: float = 30.0) -> None:
    """Until the planner answers gRPC (its status, not yet a plan)."""
    deadline = time.monotonic() + timeout_s
    assert stack.planner is not None
    # With a token set, GetStatus needs one: the reader's reads, the operator's does too.
    token = stack.options.reader_token or stack.options.operator_token
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(stack.grpc_target) as channel:
        stub = planner_pb2_grpc.PlannerStub(channel)
        while time.monotonic() < deadline:
            if not stack.planner.alive():
                raise ServerStartError(f"the planner exited:\n{stack.planner.log_tail()}")
            try:
                stub.GetStatus(planner_pb2.GetStatusRequest(), timeout=1.0, metadata=metadata)
                return
            except grpc.RpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAUTHENTICATED,
                                  grpc.StatusCode.PERMISSION_DENIED):
                    raise ServerStartError(
                        f"the planner refused the stack's token: {exc.details()}") from exc
                time.sleep(0.2)
    raise ServerStartError(
        f"the planner did not answer in {timeout_s:.0f} s:\n{stack.planner.log_tail()}"
    )


class Supervisor:
    """Restarts whatever component of the stack died, with backoff, keeping the others.

    A broker comes back on its port (Apache Kafka with its storage, Tansu empty; the topics
    are created again where missing); Redis on its port and data directory (the planner
    republishes what Redis lost); a worker or the planner with its command line. Backoff
    doubles per restart of a component, from 0.5 s to `max_backoff_s`, and resets once it
    has stayed up a minute.
    """

    def __init__(self, stack: LocalStack, max_backoff_s: float = 30.0) -> None:
        self.stack = stack
        self.max_backoff_s = max_backoff_s
        self.restarts: dict[str, int] = {}  # since the component last stayed up (backoff)
        self.restarted: Counter[str] = Counter()  # in total
        self._next: dict[str, float] = {}
        self._up_since: dict[str, float] = {}

    def check(self, now: float | None = None) -> list[str]:
        """Restart dead components whose backoff has passed; the names restarted."""
        now = time.monotonic() if now is None else now
        done = []
        for name, proc in self.components():
            if proc.alive():
                if now - self._up_since.get(name, now) > 60.0:
                    self.restarts[name] = 0
                continue
            if now < self._next.get(name, 0.0):
                continue
            n = self.restarts.get(name, 0)
            self._next[name] = now + min(self.max_backoff_s, 0.5 * 2**n)
            try:
                self._restart(name)
            except ServerStartError as exc:
                print(f"supervisor: {name} did not restart: {exc}", file=sys.stderr)
                continue
            self.restarts[name] = n + 1
            self.restarted[name] += 1
            self._up_since[name] = now
            done.append(name)
        return done

    def components(self) -> list[tuple[str, ManagedProcess]]:
        s = self.stack
        out = []
        if s.broker is not None:
            out.append(("broker", s.broker.process))
        if s.redis is not None:
            out.append(("redis", s.redis.process))
        out += [(f"worker-{i}", w) for i, w in enumerate(s.workers)]
        if s.planner is not None:
            out.append(("planner", s.planner))
        if s.gateway is not None:
            out.append(("gateway", s.gateway))
        return out

    def _restart(self, name: str) -> None:
        s = self.stack
        if name == "broker" and s.broker is not None:
            s.broker = restart_broker(s.broker, s.workdir)
            create_topics(s.bootstrap, s.options)
        elif name == "redis" and s.redis is not None:
            restart_redis(s.redis)
        elif name.startswith("worker-"):
            s.workers[int(name.split("-")[1])].start()
        elif name == "planner" and s.planner is not None:
            s.planner.start()
        elif name == "gateway" and s.gateway is not None:
            s.gateway.start()
