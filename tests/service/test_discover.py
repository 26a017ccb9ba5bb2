"""`cacheroute discover` against a real planner (gRPC, Redis): destinations from a watched
file and from DNS SRV / A records join the next plan, vanished ones drain then go, and a
bad answer (a typo in the file, a name that does not exist) changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from planner_svc.adapters.discovery_sources import DnsSource, FileSource
from planner_svc.cli.discover_cmd import DestinationSync
from planner_svc.cli.ops_client import PlannerConnection
from planner_svc.errors import InvalidRequest, NotFound
from planner_svc.server import PlannerService
from tests.service.dns_zone import Zone
from tests.service.harness import OPERATOR, feed, serving

pytestmark = pytest.mark.integration
ENGINES = ("e0", "e1", "e2")


@pytest.fixture()
def planner(redis_server, tmp_path) -> Iterator[PlannerService]:  # type: ignore[no-untyped-def]
    with serving(redis_server.url, tmp_path, operator_token=OPERATOR,
                 destinations=ENGINES) as svc:
        feed(svc)
        svc.planner.tick()
        yield svc


@pytest.fixture()
def zone() -> Iterator[Zone]:
    z = Zone()
    yield z
    z.close()


def planned(svc: PlannerService) -> dict[str, tuple[str, float, bool]]:
    svc.planner.replan(fresh=False, force=True, dry_run=False)
    plan = svc.planner.installed.plan  # type: ignore[union-attr]
    return {d.id: (d.address, d.capacity_weight, d.draining) for d in plan.destinations}


def write(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()  # a second edit within the clock's resolution must still be seen
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_the_planner_follows_a_watched_file(planner, tmp_path):
    path = tmp_path / "destinations"
    write(path, "e0 http://10.0.0.1:8000\ne1 http://10.0.0.2:8000\ne2 http://10.0.0.3:8000\n")
    clock = [0.0]
    conn = PlannerConnection(f"127.0.0.1:{planner.port}", OPERATOR)
    sync = DestinationSync(FileSource(path), conn, remove_after_s=30.0, clock=lambda: clock[0])
    try:
        assert sorted(d.id for d in sync.once().add) == list(ENGINES)  # addresses given
        assert planned(planner)["e1"] == ("http://10.0.0.2:8000", 1.0, False)
        write(path, path.read_text() + "e3 http://10.0.0.4:8000 2\n")
        assert [d.id for d in sync.once().add] == ["e3"]
        assert planned(planner)["e3"] == ("http://10.0.0.4:8000", 2.0, False)
        # a typo: refused whole, named, nothing drained
        write(path, "e0 http://10.0.0.1:8000\ne1 10.0.0.2:8000\n")
        with pytest.raises(InvalidRequest, match=r"destinations:2: address '10\.0\.0\.2:8000'"):
            sync.once()
        assert not any(draining for _, _, draining in planned(planner).values())
        write(path, "e0 http://10.0.0.1:8000\ne1 http://10.0.0.2:8000\n"
                    "e3 http://10.0.0.4:8000 2\n")  # e2 left
        assert sync.once().drain == ["e2"]
        assert planned(planner)["e2"][2] is True
        clock[0] = 1.0
        assert not sync.once()  # seen draining from now on
        clock[0] = 31.0
        assert sync.once().remove == ["e2"]
        assert "e2" not in planned(planner)
        path.unlink()
        with pytest.raises(NotFound):
            sync.once()
        assert sorted(planned(planner)) == ["e0", "e1", "e3"]
    finally:
        conn.close()


def test_the_planner_follows_dns_srv_and_a_records(planner, zone):
    name = "_http._tcp.vllm.llm.test."
    zone.records[(name, "SRV")] = ["10 50 8000 e0.llm.test.", "10 50 8000 e1.llm.test.",
                                   "20 50 8000 standby.llm.test."]
    conn = PlannerConnection(f"127.0.0.1:{planner.port}", OPERATOR)
    sync = DestinationSync(DnsSource(name, srv=True, nameserver=zone.nameserver), conn,
                           remove_after_s=0.0)
    try:
        edit = sync.once()
        assert sorted(d.id for d in edit.add) == ["e0.llm.test:8000", "e1.llm.test:8000"]
        assert sorted(edit.drain) == list(ENGINES)  # the typed-in names are not in DNS
        assert sorted(sync.once().remove) == list(ENGINES)
        zone.records[(name, "SRV")].append("10 100 8000 e2.llm.test.")  # scale up, bigger
        assert [(d.id, d.capacity_weight) for d in sync.once().add] == [
            ("e2.llm.test:8000", 1.5)]
        dests = planned(planner)
        assert dests["e2.llm.test:8000"] == ("http://e2.llm.test:8000", 1.5, False)
        del zone.records[(name, "SRV")]  # the name is gone: NXDOMAIN changes nothing
        with pytest.raises(NotFound, match="no such name"):
            sync.once()
        assert len(planned(planner)) == 3
        assert zone.queries == 4  # one per round: nothing cached between rounds

        a_name = "vllm.llm.test."
        zone.records[(a_name, "A")] = ["10.2.0.1", "10.2.0.2"]
        zone.records[(a_name, "AAAA")] = ["fd00::7"]
        a_sync = DestinationSync(DnsSource(a_name, port=8000, nameserver=zone.nameserver),
                                 conn, remove_after_s=0.0)
        assert sorted(d.address for d in a_sync.once().add) == [
            "http://10.2.0.1:8000", "http://10.2.0.2:8000", "http://[fd00::7]:8000"]
    finally:
        conn.close()


def test_the_command_reports_a_bad_source_in_one_line(planner, tmp_path):
    path = tmp_path / "destinations"
    path.write_text("e0 not-a-url\n")
    out = subprocess.run(
        [sys.executable, "-m", "planner_svc.cli.main", "discover", "--file", str(path),
         "--once", "--planner", f"127.0.0.1:{planner.port}"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "CACHEROUTE_TOKEN": OPERATOR})
    assert out.returncode != 0
    assert out.stderr.strip().splitlines()[-1] == (
        f"cacheroute: {path}:1: address 'not-a-url' must be an http(s) URL")
