"""The generated protobuf code matches the .proto files (run protos/generate.py if not).

Compared without the generator's version stamps: a fresh install may bring a newer protoc
or grpcio-tools than the one the committed code was generated with, which changes only those
lines. What the stamps must satisfy is checked apart: the installed runtimes are at least
the versions the code was generated for (the generated modules refuse to import otherwise).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import grpc
from google.protobuf import __version__ as protobuf_version

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "protos" / "cacheroute" / "v1"
# The lines a generator's version writes: `GRPC_GENERATED_VERSION = '1.85.1'`,
# `# Protobuf Python Version: 7.35.1` and ValidateProtobufRuntimeVersion's numbers.
_GRPC_STAMP = re.compile(rb"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", re.M)
_PROTOBUF_STAMP = re.compile(rb"^# Protobuf Python Version: ([0-9.]+)$", re.M)
_PROTOBUF_CHECK = re.compile(
    rb"(ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,)\s*"
    rb"\d+,\s*\d+,\s*\d+,")


def _load_generator():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(
        "protos_generate", ROOT / "protos" / "generate.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["protos_generate"] = module
    spec.loader.exec_module(module)
    return module


def _unstamped(code: bytes) -> bytes:
    code = _GRPC_STAMP.sub(b"GRPC_GENERATED_VERSION = ''", code)
    code = _PROTOBUF_STAMP.sub(b"# Protobuf Python Version:", code)
    return _PROTOBUF_CHECK.sub(rb"\1", code)


def _version(raw: bytes | str) -> tuple[int, ...]:
    text = raw.decode() if isinstance(raw, bytes) else raw
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def test_generated_code_is_fresh(tmp_path: Path) -> None:
    _load_generator().generate(tmp_path)
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*.py*"))
    assert fresh, "protoc produced nothing"
    stale = [
        str(rel)
        for rel in fresh
        if _unstamped((tmp_path / rel).read_bytes())
        != _unstamped((ROOT / "protos" / rel).read_bytes())
    ]
    assert not stale, f"stale generated code, run `python protos/generate.py`: {stale}"


def test_the_installed_runtimes_can_load_the_committed_code() -> None:
    for path in GENERATED.glob("*_pb2_grpc.py"):
        for stamp in _GRPC_STAMP.findall(path.read_bytes()):
            assert _version(grpc.__version__) >= _version(stamp), (path.name, stamp)
    for path in GENERATED.glob("*_pb2.py"):
        for stamp in _PROTOBUF_STAMP.findall(path.read_bytes()):
            assert _version(protobuf_version) >= _version(stamp), (path.name, stamp)


def test_version_stamps_alone_do_not_count_as_stale() -> None:
    committed = (GENERATED / "planner_pb2_grpc.py").read_bytes()
    bumped = _GRPC_STAMP.sub(b"GRPC_GENERATED_VERSION = '99.0.0'", committed)
    assert bumped != committed and _unstamped(bumped) == _unstamped(committed)
    changed = committed.replace(b"GetCurrentVersion", b"GetCurrentVersio", 1)
    assert _unstamped(changed) != _unstamped(committed)
