"""Tables and plots of a replay: Markdown, CSV and PNG (matplotlib, imported only when plotting)."""

from __future__ import annotations

import csv
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner_svc.simulator.metrics import (
    SLOS_S,
    Capacity,
    MeanSd,
    RunMetrics,
    mean_sd,
    slo_capacity,
)


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    loads: tuple[float, ...]
    hit: dict[float, MeanSd]
    imbalance: dict[float, MeanSd]
    p50: dict[float, MeanSd]
    p99: dict[float, MeanSd]
    capacity: dict[float, MeanSd]  # SLO -> capacity over seeds
    capacity_runs: dict[float, list[Capacity]]


def summarize(results: Sequence[RunMetrics]) -> list[PolicySummary]:
    """One summary per policy, in the order policies first appear in `results`."""
    by_policy: dict[str, list[RunMetrics]] = defaultdict(list)
    for r in results:
        by_policy[r.policy].append(r)
    return [_summary(name, runs) for name, runs in by_policy.items()]


def _summary(policy: str, runs: list[RunMetrics]) -> PolicySummary:
    loads = tuple(sorted({r.load_qps for r in runs}))

    def stat(field: str) -> dict[float, MeanSd]:
        return {
            load: mean_sd([getattr(r, field) for r in runs if r.load_qps == load]) for load in loads
        }

    seeds = sorted({r.seed for r in runs})
    caps: dict[float, list[Capacity]] = {}
    for slo in SLOS_S:
        caps[slo] = []
        for seed in seeds:
            mine = sorted((r for r in runs if r.seed == seed), key=lambda r: r.load_qps)
            caps[slo].append(slo_capacity([r.load_qps for r in mine], [r.p99_s for r in mine], slo))
    capacity = {
        slo: mean_sd([c.qps for c in cs], [c.censored for c in cs]) for slo, cs in caps.items()
    }
    return PolicySummary(
        policy,
        loads,
        stat("hit_rate"),
        stat("imbalance"),
        stat("p50_s"),
        stat("p99_s"),
        capacity,
        caps,
    )


def reference_load(summaries: Sequence[PolicySummary], wanted: float | None) -> float:
    """The sweep load closest to `wanted` (default: the middle of the sweep)."""
    loads = sorted({load for s in summaries for load in s.loads})
    if not loads:
        return 0.0
    if wanted is None:
        return loads[len(loads) // 2]
    return min(loads, key=lambda x: abs(x - wanted))


def main_table(summaries: Sequence[PolicySummary], ref: float) -> str:
    """The paper-style table: hit and imbalance at `ref`, capacities, p99 at `ref`."""
    head = (
        f"| policy | served hit rate @ {ref:g} QPS | imbalance max/mean @ {ref:g} | "
        + " | ".join(f"SLO capacity @ {slo:g} s (QPS)" for slo in SLOS_S)
        + f" | p99 @ {ref:g} QPS (s) |"
    )
    lines = [head, "|" + "---|" * (4 + len(SLOS_S))]
    for s in summaries:
        cells = [
            s.policy,
            s.hit[ref].label(1, 100.0) + " %" if ref in s.hit else "-",
            s.imbalance[ref].label(2) if ref in s.imbalance else "-",
            *(capacity_label(s, slo) for slo in SLOS_S),
            s.p99[ref].label(2) if ref in s.p99 else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def capacity_label(s: PolicySummary, slo: float) -> str:
    """Mean ± sd; "< lowest load" when every seed failed the lowest load."""
    cap = s.capacity[slo]
    if cap.censored == "<" and cap.mean == 0 and s.loads:
        return f"< {s.loads[0]:g}"
    return cap.label(0)


def sweep_table(summaries: Sequence[PolicySummary], field: str = "p99") -> str:
    """p99 (or another per-load field) by policy and load."""
    loads = sorted({load for s in summaries for load in s.loads})
    lines = [
        "| policy | " + " | ".join(f"{x:g} QPS" for x in loads) + " |",
        "|---|" + "---|" * len(loads),
    ]
    for s in summaries:
        values = getattr(s, field)
        scale, digits = (100.0, 1) if field == "hit" else (1.0, 2)
        cells = [values[x].label(digits, scale) if x in values else "-" for x in loads]
        lines.append(f"| {s.policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


CENSOR_NOTE = (
    "Capacity: highest swept load whose p99 meets the SLO (mean ± sd over seeds); "
    "`>=` = every swept load passed (right-censored at the sweep ceiling), "
    "`<` = even the lowest load failed (reported as 0)."
)


def write_csv(results: Sequence[RunMetrics], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(RunMetrics.__slots__))
        writer.writeheader()
        for r in results:
            writer.writerow(r.as_dict())


def plot_all(
    summaries: Sequence[PolicySummary], ref: float, out_dir: Path, stem: str
) -> list[Path]:
    """capacity bars, p99-vs-load curves, hit-vs-imbalance scatter; returns the PNG paths.
    Without matplotlib (the `plots` extra) none, with a warning: minutes of runs must not be
    lost to a missing plotting library after the tables are written."""
    try:
        import matplotlib
    except ImportError:
        warnings.warn("matplotlib is not installed (pip install 'cacheroute[plots]'): "
                      "tables and CSV written, no plots", RuntimeWarning, stacklevel=2)
        return []

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [
        _capacity_bars(plt, summaries, out_dir / f"{stem}-capacity.png"),
        _p99_curves(plt, summaries, out_dir / f"{stem}-p99-vs-load.png"),
        _hit_vs_imbalance(plt, summaries, ref, out_dir / f"{stem}-hit-vs-imbalance.png"),
    ]
    plt.close("all")
    return paths


def _capacity_bars(plt: object, summaries: Sequence[PolicySummary], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4.5))  # type: ignore[attr-defined]
    x = np.arange(len(summaries))
    width = 0.8 / len(SLOS_S)
    for j, slo in enumerate(SLOS_S):
        means = [s.capacity[slo].mean for s in summaries]
        sds = [s.capacity[slo].sd for s in summaries]
        bars = ax.bar(x + j * width, means, width, yerr=sds, capsize=3, label=f"p99 ≤ {slo:g} s")
        for b, s in zip(bars, summaries, strict=True):
            mark = s.capacity[slo].censored
            if mark:
                ax.annotate(
                    mark,
                    (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                )
    ax.set_xticks(
        x + width * (len(SLOS_S) - 1) / 2, [s.policy for s in summaries], rotation=20, ha="right"
    )
    ax.set_ylabel("SLO capacity (QPS)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _p99_curves(plt: object, summaries: Sequence[PolicySummary], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4.5))  # type: ignore[attr-defined]
    for s in summaries:
        loads = list(s.loads)
        ax.errorbar(
            loads,
            [s.p99[x].mean for x in loads],
            yerr=[s.p99[x].sd for x in loads],
            marker="o",
            capsize=2,
            label=s.policy,
        )
    for slo in SLOS_S:
        ax.axhline(slo, color="grey", lw=0.8, ls="--")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (QPS)")
    ax.set_ylabel("p99 latency (s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def _hit_vs_imbalance(
    plt: object, summaries: Sequence[PolicySummary], ref: float, path: Path
) -> Path:
    fig, ax = plt.subplots(figsize=(6, 4.5))  # type: ignore[attr-defined]
    for s in summaries:
        if ref in s.hit:
            ax.scatter(s.imbalance[ref].mean, 100 * s.hit[ref].mean, s=50)
            ax.annotate(
                s.policy,
                (s.imbalance[ref].mean, 100 * s.hit[ref].mean),
                fontsize=8,
                xytext=(4, 4),
                textcoords="offset points",
            )
    ax.set_xlabel(f"load imbalance max/mean @ {ref:g} QPS")
    ax.set_ylabel(f"served hit rate (%) @ {ref:g} QPS")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def write_report(
    results: Sequence[RunMetrics],
    out_dir: Path,
    stem: str,
    *,
    title: str,
    notes: Sequence[str] = (),
    ref_load: float | None = None,
    plots: bool = True,
) -> str:
    """Write `<stem>.md`, `<stem>.csv` and the PNGs into `out_dir`; return the Markdown."""
    summaries = summarize(results)
    ref = reference_load(summaries, ref_load)
    write_csv(results, out_dir / f"{stem}.csv")
    pngs = plot_all(summaries, ref, out_dir, stem) if plots else []
    parts = [
        f"## {title}",
        "",
        *[f"- {n}" for n in notes],
        "",
        main_table(summaries, ref),
        "",
        CENSOR_NOTE,
        "",
        "p99 latency (s) by offered load:",
        "",
        sweep_table(summaries, "p99"),
        "",
        "Served hit rate (%) by offered load:",
        "",
        sweep_table(summaries, "hit"),
        "",
    ]
    parts += [f"![{p.stem}]({p.name})" for p in pngs]
    text = "\n".join(parts) + "\n"
    (out_dir / f"{stem}.md").write_text(text)
    return text
