"""Closed-loop sessions in the simulator: the arena's conversations in virtual time, cut into
blocks exactly as the emulated engines cut the text."""

from __future__ import annotations

import itertools

import numpy as np

from planner_svc.simulator.cacheroute_policy import gateway_like
from planner_svc.simulator.policies import PolicyContext, round_robin
from planner_svc.simulator.replica import ReplicaModel
from planner_svc.simulator.session_sim import arena_run, simulate_sessions
from planner_svc.simulator.sessions import SCENARIOS, population, sessions
from planner_svc.simulator.simulator import ClusterSpec, simulate
from planner_svc.simulator.workload import ScenarioSpec, paper_like

MODEL = ReplicaModel(kv_capacity_tokens=200_000).time_scaled(0.5)


def _run(factory, destinations: int, until_s: float = 20.0, seed: int = 1):
    pop = population(SCENARIOS["paper-like"].scaled(sessions_per_s=3.0), seed)
    return pop, simulate_sessions(pop, sessions(pop, until_s), factory, model=MODEL,
                                  n_destinations=destinations, until_s=until_s,
                                  control_interval_s=4.0)


def test_turns_are_sent_after_their_answer_and_think_time_and_meet_their_history():
    _, r = _run(round_robin, 1)  # one engine: every turn lands where its history is
    assert len(r.sent_s) > 50 and set(r.dest.tolist()) == {0}
    for sid in set(r.session.tolist()):
        mine = np.flatnonzero(r.session == sid)
        assert r.turn[mine].tolist() == list(range(len(mine)))
        sent = r.sent_s[mine]
        ends = sent + r.e2e_s[mine]
        assert (sent[1:] >= ends[:-1]).all()  # closed loop: after the previous answer
        for a, b in itertools.pairwise(mine):
            # the whole previous prompt (but its partial last block) is served from cache
            assert r.cached_tokens[b] >= (r.prompt_tokens[a] // 16 - 1) * 16
    assert r.hit_rate() > 0.5


def test_the_same_inputs_give_the_same_records():
    _, a = _run(gateway_like(24.0, 12), 4)
    _, b = _run(gateway_like(24.0, 12), 4)
    assert (a.dest == b.dest).all() and (a.cached_tokens == b.cached_tokens).all()


def test_cacheroute_keeps_conversations_and_tenants_warm_where_round_robin_cannot():
    _, cr = _run(gateway_like(24.0, 12), 4, until_s=40.0)
    _, rr = _run(round_robin, 4, until_s=40.0)
    assert cr.hit_rate(10.0) > rr.hit_rate(10.0) + 0.05


class _Recorder:
    """A round-robin router that records what the simulator tells it, in order."""

    name = "recorder"

    def __init__(self, ctx) -> None:
        self.n, self.i = ctx.n_destinations, 0
        self.events: list[tuple[str, int, float]] = []

    def route(self, i, key, prompt, prefix, output, now) -> int:
        self.events.append(("route", i, now))
        self.i = (self.i + 1) % self.n
        return self.i

    def first_token(self, i, dest, now) -> None:
        self.events.append(("first", i, now))

    def finished(self, i, dest, now) -> None:
        self.events.append(("finished", i, now))

    def control(self, now, window_keys, window_s) -> None:
        return None


def _check_first_tokens_come_between_route_and_finish(events) -> None:
    """Each request: routed, then its first token, then (if before the end) its finish,
    each told at or before the next arrival and never before its own route."""
    seen: dict[int, list[str]] = {}
    routed: dict[int, float] = {}
    told: list[float] = []
    for kind, i, t in events:
        if kind == "route":
            assert all(x <= t for x in told)
            told = []
            routed[i] = t
        else:
            assert t >= routed[i]
            told.append(t)
        seen.setdefault(i, []).append(kind)
    heard = [kinds for kinds in seen.values() if len(kinds) > 1]
    assert heard and all(k in (["route", "first"], ["route", "first", "finished"])
                         for k in heard)


def test_a_router_that_balances_on_first_tokens_hears_each_before_its_finish() -> None:
    routers: list[_Recorder] = []

    def factory(ctx):
        routers.append(_Recorder(ctx))
        return routers[-1]

    _run(factory, 3)
    _check_first_tokens_come_between_route_and_finish(routers[0].events)


def test_the_replay_loop_tells_first_tokens_before_finishes_too() -> None:
    w = paper_like(ScenarioSpec(20.0, 3_000, 1, n_keys=300, interval_s=20.0))
    routers: list[_Recorder] = []

    def factory(ctx):
        routers.append(_Recorder(ctx))
        return routers[-1]

    simulate(w, factory, ClusterSpec(n_destinations=3, model=MODEL), seed=1)
    _check_first_tokens_come_between_route_and_finish(routers[0].events)


def test_the_guard_reads_the_gateways_reported_prefix_and_falls_back_on_low_reuse() -> None:
    """The session simulator reports each request's prefix as a gateway does (the
    characters its key covers / 4), so the production guard judges low-reuse tenants
    (short system prompts) and serves Flat-LB, as in the arena, and keeps planning
    paper-like tenants."""
    policies = []

    def factory(ctx):
        policies.append(gateway_like(3.0, 12)(ctx))
        return policies[-1]

    for name, mode in (("low-reuse", "fallback"), ("paper-like", "planned")):
        arena_run(name, 1, factory, rate_scale=4.0, time_scale=4.0, warmup_s=60.0,
                  measure_s=10.0)
        assert policies[-1].core.mode == mode, (name, policies[-1].gains)


def test_the_policy_seed_draws_the_routers_randomness_and_leaves_the_conversations() -> None:
    """bench/sim_vs_arena.py compares a random router (P2C) over several draws of its own
    randomness: another policy seed sends requests elsewhere, never other requests."""
    from planner_svc.simulator.policies import flat_lb

    runs = [arena_run("paper-like", 1, flat_lb, warmup_s=5.0, measure_s=5.0, policy_seed=s)
            for s in (1, 1, 2)]
    assert np.array_equal(runs[0].dest, runs[1].dest)  # a draw is reproducible
    assert np.array_equal(runs[0].sent_s[runs[0].turn == 0], runs[2].sent_s[runs[2].turn == 0])
    assert not np.array_equal(runs[0].dest, runs[2].dest)


def test_a_polling_router_is_given_what_each_engine_holds_at_every_poll() -> None:
    """The session simulator feeds a router that polls the engines' load (the SGLang
    gateway's power_of_two) the tokens each engine holds at each poll, once per interval."""
    from planner_svc.simulator.reactive import SGLangPowerOfTwo

    polls: list[tuple[float, list[int]]] = []

    class Recording(SGLangPowerOfTwo):
        def poll_loads(self, now: float, tokens: list[int]) -> None:
            polls.append((now, list(tokens)))
            super().poll_loads(now, tokens)

    r = arena_run("paper-like", 1, lambda c: Recording(c, poll_interval_s=2.0),
                  warmup_s=10.0, measure_s=10.0)
    times = [t for t, _ in polls]
    assert times[:3] == [0.0, 2.0, 4.0] and times == sorted(set(times))
    assert times[-1] <= float(r.sent_s.max())  # polled as requests arrive
    assert all(len(t) == 4 for _, t in polls) and polls[0][1] == [0, 0, 0, 0]
    assert any(sum(t) > 0 for _, t in polls)  # engines holding running requests' tokens


def test_the_simulated_guard_counts_conversation_history_as_the_planner_does() -> None:
    """The planner judges a key's reusable prefix as the larger of what the gateways report
    (its system prompt) and what the engines served its requests from cache (its
    conversations' history: `planning.affinity.reusable_prefix`). The simulated guard read
    the system prompts alone and, on paper-like conversations whose history outgrows them,
    predicted ~10 pp and fell back to Flat-LB mid-run (seed 4, q_cap 4.2: TTFT p99 2.65 s
    against 1.37 s planned, the learning sweep's "collapse")."""
    policies = []

    def factory(ctx):
        policies.append(gateway_like(4.2, 12, rate_window_s=24.0)(ctx))
        return policies[-1]

    r = arena_run("paper-like", 4, factory, rate_scale=3.0, time_scale=4.0, warmup_s=72.0,
                  measure_s=128.0)
    p = policies[-1]
    assert p.core.mode == "planned" and "fallback" not in p.decisions, p.gains
    assert min(p.gains[1:]) > 0.2  # history counted: far above the 10-pp floor
    assert r.hit_rate(72.0) > 0.9


def test_the_simulated_gateway_routes_with_the_gateways_defaults() -> None:
    """`gateway_like` is what `bench/sim_vs_arena.py` checks against the live gateway, so it
    must route with the gateway's command-line defaults. It had idle re-homing off after the
    gateway turned it on (2026-12-05): on the arena's one-replica capacity points the
    simulated gateway then served first turns 3 pp below the live one."""
    from planner_svc.cli.edge_args import ROUTING_FLAGS

    pop = population(SCENARIOS["paper-like"], 1)
    keys = [pop.tenant_key(t) for t in range(pop.scenario.tenants)]
    core = gateway_like(3.0, 12)(PolicyContext(4, keys, MODEL, seed=1)).core
    default = {flag: ROUTING_FLAGS[flag][1] for flag in
               ("cold-tail", "tail-slack", "history-slack", "balance", "idle-rehome-s",
                "idle-rehome-learn", "queue-aware")}
    assert (core.cold_tail, core.tail_slack, core.history_slack, core.balance) == (
        default["cold-tail"], default["tail-slack"], default["history-slack"], default["balance"])
    assert core.idle_rehome_s == default["idle-rehome-s"] > 0
    assert (core.rehome_window is not None) == default["idle-rehome-learn"]
    assert core.queue_aware is default["queue-aware"] is True  # on since 2026-12-06



def test_the_simulated_gateway_plans_with_the_planners_defaults() -> None:
    """The planner's warm placement and imbalance tolerance reach the simulated gateway from
    the planner's own defaults (on and 0.3 since 2026-12-06), so the simulator checked
    against the arena plans as the arena's planner does; an older row replays with the old
    values given explicitly (bench/sim_vs_arena.py --warm-placement off)."""
    from planner_svc.settings import PlannerSettings

    pop = population(SCENARIOS["paper-like"], 1)
    keys = [pop.tenant_key(t) for t in range(pop.scenario.tenants)]
    ctx = PolicyContext(4, keys, MODEL, seed=1)
    shipped = gateway_like(3.0, 12)(ctx)
    assert shipped.settings.warm_placement is PlannerSettings().warm_placement is True
    assert (shipped.config.imbalance_tolerance == shipped.settings.imbalance_tolerance
            == PlannerSettings().imbalance_tolerance == 0.3)
    old = gateway_like(3.0, 12, warm_placement=False, imbalance_tolerance=0.03)(ctx)
    assert not old.settings.warm_placement and old.config.imbalance_tolerance == 0.03

def test_the_simulated_planner_plans_first_after_a_whole_window_of_traffic() -> None:
    """The planner's first plan waits for a full stream window of traffic after the first
    window that had any (`orchestration.planner`). Planned at the first control step instead
    (16 s of the arena's slowed traffic, a few sessions), the simulated first plan admitted
    few tenants; the replan that admitted the rest moved each off the ring owner that had
    warmed it, and the simulator served first turns 3 pp worse than the arena's gateway."""
    seen: list[tuple[float, bool]] = []

    def factory(ctx):
        policy = gateway_like(3.0, 12, rate_window_s=24.0)(ctx)
        control = policy.control

        def recorded(now: float, window_keys: np.ndarray, window_s: float) -> None:
            control(now, window_keys, window_s)
            seen.append((now, policy.plan is not None))

        policy.control = recorded  # type: ignore[method-assign]
        return policy

    arena_run("paper-like", 1, factory, rate_scale=5.0, time_scale=4.0, warmup_s=40.0,
              measure_s=10.0)
    assert seen[:3] == [(16.0, False), (32.0, True), (48.0, True)]


def test_the_simulated_planner_plans_with_the_settings_imbalance_tolerance() -> None:
    """`imbalance_tolerance` (replay's --imbalance-tolerance, sim_capacity_1r's) reaches the
    planning config the simulated planner builds and repacks with."""
    from planner_svc.simulator.cacheroute_policy import CacheRouteSettings, planning_config

    loose = CacheRouteSettings(q_cap=3.0, warm_slots_per_destination=12, imbalance_tolerance=0.3)
    assert planning_config(4, loose).imbalance_tolerance == 0.3
    default = CacheRouteSettings(q_cap=3.0, warm_slots_per_destination=12)
    assert planning_config(4, default).imbalance_tolerance == 0.03


def test_the_drifting_scenario_moves_its_hot_tenants_and_leaves_the_others_alone() -> None:
    """`drifting` is paper-like whose tenant weights take a log-normal step every
    `drift_every_s`: the hottest tenants of the first and last stretch differ, the same
    seed gives the same conversations, and a scenario without drift keeps exactly the
    conversations it had (the drift draws from its own stream)."""
    drifting = SCENARIOS["drifting"].offered(4.0, 1.0)  # ~10 conversations a second
    pop = population(drifting, 1)
    plan = sessions(pop, 600.0)
    assert plan == sessions(population(drifting, 1), 600.0)

    def top(lo: float, hi: float) -> set[int]:
        counts = np.bincount([s.tenant for s in plan if lo <= s.start_s < hi],
                             minlength=drifting.tenants)
        return set(np.argsort(counts)[-5:].tolist())

    assert len(top(0, 120) & top(480, 600)) <= 3  # the hot set moved
    still = drifting.scaled(drift_every_s=0.0)
    unchanged = SCENARIOS["paper-like"].offered(4.0, 1.0)
    assert [s.tenant for s in sessions(population(still, 1), 600.0)] == [
        s.tenant for s in sessions(population(unchanged, 1), 600.0)]
    fixed = sessions(population(still, 1), 600.0)
    counts = [np.bincount([s.tenant for s in fixed if lo <= s.start_s < lo + 120],
                          minlength=still.tenants) for lo in (0, 480)]
    assert int(np.argmax(counts[0])) == int(np.argmax(counts[1])) == 0  # Zipf's head stays
    assert SCENARIOS["drifting"].offered(1.0, 4.0).drift_every_s == 24.0  # on the slowed clock
