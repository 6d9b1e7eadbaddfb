"""Command-line programs: ``pcitopo`` (topo, partitions, pairs, capture, verify, guest-tool, doctor, domain, preflight, serve)
and ``xmlfix``.

Each command parses its arguments, calls the library, and formats the result or the error.
A user-caused failure is one line on stderr and exit 2; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from pcitopo.cli.golden import add_golden_parser, cmd_golden
from pcitopo.cli.node import add_capture_parser, add_doctor_parser, cmd_capture, cmd_doctor
from pcitopo.cli.preflight import add_preflight_parser, cmd_preflight
from pcitopo.errors import ConfigError
from pcitopo.program import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNKNOWN, Parser, VersionAction, print_json, run_program

# -- pcitopo topo ----------------------------------------------------------------------------

def _cmd_topo(args: argparse.Namespace) -> int:
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.labels import default_devices
    from pcitopo.model.tree import Bdf
    from pcitopo.paths.classify import NvlinkOracle
    from pcitopo.paths.fabric import load_nvlink_table
    from pcitopo.views.report import topo_json, topo_text, tree_text

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
        from pcitopo.paths.fabric import load_fabric
        from pcitopo.paths.partitions import FabricNvlink

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
        from pcitopo.paths.vfs import group_vfs
        from pcitopo.views.dot import topo_dot

        sys.stdout.write(topo_dot(topo, group_vfs(topo, bdfs).heads, live_root))
        return EXIT_OK
    if args.json:
        print_json(topo_json(topo, bdfs, oracle))
        return EXIT_OK
    if args.tree:
        labels = {}
        from pcitopo.model.labels import label_devices

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
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.labels import host_labels
    from pcitopo.paths.fabric import load_fabric
    from pcitopo.paths.partitions import partition_rows, partitions_json, partitions_text

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
    from pcitopo.host.sysfs import open_host
    from pcitopo.paths.pairing import host_pairs
    from pcitopo.views.pairs import pairs_json, pairs_text

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


def _cmd_verify(args: argparse.Namespace) -> int:
    from pcitopo.cli.guesttool import verify_command

    return verify_command(args, "pcitopo verify")


def _cmd_guest_tool(args: argparse.Namespace) -> int:
    from pcitopo.cli.guesttool import write_guest_tool

    size = write_guest_tool(args.output)
    print(f"wrote {args.output} ({size} bytes): run it in the guest as `python3 {os.path.basename(args.output)} verify "
          "--expect predicted.json` (Python 3.8 or later, standard library only)", file=sys.stderr)
    return EXIT_OK


def _cmd_serve(argv: Sequence[str]) -> int:
    from pcitopo.serve.process import tune_server_process

    tune_server_process()  # before grpc and pydantic are imported
    from pcitopo.serve.server import serve_main

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

    from pcitopo.kubevirt.launcher.defines import boot_defines, vmi_interfaces
    from pcitopo.serve.core import handle_define_domain

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
    from pcitopo.cli.prediction import prediction_request
    from pcitopo.host.files import read_bounded, write_atomic
    from pcitopo.host.sysfs import open_host
    from pcitopo.kubevirt.launcher.request import predicted_domain
    from pcitopo.kubevirt.releases import ReleaseUnknown
    from pcitopo.program import MAX_VMI_BYTES

    manifest = read_bounded(args.vmi, MAX_VMI_BYTES, "VMI")
    host = open_host(args.sysfs)
    try:
        pred = predicted_domain(prediction_request(args), manifest, args.vmi, host)
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
    refused = _domain_policy(pred.vmi, args)
    return refused if refused != EXIT_OK else (EXIT_UNKNOWN if pred.unknowns else EXIT_OK)


def _domain_policy(vmi: dict, args: argparse.Namespace) -> int:
    """With --cluster: the Sidecar policy (--target's, or the dump's params with gate Sidecar)
    judges the VMI as preflight does (src/pcitopo/kubevirt/vmjudge.py); a refusal is one line and exit 1 (the
    domain is what it would be, were it admitted)."""
    if not args.cluster:
        if args.target or args.image:
            raise ConfigError("--target and --image judge the VM on a cluster: give --cluster as well")
        return EXIT_OK
    from pcitopo.kubevirt.cluster import read_dump
    from pcitopo.kubevirt.vmjudge import VmQuestion, policy_of

    q = VmQuestion(tuple(args.cluster), images=tuple(args.image), target=args.target)
    refused, _ = policy_of(vmi, q, read_dump(args.cluster))
    if refused is None or not refused.certain:
        return EXIT_OK
    print(f"pcitopo domain: policy: {refused.why}" + (f" (to admit it, vetted: {refused.admit})" if refused.admit else ""),
          file=sys.stderr)
    return EXIT_CHECK_FAILED


def _add_domain_parser(sub, default_sysfs: str) -> None:
    from pcitopo.cli.prediction import add_prediction_args

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
    d.add_argument("--target", metavar="NAME", help="with --cluster: also judge the VM by this deploy target's Sidecar "
                   "policy, as `pcitopo preflight` and `xmlfix --check --target` do (exit 1 when it refuses the VM)")
    d.add_argument("--image", metavar="REF", action="append", default=[], help="the pcitopo image your overlay pins "
                   "(REPOSITORY@sha256:<64 hex>; repeatable): the VM's hook sidecar is pcitopo's when it runs exactly that")
    d.add_argument("-o", "--output", metavar="FILE", help="write the domain here instead of stdout")


def pcitopo_main(argv: Sequence[str] | None = None) -> int:
    from pcitopo.host.sources import default_sysfs

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "serve":
        return run_program("pcitopo serve", lambda: _cmd_serve(argv[1:]))
    if argv[:2] == ["guest", "install-nccl-topo"]:  # it parses its own options, as in the guest tool
        from pcitopo.cli.guesttool import install_command

        return install_command(argv[2:], "pcitopo guest install-nccl-topo")
    parser = Parser(prog="pcitopo", description="Host PCIe topology as NCCL and nvidia-smi see it.")
    parser.add_argument("--version", action=VersionAction, prog="pcitopo")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    t = sub.add_parser("topo", help="GPU/NIC matrix like `nvidia-smi topo -m`, or the tree")
    t.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    t.add_argument("--json", action="store_true", help="machine-readable devices and pairs")
    t.add_argument("--tree", action="store_true", help="lspci -tv-like tree with roles, NUMA, switch kinds")
    t.add_argument("--vfs", action="store_true", help="include SR-IOV VFs in the default device list")
    t.add_argument("--dot", action="store_true",
                   help="Graphviz DOT: host tree and the guest a VM given these devices would see (render with dot -Tsvg)")
    t.add_argument("--nvlink-table", metavar="FILE", help="JSON NVLink board table overriding the built-in one")
    _fabric_args(t, "NV# from the fabric's active partitions instead of the board table")
    t.add_argument("bdf", nargs="*", help="devices to classify (default: all GPU and NIC physical functions)")
    pp = sub.add_parser(
        "partitions", help="NVLink fabric partitions with each GPU's best NIC (GPU pools that keep NVLink and GDR)",
        description="For each Fabric Manager partition (from `fmpm -l`): active or not, its GPUs (BDF, label, module ID), "
        "each GPU's best compute NIC with NCCL's class, and whether every GPU is PIX to a NIC of its own.")
    pp.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    _fabric_args(pp, "required")
    pp.add_argument("--json", action="store_true",
                    help='{"partitions": [{"id", "active", "gpus": [{"bdf", "module", "nic", "nic_class"}], "all_pix"}]}')
    pr = sub.add_parser(
        "pairs", help="each GPU's best NIC and whether DRA's pcieRoot alignment alone gets it on this host",
        description="For each GPU: its best NIC on the host with the pair's NCCL and nvidia-smi class (NCCL's decides, "
        "as it decides GPUDirect RDMA), its pcieRoot (resource.kubernetes.io/pcieRoot), and whether some NIC shares that "
        "root and every one that does is of the best class, i.e. whether a DRA claim matching on pcieRoot can be "
        "satisfied and is enough on this host.")
    pr.add_argument("--sysfs", default=default_sysfs(), help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or /sys)")
    pr.add_argument("--json", action="store_true", help='{"gpus": [{"gpu", "pcie_root", "nic", "nccl", "nvml", "gdr", '
                    '"same_pcie_root_nics", "pcie_root_enough"}], "pcie_root_enough", "pcie_root_not_enough_for"}')
    add_capture_parser(sub, default_sysfs())
    from pcitopo.cli.guesttool import add_verify_args

    add_verify_args(sub.add_parser("verify", help="in the guest: compare its PCI tree with `xmlfix --json`'s prediction "
                                   "(exit 1 on any difference)"))
    _add_guest_parsers(sub)
    add_doctor_parser(sub, default_sysfs())
    _add_domain_parser(sub, default_sysfs())
    add_preflight_parser(sub)
    add_golden_parser(sub)
    sub.add_parser("serve", help="run the KubeVirt hook server (see `pcitopo serve --help`)")
    if not argv:  # bare `pcitopo`: the commands, not only "a command is required"
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    args = parser.parse_args(argv)
    handler = {"topo": _cmd_topo, "capture": cmd_capture, "verify": _cmd_verify, "doctor": cmd_doctor,
               "partitions": _cmd_partitions, "pairs": _cmd_pairs, "guest-tool": _cmd_guest_tool,
               "domain": _cmd_domain, "guest": lambda a: pcitopo_main(["guest", a.action]), "preflight": cmd_preflight,
               "golden": cmd_golden}[args.command]
    return run_program(f"pcitopo {args.command}", lambda: handler(args))


def xmlfix_main(argv: Sequence[str] | None = None) -> int:
    from pcitopo.cli.xmlfix import xmlfix

    return run_program("xmlfix", lambda: xmlfix(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pcitopo_main())
