"""What the programs (``pcitopo``, ``pcitopo serve``, ``xmlfix``, ``onDefineDomain``) share: exit
codes, the argument parser, the bound on a named manifest (read by pcitopo.host.files), and the
catch-all that turns every failure into one line on stderr and an exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from pcitopo.errors import PcitopoError

EXIT_OK = 0
EXIT_CHECK_FAILED = 1  # xmlfix --check: the domain is not placed as the host requires
EXIT_BAD_INPUT = 2  # a PcitopoError: the user's input, one line on stderr
EXIT_INTERNAL = 3  # a bug of ours, one line on stderr
# xmlfix --check: nothing failed, but something the check needs is missing (BARs that cannot be
# sized, an IOMMU group, driver or NUMA node sysfs does not give, a CPU width not recorded), so
# it cannot say ok; a failure wins over it
EXIT_UNKNOWN = 4
EXIT_INTERRUPTED = 130  # Ctrl-C, as a shell reports SIGINT


class Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message}\n")


def one_line(text: str) -> str:
    return " ".join(text.split())


# What the human outputs print beyond ASCII, and what stands for each where the terminal's
# encoding (LC_ALL=C, ISO-8859-1) cannot show it: the text keeps its meaning in the reader's own
# encoding (no mojibake, as forcing UTF-8 on a Latin-1 terminal would give), and a UTF-8
# terminal, pipe or golden file sees the same bytes as before. Anything else not encodable
# prints as a backslash escape rather than stopping the command.
ASCII_FALLBACKS = {"→": "->", "–": "-", "−": "-", "─": "-", "│": "|", "├": "|-", "└": "`-", "×": "x", "·": ".", "…": "..."}


def _ascii_fallback(err: UnicodeError) -> tuple[str, int]:
    if not isinstance(err, UnicodeEncodeError):
        raise err
    bad = err.object[err.start:err.end]
    return "".join(ASCII_FALLBACKS.get(c, f"\\u{ord(c):04x}") for c in bad), err.end


def readable_streams() -> None:
    """Let stdout and stderr print any text in any locale (:data:`ASCII_FALLBACKS`)."""
    import codecs

    try:
        codecs.lookup_error("pcitopo-ascii")
    except LookupError:
        codecs.register_error("pcitopo-ascii", _ascii_fallback)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure") and (stream.encoding or "").replace("-", "").lower() != "utf8":
            stream.reconfigure(errors="pcitopo-ascii")


def run_program(prog: str, body: Callable[[], int], *, with_kind: bool = False, output_is_result: bool = False) -> int:
    """Run ``body`` and return its exit code; every failure becomes one line on stderr.

    ``with_kind`` prefixes a PcitopoError's reason with its kind (``prog: sysfs: reason``, as
    in the gRPC error details). ``output_is_result``: stdout carries the result (the shim's
    XML), so a reader that leaves early is a failure, not the reader's choice (``| head``)."""
    readable_streams()
    try:
        return body()
    except PcitopoError as e:
        print(f"{prog}: {e.kind}: {e.reason}" if with_kind else f"{prog}: {e}", file=sys.stderr)
        return getattr(e, "exit_code", EXIT_BAD_INPUT)  # kubelet refusing the pod is a verdict (1), not bad input
    except BrokenPipeError:
        if output_is_result:
            print(f"{prog}: stdout closed before the domain was written", file=sys.stderr)
            return EXIT_INTERNAL
        # `pcitopo topo | head`: the reader left; not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as e:  # the last line of defence: still one line, still no traceback
        if os.environ.get("PCITOPO_DEBUG"):
            raise
        reason = one_line(f"{type(e).__name__}: {e}")
        print(f"{prog}: internal error: {reason} (set PCITOPO_DEBUG=1 for a traceback)", file=sys.stderr)
        return EXIT_INTERNAL


# A VM or VMI manifest as people keep it; the hook itself never reads files.
MAX_VMI_BYTES = 4 * 1024 * 1024


def print_json(doc: dict) -> None:
    """Every --json document on stdout: stamped with pcitopo's version and schema number
    (pcitopo.stamped), indented alike."""
    import json

    from pcitopo import stamped

    json.dump(stamped(doc), sys.stdout, indent=2)
    sys.stdout.write("\n")


def git_commit(checkout: str) -> str | None:
    """The commit ``checkout`` (the folder holding the package's source) has checked out, read
    from its ``.git`` files, or None when it is not a git checkout (an installed wheel). Only
    ``--version`` asks: no git subprocess, nothing on the hook's path."""
    dotgit = os.path.join(checkout, ".git")
    try:
        if os.path.isfile(dotgit):  # a worktree or submodule: "gitdir: PATH"
            with open(dotgit) as fh:
                dotgit = os.path.join(checkout, fh.read().split("gitdir:", 1)[1].strip())
        with open(os.path.join(dotgit, "HEAD")) as fh:
            head = fh.read().strip()
        if not head.startswith("ref:"):
            return head[:12] or None  # a detached HEAD holds the commit
        ref = head[4:].strip()
        common = dotgit
        if os.path.isfile(os.path.join(dotgit, "commondir")):
            with open(os.path.join(dotgit, "commondir")) as fh:
                common = os.path.join(dotgit, fh.read().strip())
        for base in (dotgit, common):
            if os.path.isfile(os.path.join(base, ref)):
                with open(os.path.join(base, ref)) as fh:
                    return fh.read().strip()[:12]
        with open(os.path.join(common, "packed-refs")) as fh:
            for line in fh:
                if line.rstrip().endswith(f" {ref}"):
                    return line.split()[0][:12]
    except (OSError, IndexError):
        return None
    return None


class VersionAction(argparse.Action):
    """``--version``: :func:`version_text`, read only when asked (not at every parser build)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help="show the version and exit",
                 prog: str = "pcitopo"):
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)
        self.prog_name = prog

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text(self.prog_name))
        parser.exit()


def version_text(prog: str) -> str:
    """What ``--version`` prints: ``PROG VERSION``, and the commit when the package runs from a
    git checkout (an editable install: the package is the checkout's src/pcitopo/, beside .git)."""
    import pcitopo as lib

    package = os.path.dirname(os.path.abspath(lib.__file__))
    commit = git_commit(os.path.dirname(os.path.dirname(package)))
    return f"{prog} {lib.__version__}" + (f" (git {commit})" if commit else "")
