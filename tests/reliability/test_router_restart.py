"""A router's plan on disk must not lag behind what it applied.

Found by the model test (fixed in 3a2c2f8): `RouterClient._housekeeping`
reported status *before* saving the plan chain to disk, so when the report
failed (Redis just went away) the save was skipped for as long as the source was
unreachable, and a router restarted then came back on an older plan."""

from __future__ import annotations

import time

from router_client import RouterClient, StaticPlanSource
from router_client.plan import Version
from router_client.testing import perturb, synthetic_plan


def test_the_plan_on_disk_follows_the_applied_plan_when_the_source_goes_away(tmp_path):
    source = StaticPlanSource()
    plan = synthetic_plan(100, 4)
    source.publish(plan)

    def source_dies_after(table, kind) -> None:  # type: ignore[no-untyped-def]
        if table.version == Version(1, 2):
            source.available = False  # Redis dies right after the router applied 1.2

    client = RouterClient(source, router_id="r", public_keys=source.public_keys,
                          cache_path=tmp_path / "plan.bin", recheck_s=0.1,
                          on_applied=source_dies_after)  # fmt: skip
    client.start(initial_wait_s=5)
    time.sleep(0.5)  # 1.1 applied and saved
    source.publish(perturb(plan, 0.1, version=Version(1, 2)))
    assert client.wait_for_version(Version(1, 2), 5)
    time.sleep(1.0)  # several rounds, all failing: the source is gone
    client.stop()
    restarted = RouterClient(StaticPlanSource(), router_id="r", public_keys=source.public_keys,
                             cache_path=tmp_path / "plan.bin")  # fmt: skip
    assert restarted.restore_from_disk()
    assert restarted.version == Version(1, 2)
