"""Fault harness for the reliability suite (loopback only).

- `signals`: processes aimed at by PID (SIGKILL, SIGSTOP/SIGCONT, SIGTERM).
- `proxy`: a TCP fault proxy (latency, blackhole, reset, dropped / duplicated /
  delayed Redis pub/sub frames).
- `history`: what each router applied and samples of its decisions, and the
  checker that validates them afterwards (pure).
- `resources`: open file descriptors and resident memory of a process.

Failpoints in the planner's publish path live in `planner_svc.orchestration.failpoints`
(environment variable `CACHEROUTE_FAILPOINTS`); `planner_proc` runs a planner
in a subprocess with them.
"""
