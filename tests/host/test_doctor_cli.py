"""`topoctl doctor` end to end on fixture hosts: text, --json, exit status, lease selection."""

import json

import pytest

from topod.cli.doctor_cmd import EXIT_FINDINGS
from topod.cli.topoctl import build_parser, main
from topod.hostspec.doctor_scene import build_demo


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The README's demo host, built once: these tests only read it."""
    root = tmp_path_factory.mktemp("doctor-cli") / "h800-8gpu"
    build_demo(root)
    return root


def test_doctor_finds_the_misplaced_rank_and_exits_nonzero(demo, capsys):
    assert main(["doctor", "--root", str(demo)]) == EXIT_FINDINGS
    out = capsys.readouterr().out
    assert "8 process(es) using GPUs" in out
    assert "ERROR   gpu_remote_cpu: pid 4130" in out and "fix:  taskset -a -pc" in out
    assert out.count("ok: threads and memory") == 7


def test_doctor_json_is_machine_readable(demo, capsys):
    assert main(["doctor", "--root", str(demo), "--json", "--pid", "4130"]) == EXIT_FINDINGS
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1 and doc["healthy"] is False
    assert doc["counts"] == {"error": 2, "warning": 0, "info": 0}
    process = doc["processes"][0]
    assert process["pid"] == 4130 and process["gpus"] == [{"index": 3, "numa_node": 0}]
    finding = process["findings"][0]
    assert set(finding) == {"severity", "code", "pid", "lease", "message", "evidence", "fix", "files_read"}
    assert finding["code"] == "gpu_remote_cpu" and isinstance(finding["files_read"], list)


def test_a_healthy_rank_exits_zero(demo, capsys):
    assert main(["doctor", "--root", str(demo), "--pid", "4100"]) == 0
    assert "healthy" in capsys.readouterr().out


def test_lease_selects_its_processes_from_a_leases_file(demo, tmp_path, capsys):
    leases = tmp_path / "leases.json"
    leases.write_text(json.dumps([{"id": "L7", "owner": "alice", "gpus": [0], "cpus": [], "pids": [4100]}]))
    assert main(["doctor", "--root", str(demo), "--lease", "L7", "--leases-file", str(leases), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [p["pid"] for p in doc["processes"]] == [4100] and doc["processes"][0]["lease"] == "L7"


def test_lease_without_lease_data_says_where_to_get_it(demo, capsys):
    assert main(["doctor", "--root", str(demo), "--lease", "L1"]) == 1
    assert "--lease needs lease data" in capsys.readouterr().err


def test_unknown_lease_names_the_known_ones(demo, tmp_path, capsys):
    leases = tmp_path / "leases.json"
    leases.write_text(json.dumps([{"id": "L7", "owner": "a", "gpus": [], "cpus": [], "pids": []}]))
    assert main(["doctor", "--root", str(demo), "--lease", "L8", "--leases-file", str(leases)]) == 1
    assert "no lease 'L8'; known: L7" in capsys.readouterr().err


@pytest.mark.parametrize("content,complaint", [("{not json", "not JSON"), ('{"id": "L1"}', "expected a JSON list")])
def test_bad_leases_file_is_named(demo, tmp_path, capsys, content, complaint):
    leases = tmp_path / "leases.json"
    leases.write_text(content)
    assert main(["doctor", "--root", str(demo), "--leases-file", str(leases)]) == 1
    assert complaint in capsys.readouterr().err


def test_irq_interval_samples_rates(demo, capsys):
    assert main(["doctor", "--root", str(demo), "--json", "--irq-interval", "0.01"]) == EXIT_FINDINGS
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert not any("IRQ rates not sampled" in note for note in notes)


def test_topoctl_parser_accepts_doctor_when_wired():
    # topoctl imports topod.cli.doctor_cmd by name: the module must register cleanly.
    args = build_parser().parse_args(["doctor", "--root", "/x", "--pid", "1", "--pid", "2", "--json"])
    assert args.pid == [1, 2] and args.json


def test_a_gpu_process_whose_placement_cannot_be_read_is_not_called_ok(demo, tmp_path, capsys):
    """No finding is "ok" only when doctor could see where the process runs; a process with
    nothing readable but its open /dev/nvidia0 is reported as not checked."""
    import shutil

    root = tmp_path / "host"
    shutil.copytree(demo, root, symlinks=True)
    proc = root / "proc" / "4100"
    for part in proc.iterdir():
        if part.name != "fd":
            shutil.rmtree(part) if part.is_dir() and not part.is_symlink() else part.unlink()
    (proc / "stat").write_text("garbage\n")
    assert main(["doctor", "--root", str(root), "--pid", "4100"]) == 0
    out = capsys.readouterr().out
    assert "not checked: none of its threads' CPUs, allowed CPUs or memory could be read" in out
    assert "ok: threads" not in out and out.rstrip().endswith("— 1 process(es) not checked")
    assert main(["doctor", "--root", str(root), "--pid", "4100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unchecked_processes"] == 1 and doc["processes"][0]["placement_known"] is False
    assert main(["doctor", "--root", str(demo), "--pid", "4100", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["unchecked_processes"] == 0 and doc["processes"][0]["placement_known"] is True
