"""Compiles the engine model with mypyc at install time, when asked (CACHEROUTE_COMPILE=1).

The simulator, the emulated engines and the demo fleet all spend their time in
`planner_svc.simulator.kvcache` and `replica`; mypyc compiles those typed modules to C
extensions, several times faster. Only installs that run them at volume want that (the
replay, the benchmarks, the test environment: deploy/local/run.sh sets the variable), and
the compile takes half a minute, so it is opt-in: a router client, gateway or planner
install compiles nothing. Nothing else changes: the .py files stay the source, and
`planner_svc.simulator` falls back to them whenever a compiled module does not match its
source (edited since the install) or none was built; a failed compile (no C compiler)
installs the pure-Python package. CACHEROUTE_PURE_PYTHON=1 skips the compile whatever
else is set.

A build from a source checkout writes its intermediate files (build/, the egg-info) into a
temporary directory, not into the checkout. Only the opt-in compile writes there: mypyc's
C sources in build/ and, for an editable install (`pip install -e`), the compiled modules
beside their sources, which is where Python must find them.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build import build
from setuptools.command.build_ext import build_ext
from setuptools.command.egg_info import egg_info

ROOT = Path(__file__).resolve().parent
# Keep in step with planner_svc/simulator/__init__.py (NATIVE_MODULES).
COMPILED = ["planner_svc/simulator/kvcache.py", "planner_svc/simulator/replica.py",
            "planner_svc/simulator/chains.py", "planner_svc/simulator/eventloop.py"]


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


# One scratch directory per build step for what setuptools would write into the checkout;
# what a step leaves for the next (the wheel, the metadata) goes where pip asked.
SCRATCH = Path(tempfile.gettempdir()) / f"cacheroute-build-{os.getpid()}"
atexit.register(shutil.rmtree, SCRATCH, ignore_errors=True)


def ext_modules() -> list:
    if _flag("CACHEROUTE_PURE_PYTHON") or not _flag("CACHEROUTE_COMPILE"):
        return []
    try:
        from mypyc.build import mypycify

        # Its generated C goes to build/ in the checkout: setuptools refuses an extension's
        # sources by absolute path, so the scratch directory cannot hold them.
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


class Build(build):
    """build/ in the scratch directory unless a --build-base was given."""

    def initialize_options(self) -> None:
        super().initialize_options()
        self.build_base = str(SCRATCH / "build")


class EggInfo(egg_info):
    """The egg-info in the scratch directory unless --egg-base was given (an editable
    install keeps its own: it needs the metadata where it points Python)."""

    def finalize_options(self) -> None:
        if getattr(self, "egg_base", None) is None and "editable_wheel" not in sys.argv:
            SCRATCH.mkdir(parents=True, exist_ok=True)
            self.egg_base = str(SCRATCH)
        super().finalize_options()


setup(ext_modules=ext_modules(),
      cmdclass={"build_ext": BuildExt, "build": Build, "egg_info": EggInfo})
