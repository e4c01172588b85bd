"""Shell completion scripts (bash, zsh, fish) generated from topoctl's parser.

`topoctl completion bash > /usr/share/bash-completion/completions/topoctl`; zsh: into a
directory of $fpath as `_topoctl`; fish: `~/.config/fish/completions/topoctl.fish`.
Every command path (topoctl, topoctl irq, topoctl irq plan, ...) completes its
subcommands, its options and the choices of options that have them.
"""

from __future__ import annotations

import argparse
import sys


def command_tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[dict]:
    """[{path, subcommands, options, choices}] for the parser and every subparser below it."""
    options: list[str] = []
    choices: dict[str, list[str]] = {}
    subcommands: dict[str, argparse.ArgumentParser] = {}
    helps: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                helps[choice.dest] = choice.help or ""
            subcommands.update(action.choices)
            continue
        for flag in action.option_strings:
            options.append(flag)
            if action.choices:
                choices[flag] = [str(c) for c in action.choices]
    entry = {"path": path, "subcommands": list(subcommands), "options": options, "choices": choices,
             "helps": helps, "option_helps": {flag: (a.help or "").replace("%%", "%")
                                              for a in parser._actions for flag in a.option_strings
                                              if a.help != argparse.SUPPRESS},
             "positional_choices": [str(c) for a in parser._actions if not a.option_strings
                                    and not isinstance(a, argparse._SubParsersAction) and a.choices
                                    for c in a.choices]}
    tree = [entry]
    for name, sub in subcommands.items():
        tree.extend(command_tree(sub, path + (name,)))
    return tree


def _words(items: list[str]) -> str:
    return " ".join(items)


def bash(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    cases = []
    for entry in command_tree(parser):
        key = " ".join(entry["path"])
        words = entry["subcommands"] + entry["options"] + entry["positional_choices"]
        prev = "".join(f"            {flag}) COMPREPLY=($(compgen -W '{_words(values)}' -- \"$cur\")); return;;\n"
                       for flag, values in entry["choices"].items())
        cases.append(f"        '{key}')\n          case \"$prev\" in\n{prev}          esac\n"
                     f"          words_='{_words(words)}';;\n")
    subs = {name for entry in command_tree(parser) for name in entry["subcommands"]}
    return f"""# bash completion for {prog} (generated from its parser: {prog} completion bash)
_{prog}() {{
    local cur prev path word i words_
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    path=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        case " {_words(sorted(subs))} " in
            *" $word "*) path="${{path:+$path }}$word";;
        esac
    done
    case "$path" in
{"".join(cases)}        *) words_='';;
    esac
    if [[ "$cur" != -* ]]; then
        case "$prev" in --output|-o|--config|--leases-file|--irq-plan-file|--root) compopt -o default; COMPREPLY=(); return;; esac
    fi
    COMPREPLY=($(compgen -W "$words_" -- "$cur"))
}}
complete -F _{prog} {prog}
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    cases = []
    for entry in command_tree(parser):
        key = " ".join(entry["path"])
        specs = []
        for name in entry["subcommands"]:
            specs.append(f"'{name}:{_zsh_quote(entry['helps'].get(name, ''))}'")
        opts = []
        for flag in entry["options"]:
            values = entry["choices"].get(flag)
            text = _zsh_quote(entry["option_helps"].get(flag, ""))
            opts.append(f"'{flag}[{text}]" + (f":value:({' '.join(values)})'" if values else "'"))
        cases.append(f"    '{key}')\n      subs=({' '.join(specs)})\n      opts=({' '.join(opts)})\n      "
                     f"pos=({' '.join(entry['positional_choices'])});;\n")
    subs = sorted({name for entry in command_tree(parser) for name in entry["subcommands"]})
    return f"""#compdef {prog}
# zsh completion for {prog} (generated from its parser: {prog} completion zsh)
_{prog}() {{
  local path_ word
  local -a subs opts pos
  path_=""
  for word in ${{words[2,CURRENT-1]}}; do
    case " {' '.join(subs)} " in
      *" $word "*) path_="${{path_:+$path_ }}$word";;
    esac
  done
  case "$path_" in
{"".join(cases)}  esac
  if [[ "$PREFIX" == -* ]]; then
    _arguments -s $opts
  elif (( ${{#subs}} )); then
    _describe -t commands 'command' subs
  elif (( ${{#pos}} )); then
    compadd -a pos
  else
    _files
  fi
}}
if [[ "$funcstack[1]" == "_{prog}" ]]; then _{prog} "$@"; else compdef _{prog} {prog}; fi
"""


def _zsh_quote(text: str) -> str:
    return text.replace("'", "'\\''").replace("[", "(").replace("]", ")").replace(":", "\\:")


def fish(parser: argparse.ArgumentParser) -> str:
    prog = parser.prog
    lines = [f"# fish completion for {prog} (generated from its parser: {prog} completion fish)",
             f"complete -c {prog} -f"]
    for entry in command_tree(parser):
        path = entry["path"]
        if path:
            condition = " && ".join([f"__fish_seen_subcommand_from {word}" for word in path])
        else:
            condition = "__fish_use_subcommand"
        below = [name for name in entry["subcommands"]]
        cond = condition
        if path and below:
            cond += " && not __fish_seen_subcommand_from " + " ".join(below)
        for name in below:
            lines.append(f"complete -c {prog} -n '{cond}' -a {name} -d {_fish_quote(entry['helps'].get(name, ''))}")
        for flag in entry["options"]:
            spec = f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}"
            values = entry["choices"].get(flag)
            extra = f" -r -a '{' '.join(values)}'" if values else ""
            lines.append(f"complete -c {prog} -n '{condition}' {spec}{extra} "
                         f"-d {_fish_quote(entry['option_helps'].get(flag, ''))}")
        if entry["positional_choices"]:
            lines.append(f"complete -c {prog} -n '{condition}' -a '{' '.join(entry['positional_choices'])}'")
    return "\n".join(lines) + "\n"


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


GENERATORS = {"bash": bash, "zsh": zsh, "fish": fish}


def run_completion(args: argparse.Namespace) -> int:
    from topod.cli.commands import build_parser

    sys.stdout.write(GENERATORS[args.shell](build_parser()))
    return 0
