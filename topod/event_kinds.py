"""Every event topod publishes (to the log and to GET /v1/events), by name: the one list
that `topoctl watch --event` checks a name against and the docs name. A test holds it to
the names the code publishes. Constants only, so topoctl reads it without the event bus.
"""

from __future__ import annotations

EVENT_KINDS: tuple[str, ...] = (
    # leases
    "lease_granted", "lease_released", "lease_revoked", "lease_renewed", "lease_restored", "lease_degraded",
    "lease_scope_placed", "lease_scope_stopped",
    # requests that wait, are refused or preempt
    "request_queued", "request_abandoned", "request_rejected", "preemption_requested", "preemption_cancelled",
    # the host and the daemon
    "topology_changed", "config_reloaded", "config_rejected", "config_restart_required", "loop_stalled",
    "loop_failed",
    # IRQ balancing
    "irq_moved", "irq_move_failed", "irq_unsettable", "irq_writes_impossible", "irq_writes_possible",
    # link probes
    "link_degraded", "link_recovered",
    # a subscriber too slow for the stream
    "events_dropped",
)
