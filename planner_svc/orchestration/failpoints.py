"""Failpoints for fault tests: named places in the publish path that can be made to fail.

Enabled only through the environment, e.g.
    CACHEROUTE_FAILPOINTS="publish.after_redis=kill,publish.before_redis=sleep:2"
Actions: `kill` (SIGKILL this process: a crash at exactly that point), `raise`
(an exception), `sleep:SECONDS`. With the variable unset every call is a no-op costing
one dict lookup, so the hooks stay in production code.
"""

from __future__ import annotations

import os
import signal
import time


class FailpointError(RuntimeError):
    """Raised by a failpoint whose action is `raise`."""


def _parse(spec: str) -> dict[str, str]:
    points = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, action = item.partition("=")
        points[name.strip()] = action.strip() or "raise"
    return points


_POINTS = _parse(os.environ.get("CACHEROUTE_FAILPOINTS", ""))


def failpoint(name: str) -> None:
    action = _POINTS.get(name)
    if action is None:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action.startswith("sleep:"):
        time.sleep(float(action.split(":", 1)[1]))
    else:
        raise FailpointError(f"failpoint {name}")


def configure(spec: str) -> None:
    """Replace the active failpoints (tests in-process)."""
    _POINTS.clear()
    _POINTS.update(_parse(spec))
