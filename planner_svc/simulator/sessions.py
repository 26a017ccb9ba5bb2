"""Session workloads: tenants, conversations and turns, as real clients produce them (pure).

A scenario is a population of *tenants* (applications), each with a system prompt; some
scenarios put a global prompt in front of every tenant's, or hand documents to the first
turn (RAG). Conversations of a tenant start as a Poisson process at the tenant's rate;
a conversation is a few *turns*, each sent after the previous answer arrived plus a think
time, and each carrying the whole history (system prompt, every earlier question and
answer). So reuse is causal: a turn can only hit what earlier turns computed.

The same `Session` list drives the live arena (planner_svc.devstack.traffic renders it as
text through the OpenAI SDK) and the simulator, so both see one workload.

Token counts are exact in the arena's text: a token is a 4-byte word
(planner_svc.simulator.text).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner_svc.simulator import text as txt


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    name: str
    tenants: int = 40
    zipf_s: float = 1.0  # tenant popularity: rate of the i-th tenant ∝ 1 / i^s
    sessions_per_s: float = 2.0  # conversations started per second, all tenants together
    system_tokens: tuple[int, int] = (1_000, 3_000)
    shared_prefix_tokens: int = 0  # one prompt in front of every tenant's (a platform preamble)
    turns: tuple[int, int] = (3, 6)
    user_tokens: tuple[int, int] = (40, 160)
    output_tokens: tuple[int, int] = (16, 48)
    think_s: tuple[float, float] = (0.5, 2.0)
    whales: int = 0  # tenants that each carry `whale_share` of the conversations
    whale_share: float = 0.0
    documents: int = 0  # a first turn carries one of these documents with probability doc_p
    document_tokens: tuple[int, int] = (1_500, 3_000)
    doc_p: float = 0.0
    # Popularity drift: every `drift_every_s` each tenant's weight is multiplied by
    # exp(N(0, drift_sigma)), a log-normal random walk (the replay's drifting scenario, per
    # tenant); 0 = fixed popularity.
    drift_every_s: float = 0.0
    drift_sigma: float = 0.0
    notes: str = ""

    def scaled(self, **changes: float | int) -> Scenario:
        return replace(self, **changes)  # type: ignore[arg-type]

    def offered(self, rate_scale: float, time_scale: float) -> Scenario:
        """The scenario as offered to engines slowed by `time_scale` (the arena's and the
        session simulator's): conversations start `rate_scale / time_scale` times as often
        and popularity drifts on the slowed clock."""
        return replace(self, sessions_per_s=self.sessions_per_s * rate_scale / time_scale,
                       drift_every_s=self.drift_every_s * time_scale)


SCENARIOS: dict[str, Scenario] = {
    # Many tenants, skewed popularity, long system prompts, multi-turn: the paper's regime
    # (a few percent of keys carry a large share of requests).
    "paper-like": Scenario(name="paper-like", tenants=48, zipf_s=1.1, sessions_per_s=2.5,
                           notes="48 tenants, Zipf 1.1, 1-3k-token system prompts"),
    # Every tenant's prompt starts with the same 1,500-token platform preamble.
    "shared-system-prompt": Scenario(
        name="shared-system-prompt", tenants=48, zipf_s=0.8, sessions_per_s=2.5,
        shared_prefix_tokens=1_500, system_tokens=(200, 800),
        notes="a 1,500-token preamble shared by all 48 tenants"),
    # A few tenants carry most traffic: they need replicas (k_b > 1) and balance.
    "whale": Scenario(name="whale", tenants=40, zipf_s=0.6, sessions_per_s=2.5, whales=3,
                      whale_share=0.18, notes="3 whale tenants with 18 % of conversations each"),
    # Paper-like tenants whose popularity drifts: every 6 s (at time scale 1) each tenant's
    # rate moves by a log-normal step (sigma 0.5), so the hot set changes within a run and a
    # plan must follow it (the control loop) or go stale.
    "drifting": Scenario(name="drifting", tenants=48, zipf_s=1.1, sessions_per_s=2.5,
                         drift_every_s=6.0, drift_sigma=0.5,
                         notes="paper-like, popularity drifting (log-normal, sigma 0.5 / 6 s)"),
    # Short prompts, single turns, unique content: little to reuse; affinity cannot win.
    "low-reuse": Scenario(name="low-reuse", tenants=200, zipf_s=0.2, sessions_per_s=6.0,
                          system_tokens=(50, 150), turns=(1, 1), user_tokens=(400, 1_200),
                          notes="200 tenants, short prompts, one turn, unique questions"),
}


@dataclass(frozen=True, slots=True)
class Turn:
    user_tokens: int
    output_tokens: int
    think_s: float  # before this turn is sent (after the previous answer)
    document: int = -1  # index into the scenario's documents, or -1


@dataclass(frozen=True, slots=True)
class Session:
    sid: int
    start_s: float
    tenant: int
    turns: tuple[Turn, ...]


@dataclass(frozen=True)
class Population:
    """What the sessions refer to: every tenant's system prompt, the documents."""

    scenario: Scenario
    seed: int
    system_tokens: tuple[int, ...]
    document_tokens: tuple[int, ...]
    tenant_weights: np.ndarray = field(repr=False)

    def tenant_key(self, tenant: int) -> str:
        return f"s{self.seed}-t{tenant}"


def population(scenario: Scenario, seed: int) -> Population:
    rng = np.random.default_rng(seed)
    n = scenario.tenants
    weights = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** scenario.zipf_s
    weights /= weights.sum()
    if scenario.whales:
        rest = 1.0 - scenario.whales * scenario.whale_share
        weights = weights * rest / weights[scenario.whales:].sum()
        weights[: scenario.whales] = scenario.whale_share
        weights /= weights.sum()
    lo, hi = scenario.system_tokens
    systems = tuple(int(x) for x in rng.integers(lo, hi + 1, n))
    dlo, dhi = scenario.document_tokens
    docs = tuple(int(x) for x in rng.integers(dlo, dhi + 1, scenario.documents))
    return Population(scenario, seed, systems, docs, weights)


def sessions(pop: Population, duration_s: float) -> list[Session]:
    """Conversations starting in [0, duration_s), in start order."""
    s = pop.scenario
    rng = random.Random(pop.seed * 7919 + 17)
    out: list[Session] = []
    t = rng.expovariate(s.sessions_per_s)
    tenants = list(range(s.tenants))
    weights = pop.tenant_weights.tolist()
    # The drift draws from its own stream, so a scenario without it keeps its sessions.
    drift = random.Random(pop.seed * 104_729 + 3) if s.drift_every_s > 0 else None
    next_drift = s.drift_every_s
    while t < duration_s:
        while drift is not None and t >= next_drift:
            weights = [w * math.exp(drift.gauss(0.0, s.drift_sigma)) for w in weights]
            next_drift += s.drift_every_s
        tenant = rng.choices(tenants, weights)[0]
        n_turns = rng.randint(*s.turns)
        turns = []
        for j in range(n_turns):
            doc = -1
            if j == 0 and s.documents and rng.random() < s.doc_p:
                doc = rng.randrange(s.documents)
            turns.append(Turn(rng.randint(*s.user_tokens), rng.randint(*s.output_tokens),
                              0.0 if j == 0 else rng.uniform(*s.think_s), doc))
        out.append(Session(len(out), t, tenant, tuple(turns)))
        t += rng.expovariate(s.sessions_per_s)
    return out


# --- text, for the arena ------------------------------------------------------------------

def words(tokens: int, seed: str) -> str:
    """`tokens` 4-byte words, determined by `seed`."""
    rng = random.Random(seed)
    return "".join(rng.choice(txt._WORDS) for _ in range(tokens))


def system_text(pop: Population, tenant: int) -> str:
    shared = words(pop.scenario.shared_prefix_tokens, f"shared-{pop.seed}")
    own = words(pop.system_tokens[tenant], f"sys-{pop.seed}-{tenant}")
    # The tenant's name first in its own part: the shared preamble stays a common prefix.
    return shared + own


def user_text(pop: Population, session: Session, j: int) -> str:
    turn = session.turns[j]
    doc = ""
    if turn.document >= 0:
        doc = words(pop.document_tokens[turn.document], f"doc-{pop.seed}-{turn.document}")
    return doc + words(turn.user_tokens, f"user-{pop.seed}-{session.sid}-{j}")


@dataclass(slots=True)
class Transcript:
    """One conversation's messages as its client sends them: the tenant's system prompt,
    then each question and the answer it got. The arena's driver and the simulator both
    build their prompts here, so the engines see the same text in both."""

    pop: Population
    session: Session
    messages: list[dict[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages.append(
                {"role": "system", "content": system_text(self.pop, self.session.tenant)})

    def ask(self, j: int) -> list[dict[str, str]]:
        """The messages of turn `j`: the history plus its question."""
        self.messages.append({"role": "user", "content": user_text(self.pop, self.session, j)})
        return self.messages

    def answered(self, text: str) -> None:
        self.messages.append({"role": "assistant", "content": text})



# --- the scenario grid --------------------------------------------------------------------
# Workloads users run, as axes instead of hand-picked scenarios: how many tenants, how long
# their system prompts, how skewed their popularity, how many turns a conversation has, and
# how hard the engines are driven. One `GridCell` is one point; the simulator runs every
# cell (bench/sim_grid.py), the live arena a fixed sample of them (bench/arena.py --grid).

GRID_TENANTS = (30, 300, 3_000)
GRID_SYSTEM_TOKENS = (256, 1_024, 4_096)
GRID_ZIPF = (0.8, 1.0, 1.3)
# turns per conversation: (fewest, most), drawn uniformly
GRID_TURNS: dict[str, tuple[int, int]] = {"short": (1, 3), "long": (4, 8)}
# offered load as a share of the engines' knee (`knee_requests_per_s`)
GRID_LOADS: dict[str, float] = {"light": 0.25, "knee": 0.8}
# The knee the arena measured on paper-like (12 requests/s per emulated engine at time scale
# 1, CacheRoute's q_cap) holds for requests of paper-like's cost; a cell's knee is scaled by
# its requests' cost against paper-like's (`request_cost_s`).
KNEE_REQUESTS_PER_ENGINE_S = 12.0
GRID_SAMPLE_SEED = 54
GRID_SAMPLE_SIZE = 12


@dataclass(frozen=True, slots=True, kw_only=True)
class GridCell:
    """One point of the scenario grid; `scenario` is the workload it stands for."""

    tenants: int
    system_tokens: int
    zipf_s: float
    turns: str  # a key of GRID_TURNS
    load: str  # a key of GRID_LOADS

    @property
    def name(self) -> str:
        return (f"grid-t{self.tenants}-p{self.system_tokens}-z{self.zipf_s:g}-"
                f"{self.turns}-{self.load}")

    def scenario(self, engines: int = 4) -> Scenario:
        """The cell's workload at time scale 1 (`Scenario.offered` slows it as for the
        other scenarios): system prompts within ±25 % of the cell's length, conversations
        started at the rate that offers `GRID_LOADS[load]` of the engines' knee."""
        lo, hi = GRID_TURNS[self.turns]
        base = Scenario(name=self.name, tenants=self.tenants, zipf_s=self.zipf_s,
                        system_tokens=(self.system_tokens * 3 // 4,
                                       self.system_tokens * 5 // 4),
                        turns=(lo, hi), sessions_per_s=1.0,
                        notes=(f"{self.tenants} tenants, ~{self.system_tokens}-token system "
                               f"prompts, Zipf {self.zipf_s:g}, {lo}-{hi} turns, "
                               f"{self.load} load"))
        requests_per_s = GRID_LOADS[self.load] * knee_requests_per_s(base, engines)
        return replace(base, sessions_per_s=requests_per_s / ((lo + hi) / 2))


def request_cost_s(s: Scenario) -> float:
    """Engine seconds (at time scale 1) a request of `s` costs when its conversation's
    history is cached and its tenant's system prompt is computed once per conversation:
    the prefill overhead, the turn's question and the previous answer, a share of the
    system prompt. A fixed price per request, blind to the routing: the grid's loads are
    the same for every router."""
    from planner_svc.simulator.replica import ReplicaModel

    m = ReplicaModel()
    turns = (s.turns[0] + s.turns[1]) / 2
    new = (sum(s.user_tokens) + sum(s.output_tokens)) / 2 + sum(s.system_tokens) / 2 / turns
    return m.prefill_overhead_s + new * m.prefill_s_per_token


def knee_requests_per_s(s: Scenario, engines: int = 4) -> float:
    """The engines' knee for requests of `s` (all engines, time scale 1): the measured knee
    of paper-like's requests, scaled by their cost against `s`'s."""
    return (KNEE_REQUESTS_PER_ENGINE_S * engines * request_cost_s(SCENARIOS["paper-like"])
            / request_cost_s(s))


def grid_cells() -> list[GridCell]:
    """Every cell of the grid, in a fixed order (tenants, prompt, skew, turns, load)."""
    return [GridCell(tenants=t, system_tokens=p, zipf_s=z, turns=n, load=load)
            for t in GRID_TENANTS for p in GRID_SYSTEM_TOKENS for z in GRID_ZIPF
            for n in GRID_TURNS for load in GRID_LOADS]


def grid_sample(size: int = GRID_SAMPLE_SIZE, seed: int = GRID_SAMPLE_SEED) -> list[GridCell]:
    """The live arena's cells: a seeded Latin-hypercube sample, so every value of every axis
    appears as evenly as `size` allows (each tenant count, prompt length and skew 4 times
    in 12, each turn count and load 6 times); no cell twice."""
    rng = random.Random(seed)
    axes: list[list[Any]] = [list(GRID_TENANTS), list(GRID_SYSTEM_TOKENS), list(GRID_ZIPF),
                             list(GRID_TURNS), list(GRID_LOADS)]
    while True:
        columns = []
        for values in axes:
            column = [values[i % len(values)] for i in range(size)]
            rng.shuffle(column)
            columns.append(column)
        cells = [GridCell(tenants=t, system_tokens=p, zipf_s=z, turns=n, load=load)
                 for t, p, z, n, load in zip(*columns, strict=True)]
        if len(set(cells)) == size:
            return cells


def grid_scenario(name: str, engines: int = 4) -> Scenario:
    """The scenario of a grid cell by its name (`GridCell.name`)."""
    for cell in grid_cells():
        if cell.name == name:
            return cell.scenario(engines)
    raise KeyError(name)
