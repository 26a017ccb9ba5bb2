"""The shadow-replay simulator: engine model, workloads, routing policies (pure, virtual time)."""
