"""Every command synopsis in README.md names exactly the options of that command's `--help` usage.

What counts as a synopsis (the rule README.md follows):
- a line inside a ```sh block that starts with ``xmlfix`` or ``pcitopo SUBCOMMAND`` (nested:
  ``pcitopo guest install-nccl-topo``) and, outside its ``#`` comment, holds a ``[`` or an
  all-capitals placeholder (``FILE``, ``PATH``, ``BDF``); a line of concrete lowercase values
  (``xmlfix --check --sysfs node.tar.gz ...``) is an example and is not compared;
- all synopsis lines of one command together name every option of its usage line (``-h`` aside),
  each in one of the spellings its --help lists (``-o`` or ``--output``), and no other option;
- placeholders, brackets, grouping (``[--json | --tree]``) and order are free;
- every command (``xmlfix`` and each ``pcitopo`` subcommand, found from ``--help``) has one.

A failure lists every command whose synopsis differs, with the options missing or unknown and
the README line, so a new option is one edit of README.md away.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testkit import REPO

BIN = Path(sys.executable).parent
README = REPO / "README.md"
OPTION = re.compile(r"(?<![\w./-])(--?[A-Za-z][\w-]*)")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]+\b")
HELP_OPTIONS = {"-h", "--help"}


@dataclass
class Usage:
    """One command's --help: the options of its usage line, and each option's spellings."""

    command: str
    line: str
    options: set[str]
    spellings: dict[str, str] = field(default_factory=dict)  # any spelling -> the usage line's

    def canonical(self, option: str) -> str | None:
        return self.spellings.get(option, option if option in self.options else None)


def help_text(command: str) -> str:
    words = command.split()
    env = dict(os.environ, COLUMNS="1000")
    r = subprocess.run([str(BIN / words[0]), *words[1:], "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, (command, r.stderr)
    return r.stdout


def usage_of(command: str) -> tuple[Usage, list[str]]:
    """The command's usage and its subcommands (``{a,b} ...`` in the usage line)."""
    text = help_text(command)
    line = " ".join(text.split("\n\n", 1)[0].split()).removeprefix("usage: ")
    subs = re.search(r"\{([\w,-]+)\}( \.\.\.)?$", line)  # a dispatcher's last word: its subcommands
    options = {o for o in OPTION.findall(line) if o not in HELP_OPTIONS}
    usage = Usage(command, line, options)
    for row in text.splitlines():  # "  -o FILE, --output FILE   help": the spellings of one option
        if re.match(r"^\s+-", row):
            spelled = OPTION.findall(re.split(r"\s{2,}", row.strip(), maxsplit=1)[0])
            shown = next((s for s in spelled if s in options), None)
            for s in spelled:
                if shown:
                    usage.spellings[s] = shown
    return usage, [f"{command} {s}" for s in subs.group(1).split(",")] if subs else []


def all_usages() -> dict[str, Usage]:
    """xmlfix and every pcitopo command that takes options of its own (dispatchers left out)."""
    out: dict[str, Usage] = {}
    todo = ["xmlfix", "pcitopo"]
    while todo:
        usage, subs = usage_of(todo.pop(0))
        if subs:
            todo += subs
        else:
            out[usage.command] = usage
    return out


def synopses(readme: str, commands: set[str]) -> dict[str, list[tuple[int, str]]]:
    """command -> (line number, line) of each synopsis line of README text (the module's rule)."""
    out: dict[str, list[tuple[int, str]]] = {}
    in_sh = False
    for n, line in enumerate(readme.splitlines(), 1):
        if line.startswith("```"):
            in_sh = line.strip() == "```sh" and not in_sh
            continue
        code = line.split(" #", 1)[0].strip()
        words = code.split()
        only_options = all(OPTION.fullmatch(w) for w in words[1:])
        if not in_sh or not (PLACEHOLDER.search(code) or "[" in code or only_options):
            continue
        command = max((c for c in commands if words[:len(c.split())] == c.split()), key=len, default=None)
        if command:
            out.setdefault(command, []).append((n, code))
    return out


def synopsis_problems(readme: str, usages: dict[str, Usage]) -> list[str]:
    """One line per command whose synopsis lines differ from its --help usage."""
    found = synopses(readme, set(usages))
    problems = []
    for command, usage in sorted(usages.items()):
        lines = found.get(command)
        if not lines:
            problems.append(f"{command}: no synopsis in README.md; its usage: {usage.line}")
            continue
        named = {o for _, text in lines for o in OPTION.findall(text[len(command):])}
        unknown = sorted(o for o in named if usage.canonical(o) is None and o not in HELP_OPTIONS)
        missing = sorted(usage.options - {usage.canonical(o) for o in named})
        where = "README.md line " + ", ".join(str(n) for n, _ in lines)
        if missing:
            problems.append(f"{command}: the synopsis lacks {', '.join(missing)} ({where})")
        if unknown:
            problems.append(f"{command}: the synopsis names {', '.join(unknown)}, which `{command} --help` does not have ({where})")
    return problems


def test_every_readme_synopsis_names_exactly_the_options_of_its_help_usage():
    problems = synopsis_problems(README.read_text(), all_usages())
    assert not problems, "README.md's synopses differ from --help:\n  " + "\n  ".join(problems)


def test_the_comparison_names_the_missing_and_the_unknown_option_and_the_command_without_a_synopsis():
    usages = {"xmlfix": Usage("xmlfix", "xmlfix [-h] [-o FILE] [--door {plugin,hook}] DOMAIN.xml|-", {"-o", "--door"},
                              {"-o": "-o", "--output": "-o", "--door": "--door"}),
              "pcitopo serve": Usage("pcitopo serve", "pcitopo serve [-h] [--socket SOCKET]", {"--socket"})}
    readme = ("```sh\nxmlfix [--output FILE] [--dor plugin|hook] DOMAIN.xml|-   # a comment with --door\n"
              "xmlfix --door hook --sysfs node.tar.gz domain.xml\n```\n")
    assert synopsis_problems(readme, usages) == [
        "pcitopo serve: no synopsis in README.md; its usage: pcitopo serve [-h] [--socket SOCKET]",
        "xmlfix: the synopsis lacks --door (README.md line 2)",
        "xmlfix: the synopsis names --dor, which `xmlfix --help` does not have (README.md line 2)",
    ]


def test_the_usage_reader_finds_every_command_and_an_options_spellings():
    usages = all_usages()
    assert {"xmlfix", "pcitopo topo", "pcitopo doctor", "pcitopo guest install-nccl-topo", "pcitopo serve"} <= set(usages)
    assert "pcitopo" not in usages and "pcitopo guest" not in usages  # dispatchers: no options of their own
    assert {"--door", "-o", "--version"} <= usages["xmlfix"].options
    assert usages["xmlfix"].canonical("--output") == "-o"
