"""Regenerate the Python code for every .proto under protos/ (run from anywhere).

Generated modules sit beside their .proto files and import as `cacheroute.v1.*`.
`tests/unit/test_protos_fresh.py` fails when they are stale.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent


def generate(out_dir: Path = ROOT) -> None:
    protos = sorted(str(p.relative_to(ROOT)) for p in ROOT.rglob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *protos,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
