"""topoctl export slurm-topology, pure: which trays make blocks and of what size, what each
Slurm version accepts, and trees whose switches are unique and scoped by their rack. Every
file is checked against topology.conf(5)'s grammar here; tests/host/test_slurm_slurmctld.py
loads the tree files into a real slurmctld."""

import re

import pytest

from topod.errors import ConfigError
from topod.export.slurm_topology import (base_block_size, build_topology_conf, host_entry, parse_block_sizes,
                                         parse_slurm_version, render_topology_conf)

# topology.conf(5): Key=Value pairs per line; block plugin: BlockName= Nodes=, BlockSizes=
# (24.05+) or BlockLevels= (23.11); tree plugin: SwitchName= with Nodes= or Switches=, never both.
_NAMES = r"[A-Za-z0-9._-]{1,64}(,[A-Za-z0-9._-]{1,64})*"
_LINE = {
    "BlockName": re.compile(rf"^BlockName=[A-Za-z0-9._-]{{1,64}} Nodes={_NAMES}$"),
    "BlockSizes": re.compile(r"^BlockSizes=\d+(,\d+)*$"),
    "BlockLevels": re.compile(r"^BlockLevels=\d+(,\d+)*$"),
    "SwitchName": re.compile(rf"^SwitchName=[A-Za-z0-9._-]{{1,64}} (Nodes|Switches)={_NAMES}$"),
}
UUID = "5a1b0c2d-0000-4e3f-9a7b-72a000000001"


def parse_topology_conf(text):
    """A parser of the documented grammar: returns {kind: [dict(key=value)]}; a name defined
    twice fails as slurmctld does."""
    out = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key = line.split("=", 1)[0]
        assert key in _LINE and _LINE[key].match(line), f"not topology.conf grammar: {line!r}"
        out.setdefault(key, []).append(dict(part.split("=", 1) for part in line.split()))
    for kind in ("BlockName", "SwitchName"):
        names = [entry[kind] for entry in out.get(kind, [])]
        assert len(names) == len(set(names)), f"{kind} defined twice: {names}"
    return out


def doc(name, uuid=None, cliques=(), cluster=None, state="completed", gpus=None, others=()):
    d = {"schema_version": 1, "hostname": name}
    d["nvlink_domain"] = ({"cluster_uuid": uuid, "clique_ids": list(cliques), "state": state,
                           "other_cluster_uuids": list(others)} if uuid else None)
    if cluster is not None:
        d["cluster"] = cluster
    if gpus is not None:
        d["gpus"] = gpus
    return d


def trays(prefix, count, clique, uuid=UUID, **kw):
    return [host_entry(doc(f"{prefix}{i}", uuid, [clique], **kw)) for i in range(count)]


def blocks_of(conf):
    return {b["BlockName"]: b["Nodes"].split(",") for b in conf["BlockName"]}


# ---- blocks ---------------------------------------------------------------------------

def test_cliques_of_4_4_2_give_base_4_and_leave_the_partial_domain_out():
    hosts = trays("nvl-a", 4, 1) + trays("nvl-b", 4, 2) + trays("nvl-c", 2, 3)
    result = build_topology_conf(hosts)
    conf = parse_topology_conf(result.text)
    assert conf["BlockSizes"] == [{"BlockSizes": "4"}]  # not 2: a 4-node job stays in one domain
    assert sorted(blocks_of(conf).values()) == [[f"nvl-a{i}" for i in range(4)], [f"nvl-b{i}" for i in range(4)]]
    assert [(n.host, n.code) for n in result.notes] == [("nvl-c0", "slurm_block_left_out"),
                                                         ("nvl-c1", "slurm_block_left_out")]
    assert "fewer than the base block size 4" in result.notes[0].reason
    assert "# left out: nvl-c0: its NVLink domain has 2 healthy trays" in result.text
    assert "SwitchName" not in conf


@pytest.mark.parametrize("sizes, base", [([4, 4, 2], 4), ([18, 18, 16], 18), ([2, 4, 4, 2, 2], 2),
                                         ([4, 2], 4), ([1, 1, 3], 3), ([1, 1], None)])
def test_the_base_block_is_the_common_domain_size_the_larger_on_a_tie(sizes, base):
    assert base_block_size(sizes) == base


def test_a_tray_still_registering_is_left_out_by_name_and_does_not_shrink_the_blocks():
    hosts = trays("a", 3, 1) + [host_entry(doc("a3", UUID, [1], state="in-progress"))] + trays("b", 4, 2)
    result = build_topology_conf(hosts)
    conf = parse_topology_conf(result.text)
    # clique 1 has three healthy trays: fewer than the common 4, so it is left out too
    assert blocks_of(conf) == {"nvl-5a1b0c2d-2": ["b0", "b1", "b2", "b3"]}
    reasons = {n.host: n.reason for n in result.notes}
    assert reasons["a3"] == "fabric registration in-progress"
    assert "3 healthy trays" in reasons["a0"]


def test_a_degraded_tray_and_a_gpu_outside_the_domain_are_left_out():
    def gpus(health="ok", joined=True):
        fabric = {"cluster_uuid": UUID, "clique_id": 1, "state": "completed", "health": health}
        return [{"index": 0, "fabric": fabric}, {"index": 1, "fabric": fabric if joined else None}]

    hosts = [host_entry(doc(f"t{i}", UUID, [1], gpus=gpus())) for i in range(2)]
    hosts += [host_entry(doc("sick", UUID, [1], gpus=gpus(health="degraded-bandwidth"))),
              host_entry(doc("half", UUID, [1], gpus=gpus(joined=False)))]
    result = build_topology_conf(hosts)
    assert blocks_of(parse_topology_conf(result.text)) == {"nvl-5a1b0c2d-1": ["t0", "t1"]}
    assert {n.host: n.reason for n in result.notes} == {
        "sick": "fabric health degraded-bandwidth on GPU 0", "half": "GPU 1 has not joined the NVLink domain"}


def test_a_tray_split_across_cliques_is_left_out_instead_of_forcing_block_size_1():
    hosts = trays("a", 2, 1) + trays("b", 2, 2) + [host_entry(doc("split", UUID, [1, 2]))]
    result = build_topology_conf(hosts)
    conf = parse_topology_conf(result.text)
    assert conf["BlockSizes"] == [{"BlockSizes": "2"}]
    assert "split" not in str(conf["BlockName"])
    assert [(n.host, n.reason) for n in result.notes] == [("split", "GPUs split across cliques 1,2")]


def test_a_tray_in_two_nvlink_clusters_is_left_out():
    hosts = trays("a", 2, 1) + [host_entry(doc("odd", UUID, [1], others=["77777777-0000-0000-0000-000000000000"]))]
    result = build_topology_conf(hosts)
    assert result.notes[0].host == "odd" and "2 NVLink clusters" in result.notes[0].reason


def test_hosts_without_a_domain_are_ordinary_nodes_named_in_a_comment():
    result = build_topology_conf(trays("a", 2, 1) + [host_entry(doc("login1"))])
    assert "# not in any NVLink domain (ordinary nodes, no block): login1" in result.text
    assert result.notes == ()  # not a tray: nothing to warn about


def test_a_lone_tray_is_not_a_block():
    hosts = trays("a", 2, 1) + trays("solo", 1, 9)
    result = build_topology_conf(hosts)
    assert list(blocks_of(parse_topology_conf(result.text)).values()) == [["a0", "a1"]]
    assert result.notes[0].reason == "the only healthy tray of its NVLink domain (no multi-node block)"


def test_a_domain_larger_than_the_base_is_listed_with_a_comment_on_bigger_jobs():
    result = build_topology_conf(trays("a", 2, 1) + trays("b", 2, 2) + trays("c", 4, 3))
    assert sorted(len(v) for v in blocks_of(parse_topology_conf(result.text)).values()) == [2, 2, 4]
    assert "# more than the base 2: a job of 3-4 nodes may be spread over several blocks" in result.text


def test_no_healthy_domain_is_an_error_naming_the_trays():
    hosts = [host_entry(doc("a0", UUID, [1], state="in-progress")), host_entry(doc("a1", UUID, [1, 2]))]
    with pytest.raises(ConfigError, match=r"no healthy multi-node NVLink domain.*a0: fabric registration "
                                          r"in-progress; a1: GPUs split.*--mode tree"):
        build_topology_conf(hosts)


def test_the_operator_sets_block_sizes():
    hosts = trays("a", 4, 1) + trays("b", 4, 2) + trays("c", 2, 3)
    conf = parse_topology_conf(render_topology_conf(hosts, block_sizes=(2,)))
    assert conf["BlockSizes"] == [{"BlockSizes": "2"}] and len(conf["BlockName"]) == 3
    conf = parse_topology_conf(render_topology_conf(hosts, block_sizes=(4, 8)))
    assert conf["BlockSizes"] == [{"BlockSizes": "4,8"}] and len(conf["BlockName"]) == 2
    with pytest.raises(ConfigError, match="no NVLink domain has 8 or more healthy trays .domain sizes: 4, 2."):
        build_topology_conf(hosts, block_sizes=(8,))


def test_slurm_23_11_gets_block_levels_and_blocks_of_one_size_only():
    hosts = trays("a", 4, 1) + trays("b", 4, 2) + trays("c", 8, 3) + trays("d", 2, 4)
    result = build_topology_conf(hosts, slurm_version=(23, 11))
    conf = parse_topology_conf(result.text)
    assert "BlockSizes" not in conf and conf["BlockLevels"] == [{"BlockLevels": "0"}]
    assert {len(v) for v in blocks_of(conf).values()} == {4}
    left = {n.host: n.reason for n in result.notes}
    assert set(left) == {f"c{i}" for i in range(8)} | {"d0", "d1"}
    assert "Slurm 23.11 needs blocks of one size" in left["c0"]
    assert parse_topology_conf(render_topology_conf(hosts, slurm_version=(23, 11), block_sizes=(4, 16)))[
        "BlockLevels"] == [{"BlockLevels": "0,2"}]
    with pytest.raises(ConfigError, match="no NVLink domain has exactly 3 healthy trays"):
        build_topology_conf(hosts, slurm_version=(23, 11), block_sizes=(3,))


def test_slurm_24_05_and_later_get_block_sizes():
    for version in ((24, 5), (24, 11), (25, 11), None):
        assert "BlockSizes=2" in render_topology_conf(trays("a", 2, 1), slurm_version=version).splitlines()


def test_a_slurm_without_the_block_plugin_is_refused_for_blocks_and_gets_trees():
    with pytest.raises(ConfigError, match="Slurm 22.05 has no topology/block plugin .it came in 23.11.*--mode tree"):
        build_topology_conf(trays("a", 2, 1), slurm_version=(22, 5))
    text = render_topology_conf(trays("a", 2, 1, cluster={"rack": "r1"}), slurm_version=(22, 5), mode="tree")
    assert parse_topology_conf(text)["SwitchName"] == [{"SwitchName": "rack-r1", "Nodes": "a0,a1"}]


def test_same_clique_id_in_two_clusters_is_two_blocks_with_distinct_names():
    hosts = trays("a", 2, 1, uuid="aaaaaaaa-0000-0000-0000-000000000001") + \
        trays("b", 2, 1, uuid="aaaaaaaa-0000-0000-0000-000000000002") + \
        trays("c", 2, 1, uuid="cccccccc-0000-0000-0000-000000000003")
    names = set(blocks_of(parse_topology_conf(render_topology_conf(hosts))))
    assert names == {"nvl-aaaaaaaa-0000-0000-0000-000000000001-1", "nvl-aaaaaaaa-0000-0000-0000-000000000002-1",
                     "nvl-cccccccc-1"}


@pytest.mark.parametrize("text, sizes", [("4", (4,)), ("4,8,32", (4, 8, 32)), ("1,2", (1, 2))])
def test_block_sizes_slurm_accepts(text, sizes):
    assert parse_block_sizes(text) == sizes


@pytest.mark.parametrize("text, message", [
    ("", "node counts separated by commas"), ("four", "node counts"), ("0", "positive"), ("-2", "positive"),
    ("4,12", "power of two"), ("4,6", "power of two"), ("8,4", "power of two"), ("4,4", "power of two"),
    ("1,65536", "power of two"),
])
def test_block_sizes_slurm_would_exit_on_are_refused(text, message):
    with pytest.raises(ValueError, match=message):
        parse_block_sizes(text)


@pytest.mark.parametrize("text, version", [("22.05", (22, 5)), ("23.11.10", (23, 11)), ("24.05", (24, 5))])
def test_slurm_versions(text, version):
    assert parse_slurm_version(text) == version


@pytest.mark.parametrize("text", ["24", "24.13", "v24.05", "latest", "2024.05"])
def test_bad_slurm_versions_say_the_form(text):
    with pytest.raises(ValueError, match=r"YY\.MM"):
        parse_slurm_version(text)


# ---- trees ----------------------------------------------------------------------------

def labelled(name, **labels):
    return host_entry(doc(name, cluster=labels))


def switches_of(text):
    return {s["SwitchName"]: s for s in parse_topology_conf(text)["SwitchName"]}


def test_leaves_are_scoped_by_their_rack_and_racks_joined_by_top():
    hosts = [labelled("g1", rack="r1", leaf="l1"), labelled("g2", rack="r1", leaf="l1"),
             labelled("g3", rack="r1", leaf="l2"), labelled("g4", rack="r2", leaf="l1")]
    switches = switches_of(render_topology_conf(hosts))
    assert switches["leaf-r1-l1"]["Nodes"] == "g1,g2" and switches["leaf-r2-l1"]["Nodes"] == "g4"
    assert switches["rack-r1"]["Switches"] == "leaf-r1-l1,leaf-r1-l2"
    assert switches["rack-r2"]["Switches"] == "leaf-r2-l1"  # g4 is not merged into rack r1's l1
    assert switches["top"]["Switches"] == "rack-r1,rack-r2"


def test_rack_only_hosts_beside_leaves_get_their_own_switch_under_the_rack():
    hosts = [labelled("g1", rack="r1", leaf="l1"), labelled("g2", rack="r1"), labelled("g3", rack="r2")]
    text = render_topology_conf(hosts)
    switches = switches_of(text)  # the parser fails on a switch defined twice
    assert switches["rack-r1-nodes"] == {"SwitchName": "rack-r1-nodes", "Nodes": "g2"}
    assert switches["rack-r1"]["Switches"] == "leaf-r1-l1,rack-r1-nodes"
    assert switches["rack-r2"]["Nodes"] == "g3"  # a rack without leaves holds its hosts itself
    assert "# rack=r1, hosts without a leaf label" in text.splitlines()


def test_unlabelled_hosts_are_reported_and_kept_under_one_switch():
    hosts = [host_entry({"schema_version": 1}, "x1"), host_entry(doc("x2")), labelled("g1", rack="r1")]
    result = build_topology_conf(hosts)
    switches = switches_of(result.text)
    assert switches["unlabelled"]["Nodes"] == "x1,x2"
    assert switches["top"]["Switches"] == "rack-r1,unlabelled"
    assert [(n.code, n.host) for n in result.notes] == [("slurm_host_unlabelled", "x1"),
                                                         ("slurm_host_unlabelled", "x2")]


def test_a_leaf_without_rack_hangs_off_top_and_names_never_collide():
    # rack r1 + leaf l1 and a leaf labelled "r1-l1" alone would both read leaf-r1-l1
    hosts = [labelled("g1", rack="r1", leaf="l1"), labelled("g2", leaf="r1-l1")]
    text = render_topology_conf(hosts)
    switches = switches_of(text)
    leaves = sorted(name for name in switches if name.startswith("leaf-r1-l1-"))
    assert len(leaves) == 2 and all(re.fullmatch(r"leaf-r1-l1-[0-9a-f]{8}", n) for n in leaves)
    assert "# leaf=r1-l1 (no rack label)" in text and "# leaf=l1 rack=r1" in text


def test_labels_slurm_cannot_take_are_hashed_and_a_newline_never_adds_a_line():
    hosts = [labelled("g1", rack="r 1,[x]", leaf="a\nSwitchName=evil Nodes=g1"), labelled("g2", rack="r" * 80)]
    text = render_topology_conf(hosts)
    switches = switches_of(text)  # every line, comments aside, is grammar
    assert "evil" not in switches and len(switches) == 4  # a leaf, two racks, top: nothing injected
    assert all(len(name) <= 64 and re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in switches)
    assert r"# leaf=a\nSwitchName=evil Nodes=g1 rack=r 1,[x]" in text.splitlines()


def test_the_switch_key_is_a_leaf_label_too():
    switches = switches_of(render_topology_conf([labelled("g1", rack="r1", switch="s7")]))
    assert switches["leaf-r1-s7"]["Nodes"] == "g1"


def test_block_sizes_in_tree_mode_are_refused():
    with pytest.raises(ConfigError, match="a tree has no block sizes"):
        build_topology_conf([labelled("g1", rack="r1")], mode="tree", block_sizes=(2,))


def test_auto_mode_picks_blocks_when_a_host_has_a_domain_else_a_tree():
    assert build_topology_conf(trays("a", 2, 1)).mode == "block"
    assert build_topology_conf([labelled("g1", rack="r1")]).mode == "tree"
    assert build_topology_conf(trays("a", 2, 1, cluster={"rack": "r1"}), mode="tree").mode == "tree"


# ---- documents ------------------------------------------------------------------------

@pytest.mark.parametrize("bad, message", [
    ({"schema_version": 1}, "no 'hostname'"),
    ({"hostname": "a b"}, "not a Slurm node name"),
    ({"hostname": "a", "nvlink_domain": {"cluster_uuid": "u", "clique_ids": "1"}}, "list of integers"),
    ({"hostname": "a", "cluster": ["rack"]}, "'cluster' must be an object"),
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
    with pytest.raises(AssertionError, match="defined twice"):
        parse_topology_conf("SwitchName=rack-r1 Nodes=a\nSwitchName=rack-r1 Switches=leaf-x\n")
