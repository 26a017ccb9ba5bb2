import sys, time
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/bench')
from learning import *
from planner_svc.control.q_cap_probe import ProbeSettings
from planner_svc.simulator.policies import PolicyContext
scenario, seed, scale, run_s, start = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
model = ReplicaModel(kv_capacity_tokens=KV_TOKENS).time_scaled(TIME_SCALE)
base = SCENARIOS[scenario]
sc = base.scaled(sessions_per_s=base.sessions_per_s * scale / TIME_SCALE)
pop = population(sc, seed)
cfg = ProbeSettings(low=start/4, high=start*4, settle_s=16, measure_s=float(sys.argv[8]), rest_s=120, quiet=float(sys.argv[6]), margin=float(sys.argv[7]))
fac = gateway_like(start, W, rate_window_s=RATE_WINDOW_S, q_cap_probe=cfg, q_cap_probe_slo_s=SLO_S)
held = []
def f(ctx):
    p = fac(ctx); held.append(p); return p
t0=time.time()
r = simulate_sessions(pop, sessions(pop, run_s), f, model=model, n_destinations=ENGINES, until_s=run_s, control_interval_s=4.0*TIME_SCALE)
p = held[0]
print(f"{scenario} seed {seed} x{scale} start {start}: {time.time()-t0:.0f}s wall")
for t, q in p.q_cap_trace: print(f"  {t:7.0f} {q:.3g}")
print("final base", p.probe.base, p.probe.last)
import numpy as np
for a in range(0, int(run_s), 150):
    m=(r.sent_s>=a)&(r.sent_s<a+150)
    print(f"  [{a},{a+150}) p99 {np.percentile(r.ttft_s[m],99):.2f}")
