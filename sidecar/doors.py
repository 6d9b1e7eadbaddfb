"""What the doors (``pcitopo``, ``pcitopo serve``, ``xmlfix``, ``onDefineDomain``) share: exit
codes, the argument parser, the bound on a named manifest (read by topology/host/files.py), and the catch-all that turns every failure into one line on stderr
and an exit code, never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from pcitopo.topology.errors import PcitopoError

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


def run_door(prog: str, body: Callable[[], int], *, with_kind: bool = False, output_is_result: bool = False) -> int:
    """Run ``body`` and return its exit code; every failure becomes one line on stderr.

    ``with_kind`` prefixes a PcitopoError's reason with its kind (``prog: sysfs: reason``, as
    in the gRPC error details). ``output_is_result``: stdout carries the result (the shim's
    XML), so a reader that leaves early is a failure, not the reader's choice (``| head``)."""
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
