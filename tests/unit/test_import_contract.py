"""The architecture's import rules are the `.importlinter` contract; these tests run it.

The contract follows imports transitively, which the earlier AST check did not: the
second test shows a pure module failing it through an intermediate module.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = {"planner_svc": "planner_svc", "router_client": "router_client",
            "streams": "streams", "cacheroute": "protos/cacheroute"}


def lint(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache", *args], cwd=cwd, capture_output=True, text=True,
        env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin"}, timeout=120,
    )


def copy_tree(dst: Path) -> None:
    for name, src in PACKAGES.items():
        shutil.copytree(ROOT / src, dst / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyi", "*.proto"))
    shutil.copy(ROOT / ".importlinter", dst / ".importlinter")


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    done = lint(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_pure_module_reaching_redis_through_another_module_fails(tmp_path: Path) -> None:
    copy_tree(tmp_path)
    # An innocent-looking helper outside the pure list imports redis; a planning module
    # imports only the helper.
    (tmp_path / "streams" / "probe_helper.py").write_text("import redis\n")
    (tmp_path / "planner_svc" / "planning" / "probe.py").write_text(
        "from streams import probe_helper\n")
    done = lint(tmp_path, "--contract", "pure-cores")
    assert done.returncode != 0, done.stdout
    assert "planner_svc.planning.probe -> streams.probe_helper" in done.stdout
    assert "streams.probe_helper -> redis" in done.stdout
    # ...and the same helper is fine where no contract forbids it.
    (tmp_path / "planner_svc" / "planning" / "probe.py").unlink()
    assert lint(tmp_path, "--contract", "pure-cores").returncode == 0


def test_importing_the_planning_core_loads_no_client() -> None:
    code = ("import sys, planner_svc.planning, planner_svc.control, planner_svc.simulator; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('router_client', 'redis', 'grpc', 'cryptography', 'faust', 'aiohttp')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    loaded = eval(out)
    assert set(loaded) <= {"router_client", "router_client.errors", "router_client.plan",
                           "router_client.routing", "router_client.layered",
                           "router_client.rebase", "router_client.layout",
                           "router_client.delta", "router_client.ring"}, loaded
