"""README and docs/ stay short, true and about the product: their size, their words,
the generated references against the code, every command shown against topoctl's and
topod's own parsers, every path and link they name against the tree."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = [README, REPO / "CHANGELOG.md", *sorted((REPO / "docs").glob("*.md"))]
PRODUCT_PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]  # the changelog may name dates
FENCE = re.compile(r"^```([a-z]*)\n(.*?)^```", re.S | re.M)


def _generator():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _blocks(path: Path) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(path.read_text())]


def test_readme_is_read_in_five_minutes():
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines (at most 300: move the rest to docs/)"
    long = [f"{number}: {len(line)} chars" for number, line in enumerate(lines, 1) if len(line) > 100]
    assert not long, f"README.md lines over 100 characters: {long}"


@pytest.mark.parametrize("page", PRODUCT_PAGES, ids=lambda p: p.name)
def test_the_product_speaks_of_itself_only(page):
    found = [f"{number}: {line.strip()}" for number, line in enumerate(page.read_text().splitlines(), 1)
             if re.search(r"issue [0-9]|stop by stop|seed", line, re.I)]
    assert not found, f"{page.name} speaks of its own history: {found}"


@pytest.mark.parametrize("page", PRODUCT_PAGES, ids=lambda p: p.name)
def test_no_dated_runs_outside_the_changelog(page):
    found = re.findall(r"\b20\d\d-\d\d-\d\d\b", page.read_text())
    # one exception: a lease's `created` time in a command's output
    shown = [date for date in found if f"created {date}" not in page.read_text()]
    assert not shown, f"{page.name} names dates {shown}: dates belong in CHANGELOG.md"


def test_readme_keeps_the_two_commands_the_test_command_and_the_licence():
    text = README.read_text()
    commands = "\n".join(body for _, body in _blocks(README))
    assert re.search(r"^make demo\b", commands, re.M) and re.search(r"^make test\b", commands, re.M)
    assert "`make test` is the test command" in text
    ci = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), "CI runs the README's test command"
    apt = re.search(r"`apt-get`[^`]*`([^`]+)`", text.replace("\n", " "))
    assert apt, "README says what `make test` installs with apt-get"
    setup = (REPO / "scripts" / "setup.sh").read_text()
    packages = re.search(r"APT_TEST_PACKAGES=\(([^)]*)\)", setup).group(1).split()
    assert apt.group(1).split() == packages, "README lists exactly the packages make test installs"
    assert "## Licence" in text and "Apache-2.0" in text


def test_generated_references_match_the_code():
    generator = _generator()
    stale = generator.stale_pages()
    assert not stale, f"stale generated docs: {stale}; run python3 scripts/docs_reference.py"


def test_the_configuration_reference_lists_every_key_with_its_type_and_default():
    """Read back from the page, independently of the generator's own code."""
    from topod.config import SCHEMA

    generator = _generator()
    text = (REPO / "docs" / "operations.md").read_text()
    section = generator.generated_section(text, "config")
    assert section, "docs/operations.md has the generated configuration reference"
    rows: dict[tuple[str, str], tuple[str, str]] = {}
    current = None
    for line in section.splitlines():
        heading = re.match(r"^#### \[(\w+)\]$", line)
        if heading:
            current = heading.group(1)
            continue
        row = re.match(r"^\| `(\w+)` \| ([^|]+) \| `([^`]*)` \|", line)
        if row and current:
            rows[current, row.group(1)] = (row.group(2).strip(), row.group(3))
    expected = {}
    for section_name, keys in SCHEMA.items():
        assert f"#### [{section_name}]" in section, f"[{section_name}] is missing"
        for key, (kind, default) in keys.items():
            expected[section_name, key] = (generator.type_name(kind), generator.default_text(default))
    assert rows == expected


def _commands(path: Path, program: str) -> list[list[str]]:
    """The argv (after the program's name) of every command line in the page's code blocks
    that runs `program`: `$ ` prompts, `sudo`, comments, pipes and redirections stripped."""
    found = []
    for language, body in _blocks(path):
        if language not in ("", "sh", "console"):
            continue
        text = body.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.removeprefix("$ ").strip()
            words = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
            words.whitespace_split = True
            words.commenters = "#"
            try:
                tokens = list(words)
            except ValueError:
                continue
            while tokens and (tokens[0] == "sudo" or "=" in tokens[0]):
                tokens = tokens[1:]
            if not tokens or tokens[0] != program:
                continue
            argv = []
            for token in tokens[1:]:
                if token and set(token) <= set(";&|<>"):
                    break
                argv.append(token)
            found.append(argv)
    return found


def _all_commands(program: str) -> list[tuple[str, list[str]]]:
    return [(f"{page.name}: {program} {' '.join(argv)}", argv) for page in PAGES for argv in _commands(page, program)]


@pytest.mark.parametrize("where,argv", _all_commands("topoctl"), ids=[w for w, _ in _all_commands("topoctl")])
def test_every_topoctl_command_shown_is_one_topoctl_accepts(where, argv):
    from topod.cli.commands import build_parser

    try:
        build_parser().parse_args(argv)  # the whole parser: its errors are SystemExit(2)
    except SystemExit as exc:
        pytest.fail(f"{where}: topoctl refuses it (exit {exc.code})")


@pytest.mark.parametrize("where,argv", _all_commands("topod"), ids=[w for w, _ in _all_commands("topod")])
def test_every_topod_command_shown_is_one_topod_accepts(where, argv):
    from topod.service.main import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        if argv not in (["--version"], ["--help"]):
            pytest.fail(f"{where}: topod refuses it (exit {exc.code})")


def test_the_pages_show_commands_at_all():
    """The two tests above would pass on pages that lost their examples."""
    assert len(_all_commands("topoctl")) >= 20 and _all_commands("topod")


PATH_WORD = re.compile(r"`((?:topod|tests|bench|scripts|systemd|etc|docs)/[\w./*-]+)`")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_a_page_names_exists(page):
    missing = []
    for path in sorted(set(PATH_WORD.findall(page.read_text()))):
        path = path.rstrip(".")
        if not list(REPO.glob(path)):
            missing.append(path)
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", path.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_between_pages_resolves(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{page.name} links to nothing: {broken}"


def test_every_topoctl_command_has_its_reference_entry():
    from topod.cli.commands import COMMANDS

    text = (REPO / "docs" / "topoctl.md").read_text()
    assert all(f"#### topoctl {command.name}\n" in text for command in COMMANDS)
