"""`cacheroute replay` and `cacheroute diagnose`: shadow replay and the win/tie/lose diagnostic.

The lead wires these into the console script with `add_commands(subparsers)`; each sets
`func=callable(args) -> int`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from planner_svc.cli.console import AdvancedOptions, command
from planner_svc.planning.config import PAPER_IMBALANCE_TOLERANCE
from planner_svc.settings import PlannerSettings
from planner_svc.simulator.arena_check import (
    POWER_OF_TWO_MODELS,
    GatewaySettings,
    arena_rows,
    check_row,
    load_arena_csvs,
    summary,
    table_lines,
    transport_s,
)
from planner_svc.simulator.arrivals import ArrivalSpec
from planner_svc.simulator.diagnose import diagnose
from planner_svc.simulator.experiment import (
    BASELINE_POLICIES,
    ENGINES,
    PAPER_POLICIES,
    POLICY_NAMES,
    SIM_KEYS,
    USER_POLICIES,
    ReplayConfig,
    make_workload,
    run_experiment,
    scenario_model,
)
from planner_svc.simulator.fidelity import Fidelity, check_fidelity
from planner_svc.simulator.replica import ReplicaModel
from planner_svc.simulator.report import write_report
from planner_svc.simulator.trace import (
    TraceError,
    load_trace,
    rows_from_event_batches,
    workload_from_rows,
    write_trace,
)
from planner_svc.simulator.workload import SCENARIOS, WHALE_SHARE, WHALES, Workload
from router_client.ring import DEFAULT_TAIL_SLACK
from router_client.routing import BALANCES, DEFAULT_HISTORY_SLACK

# `cacheroute replay`'s default: the paper's comparison, its rows a user knows (the paper's
# DualMap-like baseline is an ablation: bench/ablations.py runs it, and defaults to all six).
REPLAY_POLICIES = tuple(p for p in PAPER_POLICIES if p in USER_POLICIES)


def add_commands(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add `replay` and `diagnose` to a console script's subparsers."""
    rp = command(subparsers, "replay", help="shadow-replay policies on a scenario or a trace")
    add_replay_arguments(rp, policies=USER_POLICIES, default=REPLAY_POLICIES)
    dg = command(subparsers, "diagnose", help="predict whether affinity wins on a trace")
    _workload_args(dg, AdvancedOptions(dg))
    dg.add_argument("--load", type=float, default=0.0,
                    help="req/s; needed with --scenario (with --trace, 0: as recorded)")
    dg.add_argument("--json", action="store_true", help="print the figures as JSON")
    dg.set_defaults(func=cmd_diagnose)


def add_replay_arguments(rp: argparse.ArgumentParser, *, policies: tuple[str, ...],
                         default: tuple[str, ...]) -> None:
    """The replay's options on `rp`, its `--policies` chosen from `policies` (`cacheroute
    replay`: the user's; bench/ablations.py: every policy of the simulator)."""
    advanced = AdvancedOptions(rp)
    _workload_args(rp, advanced)
    rp.add_argument("--policies", default=",".join(default), type=policy_list(policies),
                    help=f"comma list from: {_policies_help(policies)}")
    rp.add_argument("--loads", default="100,150,200,250,300",
                    help="offered loads in req/s, comma list (a trace is time-scaled to each)")
    rp.add_argument("--seeds", default="1,2,3", help="comma list of seeds")
    rp.add_argument("--routers", type=int, default=1, help="edge routers (outer balancer: random)")
    rp.add_argument("--ref-load", type=float, default=None, help="load of the main table")
    rp.add_argument("--out", type=Path, default=Path("replay-results"),
                    help="directory of the tables, CSV and plots")
    rp.add_argument("--name", default="", help="file stem of the outputs (default: scenario)")
    rp.add_argument("--no-plots", action="store_true", help="write tables only")
    rp.add_argument("--export-trace", type=Path, default=None,
                    help="write the workload of the first load and seed as a CSV trace and stop")
    _settings_args(rp, advanced)
    _arena_args(rp, advanced)
    rp.set_defaults(func=cmd_replay)


def policy_list(known: tuple[str, ...]) -> Callable[[str], str]:
    """`--policies`' parser: a comma list of names from `known`, refused at parse time
    otherwise (an ablation's name says where it runs)."""
    def parse(text: str) -> str:
        names = [p.strip() for p in text.split(",") if p.strip()]
        unknown = [p for p in names if p not in known]
        if not names or unknown:
            where = ("; the ablations run with bench/ablations.py"
                     if unknown and set(unknown) <= set(POLICY_NAMES) else "")
            raise argparse.ArgumentTypeError(
                f"unknown policies {', '.join(unknown) or '(none given)'}: choose from "
                f"{', '.join(known)}{where}")
        return ",".join(names)
    parse.__name__ = "policy list"  # argparse names the type in its error
    return parse


def _policies_help(policies: tuple[str, ...]) -> str:
    if policies != USER_POLICIES:
        return ", ".join(policies)
    return (f"the baselines {', '.join(BASELINE_POLICIES)}; cacheroute-gateway (CacheRoute as "
            "shipped: the gateway and planner with their defaults); cacheroute (CacheRoute "
            "as in the paper); the ablations run with bench/ablations.py")


def _settings_args(rp: argparse.ArgumentParser, advanced: AdvancedOptions) -> None:
    """The gateway's and the planner's settings the policies run with (advanced)."""
    g = advanced.group(rp, "gateway and planner settings", "each default is the policy's "
                       "own: as shipped for cacheroute-gateway, the paper's for cacheroute")
    advanced.add(g, "--router-sweep", default="",
                 help="comma list of router counts: one run per count at the first load")
    advanced.add(g, "--rates", choices=("measured", "known"), default="measured",
                 help="CacheRoute plans from counted warm-up arrivals or the true rates")
    advanced.add(g, "--publish-delay-s", type=float, default=1.0,
                 help="policies with the control loop (cacheroute-gateway, cacheroute-loop): "
                      "seconds from an install decision to the routers")
    advanced.add(g, "--history-slack", type=float, default=DEFAULT_HISTORY_SLACK,
                 help="policies with sessions (cacheroute-gateway, -rehome, -sessions): "
                      "the gateway's --history-slack")
    advanced.add(g, "--idle-rehome-s", type=float, default=None,
                 help="the gateway's --idle-rehome-s (the window; learned: where it "
                      "starts; 0 = off) for cacheroute-gateway (default: the gateway's) "
                      "and cacheroute-rehome(-learned) (default: the fleet's eviction "
                      "window from a cache model of the workload)")
    advanced.add(g, "--idle-rehome-with-peers", action="store_true",
                 help="with --routers > 1: the gateway's --idle-rehome-with-peers "
                      "(re-home beside other routers; off: paused, as shipped)")
    advanced.add(g, "--tail-slack", type=float, default=DEFAULT_TAIL_SLACK,
                 help="policies with the hashed cold tail (cacheroute-gateway, -rehome, "
                      "-tail, -hashed): the gateway's --tail-slack")
    advanced.add(g, "--imbalance-tolerance", type=float, default=None,
                 help="CacheRoute's planner: how far above a fresh LPT's imbalance a plan "
                      "may stay (the planner's --imbalance-tolerance; default: the "
                      f"planner's, {PlannerSettings.imbalance_tolerance:g}, for the "
                      "policies run as the gateway, the paper's "
                      f"{PAPER_IMBALANCE_TOLERANCE:g} for the others)")
    advanced.add(g, "--warm-placement", choices=("on", "off"), default=None,
                 help="CacheRoute's planner places keys entering the plan where they were "
                      "last served (the planner's warm_placement; default: as shipped, on, "
                      "for the policies run as the gateway, off for the others)")
    advanced.add(g, "--queue-aware", choices=("on", "off"), default=None,
                 help="the gateway's --queue-aware (default: as shipped, on, for the "
                      "policies run as the gateway, off for the others)")
    advanced.add(g, "--balance", choices=BALANCES, default="first-token",
                 help="policies run as the gateway (cacheroute-gateway, -rehome): the "
                      "gateway's --balance where no plan decides")
    advanced.add(g, "--replan", choices=("once", "repack", "repack-ewma", "repack-window"),
                 default="repack",
                 help="CacheRoute plans once, repacks every interval on the cumulative "
                      "rates, on smoothed rates, or on the last --rate-window-s (the "
                      "planner's rule: the stream window's rates)")
    advanced.add(g, "--paper-cadence", action="store_true",
                 help="policies run as the gateway replan on the scenario's control "
                      "interval with --replan instead of the shipped planner's: every 10 s "
                      "on the stream's 60-s window")
    advanced.add(g, "--rate-window-s", type=float, default=None,
                 help="with --replan repack-window: the window (default: one control "
                      "interval)")
    advanced.add(g, "--q-cap", type=float, default=None, help="override the calibrated q_cap")
    advanced.add(g, "--warm-slots", type=int, default=None, help="override W per destination")


def _arena_args(rp: argparse.ArgumentParser, advanced: AdvancedOptions) -> None:
    arena = advanced.group(
        rp, "arena check", "--arena-csv replays bench/arena.py's one-replica runs instead of "
        "a scenario: each run's conversations, load, seed and time scale through the "
        "simulator's engine model and routers, its hit rate and TTFT p99 set beside what the "
        "arena measured (within 3 pp and 20 %: planner_svc.simulator.arena_check); the "
        "gateway and planner settings above say what the runs ran with (default: as shipped)")
    advanced.add(arena, "--arena-csv", nargs="+", type=Path, default=None, metavar="CSV",
                 help="arena result CSVs (a later file's run replaces an earlier one's)")
    advanced.add(arena, "--transport", type=Path, default=None, metavar="JSON",
                 help="bench/gateway.py's summary: add each router's measured request "
                      "path to the simulated TTFT")
    advanced.add(arena, "--path-from-rows", action="store_true",
                 help="add each run's own request path instead: its client TTFT p50 "
                      "over its engines' (rows without them take --transport's)")
    advanced.add(arena, "--policy-seeds", type=int, default=1,
                 help="simulated draws of each router's own randomness per run")
    advanced.add(arena, "--power-of-two", choices=POWER_OF_TWO_MODELS, default="random",
                 help="the SGLang gateway's power_of_two as measured (uniform random), "
                      "as its source states it (polled), or Flat-LB")


def _workload_args(p: argparse.ArgumentParser, advanced: AdvancedOptions) -> None:
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="paper-like",
                   help="built-in workload (ignored with --trace)")
    p.add_argument("--trace", default=None, metavar="FILE|kafka://HOST:PORT/TOPIC",
                   help="recorded trace: a .csv / .jsonl file (Mooncake JSONL too), or the "
                   "events topic the gateways write")
    p.add_argument("--no-fidelity-gate", action="store_true",
                   help="answer for a recorded trace even when the engine model does not "
                   "reproduce its measured hit rate and p99")
    p.add_argument("--requests", type=int, default=200_000, help="requests per load point")
    p.add_argument("--destinations", type=int, default=30, help="engine replicas (R)")
    g = advanced.group(p, "workload and engine details")
    advanced.add(g, "--keys", type=int, default=SIM_KEYS, help="routing keys (synthetic)")
    advanced.add(g, "--engine", choices=("scenario", *sorted(ENGINES)), default="scenario",
                 help="engine model: 70b (TP2 H100 pair) or 8b (one H100); default: the "
                      "scenario's (8b for whales, 70b otherwise)")
    advanced.add(g, "--cache-tokens", type=int, default=None,
                 help="cache per destination (default: engine's)")
    advanced.add(g, "--whales", type=int, default=None, help="whales scenario: whale keys (6)")
    advanced.add(g, "--whale-share", type=float, default=None,
                 help="whales scenario: share of each (0.09)")
    advanced.add(g, "--arrivals", choices=("poisson", "gamma", "bootstrap"), default="poisson",
                 help="arrival process: Poisson, bursty gamma (--cv), or gaps resampled "
                      "from a trace (--gaps-from)")
    advanced.add(g, "--cv", type=float, default=1.9,
                 help="gamma arrivals: coefficient of variation")
    advanced.add(g, "--gaps-from", default=None,
                 help="bootstrap arrivals: a trace whose inter-arrival times are resampled")
    advanced.add(g, "--workers", type=int, default=2, help="processes running load points")


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def trace_workload(source: str) -> Workload:
    """A trace file (.csv, .jsonl, Mooncake JSONL) or `kafka://HOST:PORT/TOPIC`, the
    events topic the gateways write."""
    if not source.startswith("kafka://"):
        return load_trace(Path(source))
    from planner_svc.adapters.events_export import ExportError, parse_topic_url, read_topic

    try:
        rows = rows_from_event_batches(read_topic(*parse_topic_url(source)))
    except ExportError as exc:
        raise TraceError(str(exc)) from None
    imputed = sum(1 for row in rows if row.get("prompt_imputed"))
    if imputed:
        print(f"{source}: {imputed} of {len(rows)} requests had no usage event; their prompt "
              "size is their key's median", file=sys.stderr)
    return workload_from_rows(rows, name=source)


def _trace_stem(source: str) -> str:
    return source.rsplit("/", 1)[-1] if source.startswith("kafka://") else Path(source).stem


def _fidelity(args: argparse.Namespace, cfg: ReplayConfig) -> Fidelity | None:
    """The fidelity gate on a recorded trace (None for a synthetic scenario)."""
    if cfg.trace is None:
        return None
    return check_fidelity(cfg.trace, cfg.model)


def _report_refusal(fidelity: Fidelity, command: str) -> None:
    print(f"{command}: refusing to answer for this trace: the engine model does not "
          "reproduce what was measured (--no-fidelity-gate answers anyway)", file=sys.stderr)
    for line in fidelity.lines():
        print(line, file=sys.stderr)


def _fidelity_allows(args: argparse.Namespace, cfg: ReplayConfig, command: str) -> bool:
    fidelity = _fidelity(args, cfg)
    if fidelity is None:
        return True
    if fidelity.checked and not fidelity.passed and not args.no_fidelity_gate:
        _report_refusal(fidelity, command)
        return False
    for line in fidelity.lines():
        print(line, file=sys.stderr)
    return True


def _arrivals(args: argparse.Namespace) -> ArrivalSpec:
    if args.arrivals == "bootstrap":
        if args.gaps_from is None:
            raise TraceError("--arrivals bootstrap needs --gaps-from TRACE")
        gaps = np.diff(trace_workload(args.gaps_from).t)
        return ArrivalSpec("bootstrap", recorded_gaps_s=tuple(gaps.tolist()))
    return ArrivalSpec(args.arrivals, cv=args.cv if args.arrivals == "gamma" else 1.0)


def _engine(args: argparse.Namespace) -> ReplicaModel:
    """The engine model of `--engine` (default: the scenario's), `--cache-tokens` applied."""
    scenario = "trace" if args.trace else args.scenario
    model = scenario_model(scenario) if args.engine == "scenario" else ENGINES[args.engine]
    if args.cache_tokens is not None:
        model = replace(model, kv_capacity_tokens=args.cache_tokens)
    return model


def config_from_args(args: argparse.Namespace) -> ReplayConfig:
    model = _engine(args)
    cfg = ReplayConfig(
        scenario=args.scenario,
        n_requests=args.requests,
        n_keys=args.keys,
        n_destinations=args.destinations,
        model=model,
        arrivals=_arrivals(args),
        trace=trace_workload(args.trace) if args.trace else None,
        n_whales=args.whales,
        whale_share=args.whale_share,
    )
    if hasattr(args, "policies"):
        cfg = replace(
            cfg,
            policies=tuple(p.strip() for p in args.policies.split(",") if p.strip()),
            loads=_floats(args.loads),
            seeds=tuple(int(s) for s in _floats(args.seeds)),
            n_routers=args.routers,
            cacheroute_rates=args.rates,
            replan=args.replan,
            rate_window_s=args.rate_window_s,
            paper_cadence=args.paper_cadence,
            publish_delay_s=args.publish_delay_s,
            history_slack=args.history_slack,
            tail_slack=args.tail_slack,
            imbalance_tolerance=args.imbalance_tolerance,
            warm_placement=_switch(args.warm_placement),
            queue_aware=_switch(args.queue_aware),
            idle_rehome_s=args.idle_rehome_s,
            rehome_with_peers=args.idle_rehome_with_peers,
            balance=args.balance,
            q_cap=args.q_cap,
            warm_slots_per_destination=args.warm_slots,
            workers=args.workers,
        )
    return cfg


def _switch(value: str | None) -> bool | None:
    """An on/off flag left unset (None: the policy's own default)."""
    return None if value is None else value == "on"


def cmd_replay(args: argparse.Namespace) -> int:
    if args.arena_csv:
        return _arena_check(args)
    try:
        cfg = config_from_args(args)
    except (TraceError, OSError) as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    stem = args.name or (_trace_stem(args.trace) if args.trace else cfg.scenario)
    if args.export_trace is not None:
        write_trace(make_workload(cfg, cfg.loads[0], cfg.seeds[0]), args.export_trace)
        print(f"wrote {args.export_trace}")
        return 0
    if not _fidelity_allows(args, cfg, "replay"):
        return 3
    if args.router_sweep:
        return _router_sweep(args, cfg, stem)
    results = run_experiment(cfg)
    text = write_report(
        results,
        args.out,
        stem,
        title=_title(cfg),
        notes=_notes(cfg),
        ref_load=args.ref_load,
        plots=not args.no_plots,
    )
    print(text)
    return 0


def _arena_check(args: argparse.Namespace) -> int:
    """`--arena-csv`: the arena's one-replica runs replayed, set beside what they measured."""
    if args.policy_seeds < 1:
        print("replay: --policy-seeds must be >= 1", file=sys.stderr)
        return 2
    try:
        rows = load_arena_csvs(args.arena_csv)
        transport = (transport_s(json.loads(args.transport.read_text()))
                     if args.transport else {})
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        print(f"replay: cannot read the arena's results: {exc!r}", file=sys.stderr)
        return 2
    try:
        runs = arena_rows(rows)
    except ValueError as exc:
        print(f"replay: {exc}", file=sys.stderr)
        return 2
    if not runs:
        print("replay: no one-replica run of a known scenario and router on emulated engines "
              f"in {', '.join(map(str, args.arena_csv))}", file=sys.stderr)
        return 2
    # GatewaySettings' defaults are the gateway and planner as shipped; a flag given
    # replaces its value.
    gw = GatewaySettings(tail_slack=args.tail_slack, balance=args.balance,
                         power_of_two=args.power_of_two)
    if args.idle_rehome_s is not None:
        gw = replace(gw, idle_rehome_s=args.idle_rehome_s or None)  # 0: off
    chosen = {"warm_placement": _switch(args.warm_placement),
              "imbalance_tolerance": args.imbalance_tolerance,
              "queue_aware": _switch(args.queue_aware)}
    gw = replace(gw, **{k: v for k, v in chosen.items() if v is not None})
    try:
        checks = [check_row(run, gw, policy_seeds=args.policy_seeds, transport=transport,
                            path_from_rows=args.path_from_rows)
                  for run in runs]
    except (KeyError, ValueError) as exc:
        print(f"replay: an arena run lacks what the replay needs: {exc!r}", file=sys.stderr)
        return 2
    text = "\n".join(table_lines(checks, ranges=args.policy_seeds > 1))
    result = {"routers": summary(checks), "rows": [c.as_json() for c in checks]}
    stem = args.name or "sim-vs-arena"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.txt").write_text(text + "\n")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(text)
    return 0


def _router_sweep(args: argparse.Namespace, cfg: ReplayConfig, stem: str) -> int:
    from planner_svc.simulator.routers import router_sweep, write_router_report

    counts = tuple(int(n) for n in _floats(args.router_sweep))
    rows = router_sweep(cfg, counts)
    print(write_router_report(rows, args.out, f"{stem}-routers", cfg, plots=not args.no_plots))
    return 0


def _title(cfg: ReplayConfig) -> str:
    source = "recorded trace" if cfg.trace is not None else cfg.scenario
    return f"Shadow replay: {source}, R = {cfg.n_destinations}, {cfg.arrivals.label()} arrivals"


def _notes(cfg: ReplayConfig) -> list[str]:
    m = cfg.model
    return [
        f"{cfg.n_requests} requests per load point, first {cfg.warmup_fraction:.0%} unscored "
        f"(warm-up); {_key_count(cfg)} keys; seeds {', '.join(map(str, cfg.seeds))}; "
        f"{cfg.n_routers} router(s)",
        f"engine: KV cache {m.kv_capacity_tokens} tokens in {m.block_tokens}-token blocks, "
        f"prefill {m.prefill_overhead_s} s + {m.prefill_s_per_token * 1e3:g} ms/token "
        f"uncached, decode {m.decode_s_per_step} s/step + {m.decode_s_per_running * 1e3:g} ms "
        f"per running request + {m.decode_s_per_kv_token * 1e9:g} ns per KV token held, "
        f"batch {m.batch_limit}",
        f"CacheRoute: rates {cfg.cacheroute_rates}, replan {cfg.replan}",
        *_whale_note(cfg),
    ]


def _key_count(cfg: ReplayConfig) -> int:
    """The keys the scenario really has (wide-active-set uses half of `n_keys`)."""
    if cfg.trace is not None:
        return len(cfg.trace.keys)
    probe = replace(cfg, n_requests=min(cfg.n_requests, 1_000))
    return len(make_workload(probe, cfg.loads[0] if cfg.loads else 1.0,
                             cfg.seeds[0] if cfg.seeds else 1).keys)


def _whale_note(cfg: ReplayConfig) -> list[str]:
    if cfg.scenario != "whales" or cfg.trace is not None:
        return []
    n = cfg.n_whales if cfg.n_whales is not None else WHALES
    share = cfg.whale_share if cfg.whale_share is not None else WHALE_SHARE
    return [f"whales: {n} keys with {share:.1%} of all requests each"]


def cmd_diagnose(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except (TraceError, OSError) as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return 2
    if cfg.trace is None and args.load <= 0:
        print("diagnose: a synthetic scenario needs --load", file=sys.stderr)
        return 2
    fidelity = _fidelity(args, cfg)
    if fidelity is not None and fidelity.checked and not fidelity.passed \
            and not args.no_fidelity_gate:
        _report_refusal(fidelity, "diagnose")
        return 3
    w = make_workload(cfg, args.load, 1)
    d = diagnose(w, args.destinations, cfg.model.kv_capacity_tokens,
                 warm_slots_per_destination=cfg.warm_slots_per_destination)
    if args.json:
        extra = {"fidelity": fidelity.__dict__ if fidelity is not None else None}
        print(json.dumps({**d.__dict__, "gain": d.gain, "affinity_gain": d.affinity_gain,
                          **extra}, default=float))
    else:
        for line in fidelity.lines() if fidelity is not None else []:
            print(line)
        if d.verdict == "undecided":
            print(f"CacheRoute against Flat-LB: UNDECIDED (leaning {d.point_verdict}, "
                  f"{d.confidence:.0%} sure)")
        elif d.falls_back:
            print("CacheRoute is predicted to TIE with Flat-LB: its guard would serve "
                  "Flat-LB on this traffic")
        else:
            print(f"CacheRoute is predicted to {d.verdict.upper()} against Flat-LB "
                  f"({d.confidence:.0%} of resamples agree)")
        for line in d.evidence(args.destinations):
            print(f"  - {line}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m planner_svc.cli.replay_cmd replay|diagnose ...` (until the console script)."""
    parser = argparse.ArgumentParser(prog="cacheroute")
    add_commands(parser.add_subparsers(required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
