"""Command-line doors: ``pcitopo`` (topo, partitions, pairs, capture, verify, guest-tool, doctor, domain, preflight, serve) and ``xmlfix``.

Each command parses its arguments, calls the library, and formats the result or the error.
A user-caused failure is one line on stderr and exit 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from pcitopo.topology.errors import ConfigError

from .doors import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNKNOWN, Parser, VersionAction, print_json, run_door
from .golden import add_golden_parser, cmd_golden
from .preflight import add_preflight_parser, cmd_preflight


# -- pcitopo topo ----------------------------------------------------------------------------

def _cmd_topo(args: argparse.Namespace) -> int:
    from pcitopo.topology.paths.classify import NvlinkOracle
    from pcitopo.topology.paths.fabric import load_nvlink_table
    from pcitopo.topology.model.tree import Bdf
    from pcitopo.topology.model.labels import default_devices
    from pcitopo.topology.views.report import topo_json, topo_text, tree_text
    from pcitopo.topology.host.sysfs import open_host

    chosen = [f"--{name}" for name in ("json", "tree", "dot") if getattr(args, name)]
    if len(chosen) > 1:  # one output per run, never a silent choice
        raise ConfigError(f"{' and '.join(chosen)} are different outputs: give one of them")
    if args.tree or args.dot:  # pictures of the PCIe tree: no NVLink in them, so no NVLink input
        from_env = {"fabric": os.environ.get("PCITOPO_FABRIC") or None, "module_map": os.environ.get("PCITOPO_MODULE_MAP") or None}
        unused = [f"--{n.replace('_', '-')}" for n in ("fabric", "module_map", "nvlink_table")
                  if getattr(args, n) and getattr(args, n) != from_env.get(n)]  # a node-wide default is no mistake
        if unused:
            raise ConfigError(f"{' and '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect with {chosen[0]}"
                              " (the picture shows PCIe only): drop it")
        args.fabric = args.module_map = args.nvlink_table = None
    topo = open_host(args.sysfs)
    if args.fabric:
        if args.nvlink_table:
            raise ConfigError("--fabric and --nvlink-table exclude each other (the fabric says what the table would guess)")
        from pcitopo.topology.paths.fabric import load_fabric
        from pcitopo.topology.paths.partitions import FabricNvlink

        oracle = FabricNvlink(load_fabric(args.fabric, args.module_map, topo))
    else:
        if args.module_map:
            raise ConfigError("--module-map needs --fabric (the module map only names the fabric's GPUs)")
        table = load_nvlink_table(args.nvlink_table) if args.nvlink_table else None
        oracle = NvlinkOracle(topo, table, hint="pass --fabric (`fmpm -l`) or --nvlink-table")
    # Named devices in the order given, each once (a repeated BDF is not a second device).
    bdfs = list(dict.fromkeys(topo.function(Bdf.parse(b)).bdf for b in args.bdf)) if args.bdf else default_devices(topo, args.vfs)
    live_root = args.sysfs if os.path.realpath(args.sysfs) == "/sys" else None
    if args.dot:  # host and predicted guest as one Graphviz picture
        from pcitopo.topology.views.dot import topo_dot
        from pcitopo.topology.paths.vfs import group_vfs

        sys.stdout.write(topo_dot(topo, group_vfs(topo, bdfs).heads, live_root))
        return EXIT_OK
    if args.json:
        print_json(topo_json(topo, bdfs, oracle))
        return EXIT_OK
    if args.tree:
        labels = {}
        from pcitopo.topology.model.labels import label_devices

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


def _cmd_partitions(args: argparse.Namespace) -> int:
    from pcitopo.topology.paths.fabric import load_fabric
    from pcitopo.topology.paths.partitions import partition_rows, partitions_json, partitions_text
    from pcitopo.topology.model.labels import host_labels
    from pcitopo.topology.host.sysfs import open_host

    if not args.fabric:
        raise ConfigError("no fabric file: give --fabric FILE (the output of `fmpm -l`) or set PCITOPO_FABRIC")
    topo = open_host(args.sysfs)
    fabric = load_fabric(args.fabric, args.module_map, topo)
    labels = host_labels(topo)
    rows = partition_rows(topo, fabric, labels)
    if args.json:
        print_json(partitions_json(fabric, rows))
    else:
        sys.stdout.write(partitions_text(fabric, rows))
    return EXIT_OK


def _cmd_pairs(args: argparse.Namespace) -> int:
    from pcitopo.topology.host.sysfs import open_host
    from pcitopo.topology.paths.pairing import host_pairs
    from pcitopo.topology.views.pairs import pairs_json, pairs_text

    hp = host_pairs(open_host(args.sysfs))
    if args.json:
        print_json(pairs_json(hp))
    else:
        sys.stdout.write(pairs_text(hp))
    return EXIT_OK


def _fabric_args(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--fabric", metavar="FILE", default=os.environ.get("PCITOPO_FABRIC") or None,
                   help=f"NVLink fabric partitions, the output of `fmpm -l` (default $PCITOPO_FABRIC): {what}")
    p.add_argument("--module-map", metavar="FILE", default=os.environ.get("PCITOPO_MODULE_MAP") or None,
                   help='module ID -> BDF, {"gpus": [{"module", "bdf"}]}, for a fabric file whose BDFs are placeholders '
                   "(default $PCITOPO_MODULE_MAP)")


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


def _cmd_capture(args: argparse.Namespace) -> int:
    from pcitopo.topology.host.capture import capture

    source = args.sysfs
    if args.from_topo:  # a planned or synthetic node (fixtures/README.md, "The .topo format")
        from pcitopo.topology.synth import load_topo_file

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

def _cmd_doctor(args: argparse.Namespace) -> int:
    return _doctor_every(args) if args.every is not None else _doctor_pass(args)


def _kubelet_dir(args: argparse.Namespace) -> str | None:
    """The kubelet's files are this node's: read them when asked, or when --sysfs is this node's /sys."""
    from pcitopo.topology.checks.kubelet import KUBELET_DIR

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

    from pcitopo.topology.checks.kubelet import CONFIG_FILE, STATE_FILE

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
    from pcitopo.topology.checks.doctor import run_checks
    from pcitopo.topology.checks.fleet import nfd_text, pix_facts, prometheus_text
    from pcitopo.topology.host.files import write_atomic
    from pcitopo.topology.checks.screen import report_text
    from pcitopo.topology.model.tree import Bdf, Topology
    from pcitopo.topology.host.sysfs import SysfsReader
    from pcitopo.topology.host.sources import open_source

    source = open_source(args.sysfs)
    topo = Topology(SysfsReader(source))
    bdfs = [Bdf.parse(b) for b in args.bdf] if args.bdf else None
    report = run_checks(topo, bdfs, source, _kubelet_dir(args), args.kubelet_config)
    pix = pix_facts(topo, report.targets) if (args.prometheus or args.nfd or args.prometheus_out or args.nfd_out) else None
    if args.prometheus_out:
        write_atomic(args.prometheus_out, prometheus_text(report, pix))
    if args.nfd_out:
        write_atomic(args.nfd_out, nfd_text(report, pix))
    from pcitopo.topology import stamped

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


def _add_capture_parser(sub, default_sysfs: str) -> None:
    c = sub.add_parser("capture", help="snapshot what the reader needs into a .tar.gz")
    c.add_argument("--sysfs", default=default_sysfs, help="sysfs root to capture (default $PCITOPO_SYSFS or /sys; /host/sys under `kubectl debug node/...`)")
    c.add_argument("--from-topo", metavar="FILE.topo", help="instead of --sysfs: a planned or synthetic node described "
                   "in the .topo format (fixtures/README.md; its `cpu` line records the CPU width)")
    c.add_argument("-o", "--output", required=True, metavar="FILE.tar.gz", help="where to write the capture; - for stdout")
    c.add_argument("--phys-bits", type=_phys_bits, metavar="N", help="the node's CPU physical-address width (`address sizes` "
                   "in its /proc/cpuinfo), recorded in the capture; without it only a live sysfs records one (this machine's)")


def _add_doctor_parser(sub, default_sysfs: str) -> None:
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


# -- pcitopo verify: the guest against xmlfix --json (the guest tool's code, sidecar/guest.py) ---

def _cmd_verify(args: argparse.Namespace) -> int:
    from .guest import verify_command

    return verify_command(args, "pcitopo verify")


def _cmd_guest_tool(args: argparse.Namespace) -> int:
    from .guest import write_guest_tool

    size = write_guest_tool(args.output)
    print(f"wrote {args.output} ({size} bytes): run it in the guest as `python3 {os.path.basename(args.output)} verify "
          "--expect predicted.json` (Python 3.8 or later, standard library only)", file=sys.stderr)
    return EXIT_OK


def _cmd_serve(argv: Sequence[str]) -> int:
    from .process import tune_server_process

    tune_server_process()  # before grpc and pydantic are imported
    from .server import serve_main

    return serve_main(list(argv))


def _add_guest_parsers(sub) -> None:
    """The commands for the guest side: the guest tool's file, and the NCCL file's install."""
    g = sub.add_parser("guest-tool", help="write the guest tool: one file, Python >= 3.8, standard library only "
                       "(`python3 FILE verify` in the guest)")
    g.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write it (e.g. build/pcitopo-guest)")
    g = sub.add_parser("guest", help="in the guest: `pcitopo guest install-nccl-topo` installs the NCCL topology file the host passed")
    g.add_argument("action", choices=["install-nccl-topo"], help="what to do (see `pcitopo guest install-nccl-topo --help`)")


# -- pcitopo domain ---------------------------------------------------------------------------
# The domain XML virt-launcher would hand the hook at the first OnDefineDomain / MutateDomain call,
# for a VM or VMI manifest on a node, before anything is deployed (pcitopo.kubevirt.launcher). The
# domain goes to stdout (or -o); what was assumed goes to stderr, one line each, prefixed
# "pcitopo domain:".


def _hook_input(pred, call: int, hook: str, host) -> tuple[bytes, str]:
    """The hook's input at ``call`` of the boot for the prediction ``pred`` (``allocateHotplugPorts``'s
    defines, the release's re-parse and libvirt's define between them), with pcitopo's rewrite
    (``hook`` pcitopo) or nothing (``none``) answering the earlier calls; and the line that says so."""
    import json

    from pcitopo.kubevirt.launcher.defines import boot_defines, vmi_interfaces

    from .core import handle_define_domain

    vmi_json = json.dumps(pred.vmi).encode()
    rewrite = (lambda xml: handle_define_domain(xml, vmi_json, host).xml) if hook == "pcitopo" else (lambda xml: xml)
    boot = boot_defines(pred.xml, rewrite, pred.release, interfaces=vmi_interfaces(pred.vmi))
    calls = len(boot.hook_inputs)
    if not 1 <= call <= calls:
        raise ConfigError(f"--call {call}: KubeVirt {pred.version}'s virt-launcher calls the hook {calls} time(s) for this VM")
    answered = "pcitopo's rewrite" if hook == "pcitopo" else "no hook"
    return boot.hook_inputs[call - 1], (f"the hook's input at call {call} of {calls} (the earlier calls answered by "
                                        f"{answered}, re-parsed as {pred.version} does, libvirt's define simulated)")


def _cmd_domain(args: argparse.Namespace) -> int:
    from pcitopo.kubevirt.launcher.request import predicted_domain
    from pcitopo.topology.host.sysfs import open_host

    from pcitopo.topology.host.files import read_bounded, write_atomic

    from .doors import MAX_VMI_BYTES

    from pcitopo.kubevirt.releases import ReleaseUnknown

    manifest = read_bounded(args.vmi, MAX_VMI_BYTES, "VMI")
    host = open_host(args.sysfs)
    try:
        pred = predicted_domain(args, manifest, args.vmi, host)
    except ReleaseUnknown as e:  # no domain for a release nobody read: unknown, not a guess
        print(f"pcitopo domain: unknown: {e.line}", file=sys.stderr)
        return EXIT_UNKNOWN
    for line in pred.names.failed:  # a resource the cluster lacks: no pod, so no domain
        print(f"pcitopo domain: {line}", file=sys.stderr)
    if pred.names.failed:
        return EXIT_CHECK_FAILED
    xml, notes = pred.xml, list(pred.notes)
    if args.call is not None:
        xml, line = _hook_input(pred, args.call, args.hook, host)
        notes.append(line)
    for line in notes:
        print(f"pcitopo domain: {line}", file=sys.stderr)
    if args.output and args.output != "-":
        write_atomic(args.output, xml, error=ConfigError)
    else:
        sys.stdout.buffer.write(xml)
        sys.stdout.flush()
    for line in pred.unknowns:  # what the domain rests on but the inputs do not say (exit 4)
        print(f"pcitopo domain: unknown: {line}", file=sys.stderr)
    refused = _domain_policy(pred.vmi, args.cluster)
    return refused if refused != EXIT_OK else (EXIT_UNKNOWN if pred.unknowns else EXIT_OK)


def _domain_policy(vmi: dict, dump_paths: list[str] | None) -> int:
    """A dump with pcitopo's params and gate Sidecar: the Sidecar policy judges the VMI as
    preflight does; a refusal is one line and exit 1 (the domain is what it would be, were it
    admitted)."""
    if not dump_paths:
        return EXIT_OK
    from pcitopo.kubevirt.cluster import read_dump
    from pcitopo.kubevirt.preflight import vmi_policy_refusal

    refused = vmi_policy_refusal(vmi, read_dump(dump_paths), None)
    if refused is None or not refused.certain:
        return EXIT_OK
    print(f"pcitopo domain: policy: {refused.why}" + (f" (to admit it, vetted: {refused.admit})" if refused.admit else ""),
          file=sys.stderr)
    return EXIT_CHECK_FAILED


def _add_domain_parser(sub, default_sysfs: str) -> None:
    from pcitopo.kubevirt.launcher.request import add_prediction_args

    d = sub.add_parser("domain", help="the domain XML virt-launcher would hand the hook for a VM/VMI manifest on a node "
                       "(before anything is deployed)")
    d.add_argument("--vmi", metavar="FILE", required=True, help="the VM or VMI manifest (YAML or JSON)")
    d.add_argument("--sysfs", default=default_sysfs, help="the node: sysfs root, capture .tar.gz or fixture dir")
    add_prediction_args(d)
    d.add_argument("--call", metavar="N", type=int, help="instead of the converter's domain, the hook's input at call N "
                   "of the boot (1-3: with the placeholders and appended root ports of allocateHotplugPorts, after the "
                   "release's re-parse of the earlier answers)")
    d.add_argument("--hook", choices=("pcitopo", "none"), default="pcitopo", help="with --call: who answers the earlier "
                   "calls (default pcitopo, as the VM's hookSidecars annotation or the Plugin attaches it)")
    d.add_argument("-o", "--output", metavar="FILE", help="write the domain here instead of stdout")


def pcitopo_main(argv: Sequence[str] | None = None) -> int:
    from pcitopo.topology.host.sources import default_sysfs

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return run_door("pcitopo serve", lambda: _cmd_serve(argv[1:]))
    if argv[:2] == ["guest", "install-nccl-topo"]:  # it parses its own options, as in the guest tool
        from .guest import install_command

        return install_command(argv[2:], "pcitopo guest install-nccl-topo")
    parser = Parser(prog="pcitopo", description="Host PCIe topology as NCCL and nvidia-smi see it.")
    parser.add_argument("--version", action=VersionAction, prog="pcitopo")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    t = sub.add_parser("topo", help="GPU/NIC matrix like `nvidia-smi topo -m`, or the tree")
    t.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    t.add_argument("--json", action="store_true", help="machine-readable devices and pairs")
    t.add_argument("--tree", action="store_true", help="lspci -tv-like tree with roles, NUMA, switch kinds")
    t.add_argument("--vfs", action="store_true", help="include SR-IOV VFs in the default device list")
    t.add_argument("--dot", action="store_true", help="Graphviz DOT: host tree and the guest a VM given these devices would see (render with dot -Tsvg)")
    t.add_argument("--nvlink-table", metavar="FILE", help="JSON NVLink board table overriding the built-in one")
    _fabric_args(t, "NV# from the fabric's active partitions instead of the board table")
    t.add_argument("bdf", nargs="*", help="devices to classify (default: all GPU and NIC physical functions)")
    pp = sub.add_parser(
        "partitions", help="NVLink fabric partitions with each GPU's best NIC (GPU pools that keep NVLink and GDR)",
        description="For each Fabric Manager partition (from `fmpm -l`): active or not, its GPUs (BDF, label, module ID), "
        "each GPU's best compute NIC with NCCL's class, and whether every GPU is PIX to a NIC of its own.",
    )
    pp.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    _fabric_args(pp, "required")
    pp.add_argument("--json", action="store_true", help='{"partitions": [{"id", "active", "gpus": [{"bdf", "module", "nic", "nic_class"}], "all_pix"}]}')
    pr = sub.add_parser(
        "pairs", help="each GPU's best NIC and whether DRA's pcieRoot alignment alone gets it on this host",
        description="For each GPU: its best NIC on the host with the pair's NCCL and nvidia-smi class (NCCL's decides, "
        "as it decides GPUDirect RDMA), its pcieRoot (resource.kubernetes.io/pcieRoot), and whether some NIC shares that "
        "root and every one that does is of the best class, i.e. whether a DRA claim matching on pcieRoot can be "
        "satisfied and is enough on this host.",
    )
    pr.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    pr.add_argument("--json", action="store_true", help='{"gpus": [{"gpu", "pcie_root", "nic", "nccl", "nvml", "gdr", '
                    '"same_pcie_root_nics", "pcie_root_enough"}], "pcie_root_enough", "pcie_root_not_enough_for"}')
    _add_capture_parser(sub, default_sysfs())
    from .guest import add_verify_args

    add_verify_args(sub.add_parser("verify", help="in the guest: compare its PCI tree with `xmlfix --json`'s prediction "
                                   "(exit 1 on any difference)"))
    _add_guest_parsers(sub)
    _add_doctor_parser(sub, default_sysfs())
    _add_domain_parser(sub, default_sysfs())
    add_preflight_parser(sub)
    add_golden_parser(sub)
    sub.add_parser("serve", help="run the KubeVirt hook server (see `pcitopo serve --help`)")
    if not argv:  # bare `pcitopo`: the commands, not only "a command is required"
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    args = parser.parse_args(argv)
    handler = {"topo": _cmd_topo, "capture": _cmd_capture, "verify": _cmd_verify, "doctor": _cmd_doctor,
               "partitions": _cmd_partitions, "pairs": _cmd_pairs, "guest-tool": _cmd_guest_tool,
               "domain": _cmd_domain, "guest": lambda a: pcitopo_main(["guest", a.action]), "preflight": cmd_preflight,
               "golden": cmd_golden}[args.command]
    return run_door(f"pcitopo {args.command}", lambda: handler(args))


def xmlfix_main(argv: Sequence[str] | None = None) -> int:
    from .xmlfix import xmlfix

    return run_door("xmlfix", lambda: xmlfix(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pcitopo_main())
