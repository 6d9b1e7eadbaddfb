"""docs/CLI.md holds each command's `--help` verbatim, and every command line the docs show names
only options its command has.

- For ``xmlfix`` and every ``pcitopo`` command (dispatchers and nested commands such as
  ``pcitopo guest install-nccl-topo`` included, found by walking ``--help`` itself), docs/CLI.md
  has exactly one ```text block starting ``usage: <command>``, equal to what the installed console
  script prints for ``--help`` with ``COLUMNS=100``. scripts/cli_help.py does the walking and the
  comparing; ``make cli-doc`` rewrites stale blocks. argparse lays options out differently in
  other Python minors than the one the blocks are written with (cli_help.HELP_PYTHON); there the
  blocks' usage lines must still name exactly the live usage's options.
- A command line in a ```sh block of README.md or docs/*.md that starts with ``xmlfix`` or
  ``pcitopo SUBCOMMAND`` (after ``$ `` or ``| ``) names only options of that command's ``--help``,
  in any spelling it lists (``-o`` or ``--output``).
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from testkit import REPO

BIN = Path(sys.executable).parent
CLI_MD = REPO / "docs" / "CLI.md"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
OPTION = re.compile(r"(?<![\w./-])(--?[A-Za-z][\w-]*)")
HELP_OPTIONS = {"-h", "--help"}


def _load_cli_help():
    spec = importlib.util.spec_from_file_location("cli_help", REPO / "scripts" / "cli_help.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cli_help = _load_cli_help()


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
    return cli_help.live_helps(BIN)


def usage_options(text: str) -> set[str]:
    """The options a usage line names (the text up to its first blank line), -h aside."""
    usage = text.split("\n\n", 1)[0]
    return {o for o in OPTION.findall(usage) if o not in HELP_OPTIONS}


def spellings(text: str) -> set[str]:
    """Every spelling of every option a --help lists ("  -o FILE, --output FILE   ...")."""
    out = set(usage_options(text))
    for row in text.splitlines():
        if re.match(r"^\s+-", row):
            out |= set(OPTION.findall(re.split(r"\s{2,}", row.strip(), maxsplit=1)[0]))
    return out


def option_problems(markdown: str, helps: dict[str, str]) -> list[str]:
    """Per command: its block's usage names other options than the live usage (layout aside)."""
    blocks = cli_help.doc_blocks(markdown, set(helps))
    out = []
    for command, text in helps.items():
        spans = blocks.get(command, [])
        if len(spans) != 1:
            out.append(f"{command}: {len(spans)} usage blocks, one wanted")
            continue
        shown = usage_options(markdown[slice(*spans[0])])
        if shown != usage_options(text):
            out.append(f"{command}: the block's usage names {sorted(shown ^ usage_options(text))} differently")
    return out


def test_cli_md_holds_every_commands_help_verbatim(helps):
    text = CLI_MD.read_text()
    if sys.version_info[:2] == cli_help.HELP_PYTHON:
        problems = cli_help.problems(text, helps)
    else:
        problems = option_problems(text, helps)
    assert not problems, ("docs/CLI.md differs from --help; `make cli-doc` rewrites the blocks "
                          "(then review the diff):\n  " + "\n  ".join(problems))


def test_the_comparison_names_a_missing_a_doubled_and_a_stale_block():
    helps = {"xmlfix": "usage: xmlfix [-h] [-o FILE]\n\noptions:\n  -o FILE, --output FILE  out\n",
             "pcitopo serve": "usage: pcitopo serve [-h] [--socket SOCKET]\n",
             "pcitopo topo": "usage: pcitopo topo [-h] [--json]\n"}
    doc = ("# x\n\n```text\nusage: xmlfix [-h] [-o FILE]\n\noptions:\n  -o FILE, --output FILE  old\n```\n\n"
           "```text\nusage: pcitopo topo [-h] [--json]\n```\n\n```text\nusage: pcitopo topo [-h] [--json]\n```\n")
    assert cli_help.problems(doc, helps) == [
        "xmlfix: the block at line 4 differs from `xmlfix --help`",
        "pcitopo serve: no usage block (a ```text block starting `usage: pcitopo serve`)",
        "pcitopo topo: 2 usage blocks, one wanted",
    ]
    fixed = cli_help.refreshed(doc, helps)
    assert fixed.startswith("# x\n\n```text\n" + helps["xmlfix"] + "```\n")  # the prose around it kept
    assert [p.split(":")[0] for p in cli_help.problems(fixed, helps)] == ["pcitopo serve", "pcitopo topo"]
    assert option_problems(doc.replace("[-o FILE]", "[-o FILE] [--door D]", 1), helps)[0] == (
        "xmlfix: the block's usage names ['--door'] differently")


def test_the_walk_finds_every_command_dispatchers_and_nested_ones_included(helps):
    assert {"xmlfix", "pcitopo", "pcitopo topo", "pcitopo doctor", "pcitopo guest", "pcitopo guest install-nccl-topo",
            "pcitopo golden", "pcitopo golden make", "pcitopo golden check", "pcitopo serve"} <= set(helps)
    assert helps["pcitopo topo"].startswith("usage: pcitopo topo [-h]")
    assert {"--door", "-o", "--output", "--version"} <= spellings(helps["xmlfix"])


def command_lines(markdown: str) -> list[tuple[int, str]]:
    """(line number, command) of each xmlfix/pcitopo command in a ```sh block, comments cut."""
    out, in_sh = [], False
    for n, line in enumerate(markdown.splitlines(), 1):
        if line.startswith("```"):
            in_sh = line.strip() == "```sh" and not in_sh
            continue
        if not in_sh:
            continue
        for part in re.split(r"\|\s|&&|;|\$\(|\s--\s", line.split(" #", 1)[0]):
            words = part.strip().removeprefix("$ ").split()
            if words and words[0] in ("xmlfix", "pcitopo"):
                out.append((n, " ".join(words)))
    return out


def unknown_options(line: str, helps: dict[str, str]) -> tuple[str, list[str]]:
    words = line.split()
    command = max((c for c in helps if words[:len(c.split())] == c.split()), key=len)
    rest = " ".join(words[len(command.split()):])
    known = spellings(helps[command]) | HELP_OPTIONS
    return command, sorted({o.split("=", 1)[0] for o in OPTION.findall(rest)} - known)


def test_every_command_line_in_the_docs_names_only_options_its_command_has(helps):
    wrong, seen = [], 0
    for doc in DOCS:
        for n, line in command_lines(doc.read_text()):
            command, unknown = unknown_options(line, helps)
            seen += 1
            if unknown:
                wrong.append(f"{doc.relative_to(REPO)}:{n}: {command} has no {', '.join(unknown)}: {line}")
    assert seen > 20 and not wrong, "\n".join(wrong)


def test_the_command_line_reader_finds_a_wrong_option_after_a_pipe(helps):
    doc = "```sh\nkubectl get x | pcitopo preflight --target t --bogus -\n$ xmlfix --output o.xml d.xml\n```\n"
    found = command_lines(doc)
    assert found == [(2, "pcitopo preflight --target t --bogus -"), (3, "xmlfix --output o.xml d.xml")]
    assert unknown_options(found[0][1], helps) == ("pcitopo preflight", ["--bogus"])
    assert unknown_options(found[1][1], helps) == ("xmlfix", [])
