"""`make wheelhouse` and `make install DESTDIR= PREFIX= WHEELHOUSE=`: a staged, relocatable,
offline install; a second install keeps the config; `make uninstall` removes the rest.

SLOW: about 40-60 s on a 2-core machine (one `make wheelhouse`, two staged installs, one
uninstall, all in one module-scoped run). `make wheelhouse` needs PyPI (or the configured
index) once; the installs themselves run with `pip --no-index`. Deselect with
`-k 'not install'` when iterating on something else.

PREFIX is a real path under the test's temp dir, so "relocated to PREFIX" is checked for
real: the staged tree is copied from DESTDIR$PREFIX to $PREFIX and its entry points run
through their own #! lines, with no chroot and no root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAKE = shutil.which("make")

pytestmark = pytest.mark.skipif(MAKE is None, reason="make not installed")


def _make(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MFLAGS"))}
    return subprocess.run([MAKE, "--no-print-directory", "-C", str(REPO), *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    wheelhouse, stage, prefix = base / "wheelhouse", base / "stage", base / "opt" / "topod"
    started = time.monotonic()
    built = _make("wheelhouse", f"WHEELHOUSE_DIR={wheelhouse}")
    if built.returncode != 0:
        if not _pypi_reachable():
            pytest.skip("make wheelhouse needs PyPI once and pypi.org is unreachable")
        pytest.fail(f"make wheelhouse failed:\n{built.stdout}\n{built.stderr}")
    result = _make("install", f"DESTDIR={stage}", f"PREFIX={prefix}", f"WHEELHOUSE={wheelhouse}")
    assert result.returncode == 0, result.stdout + result.stderr
    return {"wheelhouse": wheelhouse, "stage": stage, "prefix": prefix, "venv": stage / str(prefix)[1:] / "lib/topod",
            "staged_prefix": stage / str(prefix)[1:], "output": result.stdout, "seconds": time.monotonic() - started}


def test_wheelhouse_holds_topod_and_every_dependency(installed):
    wheels = {p.name.split("-")[0].lower() for p in installed["wheelhouse"].glob("*.whl")}
    for name in ("topod", "aiohttp", "psutil", "pyudev", "structlog", "prometheus_client", "nvidia_ml_py"):
        assert name in wheels, f"{name} missing from the wheelhouse: {sorted(wheels)}"


def test_entry_points_and_venv_name_prefix_never_destdir(installed):
    prefix, venv, stage = installed["prefix"], installed["venv"], str(installed["stage"])
    for tool in ("topod", "topoctl"):
        assert os.readlink(installed["staged_prefix"] / "bin" / tool) == f"{prefix}/lib/topod/bin/{tool}"
        shebang = (venv / "bin" / tool).read_text().splitlines()[0]
        assert shebang == f"#!{prefix}/lib/topod/bin/python", shebang
    cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    assert cfg["include-system-site-packages"] == "false"
    assert cfg["command"].endswith(f"-m venv {prefix}/lib/topod"), cfg["command"]
    assert Path(cfg["home"]).is_absolute() and not cfg["home"].startswith(stage)
    assert f'"{prefix}/lib/topod"' in (venv / "bin" / "activate").read_text()
    # No file of the tree (scripts, .pyc included) remembers where it was staged.
    leaks = subprocess.run(["grep", "-rlaF", stage, str(installed["stage"])], capture_output=True, text=True)
    assert leaks.stdout == "", f"files naming the staging dir:\n{leaks.stdout}"


def test_venv_uses_the_system_python3(installed):
    python = installed["venv"] / "bin" / "python"
    system = subprocess.run(["python3", "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True)
    venv = subprocess.run([str(python), "-c", "import sys; print(sys.base_prefix, sys.prefix)"],
                          capture_output=True, text=True)
    base, prefix = venv.stdout.split()
    assert base == system.stdout.strip()
    assert prefix == str(installed["venv"])  # runs where it lies, staged ...


def test_relocated_tree_runs_from_prefix_through_its_own_shebangs(installed, tmp_path):
    prefix = installed["prefix"]
    shutil.copytree(installed["staged_prefix"], prefix, symlinks=True)
    try:
        for tool in ("topoctl", "topod"):
            result = subprocess.run([str(prefix / "bin" / tool), "--version"], capture_output=True, text=True,
                                    timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin:/bin"})
            assert result.returncode == 0, result.stderr
            assert result.stdout.strip() == f"{tool} 0.1.0"
        imported = subprocess.run([str(prefix / "lib/topod/bin/python"), "-I", "-c", "import topod; print(topod.__file__)"],
                                  capture_output=True, text=True, cwd=REPO)
        assert imported.stdout.startswith(f"{prefix}/lib/topod/lib/"), imported.stdout  # ... and at PREFIX, not ./topod
    finally:
        shutil.rmtree(prefix)


def test_units_snippets_config_and_licence_are_in_place(installed):
    stage, prefix = installed["stage"], installed["prefix"]
    units = stage / "usr/lib/systemd/system"
    assert (units / "topod.socket").read_bytes() == (REPO / "systemd/topod.socket").read_bytes()
    service = (units / "topod.service").read_text()
    assert f"ExecStart={prefix}/bin/topod --config /etc/topod/topod.toml" in service
    assert "/usr/bin/topod " not in service  # PREFIX=/opt/...: the unit must not run a missing /usr/bin/topod
    assert (stage / "usr/lib/sysusers.d/topod.conf").read_bytes() == (REPO / "systemd/topod.sysusers").read_bytes()
    assert (stage / "usr/lib/tmpfiles.d/topod.conf").read_bytes() == (REPO / "systemd/topod.tmpfiles").read_bytes()
    assert (stage / "etc/topod/topod.toml").read_bytes() == (REPO / "etc/topod.toml").read_bytes()
    assert "Apache License" in (installed["staged_prefix"] / "share/doc/topod/LICENSE").read_text()
    for path in (units / "topod.service", stage / "etc/topod/topod.toml"):
        assert path.stat().st_mode & 0o777 == 0o644


def test_man_pages_and_completions_are_installed_or_reported_skipped(installed):
    out, share = installed["output"], installed["staged_prefix"] / "share"
    if "skipped: man pages" in out:
        assert not (share / "man").exists()
    else:
        pages = {p.parent.name for p in (share / "man").glob("man*/*")}
        assert {"man1", "man5", "man8"} <= pages, pages
    if "skipped: shell completions" in out:
        assert not (share / "bash-completion").exists()
    else:
        assert "topoctl" in (share / "bash-completion/completions/topoctl").read_text()
        assert (share / "zsh/vendor-completions/_topoctl").stat().st_size > 0
        assert (share / "fish/vendor_completions.d/topoctl.fish").stat().st_size > 0


def test_reinstall_keeps_config_and_repairs_code_then_uninstall_keeps_only_config_and_state(installed):
    stage, prefix, venv = installed["stage"], installed["prefix"], installed["venv"]
    config = stage / "etc/topod/topod.toml"
    config.write_text(config.read_text() + "\n# edited by the admin\n")
    package = next((venv / "lib").glob("python3*/site-packages/topod/__init__.py"))
    package.write_text("raise SystemExit('tampered')\n")  # an upgrade must replace the code
    state = stage / "var/lib/topod/leases.sqlite"
    state.parent.mkdir(parents=True)
    state.write_text("leases")

    again = _make("install", f"DESTDIR={stage}", f"PREFIX={prefix}", f"WHEELHOUSE={installed['wheelhouse']}")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "kept /etc/topod/topod.toml" in again.stdout
    assert config.read_text().endswith("# edited by the admin\n")
    assert "tampered" not in package.read_text()
    version = subprocess.run([str(venv / "bin/python"), "-I", str(venv / "bin/topoctl"), "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == "topoctl 0.1.0", version.stderr

    gone = _make("uninstall", f"DESTDIR={stage}", f"PREFIX={prefix}")
    assert gone.returncode == 0, gone.stdout + gone.stderr
    left = sorted(str(p.relative_to(stage)) for p in stage.rglob("*") if not p.is_dir())
    assert left == ["etc/topod/topod.toml", "var/lib/topod/leases.sqlite"], left
    assert config.read_text().endswith("# edited by the admin\n")
    assert not (installed["staged_prefix"] / "share/topod").exists()
    print(f"install test: {installed['seconds']:.0f} s for wheelhouse + first install")
