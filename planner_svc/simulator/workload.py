"""Workloads: the request stream a replay feeds through the policies, as numpy columns.

A request has an arrival time, a routing key (an index into `keys`), prompt tokens, the
reusable prefix tokens (the part of its prompt shared with earlier requests) and output
tokens. Synthetic scenarios also say what the content is (`system`, `conv`: see
planner_svc.simulator.chains): key b has a system prompt of S_b tokens, and its requests
are turns of conversations of T turns; turn j carries the system prompt, every earlier
question *and answer* of its conversation, and u new tokens:
prompt_j = S_b + Σ_{i<j} (u + output_i) + u, reusable prefix = prompt_j − u. Every T turns
a new conversation starts from the system prompt. The best possible hit rate is
E[prefix]/E[prompt]; what the engines reach depends on what earlier turns had computed by
then (arrivals are open-loop here; the session workloads of
planner_svc.simulator.sessions are closed-loop).

Scenario builders (`SCENARIOS`): paper-like, whales, low-reuse, drifting,
shared-system-prompt, wide-active-set; recorded traces
come from `planner_svc.simulator.trace`. All are deterministic for a seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from planner_svc.simulator.arrivals import ArrivalSpec
from planner_svc.simulator.rates import lognormal_walk, paper_like_keys, paper_like_rates

PAPER_KEYS = 128_824


@dataclass(frozen=True, slots=True)
class PromptShape:
    """Token shape of a key's requests (see module doc)."""

    system_tokens_median: int = 2_000
    system_tokens_sigma: float = 0.5
    turn_tokens: int = 150
    turns_per_conversation: int = 8
    output_tokens_min: int = 16
    output_tokens_max: int = 64
    max_prompt_tokens: int = 32_000


@dataclass(frozen=True)
class Workload:
    """A request stream (columns sorted by arrival time) plus what generated it."""

    name: str
    t: np.ndarray  # float64 seconds
    key: np.ndarray  # int32 index into keys
    prompt: np.ndarray  # int32 tokens
    prefix: np.ndarray  # int32 reusable prefix tokens
    output: np.ndarray  # int32 tokens
    keys: Sequence[str]
    # Per-key rates (req/s) the generator used, per control interval (one row if constant).
    interval_rates: np.ndarray | None = None
    interval_s: float = 0.0
    notes: dict[str, str] = field(default_factory=dict)
    # Content (planner_svc.simulator.chains): per-key system prompt tokens and per-request
    # conversation ids; None for length-only traces (each key one stream of content).
    system: np.ndarray | None = None
    conv: np.ndarray | None = None
    # Per key, which shared system prompt it uses (keys of one group share its content and
    # its size); None = every key its own.
    system_group: np.ndarray | None = None
    # Recorded content (Mooncake-style traces): per request, the hash of each block of its
    # prompt, `hash_block_tokens` tokens a block; None when the trace gives only lengths.
    blocks: Sequence[tuple[int, ...]] | None = None
    hash_block_tokens: int = 512
    # What a recorded trace says happened (planner_svc.simulator.fidelity checks the model
    # against it): per request, the destination it went to (an index into
    # `recorded_destinations`, -1 unknown), the prompt tokens served from cache (-1 unknown)
    # and the end-to-end seconds (NaN unknown). None when the trace has no outcomes.
    recorded_dest: np.ndarray | None = None
    recorded_destinations: Sequence[str] = ()
    measured_cached: np.ndarray | None = None
    measured_e2e_s: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.t)

    @property
    def offered_qps(self) -> float:
        span = float(self.t[-1] - self.t[0]) if len(self.t) > 1 else 0.0
        return (len(self.t) - 1) / span if span > 0 else 0.0

    def max_hit_rate(self) -> float:
        """Token-weighted hit rate an infinitely large, perfectly sticky cache would reach."""
        return float(self.prefix.sum() / max(1, self.prompt.sum()))


@dataclass(frozen=True, slots=True)
class ScenarioSpec:
    """Inputs common to every synthetic scenario at one load point."""

    load_qps: float
    n_requests: int
    seed: int
    arrivals: ArrivalSpec = field(default_factory=ArrivalSpec)
    n_keys: int = PAPER_KEYS
    shape: PromptShape = field(default_factory=PromptShape)
    interval_s: float = 300.0  # control interval (replanning; drift steps for `drifting`)


def turn_index(key: np.ndarray) -> np.ndarray:
    """For each request, how many earlier requests of its key precede it (0-based)."""
    order = np.argsort(key, kind="stable")
    sorted_keys = key[order]
    starts = np.r_[0, np.nonzero(np.diff(sorted_keys))[0] + 1]
    run_start = np.repeat(starts, np.diff(np.r_[starts, len(key)]))
    j = np.empty(len(key), np.int64)
    j[order] = np.arange(len(key)) - run_start
    return j


@dataclass(frozen=True)
class Shaped:
    prompt: np.ndarray
    prefix: np.ndarray
    output: np.ndarray
    system: np.ndarray  # per key
    conv: np.ndarray  # per request


def shape_requests(
    key: np.ndarray, n_keys: int, shape: PromptShape, rng: np.random.Generator,
    system_group: np.ndarray | None = None,
) -> Shaped:
    """Token columns and content for a key sequence, per the multi-turn model; with
    `system_group`, the keys of a group share one system prompt (its size drawn once)."""
    log_median = np.log(shape.system_tokens_median)
    system = np.exp(rng.normal(log_median, shape.system_tokens_sigma, n_keys))
    system = np.clip(system, 1, shape.max_prompt_tokens // 2).astype(np.int64)
    if system_group is not None:
        system = system[system_group]  # a group's size is its first draws' (any will do)
    T = max(1, shape.turns_per_conversation)
    phase = rng.integers(0, T, n_keys)
    pos = turn_index(key) + phase[key]
    conv = key.astype(np.int64) * (1 << 24) + pos // T  # (key, conversation number)
    output = rng.integers(shape.output_tokens_min, shape.output_tokens_max + 1, len(key))
    # prefix = S + the (question + answer) tokens of the conversation's earlier turns
    step = shape.turn_tokens + output.astype(np.int64)
    order = np.argsort(conv, kind="stable")  # within a conversation: arrival order
    c_sorted, s_sorted = conv[order], step[order]
    run = np.cumsum(s_sorted) - s_sorted  # exclusive cumulative sum...
    first = np.r_[0, np.nonzero(np.diff(c_sorted))[0] + 1]
    base = np.repeat(run[first], np.diff(np.r_[first, len(key)]))
    before = np.empty(len(key), np.int64)
    before[order] = run - base  # ...restarted at each conversation
    prefix = np.minimum(system[key] + before, shape.max_prompt_tokens - shape.turn_tokens)
    prompt = prefix + shape.turn_tokens
    return Shaped(prompt.astype(np.int32), prefix.astype(np.int32), output.astype(np.int32),
                  system.astype(np.int32), conv)


def _stream(
    name: str, spec: ScenarioSpec, shares_per_interval: np.ndarray, rng: np.random.Generator,
    system_group: np.ndarray | None = None,
) -> Workload:
    """Draw arrival times, then each request's key from its interval's rate shares."""
    t = spec.arrivals.times(spec.load_qps, spec.n_requests, rng)
    n_int = len(shares_per_interval)
    interval = np.minimum((t // spec.interval_s).astype(np.int64), n_int - 1) if n_int > 1 else None
    if interval is None:
        key = rng.choice(spec.n_keys, size=spec.n_requests, p=shares_per_interval[0])
    else:
        key = np.empty(spec.n_requests, np.int64)
        for i in range(n_int):
            sel = np.nonzero(interval == i)[0]
            key[sel] = rng.choice(spec.n_keys, size=len(sel), p=shares_per_interval[i])
    shaped = shape_requests(key, spec.n_keys, spec.shape, rng, system_group)
    return Workload(
        name=name,
        t=t,
        key=key.astype(np.int32),
        prompt=shaped.prompt,
        prefix=shaped.prefix,
        output=shaped.output,
        keys=paper_like_keys(spec.n_keys),
        interval_rates=shares_per_interval * spec.load_qps,
        interval_s=spec.interval_s,
        notes={"arrivals": spec.arrivals.label(), "keys": str(spec.n_keys)},
        system=shaped.system,
        conv=shaped.conv,
        system_group=system_group,
    )


def _shares(spec: ScenarioSpec, seed_offset: int = 0) -> np.ndarray:
    rates = paper_like_rates(spec.n_keys, 1.0, seed=spec.seed * 7919 + 17 + seed_offset)
    return rates / rates.sum()


def paper_like(spec: ScenarioSpec) -> Workload:
    """Lognormal key rates (Gini ≈ 0.756, no key > 0.3 %), multi-turn growing prefixes."""
    rng = np.random.default_rng(spec.seed)
    return _stream("paper-like", spec, _shares(spec)[None, :], rng)


WHALES, WHALE_SHARE = 6, 0.09  # the whales scenario's defaults (see `whales`)


def whales(
    spec: ScenarioSpec, *, n_whales: int = WHALES, whale_share: float = WHALE_SHARE
) -> Workload:
    """The paper-like tail plus `n_whales` keys that each carry `whale_share` of all requests.

    Defaults (6 x 9 %, calibrated in docs/replay.md): 9 % of R = 30 replicas' traffic is 2.7x a
    replica's fair share, so affinity pins ~3.2x the mean on a whale's owner (the paper:
    3.46x) and saturates it about where Flat-LB saturates; 54 % of traffic in whales gives
    Flat-LB a decent hit rate (~60 %, the paper: 56 %), as every replica keeps them warm."""
    rng = np.random.default_rng(spec.seed)
    shares = _shares(spec) * (1.0 - n_whales * whale_share)
    whale_ids = rng.choice(spec.n_keys, n_whales, replace=False)
    shares[whale_ids] = whale_share
    w = _stream("whales", spec, (shares / shares.sum())[None, :], rng)
    w.notes["whales"] = f"{n_whales} keys x {whale_share:.0%}"
    return w


LOW_REUSE_SHAPE = PromptShape(
    system_tokens_median=150,
    system_tokens_sigma=0.3,
    turn_tokens=1_800,
    turns_per_conversation=1,
)


def low_reuse(spec: ScenarioSpec) -> Workload:
    """Little recoverable prefix work: short shared prefixes, long unique prompt bodies."""
    rng = np.random.default_rng(spec.seed)
    low = ScenarioSpec(
        spec.load_qps,
        spec.n_requests,
        spec.seed,
        spec.arrivals,
        spec.n_keys,
        LOW_REUSE_SHAPE,
        spec.interval_s,
    )
    return _stream("low-reuse", low, _shares(low)[None, :], rng)


SHARED_PROMPTS = 32  # the shared-system-prompt scenario's applications (see below)


def shared_system_prompt(spec: ScenarioSpec, *, n_prompts: int = SHARED_PROMPTS) -> Workload:
    """Paper-like keys (tenants) running `n_prompts` applications: every key of an
    application starts with the application's system prompt (2,000 tokens median), so only
    its conversations are its own. Shares are Zipf over applications. Every cache soon holds
    every system prompt, so Flat-LB and the content-aware routers find most of each prompt
    warm anywhere; what affinity can still win is the conversations' history."""
    rng = np.random.default_rng(spec.seed)
    popularity = 1.0 / np.arange(1, n_prompts + 1)
    group = rng.choice(n_prompts, size=spec.n_keys, p=popularity / popularity.sum())
    w = _stream("shared-system-prompt", spec, _shares(spec)[None, :], rng,
                system_group=group.astype(np.int64))
    w.notes["system prompts"] = f"{n_prompts} shared by {spec.n_keys} keys"
    return w


WIDE_SHAPE = PromptShape(system_tokens_median=4_000, system_tokens_sigma=0.3)
WIDE_KEYS_SHARE = 0.5  # of the spec's key count (8,051 at the replay's default 16,103)


def wide_active_set(spec: ScenarioSpec) -> Workload:
    """Equally hot keys with long prefixes (4,000-token system prompts): half the replay's
    key count, a working set about 1.3x the fleet's cache (30 x 1 M tokens) and ~8 x what
    one cache holds. No key is hot enough to replicate, the admitted set is bounded by W,
    and the keys outside it are as hot as the keys in it: where planned routing's
    admit-the-hottest rule has nothing to choose by, and the cold tail's routing decides."""
    n_keys = max(1, int(spec.n_keys * WIDE_KEYS_SHARE))
    wide = replace(spec, n_keys=n_keys, shape=WIDE_SHAPE)
    rng = np.random.default_rng(spec.seed)
    w = _stream("wide-active-set", wide, np.full((1, n_keys), 1.0 / n_keys), rng)
    w.notes["keys"] = f"{n_keys} equally hot"
    return w


def drifting(spec: ScenarioSpec, *, sigma: float = 0.3, interval_s: float = 60.0) -> Workload:
    """Paper-like rates that take a lognormal random walk (σ per `interval_s`, which is also
    the control interval of this scenario)."""
    spec = replace(spec, interval_s=interval_s)
    rng = np.random.default_rng(spec.seed)
    mean_gap = 1.0 / spec.load_qps
    n_int = max(1, int(np.ceil(spec.n_requests * mean_gap / spec.interval_s)) + 1)
    walk = np.random.default_rng(spec.seed + 1_000_003)
    rows = [_shares(spec)]
    for _ in range(n_int - 1):
        nxt = lognormal_walk(rows[-1], sigma, walk)
        rows.append(nxt / nxt.sum())
    w = _stream("drifting", spec, np.vstack(rows), rng)
    w.notes["drift"] = f"lognormal walk sigma={sigma} per {spec.interval_s:g} s"
    return w


SCENARIOS: dict[str, Callable[[ScenarioSpec], Workload]] = {
    "paper-like": paper_like,
    "whales": whales,
    "low-reuse": low_reuse,
    "drifting": drifting,
    "shared-system-prompt": shared_system_prompt,
    "wide-active-set": wide_active_set,
}
