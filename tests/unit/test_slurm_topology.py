"""topoctl export slurm-topology: blocks per NVLink clique, else a tree from [cluster]
labels; every line checked against topology.conf(5)'s grammar (slurmctld is not installed
here to parse it)."""

import re

import pytest

from topod.errors import ConfigError
from topod.export.slurm_topology import host_entry, render_topology_conf

# topology.conf(5): Key=Value pairs per line; block plugin: BlockName= Nodes=, BlockSizes=;
# tree plugin: SwitchName= with Nodes= or Switches= (and optional LinkSpeed=).
_LINE = {
    "BlockName": re.compile(r"^BlockName=[A-Za-z0-9._-]{1,64} Nodes=[A-Za-z0-9._,\[\]-]+$"),
    "BlockSizes": re.compile(r"^BlockSizes=\d+(,\d+)*$"),
    "SwitchName": re.compile(r"^SwitchName=[A-Za-z0-9._-]{1,64} (Nodes|Switches)=[A-Za-z0-9._,\[\]-]+$"),
}


def parse_topology_conf(text):
    """A parser of the documented grammar: returns {kind: [dict(key=value)]}."""
    out = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key = line.split("=", 1)[0]
        assert key in _LINE and _LINE[key].match(line), f"not topology.conf grammar: {line!r}"
        out.setdefault(key, []).append(dict(part.split("=", 1) for part in line.split()))
    return out


def doc(name, uuid=None, cliques=(), cluster=None):
    d = {"schema_version": 1, "hostname": name}
    d["nvlink_domain"] = {"cluster_uuid": uuid, "clique_ids": list(cliques)} if uuid else None
    if cluster is not None:
        d["cluster"] = cluster
    return d


def test_one_block_per_clique_with_its_nodes_and_the_base_block_size():
    hosts = [host_entry(doc(f"n{i}", "u1", [i // 2])) for i in range(4)] + [host_entry(doc("n9", "u1", [7]))]
    conf = parse_topology_conf(render_topology_conf(hosts))
    blocks = {b["BlockName"]: b["Nodes"].split(",") for b in conf["BlockName"]}
    assert sorted(blocks.values()) == [["n0", "n1"], ["n2", "n3"], ["n9"]]
    assert conf["BlockSizes"] == [{"BlockSizes": "1"}]  # the smallest block holds one node
    assert "SwitchName" not in conf


def test_same_clique_id_in_two_clusters_is_two_blocks():
    hosts = [host_entry(doc("a", "u1", [1])), host_entry(doc("b", "u2", [1]))]
    assert len(parse_topology_conf(render_topology_conf(hosts))["BlockName"]) == 2


def test_without_cliques_cluster_labels_make_a_tree():
    hosts = [host_entry(doc("g1", cluster={"rack": "r1", "leaf": "l1"})),
             host_entry(doc("g2", cluster={"rack": "r1", "leaf": "l1"})),
             host_entry(doc("g3", cluster={"rack": "r1", "leaf": "l2"})),
             host_entry(doc("g4", cluster={"rack": "r2", "leaf": "l3"}))]
    conf = parse_topology_conf(render_topology_conf(hosts))
    switches = {s["SwitchName"]: s for s in conf["SwitchName"]}
    assert switches["leaf-l1"]["Nodes"] == "g1,g2" and switches["leaf-l3"]["Nodes"] == "g4"
    assert switches["rack-r1"]["Switches"] == "leaf-l1,leaf-l2"
    assert switches["top"]["Switches"] == "rack-r1,rack-r2"
    assert "BlockName" not in conf


def test_unlabelled_hosts_share_one_switch_and_names_can_be_given():
    hosts = [host_entry({"schema_version": 1}, "x1"), host_entry(doc("x2"))]
    conf = parse_topology_conf(render_topology_conf(hosts))
    assert conf["SwitchName"] == [{"SwitchName": "unlabelled", "Nodes": "x1,x2"}]


@pytest.mark.parametrize("bad, message", [
    ({"schema_version": 1}, "no 'hostname'"),
    ({"hostname": "a b"}, "not a Slurm node name"),
    ({"hostname": "a", "nvlink_domain": {"cluster_uuid": "u", "clique_ids": "1"}}, "list of integers"),
])
def test_bad_documents_say_what_to_fix(bad, message):
    with pytest.raises(ConfigError, match=message):
        host_entry(bad)


def test_duplicate_hosts_are_refused():
    with pytest.raises(ConfigError, match="more than once"):
        render_topology_conf([host_entry(doc("a")), host_entry(doc("a"))])


def test_the_grammar_check_rejects_what_slurm_would():
    with pytest.raises(AssertionError):
        parse_topology_conf("BlockName=b0 Nodes=a b\n")
