"""The compiled engine model (setup.py, mypyc) is used only while it matches its source."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import shutil
import subprocess
import sys
from pathlib import Path

import planner_svc.simulator as sim

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import warnings, planner_svc.simulator as s, planner_svc.simulator.kvcache as k;"
         "print(s.NATIVE, k.__file__.endswith('.py'))")


def _tree(tmp: Path) -> Path:
    pkg = tmp / "planner_svc" / "simulator"
    pkg.mkdir(parents=True)
    (tmp / "planner_svc" / "__init__.py").write_text("")
    for source in (ROOT / "planner_svc" / "simulator").glob("*.py"):  # what they import too
        shutil.copy(source, pkg / source.name)
    return pkg


def _probe(tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-W", "always", "-c", PROBE], cwd=tmp,
                          capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp), "PATH": "/usr/bin:/bin"})


def test_the_running_model_is_what_the_package_says() -> None:
    import importlib

    for name in sim.NATIVE_MODULES:
        module = importlib.import_module(f"planner_svc.simulator.{name}")
        assert (not str(module.__file__).endswith(".py")) == sim.NATIVE, name


def test_a_stale_extension_is_never_used(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    for name in sim.NATIVE_MODULES:  # not even loadable: importing one would fail
        (pkg / f"{name}{suffix}").write_bytes(b"not a shared object")
    built = {f"planner_svc/simulator/{n}.py": hashlib.sha256(b"older source").hexdigest()
             for n in sim.NATIVE_MODULES}
    (pkg / "native.json").write_text(json.dumps(built))
    done = _probe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
    assert "does not match its source" in done.stderr


def test_a_partly_compiled_model_runs_the_source(tmp_path: Path) -> None:
    pkg = _tree(tmp_path)
    (pkg / f"kvcache{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"junk")
    done = _probe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_no_extension_is_plain_python_without_a_warning(tmp_path: Path) -> None:
    _tree(tmp_path)
    done = _probe(tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"] and "Warning" not in done.stderr
