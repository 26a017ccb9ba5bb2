"""The operator CLI against a running planner: real gRPC on a free port, real redis-server.

Each command runs through `planner_svc.cli.main.main` (the console script's entry) and is
checked twice: the human text and the `--json` document. Windows are fed straight into the
planner as tests/service does; everything from the CLI to Redis is real.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from planner_svc.cli.main import main
from planner_svc.server import PlannerService, build_service
from tests.service.harness import DESTS, OPERATOR, READER, feed, planner_settings

pytestmark = pytest.mark.integration


@pytest.fixture()
def service(redis_server, tmp_path: Path) -> Iterator[PlannerService]:
    settings = planner_settings(
        redis_server.url, tmp_path, operator_token=OPERATOR, reader_token=READER
    )
    svc = build_service(settings, consume=False)
    svc.server.start()
    feed(svc)
    svc.planner.tick()  # installs plan 1.1
    yield svc
    # A WatchPlans handler whose client left waits for the next event before it notices;
    # give it one so no server thread outlives the test.
    svc.planner.release_pin()
    svc.stop(0)


def cli(svc: PlannerService, *argv: str, token: str = OPERATOR) -> tuple[int, str, str]:
    """Run `cacheroute ARGV --planner ... --token ...` in-process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    conn = ["--planner", f"127.0.0.1:{svc.port}", "--token", token]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([*argv, *conn])
        except SystemExit as exc:  # argparse refusals
            rc = int(exc.code or 0)
    return rc, out.getvalue(), err.getvalue()


def cli_json(svc: PlannerService, *argv: str, token: str = OPERATOR) -> Any:
    rc, out, err = cli(svc, *argv, "--json", token=token)
    assert rc == 0, err
    return json.loads(out)


def test_status_human_and_json(service):
    rc, out, _ = cli(service, "status", token=READER)
    assert rc == 0
    assert "mode       planned" in out
    assert "plan       1.1, age" in out
    assert "decision   #" in out and "install" in out
    assert "fresh" in out
    data = cli_json(service, "status", token=READER)
    assert data["mode"] == "planned" and data["version"] == "1.1"
    assert data["version_age_s"] >= 0 and data["stream_fresh"] is True
    assert data["last_decision"]["action"] == "install"
    assert set(data["penalties"]) >= {"staleness_accumulated_tokens", "rewarm_cost_tokens"}
    assert data["config"]["q_cap"] == 20.0 and len(data["config"]["destinations"]) == 6


def test_plan_show_draws_loads_and_matches_the_installed_plan(service):
    rc, out, _ = cli(service, "plan", "show", "--top", "3", token=READER)
    assert rc == 0
    assert out.startswith("plan 1.1 (build): 48 admitted keys")
    assert "█" in out and "hottest admitted keys:" in out
    bars = [line for line in out.splitlines() if line[:3] in {f"{d} " for d in DESTS}]
    assert len(bars) == 6 and all("█" in line for line in bars)
    data = cli_json(service, "plan", "show", "1.1", token=READER)
    plan = service.planner.installed.plan
    assert data["version"] == "1.1" and data["admitted_keys"] == len(plan.table)
    loads = [d["expected_load_per_s"] for d in data["destinations"]]
    assert sum(loads) == pytest.approx(300.0, rel=0.02)  # all traffic lands somewhere
    assert data["imbalance_max_over_mean"] == pytest.approx(max(loads) / (sum(loads) / 6))
    assert data["top_keys"][0]["rate_per_s"] == pytest.approx(float(max(plan.table.rates)))


def test_replan_versions_diff_and_rollback(service):
    rc, out, _ = cli(service, "replan", "--dry-run")
    assert rc == 0 and out.startswith("dry run: candidate of")
    dry = cli_json(service, "replan", "--dry-run", "--fresh")
    assert dry["installed"] is False and dry["diff"] is not None
    assert service.planner.installed.plan.version.seq == 1  # nothing installed
    feed(service, seed=2)
    rc, out, _ = cli(service, "replan", "--force", "--request-id", "req-1")
    assert rc == 0 and out.startswith("installed plan 1.2 (repack")
    again = cli_json(service, "replan", "--force", "--request-id", "req-1")
    assert again["candidate"]["version"] == "1.2"  # the retried request acted once
    forced = cli_json(service, "replan", "--force", "--fresh")
    assert forced["installed"] and forced["candidate"]["version"] == "1.3"

    rc, out, _ = cli(service, "plan", "versions", token=READER)
    assert rc == 0 and "* 1.3" in out and "  1.1" in out
    versions = cli_json(service, "plan", "versions", token=READER)["versions"]
    assert [v["version"] for v in versions] == ["1.3", "1.2", "1.1"]
    assert [v["current"] for v in versions] == [True, False, False]

    rc, out, _ = cli(service, "plan", "diff", "1.1", "1.3", token=READER)
    assert rc == 0 and out.startswith("1.1 -> 1.3:") and "req/s" in out
    diff = cli_json(service, "plan", "diff", "--online", "1.2", "1.3", token=READER)
    assert diff["a"] == "1.2" and diff["moved_keys"] > 0
    assert 0 < diff["moved_traffic_share"] <= 1

    rc, out, _ = cli(service, "plan", "rollback", "1.1")
    assert rc == 0 and "installed as 1.4" in out and "pinned" in out
    status = cli_json(service, "status")
    assert status["version"] == "1.4" and status["pinned"] is True
    released = cli_json(service, "plan", "rollback", "--release")
    assert released == {"released": True, "pinned": False}
    assert service.planner.pinned is False
    rolled = cli_json(service, "plan", "rollback", "1.2")
    assert rolled["installed"]["version"] == "1.5" and rolled["pinned"] is True
    assert rolled["installed"]["built_by"] == "rollback:1.2"


def test_mode_decisions_and_watch(service):
    rc, out, _ = cli(service, "mode", "fallback", "--reason", "drill")
    assert rc == 0 and out.strip() == "mode is now fallback"
    assert service.publisher.load(service.publisher.current().version).config.built_by == "fallback"
    status = cli_json(service, "status")
    assert status["mode"] == "fallback" and status["mode_reason"] == "drill"
    back = cli_json(service, "mode", "planned")
    assert back == {"requested": "planned", "mode": "planned"}
    assert cli_json(service, "mode", "auto")["mode"] == "planned"

    rc, out, _ = cli(service, "decisions", "--limit", "5", token=READER)
    assert rc == 0 and "fallback" in out and "resume" in out
    decisions = cli_json(service, "decisions", "--limit", "2", token=READER)["decisions"]
    assert len(decisions) == 2 and decisions[0]["id"] > decisions[1]["id"]  # newest first

    lines = watch_while(
        service,
        lambda: service.planner.replan(fresh=True, force=True, dry_run=False),
        "--json",
        "--count",
        "2",
    )
    events = [json.loads(line) for line in lines]
    assert {e["event"] for e in events} == {"installed", "decision"}
    installed = next(e for e in events if e["event"] == "installed")["installed"]
    assert installed["version"] == str(service.planner.installed.plan.version)
    human = watch_while(service, lambda: service.planner.set_mode(None, "watch"), "--count", "1")
    assert human[0].startswith("planner ") and any(x.startswith("-- watching") for x in human)
    assert "decision #" in human[-1]


def watch_while(service: PlannerService, act: Any, *flags: str) -> list[str]:
    """Run `watch` in a thread, `act` once it is subscribed, return its output lines."""
    result: dict[str, Any] = {}
    before = service.planner.events.watchers
    thread = threading.Thread(
        target=lambda: result.update(out=cli(service, "watch", "--duration", "20", *flags)),
        daemon=True,
    )
    thread.start()
    deadline = time.monotonic() + 10
    while service.planner.events.watchers <= before and time.monotonic() < deadline:
        time.sleep(0.02)
    act()
    thread.join(20)
    rc, out, err = result["out"]
    assert rc == 0, err
    return out.splitlines()


def test_config_and_destinations(service):
    rc, out, _ = cli(service, "config", "get", token=READER)
    assert rc == 0 and "q_cap" in out and "destinations                6" in out
    data = cli_json(service, "config", "set", "q_cap=30", "interval-s=1800")
    assert data["q_cap"] == 30.0 and data["interval_s"] == 1800.0
    assert service.planner.tunables.q_cap == 30.0
    rc, out, _ = cli(service, "config", "set", "hysteresis=0.2")
    assert rc == 0 and out.startswith("updated hysteresis")
    # the guard at run time: one field at a time, the others kept
    cli_json(service, "config", "set", "guard.p99_ms_max=3500", "guard.resume_dwell_s=120")
    data = cli_json(service, "config", "set", "guard.enter_after_s=30")
    assert data["guard"]["p99_ms_max"] == 3500 and data["guard"]["enter_after_s"] == 30
    assert service.planner.guard.settings.resume_dwell_s == 120
    rc, out, _ = cli(service, "config", "get", token=READER)
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert lines["guard.p99_ms_max"] == ["3500"]
    assert lines["guard.hit_rate_min"] == ["0", "(unchecked)"]

    rc, out, _ = cli(service, "destinations", "add", "d6", "--address", "10.0.0.6:8000")
    assert rc == 0 and out.startswith("d6 added") and "10.0.0.6:8000" in out
    drained = cli_json(service, "destinations", "drain", "d0")["destinations"]
    assert next(d for d in drained if d["id"] == "d0")["draining"] is True
    rc, out, _ = cli(service, "destinations", "remove", "d1")
    assert rc == 0 and out.startswith("d1 removed")
    listed = cli_json(service, "destinations", "list", token=READER)["destinations"]
    assert [d["id"] for d in listed] == ["d0", "d2", "d3", "d4", "d5", "d6"]
    rc, out, _ = cli(service, "destinations", "list", token=READER)
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[1:]}
    assert rows["d0"] == ["1", "-", "draining"] and rows["d6"] == ["1", "10.0.0.6:8000", "serving"]
    assert "\x1b[" not in out  # no colour or box codes when stdout is not a terminal


@pytest.mark.parametrize(
    ("argv", "token", "code", "message"),
    [
        (["config", "set", "q_cap=-1"], OPERATOR, 2, "invalid value: q_cap must be"),
        (["config", "set", "q_cap=abc"], OPERATOR, 2, "invalid value: q_cap must be a number"),
        (["config", "set", "colour=red"], OPERATOR, 2, "expected KEY=VALUE"),
        (["destinations", "drain", "nope"], OPERATOR, 2, "unknown destination"),
        (["plan", "show", "1.99"], READER, 1, "not found: plan version 1.99"),
        (["plan", "show", "x.y"], READER, 2, "version must look like EPOCH.SEQ"),
        (["replan", "--dry-run"], READER, 4, "permission denied"),
        (["status"], "wrong", 4, "unauthenticated"),
        (["plan", "rollback"], OPERATOR, 2, "give a VERSION"),
    ],
)
def test_errors_are_one_line_and_nonzero(service, argv, token, code, message):
    rc, out, err = cli(service, *argv, token=token)
    assert rc == code, err
    assert out == "" and err.count("\n") == 1 and message in err


def test_unreachable_planner_from_the_console_script():
    env = {**os.environ, "CACHEROUTE_PLANNER": "127.0.0.1:9", "CACHEROUTE_TOKEN": "x"}
    done = subprocess.run(
        [sys.executable, "-m", "planner_svc.cli.main", "status", "--timeout", "3"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr.startswith("cacheroute: cannot reach the planner at 127.0.0.1:9")
    assert done.stderr.count("\n") == 1


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM files), valid for a day."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cacheroute-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "planner.crt", tmp_path / "planner.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_with_a_pinned_ca(redis_server, tmp_path: Path):
    cert, key = self_signed(tmp_path)
    settings = planner_settings(redis_server.url, tmp_path, tls_cert=str(cert), tls_key=str(key))
    svc = build_service(settings, consume=False)
    svc.server.start()
    try:
        rc, out, err = cli(svc, "status", "--json", "--tls-ca", str(cert))
        assert rc == 0, err
        assert json.loads(out)["version"] is None  # nothing installed yet
        rc, out, err = cli(svc, "status", "--timeout", "3")  # plaintext against TLS
        assert rc == 3 and out == "" and err.count("\n") == 1
        rc, _, err = cli(svc, "status", "--tls-ca", str(tmp_path / "missing.pem"))
        assert rc == 2 and "cannot read" in err
    finally:
        svc.stop(0)


def test_routers_shows_the_fleet(service, redis_server, tmp_path):
    from router_client import RouterClient, signing
    from router_client.redis_source import RedisPlanSource

    rc, out, _ = cli(service, "routers", token=READER)
    assert rc == 0 and out.strip() == "no router has reported yet"
    key = signing.load_public_key(tmp_path / "planner-signing-key.pub.pem")
    routers = [RouterClient(RedisPlanSource(redis_server.url), router_id=f"edge-{i}",
                            public_keys=[key], status_interval_s=0.1).start(initial_wait_s=10)
               for i in range(2)]
    try:
        routers[1].mark_down("d3")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            listed = cli_json(service, "routers", token=READER)["routers"]
            if len(listed) == 2 and all(r["state"] == "in_sync" for r in listed) and \
                    any(r["unhealthy_destinations"] for r in listed):
                break
            time.sleep(0.2)
        version = str(service.planner.installed.plan.version)
        assert sorted(r["router_id"] for r in listed) == ["edge-0", "edge-1"]
        assert all(r["applied"] == version and r["versions_behind"] == 0 for r in listed)
        assert all(r["mode"] == "planned" for r in listed)
        rc, out, _ = cli(service, "routers", token=READER)
        lines = out.splitlines()
        assert lines[0].split()[:4] == ["router", "state", "applied", "behind"]
        assert any(line.startswith("edge-0") and "in_sync" in line and version in line
                   for line in lines[1:])
        assert any(line.startswith("edge-1") and "unhealthy: d3" in line for line in lines[1:])
    finally:
        for r in routers:
            r.stop()


def test_destination_weights_change_at_run_time(service):
    data = cli_json(service, "destinations", "weight", "d2", "4")["destinations"]
    assert next(d for d in data if d["id"] == "d2")["capacity_weight"] == 4.0
    service.planner.replan(fresh=False, force=True, dry_run=False)
    plan = service.planner.installed.plan
    weights = {d.id: d.capacity_weight for d in plan.destinations}
    assert weights["d2"] == 4.0 and weights["d0"] == 1.0
    loads = dict(zip((d.id for d in plan.destinations), plan.stats.expected_load_per_s,
                     strict=True))
    assert loads["d2"] > 2.5 * loads["d0"]  # the plan gives it about 4x the load
    for bad in ("0", "-1", "nan"):
        rc, _, err = cli(service, "destinations", "weight", "d2", bad)
        assert rc != 0 and "capacity weight" in err, err
    rc, _, err = cli(service, "destinations", "weight", "nope", "2")
    assert rc != 0 and "unknown destination" in err


def test_planning_options_change_at_run_time_and_reach_the_next_plan(service):
    data = cli_json(service, "config", "set", "byte_aware=true", "admission_hysteresis=0.2",
                    "balance_effort=0.5", "rate_noise_z=2", "replica_hysteresis=0.2",
                    "warm_placement=true")
    assert (data["byte_aware"], data["admission_hysteresis"], data["balance_effort"],
            data["rate_noise_z"], data["replica_hysteresis"],
            data["warm_placement"]) == (True, 0.2, 0.5, 2.0, 0.2, True)
    config = service.planner.planning_config()
    assert config.byte_aware and config.admission_hysteresis == 0.2
    assert config.balance_effort == 0.5 and config.replica_hysteresis == 0.2
    assert service.planner.tunables.warm_placement
    service.planner.replan(fresh=False, force=True, dry_run=False)
    assert service.planner.installed.plan.config.byte_aware  # the plan says how it was built
    rc, out, _ = cli(service, "config", "get", token=READER)
    assert "byte_aware                  true" in out
    for bad, words in (("balance_effort=2", "balance_effort must be in [0, 1]"),
                       ("byte_aware=maybe", "must be true or false"),
                       ("admission_hysteresis=-1", "admission_hysteresis must be >= 0"),
                       ("rate_noise_z=11", "rate_noise_z must be in [0, 10]"),
                       ("replica_hysteresis=1", "replica_hysteresis must be in [0, 0.99]"),
                       ("warm_placement=2", "must be true or false")):
        rc, _, err = cli(service, "config", "set", bad)
        assert rc == 2 and words in err, err


def test_plan_explain_admitted_unadmitted_and_never_seen_keys(service):
    import math

    import numpy as np

    from planner_svc.simulator.rates import paper_like_keys, paper_like_rates

    keys, rates = paper_like_keys(400), paper_like_rates(400, 300.0, seed=1)  # what feed() sent
    plan = service.planner.installed.plan
    table = plan.table.as_dict()
    q_ref = service.planner.planning_config().reference_capacity
    admitted = max(table, key=lambda k: rates[keys.index(k)])  # the hottest key
    outside = [k for k in keys if k not in table and rates[keys.index(k)] > 0]
    assert outside, "the fixture's plan admits every key: nothing to explain as unadmitted"
    cutoff = float(plan.table.rates.min())

    e = cli_json(service, "plan", "explain", admitted, token=READER)
    rate = float(rates[keys.index(admitted)])
    assert e["admitted"] and e["rank"] == 1 and e["rate_per_s"] == pytest.approx(rate)
    assert e["replicas"] == min(max(1, math.ceil(rate / q_ref)), len(DESTS))
    assert e["destinations"] == [plan.destinations[m].id for m in table[admitted]]
    assert e["cutoff_rate_per_s"] == pytest.approx(cutoff)
    assert e["next_destinations"] is not None

    miss = outside[0]
    e = cli_json(service, "plan", "explain", miss, token=READER)
    rate = float(rates[keys.index(miss)])
    assert not e["admitted"] and e["destinations"] == []
    assert e["rank"] == int(np.count_nonzero(rates > rate)) + 1
    assert ("below the cut-off" in e["reason"]) == (rate < cutoff)

    e = cli_json(service, "plan", "explain", "nobody-asked-for-this", token=READER)
    assert not e["seen"] and not e["admitted"] and "never seen" in e["reason"]
    rc, out, _ = cli(service, "plan", "explain", admitted, token=READER)
    assert rc == 0 and out.startswith(f"{admitted} in plan ") and "next repack" in out
    from cacheroute.keyblob import MAX_KEY_BYTES

    rc, _, err = cli(service, "plan", "explain", "x" * (MAX_KEY_BYTES + 1), token=READER)
    assert rc == 2 and f"key must be 1 to {MAX_KEY_BYTES} bytes" in err  # the one key bound


def test_plan_report_renders_predicted_and_realized(service):
    data = cli_json(service, "plan", "report", token=READER)
    version = str(service.planner.installed.plan.version)
    assert data["version"] == version and data["predicted_hit_rate"] is None  # the first plan
    assert len(data["predicted_loads_per_s"]) == len(data["destinations"]) == len(DESTS)
    rc, out, _ = cli(service, "plan", "report", version, token=READER)
    assert rc == 0 and out.startswith(f"plan {version}: ") and "hit rate    predicted -" in out
    rc, _, err = cli(service, "plan", "report", "1.99", token=READER)
    assert rc == 1 and "no prediction for plan version 1.99" in err
