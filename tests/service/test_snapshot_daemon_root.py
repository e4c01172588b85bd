"""`topoctl snapshot` captures what the serving daemon reads: its root (GET /v1/health
"root") when one answers, else --root or /; the root taken is said on stderr."""

from __future__ import annotations

import json
import tarfile

from topod.cli.topoctl import main


def _names(archive) -> set[str]:  # noqa: ANN001 - Path
    with tarfile.open(archive) as tar:
        return set(tar.getnames())


def test_snapshot_without_root_captures_the_daemons_root(daemon_factory, capsys, tmp_path):
    daemon = daemon_factory("h800-8gpu")
    daemon.start()
    out = tmp_path / "cap.tar.gz"
    assert main(["snapshot", str(out), "--socket", daemon.socket, "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["root"] == str(daemon.root)  # not /
    (note,) = [json.loads(line) for line in captured.err.splitlines()]
    assert note["root"] == str(daemon.root) and note["daemon"] is True
    names = _names(out)
    assert "cap/nvml.json" in names  # the fixture's, which / does not have
    assert any(name.startswith("cap/sys/bus/pci/devices/") for name in names)

    # The capture is the daemon's host: eight GPUs, as the daemon counts them.
    extracted = tmp_path / "x"
    with tarfile.open(out) as tar:
        tar.extractall(extracted, filter="tar")
    assert main(["topo", "--root", str(extracted / "cap"), "--json", "--socket", str(tmp_path / "none")]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 8


def test_snapshot_root_given_wins_over_the_daemons(daemon_factory, host_tree, capsys, tmp_path):
    daemon = daemon_factory("h800-8gpu")
    daemon.start()
    other = host_tree("pcie-8gpu")
    out = tmp_path / "other.tar.gz"
    assert main(["snapshot", str(out), "--socket", daemon.socket, "--root", str(other)]) == 0
    captured = capsys.readouterr()
    assert f"from root {other}" in captured.out
    assert f"serves {daemon.root}, not {other}" in captured.err


def test_snapshot_without_a_daemon_says_so_and_captures_the_root_given(host_tree, capsys, tmp_path):
    root = host_tree("pcie-8gpu")
    out = tmp_path / "alone.tar.gz"
    assert main(["snapshot", str(out), "--root", str(root), "--socket", str(tmp_path / "none.sock")]) == 0
    captured = capsys.readouterr()
    assert f"from root {root}" in captured.out
    assert "no daemon at" in captured.err and "host view only" in captured.err
    assert "alone/nvml.json" in _names(out)
