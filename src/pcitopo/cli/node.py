"""``pcitopo capture`` and ``pcitopo doctor``: the commands an operator runs on a node (or the
doctor DaemonSet runs there), parsing their arguments and calling the library."""

from __future__ import annotations

import argparse
import json
import os
import sys

from pcitopo.program import EXIT_CHECK_FAILED, EXIT_OK


def _phys_bits(text: str) -> int:
    """--phys-bits: a CPU address width x86 can have (QEMU's phys-bits takes 32 to 64)."""
    if not text.isdigit() or not 32 <= int(text) <= 64:
        raise argparse.ArgumentTypeError(f"{text!r} is not an address width from 32 to 64 bits")
    return int(text)


def _seconds(text: str) -> int:
    """--every: an interval a node can afford and a person still sees move."""
    if not text.isdigit() or not 10 <= int(text) <= 86400:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number of seconds from 10 to 86400")
    return int(text)


def cmd_capture(args: argparse.Namespace) -> int:
    from pcitopo.host.capture import capture

    source = args.sysfs
    if args.from_topo:  # a planned or synthetic node (fixtures/README.md, "The .topo format")
        from pcitopo.synth import load_topo_file

        source = load_topo_file(args.from_topo)
    summary = capture(source, args.output, sys.stdout.buffer, args.phys_bits)  # -o - is stdout
    print(
        f"captured {summary.functions} PCI functions and {summary.numa_nodes} NUMA nodes "
        f"({summary.entries} entries) from {args.from_topo or args.sysfs} into {'stdout' if args.output == '-' else args.output}",
        file=sys.stderr,
    )
    if summary.host_bits is None and args.from_topo:
        print(f"warning: {args.from_topo} has no `cpu phys-bits=N` line and no --phys-bits was given: the capture "
              "records no CPU width, and the MMIO check will say unknown", file=sys.stderr)
    if summary.host_bits is not None:  # the MMIO check's host width travels with the capture
        print(f"recorded the host CPU's physical-address width: {summary.host_bits} bits", file=sys.stderr)
    for s in summary.skipped:
        print(f"warning: skipped {s}", file=sys.stderr)
    for line in summary.missing:  # one line per kind of file the source lacks
        print(f"warning: {line}", file=sys.stderr)
    if summary.config_cut:  # read without CAP_SYS_ADMIN: say what the doctor will not know
        print(f"warning: config space of {summary.config_cut} function(s) cut at 64 bytes (read without "
              "CAP_SYS_ADMIN): the doctor's acs and ats checks will say unknown for this capture; capture as root for them "
              "(docs/OPERATOR.md, step 1)", file=sys.stderr)
    return EXIT_OK


# -- pcitopo doctor -----------------------------------------------------------------------------

def cmd_doctor(args: argparse.Namespace) -> int:
    return _doctor_every(args) if args.every is not None else _doctor_pass(args)


def _kubelet_dir(args: argparse.Namespace) -> str | None:
    """The kubelet's files are this node's: read them when asked, or when --sysfs is this node's /sys."""
    from pcitopo.checks.kubeletcpu import KUBELET_DIR

    return args.kubelet_dir or (KUBELET_DIR if args.sysfs == "/sys" else None)


def _doctor_every(args: argparse.Namespace) -> int:
    """The DaemonSet's loop, in this one process (no shell beside it): a pass every --every
    seconds until SIGTERM. A kubelet file mounted as a file hostPath keeps the inode it was
    given, and the kubelet replaces its files by rename; once that happened on the host (the
    mounted inode's link count is 0), end, so that the kubelet starts the container again with
    the current file (restartPolicy Always)."""
    import signal
    import threading
    import time

    from pcitopo.checks.kubeletcpu import CONFIG_FILE, STATE_FILE

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    kdir = _kubelet_dir(args)
    files = [os.path.join(kdir, STATE_FILE), args.kubelet_config or os.path.join(kdir, CONFIG_FILE)] if kdir else []
    while True:
        rc = _doctor_pass(args)
        print(f"pcitopo doctor exit {rc} at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", flush=True)
        replaced = [f for f in files if os.path.exists(f) and os.stat(f).st_nlink == 0]
        if replaced:
            print(f"pcitopo doctor: {', '.join(replaced)} replaced on the host since it was mounted; ending, so that "
                  "the kubelet mounts the current one", flush=True)
            return EXIT_OK
        if stop.wait(args.every):
            return EXIT_OK


def _doctor_pass(args: argparse.Namespace) -> int:
    from pcitopo.checks.doctor import run_checks
    from pcitopo.host.files import write_atomic
    from pcitopo.host.sources import open_source
    from pcitopo.host.sysfs import SysfsReader
    from pcitopo.model.tree import Bdf, Topology
    from pcitopo.views.doctor_report import report_text
    from pcitopo.views.exports import nfd_text, pix_facts, prometheus_text

    source = open_source(args.sysfs)
    topo = Topology(SysfsReader(source))
    bdfs = [Bdf.parse(b) for b in args.bdf] if args.bdf else None
    report = run_checks(topo, bdfs, source, _kubelet_dir(args), args.kubelet_config)
    pix = pix_facts(topo, report.targets) if (args.prometheus or args.nfd or args.prometheus_out or args.nfd_out) else None
    if args.prometheus_out:
        write_atomic(args.prometheus_out, prometheus_text(report, pix))
    if args.nfd_out:
        write_atomic(args.nfd_out, nfd_text(report, pix))
    from pcitopo import stamped

    doc = json.dumps(stamped(report.as_json()), indent=2) + "\n" if args.json or args.json_out else None
    if args.json_out:  # what the node hook reads (ACS, ATS: root only) from the doctor DaemonSet
        write_atomic(args.json_out, doc)
    if args.json:
        sys.stdout.write(doc)
    elif args.prometheus:
        sys.stdout.write(prometheus_text(report, pix))
    elif args.nfd:
        sys.stdout.write(nfd_text(report, pix))
    else:
        sys.stdout.write(report_text(report, args.verbose))
    return EXIT_CHECK_FAILED if report.failed else EXIT_OK


def add_capture_parser(sub, default_sysfs: str) -> None:
    c = sub.add_parser("capture", help="snapshot what the reader needs into a .tar.gz")
    c.add_argument("--sysfs", default=default_sysfs,
                   help="sysfs root to capture (default $PCITOPO_SYSFS or /sys; /host/sys under `kubectl debug node/...`)")
    c.add_argument("--from-topo", metavar="FILE.topo", help="instead of --sysfs: a planned or synthetic node described "
                   "in the .topo format (fixtures/README.md; its `cpu` line records the CPU width)")
    c.add_argument("-o", "--output", required=True, metavar="FILE.tar.gz", help="where to write the capture; - for stdout")
    c.add_argument("--phys-bits", type=_phys_bits, metavar="N", help="the node's CPU physical-address width (`address sizes` "
                   "in its /proc/cpuinfo), recorded in the capture; without it only a live sysfs records one (this machine's)")


def add_doctor_parser(sub, default_sysfs: str) -> None:
    d = sub.add_parser(
        "doctor", help="is this host ready for GPUDirect RDMA in a VM? (IOMMU, vfio-pci, groups, ACS, ATS, links, NUMA, BARs)",
        description="Check GPUs, NICs and the bridges above them. Exit 0: nothing failed; 1: a check failed; 2: bad input. "
                    "Config space past 64 bytes (ACS, ATS) needs root; without it those checks say unknown.")
    d.add_argument("--sysfs", default=default_sysfs, help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    out = d.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help='{"checks": [{"check", "status", "bdf", "message", "fix"}], "summary": {...}}')
    out.add_argument("--prometheus", action="store_true", help="node-exporter textfile metrics on stdout")
    out.add_argument("--nfd", action="store_true", help="Node Feature Discovery local features (key=value) on stdout")
    d.add_argument("--prometheus-out", metavar="FILE.prom", help="also write the metrics to FILE (atomically)")
    d.add_argument("--nfd-out", metavar="FILE", help="also write the NFD features to FILE (atomically)")
    d.add_argument("--json-out", metavar="FILE", help="also write the --json report to FILE (atomically; the doctor "
                   "DaemonSet writes /var/run/pcitopo/doctor.json, the node hook reads it)")
    d.add_argument("--kubelet-dir", metavar="DIR", default=os.environ.get("PCITOPO_KUBELET_DIR") or None,
                   help="the node's kubelet directory, for its CPU manager settings (cpu_manager_state, config.yaml); "
                   "default $PCITOPO_KUBELET_DIR, or /var/lib/kubelet when --sysfs is /sys, else not read")
    d.add_argument("--kubelet-config", metavar="FILE", default=None,
                   help="the kubelet's config file when not DIR/config.yaml (the kubelet's --config)")
    d.add_argument("--every", type=_seconds, metavar="SECONDS", help="run a pass every SECONDS (10 to 86400) until "
                   "SIGTERM, each followed by a line `pcitopo doctor exit N at TIME` (the doctor DaemonSet's loop)")
    d.add_argument("-v", "--verbose", action="store_true", help="human output: one line per check and device, passed ones "
                   "too (default: one line per kind of finding, naming the devices it covers)")
    d.add_argument("bdf", nargs="*", help="devices to check, with the bridges above them (default: every GPU and NIC)")


# -- pcitopo verify: the guest against xmlfix --json (the guest tool's code, src/pcitopo/cli/guesttool.py) ---

