"""Compiles the engine model with mypyc at install time (same source, several times faster).

The simulator, the emulated engines and the demo fleet all spend their time in
`planner_svc.simulator.kvcache` and `replica`; mypyc compiles those typed modules to C
extensions. Nothing else changes: the .py files stay the source, and
`planner_svc.simulator` falls back to them whenever a compiled module does not match its
source (edited since the install) or none was built. Set CACHEROUTE_PURE_PYTHON=1 to skip
the compile; a failed compile (no C compiler) installs the pure-Python package.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
# Keep in step with planner_svc/simulator/__init__.py (NATIVE_MODULES).
COMPILED = ["planner_svc/simulator/kvcache.py", "planner_svc/simulator/replica.py"]


def ext_modules() -> list:
    if os.environ.get("CACHEROUTE_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify

        modules = mypycify(COMPILED, opt_level="3")
    except Exception as exc:  # no mypyc or no compiler: the pure-Python package still works
        print(f"cacheroute: not compiling the engine model ({exc})", file=sys.stderr)
        return []
    # What was compiled, so an edited source is never shadowed by a stale extension.
    digests = {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest() for p in COMPILED}
    (ROOT / "planner_svc/simulator/native.json").write_text(json.dumps(digests, indent=1))
    return modules


setup(ext_modules=ext_modules())
