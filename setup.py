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
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# Keep in step with planner_svc/simulator/__init__.py (NATIVE_MODULES).
COMPILED = ["planner_svc/simulator/kvcache.py", "planner_svc/simulator/replica.py",
            "planner_svc/simulator/chains.py", "planner_svc/simulator/eventloop.py"]


def ext_modules() -> list:
    if os.environ.get("CACHEROUTE_PURE_PYTHON", "") not in ("", "0"):
        return []
    try:
        from mypyc.build import mypycify

        modules = mypycify(COMPILED, opt_level="3")
    except (Exception, SystemExit) as exc:  # no mypyc, or it refused: pure Python still works
        print(f"cacheroute: not compiling the engine model ({exc})", file=sys.stderr)
        return []
    for ext in modules:  # a failed C build (no compiler) skips it instead of the install
        ext.optional = True
    return modules


class BuildExt(build_ext):
    """Records what was compiled (the sources' digests) beside the extensions, once they
    built: planner_svc/simulator/__init__.py uses them only while they match."""

    failed = False

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception:  # an optional extension: setuptools skips it after this
            self.failed = True
            raise

    def run(self) -> None:
        super().run()
        outputs = [Path(self.get_ext_fullpath(e.name)) for e in self.extensions]
        record = (Path(self.get_ext_fullpath("planner_svc.simulator.kvcache")).parent
                  / "native.json")
        # An extension left from an earlier build must not pass for this source.
        if self.extensions and not self.failed and all(p.exists() for p in outputs):
            digests = {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest()
                       for p in COMPILED}
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(digests, indent=1))
        elif record.exists():
            record.unlink()


setup(ext_modules=ext_modules(), cmdclass={"build_ext": BuildExt})
