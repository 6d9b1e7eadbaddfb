"""The guest tool: the commands that run inside a VM's guest, as one file for any guest Python.

A guest has a Python (3.8 or later, any distribution's) but neither pcitopo nor its
dependencies, and often no route to a package index. So the guest side is built from the same
modules as the full CLI into one zip application (``pcitopo guest-tool -o FILE``, ``make
guest-tool``; the image ships it as ``/usr/share/pcitopo/pcitopo-guest``): ``python3 FILE
verify ...`` there is ``pcitopo verify ...`` here, one implementation. Every module the guest
commands import is listed in :data:`GUEST_MODULES` and must import only the standard library
and each other (``tests/test_operator_day2.py`` checks that, and Python 3.8 syntax and APIs).

A guest command is one :class:`GuestCommand`: its parser and its handler. Adding one is
listing it in :data:`GUEST_COMMANDS` and its modules in :data:`GUEST_MODULES`.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import zipfile
from typing import Callable, NamedTuple, Sequence

from pcitopo.errors import ConfigError
from pcitopo.program import EXIT_CHECK_FAILED, EXIT_OK, Parser, run_program

GUEST_PROG = "pcitopo-guest"
# NCCL's topology files are a few KB (at most 256 nodes, nccl/topoxml.py): 1 MiB is generous.
MAX_TOPO_BYTES = 1024 * 1024


# -- verify: the guest against xmlfix --json -------------------------------------------------

def add_verify_args(v: argparse.ArgumentParser) -> None:
    from pcitopo.host.sources import default_sysfs

    v.add_argument("--expect", required=True, metavar="PREDICTED.json", help="what `xmlfix --json` printed for this VM")
    v.add_argument("--sysfs", default=default_sysfs(), help="the guest's sysfs root, a capture .tar.gz or a sysfs-shaped dir "
                   "(default $PCITOPO_SYSFS or /sys)")
    v.add_argument("--nccl-topo", metavar="FILE", help="the NCCL topology file the guest installed (default $NCCL_TOPO_FILE or "
                   "/var/run/nvidia-topologyd/virtualTopology.xml when present; none: without one)")


def _count(bad: int, of: int, unchecked: int = 0) -> str:
    text = f"{of - bad - unchecked} of {of} as predicted, {bad} differ{'s' if bad == 1 else ''}"
    return text + (f", {unchecked} not checked (a device of the pair is not as predicted)" if unchecked else "")


def verify_command(args: argparse.Namespace, prog: str) -> int:
    """Compare the guest's sysfs with the prediction; every difference one line, then what
    matched and what did not. Exit 1 on any difference."""
    from pcitopo.checks.verify import MAX_EXPECT_BYTES, load_expectation, verify_guest
    from pcitopo.host.files import read_bounded
    from pcitopo.host.sysfs import open_host

    expect = load_expectation(read_bounded(args.expect, MAX_EXPECT_BYTES, "prediction"), args.expect)
    nccl_file, system = _nccl_topo_file(args.nccl_topo)
    v = verify_guest(expect, open_host(args.sysfs), system)
    for line in v.problems:
        print(f"{prog}: {line}", file=sys.stderr)
    if v.bandwidths_checked:
        print(f"{prog}: NCCL bandwidth: {v.bandwidths_equal}/{v.bandwidths_checked} GPU paths as on the host "
              f"(NCCL topology file: {nccl_file or 'none'})", file=sys.stderr)
    nd, np_ = len(expect.devices), len(expect.pairs)
    if not v.problems:
        print(f"{prog}: as predicted: all {nd} devices and all {np_} pairs", file=sys.stderr)
        return EXIT_OK
    print(f"{prog}: differs from the prediction: devices: {_count(len(v.bad_devices), nd)}; "
          f"pairs: {_count(len(v.bad_pairs), np_, v.pairs_unchecked)}", file=sys.stderr)
    return EXIT_CHECK_FAILED


def _nccl_topo_file(given: str | None):
    """(path, parsed file) of the NCCL topology file NCCL would read in this guest: ``given``
    (``none``: no file), else ``$NCCL_TOPO_FILE`` or NCCL's default path when it exists."""
    from pcitopo.host.files import read_bounded
    from pcitopo.nccl.topoxml import DEFAULT_TOPO_FILE, NcclXmlError, parse

    if given == "none":
        return None, None
    path = given or os.environ.get("NCCL_TOPO_FILE") or DEFAULT_TOPO_FILE
    if given is None and not os.path.exists(path):  # NCCL reads no file then either
        return None, None
    data = read_bounded(path, MAX_TOPO_BYTES, "NCCL topology file")
    try:
        return path, parse(data)
    except NcclXmlError as e:
        raise ConfigError(f"{path}: NCCL would not load it: {e}") from None



def install_command(argv: Sequence[str], prog: str) -> int:
    """``install-nccl-topo`` parses its own options (``--from``, ``--dest``) with a plain
    argparse parser: the guest tool hands it the rest of the command line as ``pcitopo guest
    install-nccl-topo`` does, and its exit statuses are its own (0, 1 nothing offered, 2)."""
    from pcitopo.nccl.install import install_from
    from pcitopo.nccl.topoxml import DEFAULT_TOPO_FILE, fwcfg_raw_path

    p = argparse.ArgumentParser(prog=prog, description="copy the NCCL topology file the host passed through "
                                "fw_cfg to " + DEFAULT_TOPO_FILE)
    p.add_argument("--from", dest="source", metavar="RAW",
                   help="the fw_cfg blob (default: " + fwcfg_raw_path() + ")")
    p.add_argument("--dest", default=DEFAULT_TOPO_FILE, help="where NCCL reads it (default: %(default)s)")
    args = p.parse_args(list(argv))
    return install_from(args.source, args.dest, prog)


def add_install_args(p: argparse.ArgumentParser) -> None:
    """Its options are its own (see :func:`install_command`); listed here for the help only."""


# -- the guest tool's commands and its file ---------------------------------------------------

class GuestCommand(NamedTuple):
    name: str
    help: str
    add_args: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, str], int]


GUEST_COMMANDS = (
    GuestCommand("verify", "compare this guest's PCI tree with `xmlfix --json`'s prediction (exit 1 on any difference)",
                 add_verify_args, verify_command),
    GuestCommand("install-nccl-topo", "install the NCCL topology file the host passed through fw_cfg (run on every boot)",
                 add_install_args, lambda args, prog: install_command([], prog)),
)

# What the guest commands import (besides the standard library), as paths in the source tree.
GUEST_MODULES = (
    "__init__.py",
    "errors.py",
    "model/__init__.py",
    "model/address.py",
    "model/bars.py",
    "model/cpuinfo.py",
    "model/tree.py",
    "model/keep.py",
    "host/__init__.py",
    "host/files.py",
    "host/sources.py",
    "host/tarball.py",
    "host/sysfs.py",
    "paths/__init__.py",
    "paths/classify.py",
    "nccl/__init__.py",
    "nccl/topoxml.py",
    "nccl/pcitree.py",
    "nccl/price.py",
    "nccl/install.py",
    "checks/__init__.py",
    "checks/verify.py",
    "cli/__init__.py",
    "program.py",
    "cli/guesttool.py",
)

# The modules sit in the file under their installed names (pcitopo.model, pcitopo.cli, ...).
INSTALLED = "pcitopo"

_MAIN = f'''"""{GUEST_PROG}: pcitopo's guest commands in one file (built by `pcitopo guest-tool`)."""
import sys

from pcitopo.cli.guesttool import guest_main

sys.exit(guest_main(prog="{GUEST_PROG}"))
'''


def guest_main(argv: Sequence[str] | None = None, prog: str = GUEST_PROG) -> int:
    from pcitopo import __version__

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = Parser(prog=prog, description="pcitopo's commands for inside a VM's guest (standard library only).")
    parser.add_argument("--version", action="version", version=f"{prog} (pcitopo {__version__})")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for c in GUEST_COMMANDS:
        c.add_args(sub.add_parser(c.name, help=c.help, description=c.help))
    if not argv:
        parser.print_help(sys.stderr)
        return 2
    if argv[0] == "install-nccl-topo":
        return install_command(argv[1:], f"{prog} install-nccl-topo")
    args = parser.parse_args(argv)
    run = next(c.run for c in GUEST_COMMANDS if c.name == args.command)
    return run_program(f"{prog} {args.command}", lambda: run(args, f"{prog} {args.command}"))


def _source_root() -> str:
    """The package's own directory (``src/pcitopo`` in a checkout, ``site-packages/pcitopo``
    installed): the guest file is built from the installed modules themselves."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def guest_tool_bytes() -> bytes:
    """The guest file: a zip application of :data:`GUEST_MODULES`, deterministic (fixed
    timestamps, listed order) so the same tree always gives the same bytes."""
    root = _source_root()
    buf = io.BytesIO()
    buf.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in (*GUEST_MODULES, "__main__.py"):
            if rel == "__main__.py":
                data = _MAIN.encode()
            else:
                try:
                    with open(os.path.join(root, rel), "rb") as fh:
                        data = fh.read()
                except OSError as e:
                    raise ConfigError(f"cannot build the guest tool: {rel}: {e.strerror or e}") from None
            name = rel if rel == "__main__.py" else f"{INSTALLED}/{rel}"
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    return buf.getvalue()


def write_guest_tool(path: str) -> int:
    """Write the guest file to ``path`` (mode 0755, its directory made); returns its size."""
    from pcitopo.host.files import write_atomic

    data = guest_tool_bytes()
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    except OSError as e:
        raise ConfigError(f"cannot write {path}: {e.strerror or e}") from None
    write_atomic(path, data, mode=0o755, error=ConfigError)
    return len(data)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(guest_main())
