"""Command-line doors: ``pcitopo`` (topo, capture, serve) and ``xmlfix``.

Each command parses its arguments, calls the library, and formats the result or the error.
A user-caused failure is one line on stderr and exit 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Sequence

from topology.errors import PcitopoError

EXIT_OK, EXIT_CHECK_FAILED, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line and exit 2 like every other bad input."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message}\n")


def run_door(prog: str, body: Callable[[], int]) -> int:
    try:
        return body()
    except PcitopoError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # `pcitopo topo | head`: the reader left; not an error of ours.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # the last line of defence: still one line, still no traceback
        if os.environ.get("PCITOPO_DEBUG"):
            raise
        print(f"{prog}: internal error: {type(e).__name__}: {e} (set PCITOPO_DEBUG=1 for a traceback)", file=sys.stderr)
        return EXIT_INTERNAL


# -- pcitopo topo ----------------------------------------------------------------------------

def _cmd_topo(args: argparse.Namespace) -> int:
    from topology.classify import NvlinkOracle, load_nvlink_table
    from topology.model import Bdf
    from topology.report import default_devices, topo_json, topo_text, tree_text
    from topology.sysfs import open_host

    topo = open_host(args.sysfs)
    table = load_nvlink_table(args.nvlink_table) if args.nvlink_table else None
    oracle = NvlinkOracle(topo, table)
    # Named devices in the order given, each once (a repeated BDF is not a second device).
    bdfs = list(dict.fromkeys(topo.function(Bdf.parse(b)).bdf for b in args.bdf)) if args.bdf else default_devices(topo, args.vfs)
    live_root = args.sysfs if os.path.realpath(args.sysfs) == "/sys" else None
    if args.dot:  # issue 14 #11: host and predicted guest as one Graphviz picture
        from topology.dot import topo_dot
        from topology.vfs import group_vfs

        sys.stdout.write(topo_dot(topo, group_vfs(topo, bdfs).heads, live_root))
        return EXIT_OK
    if args.json:
        json.dump(topo_json(topo, bdfs, oracle), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return EXIT_OK
    if args.tree:
        labels = {}
        from topology.report import label_devices

        for lab in label_devices(topo, bdfs):
            labels[lab.function.bdf] = lab.label
        sys.stdout.write(tree_text(topo, live_root, labels))
        return EXIT_OK
    if not bdfs:
        print("no GPUs or NICs on this host (name BDFs to classify other devices)")
        return EXIT_OK
    sys.stdout.write(topo_text(topo, bdfs, oracle, live_root))
    for w in topo.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return EXIT_OK


def _cmd_capture(args: argparse.Namespace) -> int:
    from topology.capture import capture

    summary = capture(args.sysfs, args.output)
    print(
        f"captured {summary.functions} PCI functions and {summary.numa_nodes} NUMA nodes "
        f"({summary.entries} entries) from {args.sysfs} into {args.output}",
        file=sys.stderr,
    )
    for s in summary.skipped:
        print(f"warning: skipped {s}", file=sys.stderr)
    return EXIT_OK


def _cmd_serve(argv: Sequence[str]) -> int:
    from sidecar.server import serve_main

    return serve_main(list(argv))


def pcitopo_main(argv: Sequence[str] | None = None) -> int:
    from topology.sysfs import default_sysfs

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return run_door("pcitopo serve", lambda: _cmd_serve(argv[1:]))
    parser = _Parser(prog="pcitopo", description="Host PCIe topology as NCCL and nvidia-smi see it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    t = sub.add_parser("topo", help="GPU/NIC matrix like `nvidia-smi topo -m`, or the tree")
    t.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    t.add_argument("--json", action="store_true", help="machine-readable devices and pairs")
    t.add_argument("--tree", action="store_true", help="lspci -tv-like tree with roles, NUMA, switch kinds")
    t.add_argument("--vfs", action="store_true", help="include SR-IOV VFs in the default device list")
    t.add_argument("--dot", action="store_true", help="Graphviz DOT: host tree and the guest a VM given these devices would see (render with dot -Tsvg)")
    t.add_argument("--nvlink-table", metavar="FILE", help="JSON NVLink board table overriding the built-in one")
    t.add_argument("bdf", nargs="*", help="devices to classify (default: all GPU and NIC physical functions)")
    c = sub.add_parser("capture", help="snapshot what the reader needs into a .tar.gz")
    c.add_argument("--sysfs", default=default_sysfs())
    c.add_argument("-o", "--output", required=True, metavar="FILE.tar.gz")
    sub.add_parser("serve", help="run the KubeVirt hook server (see `pcitopo serve --help`)")
    args = parser.parse_args(argv)
    handler = {"topo": _cmd_topo, "capture": _cmd_capture}[args.command]
    return run_door(f"pcitopo {args.command}", lambda: handler(args))


def xmlfix_main(argv: Sequence[str] | None = None) -> int:
    from sidecar.xmlfix import xmlfix

    return run_door("xmlfix", lambda: xmlfix(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pcitopo_main())
