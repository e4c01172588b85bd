"""doctor checks the host as well as its GPU processes: device IRQs on a lease's CPUs,
leases held while topod does not keep IRQs off them (IRQ mode off or dry-run), and
isolation off. A host in that state is not "healthy"."""

from __future__ import annotations

from topod.doctor import diagnose

LEASE = {"id": "9436932d016188cc", "owner": "train", "gpus": [0], "cpus": [0, 1, 2, 32, 33, 34], "pids": []}
ELSEWHERE = {"id": "0123456789abcdef", "owner": "train", "gpus": [4], "cpus": [20, 21, 52, 53], "pids": []}


def _health(mode: str, isolation: bool) -> dict:
    return {"status": "ok", "irq": {"mode": mode}, "isolation": {"system": isolation}}


def _codes(report) -> list[str]:  # noqa: ANN001 - DoctorReport
    return [finding.code for finding in report.host_findings]


def test_device_irqs_on_a_leases_cpus_are_a_warning_even_with_no_process_running(readonly_host):
    host, topology = readonly_host("h800-8gpu")  # a fresh host: every device IRQ on CPU 0
    report = diagnose(host, topology, leases=[LEASE], daemon_health=_health("on", True))
    assert _codes(report) == ["irqs_on_leased_cpus"]
    (finding,) = report.host_findings
    assert finding.severity == "warning" and finding.lease == LEASE["id"] and finding.evidence["hit"] == "0"
    assert "/proc/irq/" in finding.files_read[0] and "smp_affinity_list" in finding.fix
    assert not report.healthy


def test_leases_held_while_irq_balancing_is_dry_run_or_off_are_a_warning(readonly_host):
    host, topology = readonly_host("h800-8gpu")
    for mode in ("dry-run", "off"):
        report = diagnose(host, topology, leases=[ELSEWHERE], daemon_health=_health(mode, True))
        assert _codes(report) == ["irq_balancing_off"], mode
        (finding,) = report.host_findings
        assert finding.severity == "warning" and f'mode = "{mode}"' in finding.message
        assert '[irq] mode = "on"' in finding.fix and not report.healthy
    assert diagnose(host, topology, leases=[ELSEWHERE], daemon_health=_health("on", True)).healthy


def test_isolation_off_while_leases_are_held_is_advice(readonly_host):
    host, topology = readonly_host("h800-8gpu")
    report = diagnose(host, topology, leases=[ELSEWHERE], daemon_health=_health("on", False))
    assert _codes(report) == ["isolation_off"]
    assert report.host_findings[0].severity == "info" and "[isolate] system = true" in report.host_findings[0].fix
    assert report.healthy  # a choice, not a fault


def test_no_leases_or_no_daemon_means_no_setup_findings(readonly_host):
    host, topology = readonly_host("h800-8gpu")
    assert _codes(diagnose(host, topology, leases=[], daemon_health=_health("off", False))) == []
    assert _codes(diagnose(host, topology, leases=[ELSEWHERE])) == []  # --leases-file, no daemon: IRQs only
