"""Scale-out sweep (issue 10): N edge routers, each with its own load view and prefix index.

An outer balancer spreads requests uniformly over N routers (see `simulator`). CacheRoute's
routers share one planned table (the plan is global), so only their in-flight views differ;
SGLang-like cache_aware routers each learn prefixes from their own traffic only; CHWBL and
Flat-LB routers each count only their own in-flight requests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from planner_svc.simulator.experiment import ReplayConfig, run_experiment
from planner_svc.simulator.metrics import MeanSd, RunMetrics, mean_sd

ROUTER_POLICIES = ("cacheroute", "sglang", "chwbl", "flat")


@dataclass(frozen=True)
class RouterRow:
    policy: str
    n_routers: int
    hit: MeanSd
    p99: MeanSd
    imbalance: MeanSd


def router_sweep(cfg: ReplayConfig, counts: tuple[int, ...]) -> list[RouterRow]:
    """Every policy of `cfg` (default `ROUTER_POLICIES`) at the first load, for each N."""
    policies = cfg.policies if cfg.policies else ROUTER_POLICIES
    rows: list[RouterRow] = []
    for n in counts:
        point = replace(cfg, n_routers=n, loads=cfg.loads[:1], policies=policies)
        results = run_experiment(point)
        rows.extend(_rows(results, n))
    return rows


def _rows(results: list[RunMetrics], n: int) -> list[RouterRow]:
    out = []
    for policy in dict.fromkeys(r.policy for r in results):
        mine = [r for r in results if r.policy == policy]
        out.append(
            RouterRow(
                policy,
                n,
                mean_sd([r.hit_rate for r in mine]),
                mean_sd([r.p99_s for r in mine]),
                mean_sd([r.imbalance for r in mine]),
            )
        )
    return out


def router_table(rows: list[RouterRow]) -> str:
    counts = sorted({r.n_routers for r in rows})
    policies = list(dict.fromkeys(r.policy for r in rows))
    head = "| policy | " + " | ".join(f"N = {n}: hit % / p99 s" for n in counts) + " |"
    lines = [head, "|---|" + "---|" * len(counts)]
    for p in policies:
        cells = []
        for n in counts:
            r = next((x for x in rows if x.policy == p and x.n_routers == n), None)
            cells.append(f"{r.hit.mean * 100:.1f} / {r.p99.mean:.2f}" if r else "-")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_router_report(
    rows: list[RouterRow], out_dir: Path, stem: str, cfg: ReplayConfig, *, plots: bool = True
) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    load = cfg.loads[0] if cfg.loads else 0.0
    text = "\n".join(
        [
            f"## Edge routers: served hit rate and p99 versus N ({cfg.scenario}, {load:g} QPS, "
            f"R = {cfg.n_destinations}, seeds {', '.join(map(str, cfg.seeds))})",
            "",
            router_table(rows),
            "",
            _hit_change(rows),
            "",
        ]
    )
    if plots:
        path = _plot(rows, out_dir / f"{stem}.png")
        text += f"\n![{path.stem}]({path.name})\n"
    (out_dir / f"{stem}.md").write_text(text)
    return text


def _hit_change(rows: list[RouterRow]) -> str:
    lines = []
    for p in dict.fromkeys(r.policy for r in rows):
        mine = sorted((r for r in rows if r.policy == p), key=lambda r: r.n_routers)
        if len(mine) > 1:
            delta = (mine[-1].hit.mean - mine[0].hit.mean) * 100
            lines.append(
                f"- {p}: hit rate N = {mine[0].n_routers} → {mine[-1].n_routers}: {delta:+.2f} pp"
            )
    return "\n".join(lines)


def _plot(rows: list[RouterRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for p in dict.fromkeys(r.policy for r in rows):
        mine = sorted((r for r in rows if r.policy == p), key=lambda r: r.n_routers)
        n = np.array([r.n_routers for r in mine])
        a.errorbar(
            n,
            [100 * r.hit.mean for r in mine],
            yerr=[100 * r.hit.sd for r in mine],
            marker="o",
            capsize=2,
            label=p,
        )
        b.errorbar(
            n,
            [r.p99.mean for r in mine],
            yerr=[r.p99.sd for r in mine],
            marker="o",
            capsize=2,
            label=p,
        )
    for ax, label in ((a, "served hit rate (%)"), (b, "p99 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("edge routers N")
        ax.set_ylabel(label)
    b.set_yscale("log")
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
