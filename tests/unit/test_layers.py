"""The architecture's import rules, checked on the source (like an import-linter contract).

- Pure modules never import a server client (faust, grpc, redis, confluent_kafka, aiokafka).
- Exactly one module per package talks to each server.
- Nothing imports planner_svc's service modules except its own entry points.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVER_CLIENTS = {"faust", "grpc", "redis", "confluent_kafka", "aiokafka", "mode"}

PURE_PACKAGES = ["planner_svc/planning", "planner_svc/control", "planner_svc/replay"]
PURE_MODULES = [
    "router_client/plan.py",
    "router_client/routing.py",
    "router_client/delta.py",
    "router_client/signing.py",
    "router_client/layout.py",
    "router_client/follow.py",
    "router_client/rebase.py",
    "router_client/layered.py",
    *(
        f"streams/{m}.py"
        for m in (
            "assembly",
            "windows",
            "validation",
            "dedup",
            "wire",
            "decoding",
            "processor",
            "ring",
            "keyspace",
            "arrivals",
            "snapshots",
            "config",
            "metrics",
            "partitioning",
            "usage",
            "columns",
            "settings",
            "categorical",
        )
    ),
]
# package -> {server client -> the modules allowed to import it}
SEAMS = {
    "router_client": {"redis": {"router_client/redis_source.py"}},
    "streams": {
        "faust": {"streams/app.py", "streams/__main__.py"},  # the app and its entry point
        "aiokafka": {"streams/app.py"},
        "mode": {"streams/app.py"},
        "confluent_kafka": {"streams/emitter.py"},
    },
    "planner_svc": {
        "redis": {"planner_svc/publish.py"},
        "confluent_kafka": {
            "planner_svc/snapshots.py",
            "planner_svc/history.py",
            "planner_svc/cli/stack.py",
        },
    },
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def pure_files() -> list[Path]:
    files = [p for pkg in PURE_PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    files += [ROOT / m for m in PURE_MODULES if (ROOT / m).exists()]
    return files


@pytest.mark.parametrize("path", pure_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_pure_modules_import_no_server_client(path: Path) -> None:
    bad = imported_roots(path) & SERVER_CLIENTS
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


@pytest.mark.parametrize("package", sorted(SEAMS))
def test_one_module_per_package_talks_to_each_server(package: str) -> None:
    for client, allowed in SEAMS[package].items():
        users = {
            str(p.relative_to(ROOT))
            for p in (ROOT / package).rglob("*.py")
            if client in imported_roots(p)
        }
        assert users <= allowed, f"{package}: {sorted(users - allowed)} import {client}"


def test_nothing_outside_planner_svc_imports_its_service_modules() -> None:
    service_modules = (
        "planner_svc.server",
        "planner_svc.service",
        "planner_svc.planner",
        "planner_svc.publish",
        "planner_svc.snapshots",
    )
    for package in ("router_client", "streams"):
        for path in (ROOT / package).rglob("*.py"):
            hits = {m for m in imported_modules(path) if m.startswith(service_modules)}
            assert not hits, f"{path.relative_to(ROOT)} imports {sorted(hits)}"
