"""mypy over the package, held to a committed baseline that only shrinks (``make lint``, docs/CI.md).

The package was written before it was type-checked, so mypy reports errors that are known and
listed in ``mypy-baseline.txt``. This script runs mypy (its settings are ``[tool.mypy]`` in
pyproject.toml) and compares what it reports with that list:

- an error not in the list fails: new code does not add type errors;
- a listed error mypy no longer reports fails too, with the hint to run ``--update``: whoever
  fixes one drops it from the list in the same commit, so the list only shrinks.

An error is kept as ``path:code:message`` without its line number, so an edit that moves lines
does not touch the list; line numbers inside a message ("defined on line 12") are blanked the
same way. The same error twice in a file is listed twice (counted, not a set).

    python scripts/mypy_baseline.py            # check (exit 0 clean, 1 differs, 2 mypy failed)
    python scripts/mypy_baseline.py --update   # drop the errors that are gone from the list
    python scripts/mypy_baseline.py --update --accept-new   # also list the new ones (review them)
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "mypy-baseline.txt"
HEADER = (
    "# mypy errors the package had when type checking began; it only shrinks (docs/CI.md).\n"
    "# path:code:message, no line numbers. Written by `python scripts/mypy_baseline.py --update`.\n"
)
# mypy's one-line form: path:line[:column]: severity: message  [code]
_LINE = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+)(?::\d+)?: (?P<severity>error|warning|note): "
                   r"(?P<message>.*?)(?:  \[(?P<code>[a-z0-9-]+)\])?$")
_LINE_REF = re.compile(r"\bline \d+")


def normalise(output: str) -> list[str]:
    """mypy's errors as sorted ``path:code:message`` entries (notes dropped: they explain the
    error before them, whose entry already stands for it)."""
    entries = []
    for raw in output.splitlines():
        m = _LINE.match(raw.strip())
        if m is None or m["severity"] == "note":
            continue
        path = m["path"].replace("\\", "/")
        message = _LINE_REF.sub("line N", m["message"])
        entries.append(f"{path}:{m['code'] or 'misc'}:{message}")
    return sorted(entries)


def read_baseline(text: str) -> list[str]:
    return sorted(line for line in text.splitlines() if line.strip() and not line.startswith("#"))


def compare(current: Iterable[str], baseline: Iterable[str]) -> tuple[list[str], list[str]]:
    """(new, gone): the entries mypy reports beyond the baseline's count of each, and the
    baseline's entries it no longer reports as often."""
    now, before = Counter(current), Counter(baseline)
    return sorted((now - before).elements()), sorted((before - now).elements())


def updated(current: Iterable[str], baseline: Iterable[str], accept_new: bool) -> list[str]:
    """The baseline ``--update`` writes: what it lists that mypy still reports, and with
    ``accept_new`` everything mypy reports."""
    if accept_new:
        return sorted(current)
    return sorted((Counter(baseline) & Counter(current)).elements())


def render(entries: Iterable[str]) -> str:
    return HEADER + "".join(f"{e}\n" for e in sorted(entries))


def run_mypy(extra: Sequence[str] = (), cwd: Path = REPO) -> tuple[int, str]:
    """mypy's exit status and output in the one-line form :func:`normalise` reads."""
    r = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--show-error-codes",
                        "--no-pretty", "--hide-error-context", "--no-color-output", *extra],
                       cwd=cwd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def _show(title: str, entries: Sequence[str]) -> None:
    print(f"{title} ({len(entries)}):", file=sys.stderr)
    for e in entries:
        print(f"  {e}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--update", action="store_true", help="rewrite mypy-baseline.txt without the errors that are gone")
    p.add_argument("--accept-new", action="store_true", help="with --update: list the new errors too")
    p.add_argument("--baseline", type=Path, default=BASELINE, help="default: %(default)s")
    args = p.parse_args(argv)
    status, output = run_mypy()
    current = normalise(output)
    # mypy exits 1 when it found errors, 2 when it could not check (bad config, a crash)
    if status not in (0, 1) or (status == 1 and not current):
        print(output, file=sys.stderr)
        print(f"mypy_baseline: mypy exited {status} without a list of errors", file=sys.stderr)
        return 2
    baseline = read_baseline(args.baseline.read_text()) if args.baseline.exists() else []
    new, gone = compare(current, baseline)
    if args.update:
        if new and not args.accept_new:
            _show("new mypy errors (fix them; --accept-new lists them, for review)", new)
            return 1
        kept = updated(current, baseline, args.accept_new)
        args.baseline.write_text(render(kept))
        print(f"mypy_baseline: {len(kept)} errors listed ({len(gone)} gone, {len(new) if args.accept_new else 0} added)")
        return 0
    if new:
        _show("mypy errors not in mypy-baseline.txt (fix them)", new)
    if gone:
        _show("fixed, still in mypy-baseline.txt (run `python scripts/mypy_baseline.py --update` and commit it)", gone)
    if new or gone:
        return 1
    print(f"mypy_baseline: {len(current)} errors, all in the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
