"""Item 1, torn reads: 8 threads make 1,000,000 route() calls while 5,000 plans
(and some forged ones) are swapped in through the client's real follow path:
0 decisions from a mixed or unverified table."""

from __future__ import annotations

import threading

from router_client import RouterClient, StaticPlanSource, signing
from router_client.layout import Pointer
from router_client.plan import Version, encode_plan
from tests.faults.history import RouterHistory, check_history
from tests.reliability.plans import allowed, versioned_plan
from tests.waiting import eventually

THREADS = 8
CALLS = 1_000_000
PLANS = 5_000
FORGE_EVERY = 250
KEYS = [f"k{i}" for i in range(43)]  # k40..k42 are never admitted


class Callers:
    """Threads that route and check every answer against the tables around it."""

    def __init__(self, client: RouterClient, per_thread: int) -> None:
        self.client = client
        self.per_thread = per_thread
        self.bad: list[str] = []
        self.done = [0] * THREADS
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(THREADS)]

    def _run(self, i: int) -> None:
        core, route, bad = self.client.core, self.client.route, self.bad
        for n in range(self.per_thread):
            key = KEYS[(n + i) % len(KEYS)]
            before, mode_b = core.table, core.mode
            dest = route(key)
            after, mode_a = core.table, core.mode
            if before is None or after is None:
                continue
            planned = mode_b == mode_a == "planned"
            if dest not in allowed(before.version, key, planned) and dest not in allowed(
                after.version, key, planned
            ):
                bad.append(f"{key}->{dest} between {before.version} and {after.version}")
        self.done[i] = self.per_thread


def _forge(source: StaticPlanSource, seq: int) -> Version:
    """A plan for `seq` signed by a key the router does not pin."""
    forger = signing.generate_private_key()
    blob = signing.sign_blob(encode_plan(versioned_plan(seq)), signing.PLAN, forger)
    _k, _p, digest = signing.verify_blob(blob, [forger.public_key()])
    source.put_raw(Version(1, seq), blob, digest)
    return Version(1, seq)


def test_a_million_decisions_while_5000_plans_swap_in():
    source = StaticPlanSource()
    history = RouterHistory("torn")
    client = RouterClient(
        source,
        router_id="torn",
        public_keys=source.public_keys,
        recheck_s=0.05,
        on_applied=history.on_applied,
    )
    published: dict[Version, bytes] = {}
    forged: list[Version] = []
    ptr = source.publish(versioned_plan(1))
    published[ptr.version] = ptr.digest
    client.start(initial_wait_s=5)
    callers = Callers(client, CALLS // THREADS)
    try:
        for t in callers.threads:
            t.start()
        seq = 2
        while len(published) < PLANS:
            if seq % FORGE_EVERY == 0:
                forged.append(_forge(source, seq))
                assert eventually(lambda: client.follower.rejections == len(forged), 5)
                seq += 1
                continue
            p: Pointer = source.publish(versioned_plan(seq))
            published[p.version] = p.digest
            assert client.wait_for_version(p.version, 5), f"stuck before {p.version}"
            seq += 1
        for t in callers.threads:
            t.join(120)
    finally:
        client.stop()
    assert sum(callers.done) == CALLS
    assert callers.bad == [], callers.bad[:5]
    final = max(published)
    assert history.wait_for(final)
    assert check_history(history, published=published, final=final) == []
    assert len(history.applied) == PLANS  # every valid plan was swapped in, one by one
    assert not set(forged) & {a.version for a in history.applied}
    assert client.follower.rejections == len(forged)
