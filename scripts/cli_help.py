"""Keep docs/CLI.md's usage blocks equal to the commands' own `--help`.

docs/CLI.md holds, for ``xmlfix`` and every ``pcitopo`` command (dispatchers and nested commands
such as ``pcitopo guest install-nccl-topo`` included), one fenced ``text`` block whose first line
is ``usage: <command> ...``: the command's ``--help`` output, byte for byte, as the installed
console script prints it with ``COLUMNS=100``. The commands are found by walking ``--help``
itself (``{a,b}`` in a usage line names subcommands), so a new command is missed by no one.

    python3 scripts/cli_help.py docs/CLI.md            # check: exit 1 naming each stale or missing block
    python3 scripts/cli_help.py --write docs/CLI.md    # rewrite the stale blocks in place (make cli-doc)

Run it with the interpreter of the environment that has the console scripts (``.venv/bin/python``):
the scripts are looked up beside it. argparse's layout differs between Python minors (3.13 prints
``-o, --output FILE`` where 3.11 prints ``-o FILE, --output FILE``); the blocks are written with
HELP_PYTHON, the Python of the Debian 12 machine ``make test`` runs on.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

COLUMNS = "100"
HELP_PYTHON = (3, 11)
ROOTS = ("pcitopo", "xmlfix")
FENCE = "```text\n"


def help_text(command: str, bin_dir: Path) -> str:
    """``<command> --help`` as the console script prints it at COLUMNS columns, without colour."""
    words = command.split()
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "PYTHON_COLORS")}
    env.update(COLUMNS=COLUMNS, NO_COLOR="1")
    r = subprocess.run([str(bin_dir / words[0]), *words[1:], "--help"], capture_output=True, text=True,
                       env=env, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{command} --help exited {r.returncode}: {r.stderr.strip()}")
    return r.stdout


def subcommands(command: str, text: str) -> list[str]:
    """The subcommands a dispatcher's usage names (``{a,b,c}``), as full commands."""
    usage = " ".join(text.split("\n\n", 1)[0].split())
    m = re.search(r"\{([\w,-]+)\}( \.\.\.)?$", usage)
    return [f"{command} {s}" for s in m.group(1).split(",")] if m else []


def live_helps(bin_dir: Path) -> dict[str, str]:
    """command -> its --help, for xmlfix and every pcitopo command, dispatchers included."""
    out: dict[str, str] = {}
    todo = list(ROOTS)
    while todo:
        command = todo.pop(0)
        out[command] = help_text(command, bin_dir)
        todo += subcommands(command, out[command])
    return out


def doc_blocks(markdown: str, commands: set[str]) -> dict[str, list[tuple[int, int]]]:
    """command -> (start, end) character spans of the bodies of its usage blocks in ``markdown``.

    A usage block is a ```text fence whose body starts with ``usage: ``; its command is the
    longest known command its usage line starts with."""
    out: dict[str, list[tuple[int, int]]] = {}
    for m in re.finditer(r"^```text\n(usage: .*?)^```$", markdown, re.M | re.S):
        words = m.group(1).split("\n", 1)[0].split()[1:]
        command = max((c for c in commands if words[:len(c.split())] == c.split()), key=len, default=None)
        if command:
            out.setdefault(command, []).append((m.start(1), m.end(1)))
    return out


def problems(markdown: str, helps: dict[str, str]) -> list[str]:
    """One line per command whose block is missing, doubled or differs from its --help."""
    found = doc_blocks(markdown, set(helps))
    out = []
    for command, text in helps.items():
        spans = found.get(command, [])
        if not spans:
            out.append(f"{command}: no usage block (a ```text block starting `usage: {command}`)")
        elif len(spans) > 1:
            out.append(f"{command}: {len(spans)} usage blocks, one wanted")
        elif markdown[slice(*spans[0])] != text:
            line = markdown.count("\n", 0, spans[0][0]) + 1
            out.append(f"{command}: the block at line {line} differs from `{command} --help`")
    return out


def refreshed(markdown: str, helps: dict[str, str]) -> str:
    """``markdown`` with each command's one usage block replaced by its live --help."""
    spans = sorted(((s[0], c) for c, s in doc_blocks(markdown, set(helps)).items() if len(s) == 1),
                   reverse=True)
    for (start, end), command in spans:
        markdown = markdown[:start] + helps[command] + markdown[end:]
    return markdown


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="check (or --write) docs/CLI.md's usage blocks against --help")
    p.add_argument("doc", type=Path)
    p.add_argument("--write", action="store_true", help="rewrite stale blocks in place")
    p.add_argument("--bin", type=Path, default=Path(sys.executable).parent, help="where the console scripts are")
    args = p.parse_args(argv)
    if sys.version_info[:2] != HELP_PYTHON:
        print(f"cli_help: Python {sys.version_info[0]}.{sys.version_info[1]} lays --help out differently "
              f"from {HELP_PYTHON[0]}.{HELP_PYTHON[1]}, which the blocks are written with", file=sys.stderr)
        return 2
    helps = live_helps(args.bin)
    text = args.doc.read_text()
    if args.write:
        text = refreshed(text, helps)
        args.doc.write_text(text)
    left = problems(text, helps)
    for line in left:
        print(f"{args.doc}: {line}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
