"""Router processes for the benchmarks: CacheRoute's gateway and the peers, started the way
their users start them (bound to 127.0.0.1, metrics on a loopback port of their own).

Peers (PyPI): `sglang-router` (the SGLang model gateway, `smg launch`) and `vllm-router`.
Their documented defaults are kept except what this machine needs: loopback addresses, a
metrics port each (both default to 29000), and vllm-router's worker start-up check every
1 s instead of 30 s (it only delays start-up). `best` settings come from the sweep in
bench/arena.py and are named where used.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from planner_svc.devstack.processes import (
    ManagedProcess,
    ServerStartError,
    free_port,
    stop_all,
    until_bound,
)


def peer_versions() -> dict[str, str]:
    out = {}
    for package in ("sglang-router", "vllm-router"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    return out


@dataclass(frozen=True)
class RouterSpec:
    """One router configuration: `kind` is cacheroute, sglang or vllm."""

    name: str
    kind: str
    policy: str = ""
    extra: tuple[str, ...] = ()

    def argv(self, port: int, metrics_port: int, destinations: dict[str, str],
             cacheroute: dict[str, str] | None = None) -> tuple[list[str], str]:
        """The command and its readiness path."""
        bindir = Path(sys.executable).parent
        urls = list(destinations.values())
        if self.kind == "cacheroute":
            argv = [str(bindir / "cacheroute"), "gateway", "--port", str(port),
                    "--destinations", ",".join(f"{k}={v}" for k, v in destinations.items()),
                    "--probe-path", ""]
            for flag, value in (cacheroute or {}).items():
                argv += [f"--{flag}", value]
            return [*argv, *self.extra], "/readyz"
        if self.kind == "sglang":
            return [str(bindir / "smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
                    "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                    "--worker-urls", *urls, "--policy", self.policy, "--log-level", "warn",
                    *self.extra], "/readiness"
        return [str(bindir / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                "--worker-urls", *urls, "--policy", self.policy,
                "--worker-startup-check-interval", "1", "--log-level", "warning",
                *self.extra], "/readiness"

    @property
    def installed(self) -> bool:
        name = {"cacheroute": "cacheroute", "sglang": "smg", "vllm": "vllm-router"}[self.kind]
        return (Path(sys.executable).parent / name).exists()


@dataclass
class RunningRouters:
    spec: RouterSpec
    processes: list[ManagedProcess] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def stop(self) -> None:
        stop_all(self.processes)

    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds() for p in self.processes)

    def peak_rss_mb(self) -> float:
        return max((p.peak_rss_mb() for p in self.processes), default=0.0)


def start_routers(spec: RouterSpec, replicas: int, destinations: dict[str, str], workdir: Path,
                  *, cacheroute: dict[str, str] | None = None, wrap: Sequence[str] = (),
                  timeout_s: float = 60.0) -> RunningRouters:
    """`replicas` processes of `spec`, each ready before this returns. They start together
    (a cold start of one takes ~0.8 s, mostly waiting on its workers' health checks)."""
    running = RunningRouters(spec)

    def launch(i: int) -> tuple[ManagedProcess, str, str]:
        port, metrics_port = free_port(), free_port()
        argv, ready = spec.argv(port, metrics_port, destinations,
                                {**(cacheroute or {}), "router-id": f"arena-{i}"}
                                if spec.kind == "cacheroute" else None)
        proc = ManagedProcess(f"{spec.name}-{i}", [*wrap, *argv],
                              workdir / f"{spec.name.replace(' ', '_')}-{i}.log")
        proc.start()
        return proc, f"http://127.0.0.1:{port}", ready

    try:
        launched = [launch(i) for i in range(replicas)]
        running.processes = [proc for proc, _, _ in launched]
        running.urls = [url for _, url, _ in launched]
        for i in range(replicas):
            def wait(i: int = i) -> None:
                proc, url, ready = launched[i]
                if not wait_ready(url, ready, timeout_s, proc):
                    raise ServerStartError(f"{spec.name} did not become ready:\n"
                                           f"{proc.log_tail(8)}")

            def relaunch(i: int = i) -> None:  # its port was taken: new ports
                launched[i] = launch(i)
                running.processes[i], running.urls[i] = launched[i][0], launched[i][1]

            def process(i: int = i) -> list[ManagedProcess | None]:
                return [launched[i][0]]

            until_bound(wait, process, relaunch)
    except BaseException:
        running.stop()
        raise
    return running


def wait_ready(url: str, path: str, timeout_s: float, proc: ManagedProcess) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            return False
        try:
            with urllib.request.urlopen(url + path, timeout=2) as r:
                body = r.read()
                if r.status == 200 and (path != "/readiness" or b"ready" in body):
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False
