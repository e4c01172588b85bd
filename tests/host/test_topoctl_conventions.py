"""topoctl's conventions: no abbreviations, global options anywhere, documented exit
statuses, clean failures writing stdout, lean start-up, completions and man pages
generated from the parsers."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from topod.cli.topoctl import build_parser, main

REPO = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(REPO), TOPOD_SOCKET="/nonexistent/topod.sock")


@pytest.fixture(scope="module")
def h800(tmp_path_factory):
    from topod.hostspec import build_host, load_builtin_spec

    return str(build_host(load_builtin_spec("h800-8gpu"), tmp_path_factory.mktemp("conv") / "h800"))


def _topoctl(*argv: str, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("capture_output", "stdout" not in kwargs)
    return subprocess.run([sys.executable, "-m", "topod.cli.topoctl", *argv], env=ENV, text=True, timeout=60,
                          **kwargs)


def _parsers(parser: argparse.ArgumentParser, path: str = "topoctl"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for _, p in _parsers(parser) for a in p._actions for flag in a.option_strings
            if flag.startswith("--") and a.help != argparse.SUPPRESS}


def test_no_parser_accepts_abbreviations(h800, capsys):
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 15 and all(p.allow_abbrev is False for _, p in parsers), \
        [path for path, p in parsers if p.allow_abbrev]
    with pytest.raises(SystemExit) as exit_info:
        main(["topo", "--roo", h800])
    assert exit_info.value.code == 2 and "--roo" in capsys.readouterr().err


def test_global_options_go_before_or_after_the_command(h800, capsys):
    assert main(["--root", h800, "--json", "topo"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["topo", "--root", h800, "--json"]) == 0
    after = json.loads(capsys.readouterr().out)
    assert before == after and before["root"] == h800
    assert main(["--json", "export", "slurm-gres", "--root", h800]) == 0
    assert len(json.loads(capsys.readouterr().out)["gres"]) == 8


@pytest.mark.parametrize("argv, words", [
    (["allocate", "--gpus", "1", "--wait", "inf"], "--wait: expected a finite number of seconds"),
    (["allocate", "--gpus", "1", "--wait", "nan"], "--wait: expected a finite number of seconds"),
    (["allocate", "--gpus", "1", "--wait", "-1"], "--wait: must be from 0 to 100000000 seconds"),
    (["allocate", "--gpus", "1", "--ttl", "1e300"], "--ttl: must be from 0 to 100000000 seconds"),
    (["renew", "abc", "--ttl=-inf"], "--ttl: expected a finite number of seconds"),
    (["irq", "plan", "--interval", "1e300"], "--interval: must be from 0 to 100000000 seconds"),
    (["doctor", "--irq-interval", "inf"], "--irq-interval: expected a finite number of seconds"),
    (["watch", "--count", "-5"], "--count: must be >= 0"),
    (["allocate", "--gpus", "1", "--must-include", "1,,2"], "--must-include: expected comma-separated GPU"),
])
def test_numbers_no_timer_can_take_are_usage_errors_not_tracebacks(argv, words, capsys):
    """argparse's float takes inf, nan and 1e300; time.sleep and socket timeouts then
    raise OverflowError. Each is refused as a usage error, status 2, one line."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_must_include_takes_indices_addresses_and_uuids_and_a_huge_wait_fits_a_socket_timeout(monkeypatch):
    from topod.cli.commands import build_parser as build
    from topod.client import MAX_WAIT_TIMEOUT_SECONDS, Client

    args = build(["allocate"]).parse_args(["allocate", "--gpus", "2", "--must-include", "0, 0000:13:00.0,GPU-3ea6"])
    assert args.must_include == [0, "0000:13:00.0", "GPU-3ea6"]
    sent = {}
    monkeypatch.setattr(Client, "request", lambda self, method, path, body=None, timeout=None: sent.update(
        body=body, timeout=timeout) or {})
    Client("/nonexistent.sock").allocate(1, wait=1e300)
    assert sent["timeout"] == MAX_WAIT_TIMEOUT_SECONDS and sent["body"]["wait"] == 1e300


def test_an_output_file_that_cannot_be_written_is_one_line_naming_it(h800, tmp_path):
    for argv in (["snapshot", str(tmp_path / "no" / "x.tar.gz")],
                 ["topo", "--format", "dot", "--output", str(tmp_path / "no" / "x.dot")]):
        done = _topoctl(*argv, "--root", h800)
        lines = [line for line in done.stderr.splitlines() if not line.startswith("topoctl: root ")]
        assert done.returncode == 1 and lines == [f"topoctl: {argv[-1]}: No such file or directory"], done.stderr
    assert not (tmp_path / "no").exists()


def test_root_on_a_daemon_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--root", "/x", "leases"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "reads no host root" in err
    assert err.startswith("usage: topoctl [-h]")


def test_no_daemon_is_exit_status_75_in_one_line():
    done = _topoctl("leases", "--socket", "/nonexistent/topod.sock")
    assert done.returncode == 75
    assert done.stderr.splitlines() == ["topoctl: cannot reach topod at /nonexistent/topod.sock: No such file or directory"]


def test_host_commands_say_there_is_no_daemon_and_go_on(h800):
    done = _topoctl("export", "slurm-gres", "--root", h800)
    assert done.returncode == 0 and "Name=gpu" in done.stdout
    assert done.stderr.splitlines() == [f"topoctl: root {h800}; no daemon at /nonexistent/topod.sock "
                                        "(not running): host view only, no leases"]


def test_a_reader_that_goes_away_ends_topoctl_silently_with_141(h800):
    """As `| head` ends a coreutils tool: no word on stderr, the status a shell gives SIGPIPE."""
    process = subprocess.Popen([sys.executable, "-m", "topod.cli.topoctl", "topo", "--root", h800],
                               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()  # like `| head -0`: the reader is gone before the first write
    err = process.stderr.read()
    assert process.wait(timeout=60) == 141
    assert [line for line in err.splitlines() if not line.startswith("topoctl: root ")] == [], err
    process = subprocess.Popen([sys.executable, "-m", "topod.cli.topoctl", "topo", "--root", h800, "--json"],
                               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    process.stdout.close()
    err = process.stderr.read()
    assert process.wait(timeout=60) == 141
    assert all(json.loads(line).get("code") != "stdout_closed" for line in err.splitlines())
    assert "Traceback" not in err and "Exception ignored" not in err and "closed early" not in err


def _on_a_terminal(*argv: str) -> str:
    """topoctl's stdout and stderr on a pseudo-terminal: what a user's terminal receives."""
    import pty

    controller, terminal = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "topod.cli.topoctl", *argv], env=ENV, stdout=terminal,
                               stderr=terminal)
    os.close(terminal)
    received = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the last writer closed its end
            break
        if not chunk:
            break
        received += chunk
    os.close(controller)
    process.wait(timeout=60)
    return received.decode("utf-8", "replace")


def test_control_characters_from_a_hostile_tree_never_reach_a_terminal_raw(tmp_path, h800):
    """A captured tree can name a network interface with an ESC sequence, a BEL, a
    carriage return; on a terminal they are shown escaped, in a pipe they stay exact."""
    root = tmp_path / "evil"
    shutil.copytree(h800, root, symlinks=True)
    net = next(path for path in root.glob("sys/devices/**/net/*") if path.is_dir())
    net.rename(net.with_name("ev\x1b[31mRED\x07\rxx\x9bil"))
    shown = _on_a_terminal("topo", "--root", str(root))
    assert "ev\\x1b[31mRED\\x07\\x0dxx\\x9bil" in shown, shown[-2000:]
    assert not any(ch in shown for ch in "\x1b\x07\x9b")
    piped = subprocess.run([sys.executable, "-m", "topod.cli.topoctl", "topo", "--root", str(root)], env=ENV,
                           capture_output=True, timeout=60)
    assert "ev\x1b[31mRED\x07\rxx\x9bil".encode() in piped.stdout


def test_an_error_message_echoing_input_is_escaped_on_a_terminal():
    shown = _on_a_terminal("topo", "--root", "/nonexistent/\x1b]0;title\x07")
    assert "\\x1b]0;title\\x07" in shown and "\x1b" not in shown and "\x07" not in shown


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_is_one_line_and_status_1(h800):
    with open("/dev/full", "w") as full:
        done = _topoctl("topo", "--root", h800, stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == "topoctl: writing standard output: No space left on device"
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


def test_json_output_is_one_write(h800, monkeypatch):
    class Counting(io.StringIO):
        writes = 0

        def write(self, text):
            Counting.writes += 1
            return super().write(text)

    out = Counting()
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["topo", "--root", h800, "--json"]) == 0
    assert Counting.writes == 1 and json.loads(out.getvalue())["schema_version"] == 1


def test_start_up_imports_only_the_chosen_command(h800):
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "topod.cli.topoctl", "topo", "--root", h800,
                           "--json"], env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert "topod.cli.topo_cmd" in imported
    for module in ("topod.cli.lease_cmd", "topod.cli.export_cmd", "topod.cli.doctor_cmd", "topod.cli.irq_cmd",
                   "topod.cli.links_cmd", "topod.cli.completion", "http.client", "topod.client", "socket",
                   # dataclasses compiles every class's methods at import (~1 ms each) and brings
                   # inspect and ast: the topology path is built from topod.record instead.
                   "dataclasses", "inspect", "ast", "pathlib", "typing", "urllib.parse", "ipaddress"):
        assert module not in imported, module


ONE_COMMAND_LINES = [
    ["topo", "--root", "/x", "--json"], ["--json", "topo"], ["--root", "/x", "topo", "--format", "dot"],
    ["allocate", "--gpus", "2", "--cpus-per-gpu", "4", "--wait", "3"], ["release", "abc"],
    ["--socket", "/s", "leases"], ["irq", "plan", "--interval", "2"], ["export", "slurm-gres"],
    ["watch", "--count", "3"], ["run", "--gpus", "1", "--", "true"], ["completion", "bash"],
]


@pytest.mark.parametrize("argv", ONE_COMMAND_LINES)
def test_a_command_line_parses_with_only_its_command_exactly_as_with_every_command(argv):
    from topod.cli.commands import build_parser as parser_for

    lean = parser_for(argv)
    [action] = [a for a in lean._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(action.choices) == {argv[[i for i, t in enumerate(argv) if t in action.choices][0]]}
    assert vars(lean.parse_args(argv)) == vars(parser_for(argv, every_command=True).parse_args(argv)) \
        == vars(build_parser().parse_args(argv))


@pytest.mark.parametrize("argv", [["--bogus", "topo"], ["topo", "--json", "stray"], ["leases", "0123", "extra"]])
def test_a_top_level_error_is_told_by_the_whole_parser_listing_every_command(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert err == capsys.readouterr().err  # word for word the whole parser's error
    assert "usage: topoctl" in err and "unrecognized arguments" in err


def test_top_level_help_before_a_command_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help", "topo"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    for command in ("topo", "allocate", "release", "doctor", "completion"):
        assert f"    {command}" in out, command
    with pytest.raises(SystemExit):
        main(["topo", "--help"])  # after the command: that command's help
    assert "usage: topoctl topo" in capsys.readouterr().out


def test_a_misspelt_option_is_named_as_unrecognized(capsys):
    for argv in (["allocate", "--gpu", "2"], ["run", "--gpu", "2", "--", "true"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and "unrecognized arguments: --gpu" in err and "required" not in err


def test_help_documents_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for fragment in ("0 success", "2 usage", "3 not found", "75 temporary failure"):
        assert fragment in out


# -- completions -----------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completion_completes_commands_options_and_choices(tmp_path, capsys):
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "topoctl.bash"
    script.write_text(capsys.readouterr().out)

    def complete(*words: str) -> list[str]:
        array = " ".join(f"'{w}'" for w in ("topoctl", *words))
        done = subprocess.run(["bash", "-c", f"source {script}; COMP_WORDS=({array}); "
                               f"COMP_CWORD={len(words)}; _topoctl; printf '%s\\n' \"${{COMPREPLY[@]}}\""],
                              capture_output=True, text=True, check=True)
        return done.stdout.split()

    assert complete("irq", "pl") == ["plan"]
    assert complete("topo", "--format", "") == ["text", "json", "dot", "svg", "png"]
    assert set(complete("export", "nrt", "--le")) == {"--leased-gpus", "--leased-cpus"}
    assert "--event" in complete("watch", "--")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_completions_name_every_option(shell, capsys):
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    names = _options(build_parser())
    if shell == "fish":
        missing = [o for o in names if f"-l {o[2:]}" not in script]
    else:
        missing = [o for o in names if f"'{o}[" not in script]
    assert not missing
    checker = shutil.which(shell)
    if checker:
        flag = ["-n"] if shell == "zsh" else ["--no-execute"]
        subprocess.run([checker, *flag], input=script, text=True, check=True)


# -- man pages ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    from topod.cli.manpages import write_pages

    return {path.name: path for path in write_pages(tmp_path_factory.mktemp("man"))}


def _render(path: Path) -> str:
    if shutil.which("groff") is None:
        pytest.skip("groff not installed")
    done = subprocess.run(["groff", "-man", "-Tutf8", "-ww", str(path)], capture_output=True, text=True,
                          env=dict(os.environ, GROFF_NO_SGR="1"))
    assert done.returncode == 0 and done.stderr == "", done.stderr  # -ww: any warning is a failure
    return re.sub(r".\x08", "", done.stdout).replace("\u2010", "-").replace("\u2212", "-")


def test_topoctl_1_is_valid_roff_listing_every_command_and_option(pages):
    text = _render(pages["topoctl.1"])
    parser = build_parser()
    assert not [o for o in _options(parser) if o not in text]
    for path, _ in _parsers(parser):
        assert path in text, path
    assert "EXIT STATUS" in text and "75" in text and "TOPOD_SOCKET" in text


def test_topod_8_lists_every_daemon_option(pages):
    from topod.service.main import build_parser as topod_parser

    text = _render(pages["topod.8"])
    options = {flag for a in topod_parser()._actions for flag in a.option_strings if flag.startswith("--")}
    assert options >= {"--root", "--socket", "--state-dir", "--check-config"}
    assert not [o for o in options if o not in text]


def test_topod_toml_5_lists_every_key_with_its_documented_comment(pages):
    from topod.config import SCHEMA

    text = _render(pages["topod.toml.5"])
    for section, keys in SCHEMA.items():
        assert f"[{section}]" in text
        for key in keys:
            assert re.search(rf"^\s+{re.escape(key)} = ", text, re.M), f"{section}.{key}"
    assert "lease database (SQLite, WAL)" in text  # a comment from etc/topod.toml


@pytest.mark.skipif(shutil.which("man") is None, reason="man not installed")
def test_man_reads_the_generated_pages(pages):
    for path in pages.values():
        done = subprocess.run(["man", "-l", str(path)], capture_output=True, text=True,
                              env=dict(os.environ, MANPAGER="cat", PAGER="cat", MANWIDTH="100"))
        assert done.returncode == 0 and "NAME" in done.stdout, done.stderr


# A real command line ends its process at once (topoctl._end_process: no interpreter
# teardown); these say what that keeps: exit handlers, all the output, the exit status.
_COMMAND_LINE = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
from topod.cli.topoctl import main
sys.argv[1:] = {argv!r}
sys.exit(main())
"""


def _as_command_line(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _COMMAND_LINE.format(argv=list(argv))], env=ENV,
                          capture_output=True, text=True, timeout=60)


def test_a_command_line_ends_with_all_its_output_its_exit_handlers_and_its_status(h800, capsys):
    done = _as_command_line("topo", "--root", h800, "--json")
    assert done.returncode == 0, done.stderr
    assert main(["topo", "--root", h800, "--json"]) == 0  # in-process: main returns, the process goes on
    assert done.stdout == capsys.readouterr().out  # every byte of the document, through the pipe
    assert json.loads(done.stdout)["gpus"]
    assert done.stderr.splitlines()[-1] == "exit handler ran"


def test_a_failing_command_line_keeps_its_documented_status(tmp_path):
    done = _as_command_line("topo", "--root", str(tmp_path / "missing"), "--json")
    assert done.returncode == 1  # not_a_host_tree: README's status 1
    assert json.loads(done.stderr.splitlines()[-2])["code"] == "not_a_host_tree"
    assert done.stderr.splitlines()[-1] == "exit handler ran"
