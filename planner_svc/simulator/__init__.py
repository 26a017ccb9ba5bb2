"""The shadow-replay simulator: engine model, workloads, routing policies (pure, virtual time).

The engine model (`kvcache`, `replica`) is compiled by mypyc at install time (setup.py):
the same source as C extensions, which the simulator, the emulated engines and the demo
fleet then run several times faster. A compiled module is used only while it matches its
source: if either was edited since the install (or only part of it was compiled), this
package loads every engine-model module from its .py file instead, and says so once.
`NATIVE` tells which one is running.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import sys
import warnings
from pathlib import Path

# Keep in step with setup.py (COMPILED): compiled together, so used (or not) together.
NATIVE_MODULES = ("kvcache", "replica", "chains", "eventloop")


def _compiled(here: Path, name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = here / f"{name}{suffix}"
        if path.exists():
            return path
    return None


def _matches(here: Path, extensions: list[Path]) -> bool:
    """Every compiled module was built from the source now beside it."""
    try:
        built = json.loads((here / "native.json").read_text())
    except (OSError, ValueError):
        built = None
    for name, ext in zip(NATIVE_MODULES, extensions, strict=True):
        source = here / f"{name}.py"
        if isinstance(built, dict):
            digest = hashlib.sha256(source.read_bytes()).hexdigest()
            if built.get(f"planner_svc/simulator/{name}.py") != digest:
                return False
        elif ext.stat().st_mtime < source.stat().st_mtime:  # no record: by age
            return False
    return True


def _load_sources(here: Path) -> None:
    for name in NATIVE_MODULES:
        full = f"{__name__}.{name}"
        spec = importlib.util.spec_from_file_location(full, here / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
        setattr(sys.modules[__name__], name, module)


def _choose() -> bool:
    here = Path(__file__).resolve().parent
    found = [_compiled(here, name) for name in NATIVE_MODULES]
    if not any(found):
        return False
    extensions = [p for p in found if p is not None]
    if len(extensions) == len(NATIVE_MODULES) and _matches(here, extensions):
        return True
    warnings.warn("planner_svc.simulator: the compiled engine model does not match its "
                  "source (edited since the install?); running the source. Reinstall "
                  "(pip install -e .) to compile it again.", RuntimeWarning, stacklevel=2)
    _load_sources(here)
    return False


NATIVE = _choose()
