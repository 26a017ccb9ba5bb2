"""A commit whose reply is lost: Redis applied the install (and routers may already run
it), but the planner saw only a broken connection. Found by the Redis-kill test under load
(AOF kept a plan the planner thought had failed: routers ran a version the planner never
announced, and its next install skipped past it). The planner now settles such a commit
against Redis's pointer before it installs anything else."""

from __future__ import annotations

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


def test_a_commit_that_landed_without_a_reply_is_announced_and_never_skipped(redis_server,
                                                                             tmp_path):
    svc = planner_service(redis_server.url, tmp_path / "planner", interval_s=3600.0)
    log = InstallLog(svc)
    try:
        feed(svc)
        svc.planner.replan(fresh=True, force=True, dry_run=False)
        first = svc.planner.installed.plan.version
        lose = LoseOneReply(svc.publisher)
        feed(svc, seed=2)
        try:
            svc.planner.replan(fresh=False, force=True, dry_run=False)
            raise AssertionError("the lost reply should have surfaced as an error")
        except Exception as exc:  # the planner's error for an unavailable Redis
            assert "Connection closed" in str(exc) or isinstance(exc, redis.ConnectionError)
        assert not lose.armed
        landed = svc.publisher.current()
        assert landed is not None and landed.version > first  # Redis holds it, routers run it
        assert svc.planner.installed.plan.version == first  # the planner does not know yet

        feed(svc, seed=3)
        svc.planner.replan(fresh=False, force=True, dry_run=False)
        assert eventually(lambda: landed.version in log.published, 5)
        assert log.published[landed.version] == landed.digest  # announced as it landed
        newest = svc.planner.installed.plan.version
        assert newest.seq == landed.version.seq + 1  # the next one follows it, no skip
        assert svc.planner.version_conflicts == 0
        assert svc.planner.uncertain_commits_landed == 1
    finally:
        log.close()
        svc.stop(0)


def test_a_commit_that_did_not_land_is_forgotten(redis_server, tmp_path):
    svc = planner_service(redis_server.url, tmp_path / "planner", interval_s=3600.0)
    log = InstallLog(svc)
    try:
        feed(svc)
        svc.planner.replan(fresh=True, force=True, dry_run=False)
        first = svc.planner.installed.plan.version
        inner = svc.publisher.commit

        def refuse(prepared):  # type: ignore[no-untyped-def]
            svc.publisher.commit = inner  # type: ignore[method-assign]
            raise redis.ConnectionError("Connection refused.")
        svc.publisher.commit = refuse  # type: ignore[method-assign]
        feed(svc, seed=2)
        try:
            svc.planner.replan(fresh=False, force=True, dry_run=False)
        except Exception:
            pass
        else:
            raise AssertionError("the refused commit should have surfaced as an error")
        feed(svc, seed=3)
        svc.planner.replan(fresh=False, force=True, dry_run=False)
        newest = svc.planner.installed.plan.version
        # never numbered again: had it landed and been lost by a restarting Redis, routers
        # could hold it, and they ignore a pointer to the version they already hold
        assert newest.seq == first.seq + 2
        assert svc.planner.uncertain_commits_landed == 0
        assert eventually(lambda: newest in log.published, 5)
        assert set(log.published) == {first, newest}
    finally:
        log.close()
        svc.stop(0)


def test_a_failure_between_the_commit_and_its_record_is_settled(redis_server, tmp_path):
    # The plan landed, then the planner failed before recording it (its durable history
    # unreachable, say): the next install records it first, then follows it.
    svc = planner_service(redis_server.url, tmp_path / "planner", interval_s=3600.0)
    log = InstallLog(svc)
    try:
        feed(svc)
        svc.planner.replan(fresh=True, force=True, dry_run=False)
        failpoints.configure("publish.after_redis=raise")
        feed(svc, seed=2)
        try:
            svc.planner.replan(fresh=False, force=True, dry_run=False)
        except failpoints.FailpointError:
            pass
        else:
            raise AssertionError("the failpoint should have raised")
        finally:
            failpoints.configure("")
        landed = svc.publisher.current()
        assert landed is not None and landed.version not in log.published
        feed(svc, seed=3)
        svc.planner.replan(fresh=False, force=True, dry_run=False)
        assert eventually(lambda: landed.version in log.published, 5)
        assert svc.planner.installed.plan.version.seq == landed.version.seq + 1
        assert svc.planner.version_conflicts == 0
    finally:
        failpoints.configure("")
        log.close()
        svc.stop(0)
