"""A daemon started with its defaults keeps each node's first whole core for the host:
no lease gets CPU 0 or its sibling (where every IRQ and kernel thread sits on a fresh
host); `[alloc] housekeeping_cores_per_node = 0` gives them back."""

from __future__ import annotations

HOUSEKEEPING = {0, 32, 16, 48}  # h800-8gpu: the first core of node 0 and of node 1, both threads


def _held(client) -> set[int]:  # noqa: ANN001 - Client
    return {cpu for lease in client.leases() for cpu in lease["cpus"]}


def test_leases_on_a_default_daemon_never_get_the_housekeeping_cores(daemon_factory):
    client = daemon_factory(config=None).start()
    first = client.allocate(1, ttl_seconds=600)
    assert first["cpus"] and not set(first["cpus"]) & HOUSEKEEPING, first["cpus"]
    for _ in range(7):
        client.allocate(1, ttl_seconds=600)
    cpu_only = client.request("POST", "/v1/leases", {"gpus": 0, "cpus": 2, "level": "any", "ttl_seconds": 600})
    assert not set(cpu_only["cpus"]) & HOUSEKEEPING
    assert _held(client) and not _held(client) & HOUSEKEEPING


def test_zero_housekeeping_cores_lets_a_lease_take_cpu_0(daemon_factory):
    client = daemon_factory(config='[alloc]\nhousekeeping_cores_per_node = 0\n[irq]\nmode = "dry-run"\n'
                                   '[probe]\nenabled = false\n').start()
    leases = [client.allocate(1, ttl_seconds=600) for _ in range(8)]
    assert 0 in {cpu for lease in leases for cpu in lease["cpus"]}


def test_doctor_is_not_healthy_while_leases_are_held_and_irqs_are_only_planned(daemon_factory, capsys):
    from topod.cli.topoctl import main

    daemon = daemon_factory()  # [irq] mode = "dry-run"
    client = daemon.start()
    argv = ["doctor", "--socket", daemon.socket, "--root", str(daemon.root)]
    assert main(argv) == 0, capsys.readouterr()  # no lease: nothing to keep IRQs off
    capsys.readouterr()
    lease = client.allocate(1, ttl_seconds=600)
    assert main(argv) == 3
    out = capsys.readouterr().out
    assert 'irq_balancing_off: 1 lease(s) held while topod only plans IRQ placement' in out, out
    assert "isolation_off" in out and "healthy" not in out.splitlines()[-1]
    assert lease["id"]
