"""IRQs written for real: topod in continuous mode on a two-node guest's kernel.

What a file tree cannot show: the kernel refuses managed vectors (EIO), applies a write
to effective_affinity_list on its own schedule, and reads back what it actually took."""

from __future__ import annotations

import re

from guest import NODE_CPUS
from livetier import affinities, api, interrupt_names, irq_report, journal, now_usec, topology, wait_cycles

CONFIG = "/etc/topod/topod.toml"
NVME_QUEUE = re.compile(r"^nvme\d+q([1-9]\d*)$")  # I/O queues: the kernel manages their affinity


def _devices(guest, kind: str) -> list[dict]:
    return [d for d in topology(guest)["pci_devices"] if d["kind"] == kind]


def _entries(report: dict) -> dict[int, dict]:
    return {entry["irq"]: entry for entry in report["irqs"]}


def test_the_guest_has_two_nodes_and_a_node_local_nvme_and_nic_on_each(guest):
    # The layout every other test relies on, as topod discovered it.
    body = topology(guest)
    nodes = {node["id"]: sorted(node["cpus"]) for node in body["numa_nodes"]}
    assert nodes == {0: [0, 1], 1: [2, 3]}, nodes
    for kind in ("nvme", "nic"):
        placed = sorted((d["numa_node"], tuple(d["local_cpus"])) for d in _devices(guest, kind))
        assert placed == [(0, (0, 1)), (1, (2, 3))], (kind, placed)


def test_every_movable_nvme_vector_is_on_its_devices_node_spread_and_reads_back_as_planned(guest):
    report = wait_cycles(guest, 1)
    devices = {d["address"]: d for d in _devices(guest, "nvme")}
    kernel = affinities(guest)
    movable = [e for e in report["irqs"] if e["device"] in devices and e["status"] not in ("managed", "refused")]
    assert movable, f"no movable NVMe vector in the plan: {[e['name'] for e in report['irqs']]}"
    per_device: dict[str, list[int]] = {}
    for entry in movable:
        node_cpus = set(NODE_CPUS[devices[entry["device"]]["numa_node"]])
        assert entry["planned"] and set(entry["planned"]) <= node_cpus, entry
        requested, _ = kernel[entry["irq"]]
        # read back from the kernel: what the plan says, not merely "a write happened"
        assert list(requested) == entry["planned"], (entry, requested)
        per_device.setdefault(entry["device"], []).extend(entry["planned"])
    for address, cpus in per_device.items():
        # spread: no CPU of the node takes a second vector while another has none
        counts = [cpus.count(cpu) for cpu in NODE_CPUS[devices[address]["numa_node"]]]
        assert max(counts) - min(counts) <= 1 or len(cpus) < len(counts), (address, cpus)


def test_vectors_topod_leaves_keep_the_affinity_they_had_before_it_started(guest):
    report = wait_cycles(guest, 1)
    kernel = affinities(guest)
    left = [e for e in report["irqs"] if e["planned"] is None]
    assert left, "the plan leaves nothing alone (the root disk's and legacy IRQs should be left)"
    for entry in left:
        irq = entry["irq"]
        if irq in guest.affinity_before and irq in kernel:
            assert kernel[irq][0] == guest.affinity_before[irq][0], (entry, guest.affinity_before[irq], kernel[irq])
    # Ethernet vectors: either left (policy leave) or placed on their NIC's node, never elsewhere.
    nics = {d["address"]: d for d in _devices(guest, "nic")}
    for entry in report["irqs"]:
        if entry["device"] in nics and entry["planned"] is not None:
            assert set(kernel[entry["irq"]][0]) <= set(NODE_CPUS[nics[entry["device"]]["numa_node"]]), entry


def test_managed_nvme_queue_vectors_are_classified_once_and_never_retried(guest):
    names = interrupt_names(guest)
    queues = {irq for irq, name in names.items() if NVME_QUEUE.match(name)}
    assert queues, f"no NVMe I/O queue vectors in /proc/interrupts: {sorted(set(names.values()))}"
    since = now_usec(guest)
    report = wait_cycles(guest, 3, timeout=600)  # three more full cycles: a loop would show
    entries = _entries(report)
    managed = {irq for irq in queues if entries.get(irq, {}).get("status") == "managed"}
    # The kernel spreads these itself: topod either never planned a change (they already sit
    # where it would put them) or learned EIO once. Either way none is retrying or failed.
    for irq in queues:
        assert entries.get(irq, {}).get("status") not in ("failed", "retrying"), entries.get(irq)
    unsettable = journal(guest, "TOPOD_EVENT=irq_unsettable")
    per_irq: dict[int, int] = {}
    for entry in unsettable:
        per_irq[int(entry.get("TOPOD_IRQ", -1))] = per_irq.get(int(entry.get("TOPOD_IRQ", -1)), 0) + 1
    for irq in managed:
        assert per_irq.get(irq) == 1, f"IRQ {irq} ({names[irq]}) announced {per_irq.get(irq, 0)} times"
        errnos = {e.get("TOPOD_ERRNO") for e in unsettable if int(e.get("TOPOD_IRQ", -1)) == irq}
        assert errnos == {"EIO"}, errnos
    again = [e for e in journal(guest, "TOPOD_EVENT=irq_unsettable", since=since)]
    failed = journal(guest, "TOPOD_EVENT=irq_move_failed", since=since)
    assert again == [] and failed == [], (again, failed)
    health = api(guest, "GET", "/v1/health")[1]
    print(f"\nlive: {len(queues)} NVMe I/O queue vectors, {len(managed)} refused once with EIO "
          f"(the rest already where topod would put them); health irq: {health.get('irq')}")


def test_a_lagging_effective_affinity_is_pending_not_a_failure(guest):
    # The ACPI SCI is an IO-APIC line: on x86 its move waits for its next interrupt, and an
    # idle guest raises none, so effective_affinity_list lags for as long as we look.
    names = interrupt_names(guest)
    acpi = next((irq for irq, name in names.items() if name == "acpi"), None)
    assert acpi is not None, f"no 'acpi' IRQ in /proc/interrupts: {names}"
    before = affinities(guest)[acpi]
    target = 3 if before[1] != (3,) else 2
    original = guest.sh(f"cat {CONFIG}", check=True).stdout
    try:
        guest.sh(f"sed -i 's/^\\[irq.irq_overrides\\].*/&\\n{acpi} = \"{target}\"/' {CONFIG}", check=True)
        assert f'{acpi} = "{target}"' in guest.sh(f"cat {CONFIG}").stdout
        since = now_usec(guest)  # before the reload: its full cycle may come before the next command
        guest.sh("systemctl reload topod.service", check=True)
        report = guest.wait_until(lambda: (r := irq_report(guest)) and _entries(r).get(acpi, {}).get("planned") == [target]
                                  and _entries(r)[acpi]["status"] != "planned" and r,
                                  f"IRQ {acpi} planned on CPU {target}", 300, 3)
        requested, effective = affinities(guest)[acpi]
        assert requested == (target,), (requested, effective)
        entry = _entries(report)[acpi]
        if effective is not None and target not in effective:
            assert entry["status"] in ("pending", "unchanged"), entry
        else:
            assert entry["status"] in ("moved", "unchanged", "pending"), entry
        report = wait_cycles(guest, 2, timeout=300)
        entry = _entries(report)[acpi]
        assert entry["status"] not in ("failed", "retrying", "refused", "managed"), entry
        assert journal(guest, "TOPOD_EVENT=irq_move_failed", since=since) == []
        # The reload reached the running balancer: nothing it had learned (the managed
        # NVMe queues' EIO) is written and announced again.
        assert journal(guest, "TOPOD_EVENT=irq_unsettable", since=since) == []
        moved = journal(guest, "TOPOD_EVENT=irq_moved", f"TOPOD_IRQ={acpi}", since=since)
        assert len(moved) == 1, [e.get("MESSAGE") for e in moved]  # written once, not every cycle
        print(f"\nlive: IRQ {acpi} (acpi) written {target}, effective {effective} "
              f"({'lagging: pending' if effective and target not in effective else 'moved at once'})")
    finally:
        guest.exec(["/bin/sh", "-c", f"cat > {CONFIG}"], stdin=original)
        guest.sh("systemctl reload topod.service")
        # topod leaves the line alone again: give it back the affinity it had before
        guest.sh(f"echo {','.join(map(str, before[0]))} > /proc/irq/{acpi}/smp_affinity_list")
