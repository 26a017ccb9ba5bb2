"""Router processes for the benchmarks: CacheRoute's gateway and the peers, started the way
their users start them (bound to 127.0.0.1, metrics on a loopback port of their own).

Peers (PyPI): the SGLang model gateway as `smg` (its current package, kind `smg`, in a
virtualenv of its own: `sglang-router` installs an `smg` console script too), the same gateway
as `sglang-router` 0.3.2 (kind `sglang`, the arena's earlier peer) and `vllm-router`. Their
documented defaults are kept except what this machine needs: loopback addresses, a metrics
port each (all default to 29000), and vllm-router's worker start-up check every 1 s instead
of 30 s (it only delays start-up). Several `smg` replicas form a mesh (`--enable-mesh`,
`--mesh-peer-urls`: each replica's radix tree and worker state shared with the others), as
its docs set up gateways in high availability. `best` settings come from the sweep in
bench/arena.py and are named where used.
"""

from __future__ import annotations

import os
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

# `smg` lives in its own virtualenv (`sglang-router` installs a console script of that name
# too): bench/arena.py's install line, `python3 -m venv .venv-peers/smg &&
# .venv-peers/smg/bin/pip install smg==<version>`; CACHEROUTE_SMG_VENV points elsewhere.
SMG_VENV = Path(__file__).resolve().parents[2] / ".venv-peers" / "smg"


def smg_venv() -> Path:
    return Path(os.environ.get("CACHEROUTE_SMG_VENV") or SMG_VENV)


def peer_versions() -> dict[str, str]:
    """Every peer's installed version (the results record them)."""
    out = {}
    for package in ("sglang-router", "vllm-router"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            out[package] = "not installed"
    out["smg"] = _dist_version(smg_venv(), "smg")
    return out


def _dist_version(venv: Path, package: str) -> str:
    """`package`'s version in another virtualenv, from its dist-info directory's name."""
    found = sorted(venv.glob(f"lib/python*/site-packages/{package}-*.dist-info"))
    if not found:
        return "not installed"
    return found[-1].name.removeprefix(f"{package}-").removesuffix(".dist-info")


@dataclass(frozen=True)
class RouterSpec:
    """One router configuration: `kind` is cacheroute, smg (the SGLang model gateway's
    current package), sglang (`sglang-router`, the same gateway's earlier package) or vllm."""

    name: str
    kind: str
    policy: str = ""
    extra: tuple[str, ...] = ()

    def argv(self, port: int, metrics_port: int, destinations: dict[str, str],
             cacheroute: dict[str, str] | None = None,
             mesh: tuple[int, list[int]] | None = None) -> tuple[list[str], str]:
        """The command and its readiness path. `mesh`: (this replica's mesh port, the
        other replicas' mesh ports) for `smg` replicas that share their state."""
        bindir = Path(sys.executable).parent
        urls = list(destinations.values())
        if self.kind == "cacheroute":
            argv = [str(bindir / "cacheroute"), "gateway", "--port", str(port),
                    "--destinations", ",".join(f"{k}={v}" for k, v in destinations.items()),
                    "--probe-path", ""]
            for flag, value in (cacheroute or {}).items():
                argv += [f"--{flag}", value]
            return [*argv, *self.extra], "/readyz"
        if self.kind == "smg":
            argv = [str(smg_venv() / "bin" / "smg"), "launch", "--host", "127.0.0.1",
                    "--port", str(port), "--prometheus-host", "127.0.0.1",
                    "--prometheus-port", str(metrics_port), "--worker-urls", *urls,
                    "--policy", self.policy, "--log-level", "warn"]
            if mesh is not None:
                own, others = mesh
                argv += ["--enable-mesh", "--mesh-server-name", f"arena-{own}",
                         "--mesh-host", "127.0.0.1", "--mesh-port", str(own),
                         "--mesh-peer-urls", *[f"127.0.0.1:{p}" for p in others]]
            return [*argv, *self.extra], "/readiness"
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
        if self.kind == "smg":
            return (smg_venv() / "bin" / "smg").exists()
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
    # smg replicas in a mesh: every replica's mesh port known before the first starts
    mesh_ports = ([free_port() for _ in range(replicas)]
                  if spec.kind == "smg" and replicas > 1 else [])

    def launch(i: int) -> tuple[ManagedProcess, str, str]:
        port, metrics_port = free_port(), free_port()
        mesh = ((mesh_ports[i], [p for j, p in enumerate(mesh_ports) if j != i])
                if mesh_ports else None)
        argv, ready = spec.argv(port, metrics_port, destinations,
                                {**(cacheroute or {}), "router-id": f"arena-{i}"}
                                if spec.kind == "cacheroute" else None, mesh)
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
