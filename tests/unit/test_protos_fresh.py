"""The generated protobuf code matches the .proto files (run protos/generate.py if not)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "protos" / "cacheroute" / "v1"


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "protos_generate", ROOT / "protos" / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["protos_generate"] = module
    spec.loader.exec_module(module)
    return module


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    _load_generator().generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert fresh, "protoc produced nothing"
    stale = [
        str(rel)
        for rel in fresh
        if (tmp_path / rel).read_bytes() != (ROOT / "protos" / rel).read_bytes()
    ]
    assert not stale, f"stale generated code, run `python protos/generate.py`: {stale}"
