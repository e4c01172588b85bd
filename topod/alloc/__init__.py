"""Topology-aware GPU allocation: the pure engine (request, engine, search, cores,
policy, preemption) and the daemon's shells (leases, service)."""
