"""Baselines follow their sources' decision rules (shared/reference/baselines.md)."""

from __future__ import annotations

from collections import Counter

import numpy as np

from planner_svc.simulator.hashring import HashRing, stable_hash
from planner_svc.simulator.policies import CHWBL, FlatP2C, PolicyContext, Sticky
from planner_svc.simulator.preble import PrebleLike
from planner_svc.simulator.reactive import DualMapLike, SGLangCacheAware, SGLangPowerOfTwo
from planner_svc.simulator.replica import ReplicaModel

KEYS = [f"tenant-{i:05d}" for i in range(200)]


def ctx(n: int = 4, seed: int = 1, model: ReplicaModel | None = None) -> PolicyContext:
    return PolicyContext(n, KEYS, model or ReplicaModel(), seed=seed)


def test_p2c_samples_two_distinct_replicas_and_takes_the_less_loaded() -> None:
    p = FlatP2C(ctx(n=2))
    p.inflight[:] = [5, 0]
    picks = set()
    for i in range(50):
        d = p.route(i, 0, 10, 0, 1, 0.0)
        picks.add(d)
        p.finished(i, d, 0.0)
    assert picks == {1}  # two distinct replicas out of two: always both, the idle one wins


def test_p2c_breaks_ties_at_random_and_counts_at_dispatch() -> None:
    p = FlatP2C(ctx(n=2, seed=3))
    picks = Counter()
    for i in range(400):
        d = p.route(i, 0, 10, 0, 1, 0.0)
        picks[d] += 1
        assert p.inflight[d] == 1
        p.finished(i, d, 0.0)
    assert min(picks.values()) > 150


def test_sticky_is_a_stable_160_vnode_ring() -> None:
    a, b = Sticky(ctx(seed=1)), Sticky(ctx(seed=2))
    first = [a.route(i, k, 10, 0, 1, 0.0) for i, k in enumerate(range(200))]
    assert first == [b.route(i, k, 10, 0, 1, 0.0) for i, k in enumerate(range(200))]
    assert len(HashRing(4)) == 4 * 160
    assert stable_hash("x") == stable_hash("x") != stable_hash("y")
    assert set(first) == {0, 1, 2, 3}


def test_chwbl_takes_the_hashed_endpoint_until_it_is_over_the_bound() -> None:
    p = CHWBL(ctx())
    key = 7
    hashed = p.route(0, key, 10, 0, 1, 0.0)  # total 0: always OK
    assert hashed == Sticky(ctx()).route(0, key, 10, 0, 1, 0.0) or p.c == 1.25
    p.inflight[:] = [0, 0, 0, 0]
    p.inflight[hashed] = 10
    p.total = 10
    moved = p.route(1, key, 10, 0, 1, 0.0)
    assert moved != hashed  # 10 > 1.25 * 11 / 4
    p.inflight[:] = [3, 3, 3, 3]
    p.total = 12
    assert p.route(2, key, 10, 0, 1, 0.0) == hashed  # 3 <= 1.25 * 13 / 4


def test_dualmap_prefers_the_candidate_it_sent_the_prefix_unless_its_ttft_breaks_the_slo() -> None:
    m = ReplicaModel(prefill_s_per_token=1e-3)
    p = DualMapLike(ctx(model=m), ttft_slo_s=2.0)
    key = 11
    c1, c2 = p._candidates(key)
    assert c1 != c2
    first = p.route(0, key, 1_000, 0, 1, 0.0)  # no hit anywhere: the lower TTFT, c1 on a tie
    assert first == c1
    # It remembers what it sent: c1 now holds the key's prefix as far as it knows.
    assert p.route(1, key, 1_100, 1_000, 1, 10.0) == c1
    for j in range(5):  # its own dispatches give c1 a prefill backlog far beyond the SLO
        p._remember(c1, 100 + j, 2_000, 0, 10.0)
    assert p.route(10, key, 1_100, 1_000, 1, 10.0) == c2


def test_sglang_uses_the_learned_tenant_above_the_threshold_and_least_load_when_imbalanced() -> (
    None
):
    p = SGLangCacheAware(ctx())
    d = p.route(0, 5, 1_000, 0, 1, 0.0)  # nothing learned: smallest tenant
    assert p.route(1, 5, 1_100, 1_000, 1, 0.0) == d  # 1000/1100 > 0.3
    p.inflight[:] = [100, 100, 100, 0]
    p.inflight[d] = 100
    assert p.route(2, 5, 1_100, 1_000, 1, 0.0) == 3  # 100 - 0 > 64 and 100 > 1.5 * 0


def test_preble_exploits_when_the_match_exceeds_half_the_prompt() -> None:
    p = PrebleLike(ctx())
    g = p.route(0, 9, 1_000, 0, 1, 0.0)
    p.inflight = [0, 0, 0, 0]
    p.window_cost[g] += 100.0  # g looks expensive, but the key's prefix lives there
    assert p.route(1, 9, 1_100, 1_000, 1, 1.0) == g
    other = p.route(2, 10, 1_000, 0, 1, 2.0)  # explore: argmin cost, not g
    assert other != g


def test_policies_route_every_request_to_a_valid_destination() -> None:
    rng = np.random.default_rng(0)
    c = ctx()
    for p in (FlatP2C(c), Sticky(c), CHWBL(c), DualMapLike(c), SGLangCacheAware(c), PrebleLike(c)):
        for i in range(300):
            d = p.route(i, int(rng.integers(200)), 500, 400, 10, float(i))
            assert 0 <= d < 4
            p.finished(i, d, float(i) + 0.5)


def test_sglang_matches_content_shared_across_keys() -> None:
    """A preamble every tenant shares is one prefix to the router's tree, as in its text
    tree: a new tenant's first request goes where the preamble already is."""
    p = SGLangCacheAware(ctx())
    preamble, a, b = (7, 60), (100, 10), (200, 10)  # (segment, blocks)
    d = p.route_chain(0, 1, [preamble, a], 70 * 16, 1, 0.0)
    p.finished(0, d, 0.5)
    assert p.route_chain(1, 2, [preamble, b], 70 * 16, 1, 1.0) == d  # 60/70 of it matches
    p.finished(1, d, 1.5)
    # A prompt sharing nothing goes to the smallest tree, not to d.
    assert p.route_chain(2, 3, [(300, 70)], 70 * 16, 1, 2.0) != d


def test_prefix_index_matches_under_the_parent_and_forgets_least_recent_first() -> None:
    from planner_svc.simulator.prefix_index import PrefixIndex

    idx = PrefixIndex(3)
    idx.insert([(1, 4), (2, 6)], 0)
    idx.insert([(1, 4), (3, 2)], 1)
    assert idx.match([(1, 4), (2, 8)]) == [10, 4, 0]
    assert idx.match([(9, 4), (2, 6)]) == [0, 0, 0]  # segment 2 under another parent
    assert idx.match([(1, 4), (2, 8)], limit_blocks=5) == [5, 4, 0]
    idx.insert([(5, 3)], 0)  # newer than (1, 4) and (2, 6) on destination 0
    idx.trim(6)
    assert idx.blocks == [3, 6, 0] and idx.match([(5, 3)]) == [3, 0, 0]
    assert idx.match([(1, 4), (3, 2)]) == [0, 6, 0]  # destination 1 kept its 6 blocks


def test_prefix_index_ignores_empty_segments_and_trims_leaves_before_their_prefix() -> None:
    from planner_svc.simulator.prefix_index import PrefixIndex

    idx = PrefixIndex(2)
    idx.insert([(5, 0)], 0)  # less than a block: nothing held
    idx.insert([(1, 4), (2, 6)], 0)
    idx.insert([(1, 4), (3, 1)], 1)
    idx.trim(4)  # destination 0 drops its leaf, keeps the shared prefix
    assert idx.blocks == [4, 4]  # destination 1 dropped its leaf (3) too
    assert idx.match([(1, 4), (2, 6)])[0] == 4


def test_sglang_power_of_two_compares_the_polled_tokens_and_herds_between_polls() -> None:
    """sglang-router's power_of_two: the lower of two distinct workers' polled `/get_load`
    tokens, ties to the first drawn; before the first poll, its own in-flight counts. The
    loads hold until the next poll, so every request goes to the least-loaded of its pair
    however many were sent there since (the herding live-count P2C avoids)."""
    p = SGLangPowerOfTwo(ctx(n=4))
    p.inflight[:] = [3, 3, 3, 0]
    before = Counter(p.route(i, 0, 10, 0, 1, 0.0) for i in range(200))
    assert before.most_common(1)[0][0] == 3  # live counts until a poll: the idle one
    p.poll_loads(5.0, [900, 100, 500, 700])
    picks = Counter(p.route(i, 0, 10, 0, 1, 5.0) for i in range(3000))
    # the least loaded wins every pair it is in (1/2 of pairs), the next 1/3, the next 1/6,
    # the most loaded none, however many requests land in between
    assert picks[0] == 0
    assert picks[1] > picks[2] > picks[3] > 0
    assert abs(picks[1] / 3000 - 0.5) < 0.05 and abs(picks[3] / 3000 - 1 / 6) < 0.05
    p.poll_loads(5.0, [0, 0, 0, 0])  # ties: the first drawn, so uniform
    ties = Counter(p.route(i, 0, 10, 0, 1, 5.0) for i in range(4000))
    assert all(abs(ties[d] / 4000 - 0.25) < 0.04 for d in range(4))


def test_uniform_random_spreads_evenly_and_ignores_load() -> None:
    """The simulator's counterpart of the SGLang gateway's power_of_two as it measured in
    front of the arena's engines: a destination drawn uniformly, whatever is in flight."""
    from planner_svc.simulator.policies import UniformRandom

    p = UniformRandom(ctx(n=4))
    picks = Counter(p.route(i, 0, 10, 0, 1, 0.0) for i in range(8000))  # never finished
    assert all(abs(picks[d] / 8000 - 0.25) < 0.03 for d in range(4))
