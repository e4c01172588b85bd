"""Tree topology files loaded by a real slurmctld (Debian's 22.05, package slurmctld):
`slurmctld -D` in a temporary directory with a generated slurm.conf, the file's nodes in
State=FUTURE, then `scontrol show topology` read back and compared with what topoctl
wrote. About a second per file. Skipped when slurmctld or scontrol are not installed."""

from __future__ import annotations

import getpass
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

from topod.export.slurm_topology import build_topology_conf, host_entry

SLURMCTLD = shutil.which("slurmctld") or shutil.which("slurmctld", path="/usr/sbin:/sbin")
SCONTROL = shutil.which("scontrol")
needs_slurmctld = pytest.mark.skipif(SLURMCTLD is None or SCONTROL is None,
                                     reason="slurmctld/scontrol not installed (Debian packages slurmctld, slurm-client)")
UUID = "5a1b0c2d-0000-4e3f-9a7b-72a000000001"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slurmctld:
    """One slurmctld on a private port and state directory, for one topology.conf."""

    def __init__(self, directory: Path, topology: str, nodes: list[str], *, plugin: str = "tree",
                 slurmctld: str | None = SLURMCTLD, scontrol: str | None = SCONTROL, extra: str = "",
                 node_state: str = "State=FUTURE"):
        self.dir, self.slurmctld, self.scontrol = directory, slurmctld, scontrol
        self.record = "SwitchName=" if plugin == "tree" else "BlockName="
        state = directory / "state"
        state.mkdir()
        host = socket.gethostname().split(".")[0]
        node_lines = "".join(f"NodeName={name} CPUs=1 {node_state}\n" for name in nodes)
        (directory / "slurm.conf").write_text(
            f"ClusterName=topodtest\nSlurmctldHost={host}\nSlurmctldPort={_free_port()}\nSlurmdPort={_free_port()}\n"
            "AuthType=auth/none\nCredType=cred/none\nMpiDefault=none\nProctrackType=proctrack/linuxproc\n"
            f"SlurmUser={getpass.getuser()}\nStateSaveLocation={state}\nSlurmctldPidFile={directory}/ctld.pid\n"
            f"SelectType=select/cons_tres\nTopologyPlugin=topology/{plugin}\nMailProg=/bin/true\nMessageTimeout=2\n"
            f"{extra}{node_lines}PartitionName=all Nodes=ALL Default=YES\n")
        (directory / "topology.conf").write_text(topology)
        self.env = {"SLURM_CONF": str(directory / "slurm.conf"), "PATH": "/usr/bin:/bin:/usr/sbin:/sbin"}
        self.log = directory / "slurmctld.log"
        self.process: subprocess.Popen | None = None

    def show_topology(self, deadline: float = 10.0) -> str:
        """Start slurmctld, return `scontrol show topology` (slurmctld stays up until stop());
        AssertionError with the log when slurmctld exits or never answers."""
        with open(self.log, "w") as log:
            self.process = subprocess.Popen([self.slurmctld, "-D", "-i"], env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, cwd=self.dir)
        end = time.monotonic() + deadline
        try:
            while time.monotonic() < end:
                time.sleep(0.2)  # a fatal config error ends slurmctld within milliseconds
                if self.process.poll() is not None:
                    raise AssertionError(f"slurmctld exited ({self.process.returncode}):\n{self.log.read_text()}")
                try:
                    result = self.run("show", "topology", timeout=3)
                except subprocess.TimeoutExpired:
                    continue  # scontrol retries a controller that is not listening yet
                if result.returncode == 0 and self.record in result.stdout:
                    return result.stdout
            raise AssertionError(f"no answer from slurmctld within {deadline} s:\n{self.log.read_text()}")
        except BaseException:
            self.stop()
            raise

    def run(self, *args: str, program: str | None = None, timeout: float = 5) -> subprocess.CompletedProcess:
        return subprocess.run([program or self.scontrol, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def expand(self, hostlist: str) -> set[str]:
        result = self.run("show", "hostnames", hostlist)
        assert result.returncode == 0, result.stderr
        return set(result.stdout.split())


def _ours(text: str) -> dict[str, dict[str, set[str]]]:
    switches: dict[str, dict[str, set[str]]] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            fields = dict(part.split("=", 1) for part in line.split())
            switches[fields["SwitchName"]] = {k: set(v.split(",")) for k, v in fields.items() if k != "SwitchName"}
    return switches


def _nodes_below(switches, name) -> set[str]:
    entry = switches[name]
    nodes = set(entry.get("Nodes", ()))
    for child in entry.get("Switches", ()):
        nodes |= _nodes_below(switches, child)
    return nodes


def assert_slurmctld_loads(tmp_path: Path, text: str, nodes: list[str]) -> str:
    """slurmctld reads the file without an error about it, and shows every switch with the
    nodes and child switches topoctl wrote."""
    ctld = Slurmctld(tmp_path, text, nodes)
    try:
        shown = ctld.show_topology()
    finally:
        ctld.stop()
    log = ctld.log.read_text()
    complaints = [line for line in log.splitlines()
                  if ("topology" in line.lower() or "switch" in line.lower()) and ("error" in line or "fatal" in line
                                                                                  or "warning" in line)]
    assert not complaints, log
    ours = _ours(text)
    theirs = {}
    for line in shown.splitlines():
        fields = dict(part.split("=", 1) for part in line.split())
        theirs[fields["SwitchName"]] = fields
    assert set(theirs) == set(ours)
    for name, entry in ours.items():
        assert ctld.expand(theirs[name]["Nodes"]) == _nodes_below(ours, name), name
        if "Switches" in entry:
            assert ctld.expand(theirs[name]["Switches"]) == entry["Switches"], name
        assert theirs[name]["Level"] == ("0" if "Nodes" in entry else theirs[name]["Level"])
    return shown


def labelled(name, **labels):
    return host_entry({"hostname": name, "cluster": labels})


# Every tree shape the unit tests and the table produce.
TREE_CASES = {
    "racks-and-leaves": [labelled("g1", rack="r1", leaf="l1"), labelled("g2", rack="r1", leaf="l1"),
                         labelled("g3", rack="r1", leaf="l2"), labelled("g4", rack="r2", leaf="l3")],
    "rack-only-beside-leaves": [labelled("g1", rack="r1", leaf="l1"), labelled("g2", rack="r1"),
                                labelled("g3", rack="r2")],
    "same-leaf-in-two-racks": [labelled("g1", rack="r1", leaf="l1"), labelled("g2", rack="r2", leaf="l1")],
    "unlabelled-and-leaf-only": [labelled("x1"), labelled("x2"), labelled("g1", leaf="r1-l1"),
                                 labelled("g2", rack="r1", leaf="l1"), labelled("g3", switch="s9")],
    "one-rack-only": [labelled("g1", rack="r1"), labelled("g2", rack="r1")],
    "hashed-names": [labelled("g1", rack="r 1,[x]", leaf="a\nb"), labelled("g2", rack="r" * 80)],
    "nvl-trays-as-tree": [host_entry({"hostname": f"nvl72-r01-t{i}", "cluster": {"rack": "r01"},
                                      "nvlink_domain": {"cluster_uuid": UUID, "clique_ids": [1]}}) for i in range(3)],
}


@needs_slurmctld
@pytest.mark.parametrize("case", sorted(TREE_CASES))
def test_slurmctld_loads_every_tree_topoctl_writes(tmp_path, case):
    hosts = TREE_CASES[case]
    text = build_topology_conf(hosts, mode="tree", slurm_version=(22, 5)).text
    assert_slurmctld_loads(tmp_path, text, [h.name for h in hosts])


@needs_slurmctld
def test_the_same_leaf_in_two_racks_stays_in_its_rack_in_slurmctld(tmp_path):
    hosts = TREE_CASES["same-leaf-in-two-racks"]
    shown = assert_slurmctld_loads(tmp_path, build_topology_conf(hosts, mode="tree").text, ["g1", "g2"])
    assert "SwitchName=rack-r2 Level=1 LinkSpeed=1 Nodes=g2 Switches=leaf-r2-l1" in shown.splitlines()


@needs_slurmctld
@pytest.mark.parametrize("text, message", [
    # what topoctl wrote before: a rack switch defined twice (once for its rack-only hosts)
    ("SwitchName=leaf-l1 Nodes=g1\nSwitchName=rack-r1 Nodes=g2\nSwitchName=rack-r1 Switches=leaf-l1\n",
     "Switch (rack-r1) has already been defined"),
    ("SwitchName=rack-r1 Nodes=g2 Switches=leaf-l1\nSwitchName=leaf-l1 Nodes=g1\n",
     "switch rack-r1 has both child switches and nodes"),
])
def test_the_check_sees_slurmctld_refuse_a_bad_tree(tmp_path, text, message):
    with pytest.raises(AssertionError, match=r"slurmctld exited"):
        try:
            assert_slurmctld_loads(tmp_path, text, ["g1", "g2"])
        except AssertionError as exc:
            assert message in str(exc)
            raise


# ---- the topoctl command: warnings, JSON and exit statuses ----------------------------

def _write(tmp_path, documents):
    paths = []
    for document in documents:
        path = tmp_path / f"{document['hostname']}.json"
        path.write_text(json.dumps(document))
        paths.append(str(path))
    return paths


def _tray(name, clique, state="completed", cluster=None):
    doc = {"hostname": name, "nvlink_domain": {"cluster_uuid": UUID, "clique_ids": [clique], "state": state}}
    if cluster:
        doc["cluster"] = cluster
    return doc


def test_topoctl_warns_of_each_tray_left_out_and_reports_them_in_json(tmp_path, capsys):
    from topod.cli.topoctl import main

    files = _write(tmp_path, [_tray(f"a{i}", 1) for i in range(2)] + [_tray("a2", 1, "in-progress")])
    assert main(["export", "slurm-topology", *files]) == 0
    captured = capsys.readouterr()
    assert "BlockSizes=2" in captured.out.splitlines()
    assert captured.err.splitlines() == ["topoctl: warning: [slurm_block_left_out] a2: fabric registration in-progress"]
    assert main(["export", "slurm-topology", "--json", *files]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["mode"], result["block_sizes"], result["left_out"][0]["host"]) == ("block", [2], "a2")


@pytest.mark.parametrize("options, status, message", [
    (["--block-sizes", "4,6"], 2, "--block-sizes '4,6': each size after the first must be the first (4) times"),
    (["--slurm-version", "24"], 2, "--slurm-version '24' is not a Slurm release"),
    (["--mode", "block", "--slurm-version", "22.05"], 2, "Slurm 22.05 has no topology/block plugin"),
    (["--mode", "tree", "--block-sizes", "2"], 2, "--block-sizes is for --mode block"),
    (["--slurm-version", "23.11", "--block-sizes", "3"], 1, "no NVLink domain has exactly 3 healthy trays"),
    (["--slurm-version", "22.05"], 1, "Slurm 22.05 has no topology/block plugin (it came in 23.11): write a tree"),
])
def test_topoctl_refuses_what_slurm_would_not_load(tmp_path, capsys, options, status, message):
    from topod.cli.topoctl import main

    files = _write(tmp_path, [_tray(f"a{i}", 1) for i in range(2)])
    assert main(["export", "slurm-topology", *options, *files]) == status
    captured = capsys.readouterr()
    assert message in captured.err and captured.out == ""
