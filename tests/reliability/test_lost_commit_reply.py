"""A commit whose reply is lost: Redis applied the install (and routers may already run
it), but the planner saw only a broken connection. Found by the Redis-kill test under load
(AOF kept a plan the planner thought had failed: routers ran a version the planner never
announced, and its next install skipped past it). The planner now settles such a commit
against Redis's pointer before it installs anything else."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from planner_svc.adapters.redis_publisher import PlanPublisher
from planner_svc.orchestration import failpoints
from tests.reliability.harness import InstallLog, feed, planner_service
from tests.waiting import eventually


class LoseOneReply:
    """Wraps the publisher's commit: the first call commits, then raises as if the
    connection broke before the reply arrived."""

    def __init__(self, publisher: PlanPublisher) -> None:
        self.publisher, self.inner, self.armed = publisher, publisher.commit, True
        publisher.commit = self  # type: ignore[method-assign]

    def __call__(self, prepared):  # type: ignore[no-untyped-def]
        published = self.inner(prepared)
        if self.armed:
            self.armed = False
            raise redis.ConnectionError("Connection closed by server.")
        return published


@pytest.fixture()
def planned(redis_server: Any, tmp_path: Any) -> Iterator[tuple[Any, InstallLog, Any]]:
    """The in-process planner service with its first plan installed, and its install log."""
    svc = planner_service(redis_server.url, tmp_path / "planner", interval_s=3600.0)
    log = InstallLog(svc)
    try:
        feed(svc)
        svc.planner.replan(fresh=True, force=True, dry_run=False)
        yield svc, log, svc.planner.installed.plan.version
    finally:
        failpoints.configure("")
        log.close()
        svc.stop(0)


def replan(svc: Any, seed: int) -> None:
    feed(svc, seed=seed)
    svc.planner.replan(fresh=False, force=True, dry_run=False)


def test_a_commit_that_landed_without_a_reply_is_announced_and_never_skipped(planned) -> None:
    svc, log, first = planned
    lose = LoseOneReply(svc.publisher)
    with pytest.raises(Exception, match="Connection closed"):
        replan(svc, 2)
    assert not lose.armed
    landed = svc.publisher.current()
    assert landed is not None and landed.version > first  # Redis holds it, routers run it
    assert svc.planner.installed.plan.version == first  # the planner does not know yet

    replan(svc, 3)
    assert eventually(lambda: landed.version in log.published, 5)
    assert log.published[landed.version] == landed.digest  # announced as it landed
    assert svc.planner.installed.plan.version.seq == landed.version.seq + 1  # no skip
    assert svc.planner.version_conflicts == 0
    assert svc.planner.uncertain_commits_landed == 1


def test_a_commit_that_did_not_land_is_forgotten_and_its_version_not_reused(planned) -> None:
    svc, log, first = planned
    inner = svc.publisher.commit

    def refuse(prepared):  # type: ignore[no-untyped-def]
        svc.publisher.commit = inner  # type: ignore[method-assign]
        raise redis.ConnectionError("Connection refused.")
    svc.publisher.commit = refuse  # type: ignore[method-assign]
    with pytest.raises(Exception, match="Connection refused"):
        replan(svc, 2)
    replan(svc, 3)
    newest = svc.planner.installed.plan.version
    # never numbered again: had it landed and been lost by a restarting Redis, routers
    # could hold it, and they ignore a pointer to the version they already hold
    assert newest.seq == first.seq + 2
    assert svc.planner.uncertain_commits_landed == 0
    assert eventually(lambda: newest in log.published, 5)
    assert set(log.published) == {first, newest}


def test_a_failure_between_the_commit_and_its_record_is_settled(planned) -> None:
    # The plan landed, then the planner failed before recording it (its durable history
    # unreachable, say): the next install records it first, then follows it.
    svc, log, _ = planned
    failpoints.configure("publish.after_redis=raise")
    with pytest.raises(failpoints.FailpointError):
        replan(svc, 2)
    failpoints.configure("")
    landed = svc.publisher.current()
    assert landed is not None and landed.version not in log.published
    replan(svc, 3)
    assert eventually(lambda: landed.version in log.published, 5)
    assert svc.planner.installed.plan.version.seq == landed.version.seq + 1
    assert svc.planner.version_conflicts == 0


def test_a_plan_its_leader_never_recorded_is_recorded_by_the_next_leader(
        broker: Any, redis_server: Any, tmp_path: Any) -> None:
    """The leader's install lands in Redis, then it fails before recording it and dies.
    The replica that takes over finds Redis ahead of the history: it records and announces
    the plan routers run (before, it adopted it silently: the history never knew it)."""
    import uuid

    from planner_svc.adapters.kafka_history import KafkaHistory
    from planner_svc.server import build_service
    from tests.service.harness import planner_settings

    topic = f"state-{uuid.uuid4().hex[:8]}"

    def replica(name: str, **extra: Any) -> Any:
        return build_service(planner_settings(
            redis_server.url, tmp_path / name, bootstrap=broker.bootstrap, state_topic=topic,
            signing_key_path=str(tmp_path / "planner-signing-key.pem"), interval_s=3600.0,
            **extra), consume=False, durable=True)

    a = replica("a")
    try:
        feed(a)
        a.planner.replan(fresh=True, force=True, dry_run=False)
        failpoints.configure("publish.after_redis=raise")
        with pytest.raises(failpoints.FailpointError):
            replan(a, 2)
    finally:
        failpoints.configure("")
        a.stop(0)
    b = replica("b", leader_lease_s=2.0, leader_id="b")
    log = InstallLog(b)
    try:
        assert eventually(lambda: b.planner.events.watchers >= 1, 5)  # subscribed first
        landed = b.publisher.current().version
        assert landed.seq == 2
        history = KafkaHistory(broker.bootstrap, topic)
        assert history.load().current.seq == 1  # a never recorded 1.2
        assert b.planner.role == "standby" and b.planner.installed.plan.version == landed
        b.planner.take_over("b")
        assert eventually(lambda: landed in log.published, 5)
        assert eventually(lambda: history.load().current == landed, 10)
        history.close()
        b.planner.take_over("b")  # a second take-over finds it recorded: no second record
        assert list(log.published) == [landed]
    finally:
        log.close()
        b.stop(0)
