"""Each NUMA node keeps its first whole core(s) for housekeeping by default: never
leased, every hyper-thread of them, never an isolated core, never a node's last core."""

from __future__ import annotations

import types

from topod.alloc.housekeeping import housekeeping_cpus
from topod.config import load_config, parse_config


def test_the_default_keeps_one_whole_core_per_node(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    assert load_config(None).get("alloc", "housekeeping_cores_per_node") == 1
    kept = housekeeping_cpus(topology, 1)
    assert kept == {0, 32, 16, 48}  # CPU 0 and its sibling on node 0, CPU 16 and its sibling on node 1
    for node in topology.numa_nodes:
        assert min(node.cpus) in kept
    assert all(set(topology.cpu(c).siblings) <= kept for c in kept)


def test_more_cores_zero_cores_and_a_nodes_last_core(readonly_host):
    _, topology = readonly_host("nps4-8gpu")
    assert len(housekeeping_cpus(topology, 2)) == 4 * 2 * 2
    assert housekeeping_cpus(topology, 0) == frozenset()
    _, small = readonly_host("vm-nogpu")  # one node of 4 CPUs
    assert housekeeping_cpus(small, 1) == {0}
    cores = {tuple(small.cpu(c).physical_core) for c in small.online_cpus}
    assert len(housekeeping_cpus(small, 99)) == sum(len(c) for c in cores) - len(max(cores))  # one core left


def test_an_isolated_first_core_is_passed_over(readonly_host):
    _, topology = readonly_host("h800-8gpu")
    isolated = {0, 32}
    cpus = {c.id: types.SimpleNamespace(physical_core=c.physical_core, isolated=c.id in isolated, nohz_full=False)
            for c in topology.cpus}
    changed = types.SimpleNamespace(numa_nodes=topology.numa_nodes, cpu=cpus.get)
    kept = housekeeping_cpus(changed, 1)
    assert not kept & isolated and {1, 33} <= kept


def test_the_key_is_checked_by_the_one_schema():
    assert parse_config("[alloc]\nhousekeeping_cores_per_node = 0\n").get("alloc", "housekeeping_cores_per_node") == 0
    import pytest

    from topod.errors import ConfigError

    with pytest.raises(ConfigError, match="housekeeping_cores_per_node"):
        parse_config("[alloc]\nhousekeeping_cores_per_node = -1\n")
