"""`xmlfix`: the rewrite on a captured domain XML and a captured (or live) sysfs.

    xmlfix [--sysfs PATH] [--vmi FILE] [-o FILE] [--check] [--explain] [--diff] DOMAIN.xml|-

Exit 0 on success; 1 when --check finds the domain not already correctly placed or fidelity
lost; 2 with one line on stderr for bad input.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from typing import Sequence

from topology.domain import MAX_DOMAIN_BYTES
from topology.errors import ConfigError, DomainError
from topology.sysfs import default_sysfs

from .cli import EXIT_CHECK_FAILED, EXIT_OK, _Parser

MAX_VMI_BYTES = 4 * 1024 * 1024


def _read_bounded(path: str, limit: int, what: str) -> bytes:
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
    except OSError as e:
        err = DomainError if what == "domain" else ConfigError
        raise err(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        err = DomainError if what == "domain" else ConfigError
        raise err(f"{what} {path} is larger than {limit} bytes")
    return data


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.xmlfix-tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise DomainError(f"cannot write {path}: {e.strerror or e}") from None


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="xmlfix", description="Mirror the host PCIe topology into a libvirt domain XML.")
    p.add_argument("domain", metavar="DOMAIN.xml|-", help="domain XML as KubeVirt hands it to a hook (- for stdin)")
    p.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    p.add_argument("--vmi", metavar="FILE", help="the VMI as JSON: its pcitopo.kubevirt.io/ annotations set the options")
    p.add_argument("-o", "--output", metavar="FILE", help="write the rewritten domain here instead of stdout")
    p.add_argument("--check", action="store_true", help="exit 1 unless the domain is already correctly placed with full fidelity")
    p.add_argument("--explain", action="store_true", help="host vs predicted guest matrices and the guest tree")
    p.add_argument("--diff", action="store_true", help="unified diff of the change")
    p.add_argument("--dot", action="store_true", help="the explanation as a Graphviz picture: host and predicted guest trees in DOT (implies --explain)")
    return p


def xmlfix(argv: Sequence[str]) -> int:
    from sidecar.core import handle_define_domain
    from topology.report import explain_text
    from topology.sysfs import open_host

    args = build_parser().parse_args(list(argv))
    domain = _read_bounded(args.domain, MAX_DOMAIN_BYTES, "domain")
    vmi = _read_bounded(args.vmi, MAX_VMI_BYTES, "VMI") if args.vmi else None
    host = open_host(args.sysfs)
    outcome = handle_define_domain(domain, vmi, host)
    result = outcome.result
    out = outcome.xml

    args.explain = args.explain or args.dot  # issue 14 #11
    if args.explain and args.dot:  # issue 14 #11: the explanation as a picture
        from topology.dot import explain_dot

        sys.stdout.write(explain_dot(result, host, outcome.reason))
    elif args.explain:
        if result is None:
            sys.stdout.write(f"domain left unchanged ({outcome.outcome}): {outcome.reason}\n")
        else:
            sys.stdout.write(explain_text(result, host, args.sysfs if os.path.realpath(args.sysfs) == "/sys" else None))
    if args.diff:
        name = "-" if args.domain == "-" else args.domain
        diff = difflib.unified_diff(
            domain.decode("utf-8", "replace").splitlines(keepends=True),
            out.decode("utf-8", "replace").splitlines(keepends=True),
            fromfile=name,
            tofile=f"{name} (xmlfix)",
        )
        sys.stdout.writelines(diff)
    if args.output:
        _write_atomic(args.output, out)
    elif not (args.explain or args.diff or args.check):
        sys.stdout.buffer.write(out)
        sys.stdout.flush()

    if args.check:
        if result is None:
            print(f"xmlfix: check: not rewritten ({outcome.outcome}): {outcome.reason}", file=sys.stderr)
            return EXIT_CHECK_FAILED
        lost = result.report.fidelity_lost
        if result.changed:
            print("xmlfix: check: the domain is not placed as the host topology requires (see --diff)", file=sys.stderr)
            return EXIT_CHECK_FAILED
        if lost:
            p = lost[0]
            print(f"xmlfix: check: fidelity lost for {len(lost)} pair(s), e.g. {p.a}-{p.b}: {p.why}", file=sys.stderr)
            return EXIT_CHECK_FAILED
    return EXIT_OK
