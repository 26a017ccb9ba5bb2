import sys
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/bench')
from learning import *
import numpy as np
from planner_svc.control.q_cap_probe import fleet_score
scenario, seed, scale, q = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
run_s = 600.0
model = ReplicaModel(kv_capacity_tokens=KV_TOKENS).time_scaled(TIME_SCALE)
base = SCENARIOS[scenario]
sc = base.scaled(sessions_per_s=base.sessions_per_s * scale / TIME_SCALE)
pop = population(sc, seed)
r = simulate_sessions(pop, sessions(pop, run_s), gateway_like(q, W, rate_window_s=RATE_WINDOW_S), model=model, n_destinations=ENGINES, until_s=run_s, control_interval_s=16.0)
first = r.sent_s + r.ttft_s
scores = []
for a in np.arange(WARMUP_S, run_s, 16.0):
    m = (first >= a) & (first < a + 16)
    p99 = [np.percentile(r.ttft_s[m & (r.dest == d)], 99) for d in range(ENGINES) if (m & (r.dest == d)).any()] if hasattr(r,'destination') else []
    s = fleet_score(p99, SLO_S) if p99 else None
    if s is not None: scores.append(s)
m = r.sent_s >= WARMUP_S
print(f"{scenario} seed {seed} x{scale} q {q}: p99 {np.percentile(r.ttft_s[m],99):.2f} mean ttft {r.ttft_s[m].mean():.3f} hit {r.hit_rate(WARMUP_S):.3f} score mean {np.mean(scores):.3f} sd {np.std(scores):.3f} n {len(scores)}")
