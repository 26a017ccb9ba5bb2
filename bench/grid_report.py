"""The scenario grid's figures: CacheRoute against the best peer, cell by cell (pure but for
the files it writes). Used by bench/arena.py --grid (live) and bench/sim_grid.py (the
simulator): rows in, per-cell deltas, a Markdown table, a CSV and heat maps out.

A cell's best peer is, at each gateway count, the peer with the highest served hit rate
there (as the arena ranks peers); its delta is CacheRoute's hit minus that peer's (pp) and
CacheRoute's TTFT p99 over that peer's.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OURS = "cacheroute"
# CacheRoute at 1 gateway within this many pp of the best peer counts as "within"
WITHIN_PP = 1.0


@dataclass(frozen=True)
class CellDelta:
    """CacheRoute against the best peer on one cell at one gateway count."""

    cell: str
    replicas: int
    ours_hit: float
    ours_p99_s: float
    peer: str
    peer_hit: float
    peer_p99_s: float

    @property
    def hit_delta_pp(self) -> float:
        return (self.ours_hit - self.peer_hit) * 100

    @property
    def p99_ratio(self) -> float:
        return self.ours_p99_s / self.peer_p99_s if self.peer_p99_s > 0 else math.nan


def cell_deltas(rows: Iterable[dict[str, Any]], ours: str = OURS) -> list[CellDelta]:
    """One `CellDelta` per (scenario, replicas) that has both CacheRoute (`ours`) and a
    peer; the best peer by hit rate (rows whose router name starts with "cacheroute" are
    CacheRoute's variants, never peers)."""
    rows = list(rows)
    out = []
    for cell, rep in dict.fromkeys((r["scenario"], int(r["replicas"])) for r in rows):
        here = [r for r in rows if r["scenario"] == cell and int(r["replicas"]) == rep]
        mine = [r for r in here if r["router"] == ours]
        peers = [r for r in here if not str(r["router"]).startswith("cacheroute")]
        if not mine or not peers:
            continue
        best = max(peers, key=lambda r: float(r["hit"]))
        out.append(CellDelta(cell, rep, float(mine[0]["hit"]), float(mine[0]["ttft_p99_s"]),
                             str(best["router"]), float(best["hit"]),
                             float(best["ttft_p99_s"])))
    return out


def grid_summary(deltas: Sequence[CellDelta]) -> dict[str, Any]:
    """The grid's acceptance figures: how many cells, how many within 1 pp at one gateway,
    ahead at four and eight, the worst one-gateway cell's hit delta and p99 ratio."""
    by = {rep: [d for d in deltas if d.replicas == rep] for rep in (1, 4, 8)}
    one = by[1]
    return {
        "cells": len({d.cell for d in deltas}),
        "cells_within_1pp_1r": sum(d.hit_delta_pp >= -WITHIN_PP for d in one),
        "cells_p99_within_1_1x_1r": sum(d.p99_ratio <= 1.1 for d in one),
        "cells_ahead_4r": sum(d.hit_delta_pp > 0 for d in by[4]),
        "cells_ahead_8r": sum(d.hit_delta_pp > 0 for d in by[8]),
        "cells_4r": len(by[4]),
        "cells_8r": len(by[8]),
        "worst_cell_hit_delta_1r_pp": round(min((d.hit_delta_pp for d in one),
                                                default=math.nan), 2),
        "worst_cell_1r": min(one, key=lambda d: d.hit_delta_pp).cell if one else "",
        "best_cell_hit_delta_1r_pp": round(max((d.hit_delta_pp for d in one),
                                               default=math.nan), 2),
        "worst_cell_p99_ratio_1r": round(max((d.p99_ratio for d in one), default=math.nan), 3),
        "worst_cell_hit_delta_4r_pp": round(min((d.hit_delta_pp for d in by[4]),
                                                default=math.nan), 2),
        "worst_cell_hit_delta_8r_pp": round(min((d.hit_delta_pp for d in by[8]),
                                                default=math.nan), 2),
    }


ROW_KEYS = ("scenario", "router", "replicas", "seed", "requests", "errors", "hit",
            "first_turn_hit", "later_turn_hit", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s",
            "imbalance", "cpu_s", "time_scale", "warmup_s", "measure_s", "rate_scale")


def write_rows_csv(rows: Sequence[dict[str, Any]], path: Path,
                   keys: Sequence[str] = ROW_KEYS) -> None:
    """Every run, one row each (floats to 4 places)."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, list(keys), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: round(r[k], 4) if isinstance(r.get(k), float) else r.get(k, "")
                        for k in keys})


def delta_lines(deltas: Sequence[CellDelta]) -> list[str]:
    """The per-cell table (Markdown), worst one-gateway cell first."""
    lines = ["| cell | gateways | CacheRoute hit | best peer | its hit | Δ hit pp | "
             "CacheRoute TTFT p99 s | peer's p99 s | p99 ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = {d.cell: d.hit_delta_pp for d in deltas if d.replicas == 1}
    for d in sorted(deltas, key=lambda d: (order.get(d.cell, 0.0), d.cell, d.replicas)):
        lines.append(f"| {d.cell} | {d.replicas} | {d.ours_hit:.1%} | {d.peer} | "
                     f"{d.peer_hit:.1%} | {d.hit_delta_pp:+.1f} | {d.ours_p99_s:.3f} | "
                     f"{d.peer_p99_s:.3f} | {d.p99_ratio:.2f} |")
    return lines


def write_deltas_csv(deltas: Sequence[CellDelta], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["cell", "replicas", "cacheroute_hit", "cacheroute_ttft_p99_s",
                    "best_peer", "best_peer_hit", "best_peer_ttft_p99_s", "hit_delta_pp",
                    "p99_ratio"])
        for d in deltas:
            w.writerow([d.cell, d.replicas, round(d.ours_hit, 4), round(d.ours_p99_s, 4),
                        d.peer, round(d.peer_hit, 4), round(d.peer_p99_s, 4),
                        round(d.hit_delta_pp, 2), round(d.p99_ratio, 3)])


def _pyplot() -> Any:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _panel(plt: Any, ax: Any, grid: list[list[float]], rows: list[str], cols: list[str],
           title: str, *, ratio: bool) -> None:
    """One heat map: green where CacheRoute is better, red where it is worse; the value in
    every square."""
    import numpy as np

    data = np.array(grid, dtype=float)
    if ratio:  # log scale around 1: 0.5x and 2x equally far
        shown, bound = np.log2(data), 1.0
        cmap = "RdYlGn_r"
    else:
        shown = data
        finite = np.abs(data[np.isfinite(data)])
        bound = max(1.0, float(finite.max()) if finite.size else 1.0)
        cmap = "RdYlGn"
    image = ax.imshow(np.ma.masked_invalid(shown), cmap=cmap, vmin=-bound, vmax=bound,
                      aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = data[i, j]
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}" if ratio else f"{v:+.1f}", ha="center",
                        va="center", fontsize=6)
    ax.set_title(title, fontsize=9)
    bar = plt.colorbar(image, ax=ax, fraction=0.04)
    bar.set_label("log2 of the ratio" if ratio else "pp", fontsize=7)


def plot_live(deltas: Sequence[CellDelta], path: Path, title: str) -> bool:
    """Heat maps of the live cells (rows) by gateway count (columns): hit delta pp and p99
    ratio. False without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    cells = list(dict.fromkeys(d.cell for d in deltas))
    reps = sorted({d.replicas for d in deltas})
    at = {(d.cell, d.replicas): d for d in deltas}
    hit = [[at[(c, r)].hit_delta_pp if (c, r) in at else math.nan for r in reps]
           for c in cells]
    p99 = [[at[(c, r)].p99_ratio if (c, r) in at else math.nan for r in reps] for c in cells]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.45 * len(cells) + 2))
    labels = [f"{r} gateway{'s' if r > 1 else ''}" for r in reps]
    _panel(plt, axes[0], hit, cells, labels, f"{title}: hit, CacheRoute − best peer (pp)",
           ratio=False)
    _panel(plt, axes[1], p99, cells, labels,
           f"{title}: TTFT p99, CacheRoute / best peer", ratio=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_grid(deltas: Sequence[CellDelta], cells: Sequence[Any], path: Path,
              title: str) -> bool:
    """Heat maps of the whole grid at one gateway count: rows tenants x prompt length,
    columns skew x turns x load; hit delta pp and p99 ratio. `cells`: the GridCells."""
    plt = _pyplot()
    if plt is None:
        return False
    at = {d.cell: d for d in deltas}
    row_keys = list(dict.fromkeys((c.tenants, c.system_tokens) for c in cells))
    col_keys = list(dict.fromkeys((c.zipf_s, c.turns, c.load) for c in cells))
    by = {((c.tenants, c.system_tokens), (c.zipf_s, c.turns, c.load)): c.name for c in cells}

    def value(r: Any, k: Any, ratio: bool) -> float:
        d = at.get(by.get((r, k), ""))
        if d is None:
            return math.nan
        return d.p99_ratio if ratio else d.hit_delta_pp

    rows = [f"{t} tenants, {p} tok" for t, p in row_keys]
    cols = [f"Zipf {z:g}, {n}, {load}" for z, n, load in col_keys]
    fig, axes = plt.subplots(2, 1, figsize=(12, 11))
    for ax, ratio, what in ((axes[0], False, "hit, CacheRoute − best peer (pp)"),
                            (axes[1], True, "TTFT p99, CacheRoute / best peer")):
        _panel(plt, ax, [[value(r, k, ratio) for k in col_keys] for r in row_keys], rows,
               cols, f"{title}: {what}", ratio=ratio)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def print_table(deltas: Sequence[CellDelta]) -> None:
    """The per-cell deltas as a readable table on stdout."""
    print(f"{'cell':<40} {'gw':>2} {'ours':>6} {'best peer':<20} {'peer':>6} {'Δ pp':>6} "
          f"{'p99 ratio':>9}")
    for d in deltas:
        print(f"{d.cell:<40} {d.replicas:>2} {d.ours_hit:>6.1%} {d.peer:<20} "
              f"{d.peer_hit:>6.1%} {d.hit_delta_pp:>+6.1f} {d.p99_ratio:>9.2f}")


def main() -> None:
    """Re-read a grid's rows (the CSV `write_rows_csv` wrote) and print its per-cell table
    and summary: what `bench/arena.py --grid` and `bench/sim_grid.py` report at their end."""
    import argparse
    import contextlib
    import json

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("rows_csv", type=Path, help="grid-live.csv or the simulator grid's rows")
    args = ap.parse_args()
    with args.rows_csv.open(newline="") as f:
        rows = [dict(r) for r in csv.DictReader(f)]
    for r in rows:  # numbers back from their text; names stay text
        for k, v in r.items():
            with contextlib.suppress(ValueError, TypeError):
                r[k] = float(v) if v and k not in ("scenario", "router") else v
    deltas = cell_deltas(rows)
    print_table(deltas)
    print(json.dumps(grid_summary(deltas)))


if __name__ == "__main__":
    main()
