"""`python -m streams worker --bootstrap HOST:PORT --web-port PORT [...]`: a stream worker.
`python -m streams engines --kv ... --metrics ...`: the engine-signals watcher."""

from __future__ import annotations

import gc
import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "engines":
        from streams.engines.watch import main as engines_main

        return engines_main(args[1:])
    if not args or args[0] != "worker":
        print(__doc__, file=sys.stderr)
        return 2
    from streams.app import create_app
    from streams.settings import parse_settings
    from streams.snapshot_signing import SnapshotSigner, load_or_create_private_key

    settings = parse_settings(args[1:], os.environ)
    signer = SnapshotSigner(load_or_create_private_key(settings.resolved_signing_key_path))
    print(f"signing snapshots with key {signer.key_id} "
          f"({settings.resolved_signing_key_path})", file=sys.stderr)
    app, _ = create_app(settings, signer)
    # The hot loop allocates many short-lived objects: fewer young-generation
    # collections, and none that rescan the long-lived state.
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    from faust import Worker

    Worker(app, loglevel=os.environ.get("CACHEROUTE_LOG_LEVEL", "info")).execute_from_commandline()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
