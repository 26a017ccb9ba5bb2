"""deploy/compose.engines.yaml: one CACHEROUTE_ENGINES names the engines to the planner and
the gateway alike (compose interpolates it; here it is substituted as compose would)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from planner_svc.cli.gateway_cmd import FLAGS as GATEWAY_FLAGS
from planner_svc.settings import from_env
from router_client.plan import parse_destinations

yaml = pytest.importorskip("yaml")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ENGINES = "e0=http://10.0.0.5:8000,e1=http://10.0.0.6:8000*2"
# ${NAME:?message}: the value of NAME, or compose refuses to start with the message.
REQUIRED = re.compile(r"\$\{(\w+):\?[^}]*\}")


def rendered(environ: dict[str, str]) -> dict[str, Any]:
    text = (DEPLOY / "compose.engines.yaml").read_text()
    return dict(yaml.safe_load(REQUIRED.sub(lambda m: environ[m.group(1)], text)))


def test_the_planner_and_the_gateway_get_the_same_engines() -> None:
    services = rendered({"CACHEROUTE_ENGINES": ENGINES})["services"]
    base = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    assert set(services) <= set(base)  # an override of services compose.yaml has
    planner = {**base["planner"]["environment"], **services["planner"]["environment"]}
    settings = from_env(environ={k: str(v) for k, v in planner.items()})
    assert list(settings.destinations) == ["e0=http://10.0.0.5:8000",
                                           "e1=http://10.0.0.6:8000*2"]
    gateway = services["gateway"]["environment"]["CACHEROUTE_GATEWAY_DESTINATIONS"]
    assert "destinations" in GATEWAY_FLAGS
    assert [(d.id, d.address, d.capacity_weight) for d in parse_destinations(gateway)] == [
        ("e0", "http://10.0.0.5:8000", 1.0), ("e1", "http://10.0.0.6:8000", 2.0)]


def test_without_the_engines_compose_refuses_to_start() -> None:
    """Both values are required: an unset CACHEROUTE_ENGINES stops compose with the hint,
    rather than a planner and a gateway on different (or no) engines."""
    text = (DEPLOY / "compose.engines.yaml").read_text()
    assert REQUIRED.findall(text) == ["CACHEROUTE_ENGINES", "CACHEROUTE_ENGINES"]
    assert "$" not in REQUIRED.sub("", text.split("services:", 1)[1])
