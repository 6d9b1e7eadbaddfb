"""`xmlfix`: the rewrite on a captured domain XML and a captured (or live) sysfs.

    xmlfix [--sysfs PATH] [--vmi FILE] [--fabric FILE [--module-map FILE]] [-o FILE] [--check] [--explain] [--dot] [--json]
           [--diff] DOMAIN.xml|-
    xmlfix --check --vmi FILE [--cluster FILE ...] [--kubevirt VERSION] [--door plugin|hook] [--sysfs PATH] DOMAIN.xml|-
    xmlfix --vmi FILE [--sysfs PATH] [--cluster FILE] [--kubevirt VERSION] [--devices BDF,...] [--cpu-policy POLICY] [...]
        (no domain argument: the domain `pcitopo domain` predicts, src/pcitopo/kubevirt/launcher/request.py)

Exit 0 on success; 1 when --check finds that the guest will not see what the host has, or (with
--vmi) that the VMI would not start, or would start without a setting pcitopo writes, on the
KubeVirt release judged (src/pcitopo/kubevirt/starts.py; --cluster, --kubevirt, else v1.9.0 assumed); 2 with
one line on stderr for bad input; 4 (EXIT_UNKNOWN) when --check finds nothing wrong but lacks
something it needs (src/pcitopo/guest/verdict.py ``check_unknowns``). A passthrough or off outcome is always named on stderr, and so
is everything the hook would only log and boot anyway (``xmlfix: warning: ...``: a firmware
warning, the NVLink verdict under ``nvlink: warn``, the pairing findings under ``pairing:
warn``, failed readiness checks under ``doctor: warn``). ``--fabric`` is read as the hook reads it, when the NVLink check runs:
a bad file stops only ``nvlink: require``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence

from pcitopo.cli.check import CheckReport, check_lines, check_report, prediction_doc
from pcitopo.errors import ConfigError, DomainError, PcitopoError
from pcitopo.host.files import read_bounded, write_atomic
from pcitopo.host.sources import default_sysfs
from pcitopo.kubevirt.doors import DOORS
from pcitopo.kubevirt.releases import DOOR_NOTES, DOOR_ROWS, RELEASES, ReleaseUnknown
from pcitopo.libvirt.document import MAX_DOMAIN_BYTES
from pcitopo.program import (
    EXIT_BAD_INPUT,
    EXIT_CHECK_FAILED,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_UNKNOWN,
    MAX_VMI_BYTES,
    Parser,
    VersionAction,
    print_json,
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="xmlfix", description="Mirror the host PCIe topology into a libvirt domain XML.",
               epilog=f"exit status: {EXIT_OK} ok; {EXIT_CHECK_FAILED} --check failed; {EXIT_BAD_INPUT} bad input (one line on "
               f"stderr); {EXIT_INTERNAL} internal error; {EXIT_UNKNOWN} --check unknown (nothing failed, but something it "
               "needs is missing: it says what)")
    p.add_argument("--version", action=VersionAction, prog="xmlfix (pcitopo)")
    p.add_argument("domain", metavar="DOMAIN.xml|-", nargs="?", help="domain XML as KubeVirt hands it to a hook (- for stdin); "
                   "without it, with --vmi: the domain `pcitopo domain` predicts for that manifest on --sysfs")
    p.add_argument("--sysfs", default=None, help="sysfs root, capture .tar.gz or fixture dir (default $PCITOPO_SYSFS or this "
                   "machine's /sys, which the verdict then names)")
    p.add_argument("--vmi", metavar="FILE", help="the VMI (JSON or YAML, as `kubectl get vmi NAME -o yaml` prints it): its "
                   "pcitopo.kubevirt.io/ annotations set the options")
    p.add_argument("--fabric", metavar="FILE", default=os.environ.get("PCITOPO_FABRIC") or None,
                   help="NVLink fabric partitions: the output of `fmpm -l` (default $PCITOPO_FABRIC); enables the "
                   "pcitopo.kubevirt.io/nvlink check and the fabric's NV# in --explain; read, as by the hook, only when the "
                   "check runs: a bad file exits 2 under nvlink: require, is a warning under warn")
    p.add_argument("--module-map", metavar="FILE", default=os.environ.get("PCITOPO_MODULE_MAP") or None,
                   help='module ID -> BDF, {"gpus": [{"module", "bdf"}]}, for a fabric file with placeholder BDFs '
                   "(default $PCITOPO_MODULE_MAP)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the rewritten domain here instead of stdout")
    p.add_argument("--check", action="store_true",
                   help="the verdict on stderr, ending in check: ok (exit 0), check: failed: ... (exit 1: a pair's "
                   "class, a device's NUMA cell, a firmware warning, NVLink with --fabric, or a GPU without a NIC at PIX or PXB "
                   "in the guest where the node has one for it) or check: unknown: <what is missing> (exit 4: BARs that cannot "
                   "be sized, an IOMMU group, driver or NUMA node sysfs does not give, a CPU width not recorded)")
    p.add_argument("--pairing", choices=("off",), metavar="off", help="count GPUDirect RDMA, do not judge it (what the VMI's "
                   "pcitopo.kubevirt.io/pairing: off also does): --check does not fail a GPU given a worse NIC")
    p.add_argument("--explain", action="store_true",
                   help="a verdict line, host vs predicted guest matrices, differences grouped by reason, the guest tree")
    p.add_argument("--dot", action="store_true", help="the explanation as a Graphviz picture: host and predicted guest trees in DOT "
                   "(implies --explain; not with --json or --diff)")
    p.add_argument("--json", action="store_true",
                   help="the predicted guest (devices, pairs, notes) as JSON, for `pcitopo verify --expect` in the guest")
    p.add_argument("--nccl-topo", action="store_true", help="NCCL's topology file for the predicted guest (what the hook passes "
                   "through fw_cfg under nccl-topo: fwcfg), for the guest's /var/run/nvidia-topologyd/virtualTopology.xml")
    _add_cluster_args(p)
    p.add_argument("--summary", action="store_true", help="four lines: the host, the guest, the verdict --check gives, the doctor's "
                   "verdict on the placed devices (what `make demo` ends with)")
    p.add_argument("--diff", action="store_true",
                   help="unified diff of what the rewrite changes (both sides serialised alike: only real edits show)")
    from pcitopo.cli.prediction import add_prediction_args

    add_prediction_args(p, shared=False)  # --devices, --cpu-policy: only without a domain argument
    return p


def _add_cluster_args(p: argparse.ArgumentParser) -> None:
    """What the VM meets in its cluster: the door, the KubeVirt release, the pinned image, the target's policy."""
    p.add_argument("--door", choices=DOORS, default=None,
                   help=f"the KubeVirt door the VM comes through: plugin, the pcitopo Plugin ({DOOR_ROWS[3].releases}); "
                   f"hook, the hook sidecar ({DOOR_ROWS[0].releases}; {DOOR_ROWS[1].releases}). --explain says what "
                   "reaches libvirt through it (default: the VMI's door on the release judged, the hook sidecar wherever "
                   "a Plugin object stops VMs); --check --vmi checks that the VMI asks for it and, without --cluster, "
                   "assumes the cluster runs that door (default: the doors the VMI asks for)")
    p.add_argument("--cluster", metavar="FILE", action="append",
                   help="with --check --vmi: judge the VMI on this cluster's KubeVirt release, gates and Plugin objects; "
                   "with --vmi and no domain argument, also predict its domain from it (permittedHostDevices, claims, instance "
                   "types); what `kubectl get kubevirt,plugins.plugin.kubevirt.io,namespaces,nodes,vmis,vms -A -o yaml` "
                   "prints; - for stdin; repeatable")
    p.add_argument("--kubevirt", metavar="VERSION",
                   help="with --check --vmi: judge the VMI on this KubeVirt release (e.g. v1.8.0), with the gates and Plugin "
                   "objects its doors (or --door) imply; with --vmi and no domain argument, also predict that release's "
                   "domain; with --cluster, overrides the dump's release (default v1.9.0, assumed); main is main as read; "
                   "a release pcitopo did not read is unknown (exit 4)")
    p.add_argument("--assume-release", metavar="RELEASE",
                   help="judge the release (--cluster's or --kubevirt's) as this release pcitopo read: "
                   + ", ".join(r.newest for r in RELEASES))
    p.add_argument("--image", metavar="REF", action="append", default=[],
                   help="the pcitopo image your overlay pins (REPOSITORY@sha256:<64 hex>, a mirror's or renamed one "
                   "included; repeatable): the VMI's hook sidecar is pcitopo's when it runs exactly that (default: the "
                   "--cluster dump's PodTemplate pcitopo/pcitopo-image, else an image named pcitopo)")
    p.add_argument("--target", metavar="NAME",
                   help="with --check --vmi: also judge the VMI by this deploy target's Sidecar policy, as `pcitopo "
                   "preflight` does (a dump with pcitopo's params and gate Sidecar is judged without it)")


def _domain_input(args: argparse.Namespace, host, manifest: bytes | None) -> bytes | None:
    """The domain to rewrite: the argument's, or without one (and with --vmi, whose bytes
    ``manifest`` are) the predicted one, said first, on stderr and as --explain's first line;
    None, said, when the release to predict for is not one pcitopo read."""
    if args.domain is not None:
        for opt in ("devices", "cpu_policy", "topology_policy", "reserved_cpus", "kubelet_config"):
            if getattr(args, opt) is not None:
                raise ConfigError(f"--{opt.replace('_', '-')} is for a predicted domain: use it without a domain argument")
        return read_bounded(args.domain, MAX_DOMAIN_BYTES, "domain", DomainError)
    if manifest is None:
        raise ConfigError("no domain: give DOMAIN.xml (or - for stdin), or --vmi FILE to predict the domain")
    from pcitopo.cli.prediction import prediction_request
    from pcitopo.kubevirt.launcher.request import predicted_domain

    try:
        pred = predicted_domain(prediction_request(args), manifest, args.vmi, host)
    except ReleaseUnknown as e:
        print(f"xmlfix: {'check: ' if args.check else ''}unknown: {e.line}", file=sys.stderr)
        return None
    args.predicted = pred  # its resource names and gaps join --check's verdict
    if pred.names.failed:
        return b""
    first = (f"domain predicted (no domain argument): what KubeVirt {pred.version}'s virt-launcher would hand "
             f"the hook for {args.vmi} on this node (pcitopo domain)")
    print(f"xmlfix: {first}", file=sys.stderr)
    for line in pred.notes:
        print(f"xmlfix: domain: {line}", file=sys.stderr)
    if (args.explain or args.summary) and not (args.dot or args.json):
        sys.stdout.write(first + "\n")
    args.domain = "predicted.xml"
    args.sizing = pred.sizing  # the check's advice when a device's node gets no guest cell
    return pred.xml


def xmlfix(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(list(argv))
    # without --sysfs (or $PCITOPO_SYSFS) the node is this machine: every verdict and error says so
    args.here = None if args.sysfs or os.environ.get("PCITOPO_SYSFS") else "read this machine's /sys: no --sysfs given"
    args.sysfs = args.sysfs or default_sysfs()
    _one_document(args)
    _check_cluster_args(args)
    manifest = read_bounded(args.vmi, MAX_VMI_BYTES, "VMI") if args.vmi else None
    vmi = None
    if manifest is not None:  # `kubectl get vmi -o yaml` is what people paste
        from pcitopo.kubevirt.manifest import vmi_as_json

        vmi = vmi_as_json(manifest, args.vmi)
    try:
        return _run(args, manifest, vmi)
    except PcitopoError as e:
        if args.here:
            raise type(e)(f"{e.reason}; {args.here}") from None
        raise


def _run(args: argparse.Namespace, manifest: bytes | None, vmi: bytes | None) -> int:
    """xmlfix on its inputs read: the host, the domain (given or predicted), the rewrite."""
    from pcitopo.host.sysfs import open_host
    from pcitopo.serve.core import handle_define_domain
    from pcitopo.views.explain import diff_text

    host = open_host(args.sysfs)
    domain = _domain_input(args, host, manifest)
    if domain is None:  # no domain can be predicted for a release nobody read (said)
        return EXIT_UNKNOWN
    failed = getattr(args, "predicted", None) and args.predicted.names.failed
    if failed:  # a resource the cluster lacks: no pod, so no domain to rewrite or check
        for line in failed:
            print(f"xmlfix: check: {line}" if args.check else f"xmlfix: {line}", file=sys.stderr)
        if args.check:
            print("xmlfix: check: failed: devices (above)", file=sys.stderr)
        return EXIT_CHECK_FAILED
    fabric_file = None
    if args.fabric:  # read lazily, as the hook does: a bad file matters only when the check runs
        from pcitopo.paths.fabric import FabricFile

        fabric_file = FabricFile(args.fabric, args.module_map, host)
    elif args.module_map:
        raise ConfigError("--module-map needs --fabric (the module map only names the fabric's GPUs)")
    outcome = handle_define_domain(domain, vmi, host, fabric_file)
    if getattr(args, "sizing", None) and outcome.result is not None and outcome.result.report.missing_cells is not None:
        report = outcome.result.report  # the predicted pod's own sizing, from kubelet's model
        report.missing_cells = dataclasses.replace(report.missing_cells, sizing=args.sizing)
    fabric = _loaded(fabric_file)
    result = outcome.result
    out = outcome.xml
    _print_warnings(outcome, fabric, args.check, domain, host, _judges_gdr(args, outcome))

    report = check_report(outcome, host, fabric, vmi, args, _judges_gdr(args, outcome)) if args.check else None
    if args.json:
        print_json(prediction_doc(outcome, host, fabric, report))
    if args.nccl_topo:
        _print_nccl_topo(outcome)
    _print_explanation(args, outcome, host, fabric, vmi)
    if args.summary and result is not None:
        from pcitopo.views.explain import summary_lines

        sys.stdout.write("\n".join(summary_lines(result, host, fabric, outcome.doctor, _judges_gdr(args, outcome))) + "\n")
    if args.diff:  # only what changed in meaning (both sides serialised alike)
        sys.stdout.write(diff_text(domain, out, "-" if args.domain == "-" else args.domain))
    if args.output:
        write_atomic(args.output, out, error=DomainError)
    elif not (args.explain or args.dot or args.diff or args.check or args.json or args.nccl_topo or args.summary):
        sys.stdout.buffer.write(out)
        sys.stdout.flush()

    # A passthrough or off outcome is never silent, whatever was asked for.
    if result is None:
        print(f"xmlfix: domain left unchanged ({outcome.outcome}): {outcome.reason}", file=sys.stderr)
    if report is not None:
        return _check(report)
    return EXIT_OK


def _check_cluster_args(args: argparse.Namespace) -> None:
    predicted = args.domain is None and args.vmi  # they also choose the release the domain is predicted for
    if (args.cluster or args.kubevirt or args.assume_release) and not ((args.check and args.vmi) or predicted or args.explain):
        raise ConfigError("--cluster, --kubevirt and --assume-release judge a VMI on a KubeVirt release: use them with "
                          "--check --vmi FILE or --explain")
    if (args.target or args.image) and not (args.check and args.vmi):
        raise ConfigError("--target and --image judge a VMI: use them with --check --vmi FILE")
    if "-" in (args.cluster or []) and "-" in (args.domain, args.vmi):
        raise ConfigError("only one of DOMAIN, --vmi and --cluster can be - (standard input)")


def _door_text(door: str, why: str = "") -> str:
    """``xmlfix --explain``'s door section: the door, why that one, then which door each release needs,
    wrapped here where it is printed (the release table holds the facts, not their layout)."""
    from pcitopo.views.report import wrap_text

    rows = [f"- {r.releases}: {r.doors} (gates {r.gates}): {r.survives}" for r in DOOR_ROWS]
    head = wrap_text(DOOR_NOTES[door]) + ("\n" + wrap_text(why) if why else "")
    return head + "\n" + wrap_text("\n".join(["Which door, per KubeVirt release:", *rows])) + "\n"


def _explain_door(args: argparse.Namespace, vmi: bytes | None) -> str:
    """--explain's door section: --door, or the VMI's door on the release judged as --check judges it."""
    import json

    from pcitopo.kubevirt.releases import DEFAULT_VERSION, judged_as, resolve
    from pcitopo.kubevirt.starts import explain_door

    if args.door:
        return _door_text(args.door)
    try:
        doc = json.loads(vmi) if vmi is not None else None
    except ValueError:
        doc = None
    version, said = args.kubevirt, "--kubevirt"
    if args.cluster and not version:
        from pcitopo.kubevirt.cluster import read_dump

        cr = read_dump(args.cluster).kubevirt
        version, said = (cr.version if cr else None), "the dump's KubeVirt CR"
    if not version and not args.assume_release:
        version, said = DEFAULT_VERSION, "assumed: give --cluster, --kubevirt or --assume-release"
    try:
        name, assumed = judged_as(version, args.assume_release)
        release, why = resolve(name), f"Door for KubeVirt {name} ({assumed or said})."
    except ReleaseUnknown as e:
        release, why = None, f"Door: the hook sidecar, as the release is unknown: {e.line}."
    door = explain_door(doc if isinstance(doc, dict) else None, release)
    return _door_text(door, why)


def _print_explanation(args: argparse.Namespace, outcome, host, fabric, vmi: bytes | None = None) -> None:
    """--dot (the explanation as a picture), or --explain, with the placed devices' readiness."""
    from pcitopo.views.explain import explain_text
    from pcitopo.views.report import wrap_text

    result = outcome.result
    if args.dot:
        from pcitopo.views.dot import explain_dot

        sys.stdout.write(explain_dot(result, host, outcome.reason, fabric=fabric, gdr=_judges_gdr(args, outcome)))
    elif args.explain:
        if result is None:
            sys.stdout.write(wrap_text(f"domain left unchanged ({outcome.outcome}): {outcome.reason}") + "\n")
        else:
            sys.stdout.write(explain_text(result, host, args.sysfs if os.path.realpath(args.sysfs) == "/sys" else None, fabric))
            sys.stdout.write("\n" + _explain_door(args, vmi))
            if outcome.doctor is not None:  # the placed devices' readiness (pcitopo doctor)
                from pcitopo.views.doctor_report import report_text

                sys.stdout.write("\nHost readiness of the placed devices (pcitopo doctor):\n\n"
                                 + wrap_text(report_text(outcome.doctor, beside_vm_labels=True)))


def _loaded(fabric_file):
    """The fabric for the explanation and the prediction: the file's, or None when there is
    none or it cannot be read (a warning already said so if the check needed it)."""
    from pcitopo.errors import FabricError

    if fabric_file is None:
        return None
    try:
        return fabric_file()
    except FabricError:
        return None


def _warnings(outcome, domain: bytes = b"") -> list[str]:
    """One line per thing the hook would boot the VM with and only log: the rewrite's firmware
    warnings, the NVLink verdict under ``nvlink: warn``, GPUs given a worse NIC than the host has
    under ``pairing: warn``, failed host-readiness checks under ``doctor: warn`` (or a doctor
    that could not run), and a VMI whose name is not the domain's (``VmiFacts.domain_mismatch``)."""
    from pcitopo.guest.verdict import firmware_warnings
    from pcitopo.libvirt.lenient import readable_domain_name
    from pcitopo.serve.core import nvlink_note

    out = firmware_warnings(outcome.result) if outcome.result is not None else []
    mismatch = outcome.vmi.domain_mismatch(readable_domain_name(domain)) if outcome.vmi.name else None
    if mismatch:
        out.append(f"vmi: {mismatch}")
    if outcome.summary.get("nvlink_reason"):
        out.append(nvlink_note(outcome.summary))
    out += [f"pairing: {line}" for line in outcome.summary.get("pairing_findings", ())]
    if outcome.summary.get("pairing_reason"):
        out.append(f"pairing: not checked: {outcome.summary['pairing_reason']}")
    doctor = outcome.summary.get("doctor") or {}
    if "error" in doctor:
        out.append(f"doctor: not run: {doctor['error']}")
    elif outcome.doctor is not None and outcome.doctor.failed:
        failed = outcome.doctor.failed
        shown = ", ".join(f"{f.check} {f.bdf or 'host'}" for f in failed[:3])
        more = f", and {len(failed) - 3} more" if len(failed) > 3 else ""
        out.append(f"doctor: {len(failed)} fail ({shown}{more}; `pcitopo doctor` explains each)")
    return out


def _gdr_lost(outcome, host) -> list:
    """The GPUs --check fails for GPUDirect RDMA (their pairing warnings say it again)."""
    from pcitopo.guest.verdict import gdr_in_guest

    return [g.host.gpu.bdf for g in gdr_in_guest(outcome.result, host).lost] if outcome.result is not None else []


def _print_warnings(outcome, fabric, check: bool, domain: bytes = b"", host=None, judge_gdr: bool = False) -> None:
    """What the hook logs and boots anyway: never silent here. Under --check a line the check
    prints as a reason (NVLink, firmware, a GPU without GPUDirect RDMA) is said there, once."""
    from pcitopo.guest.verdict import beyond_pairs

    said_by_check = beyond_pairs(outcome.result, fabric) if check and outcome.result is not None else []
    lost = _gdr_lost(outcome, host) if check and judge_gdr else ()
    for line in _warnings(outcome, domain):
        if line not in said_by_check and not (line.startswith("pairing: ") and any(f"({b}) got" in line for b in lost)):
            print(f"xmlfix: warning: {line}", file=sys.stderr)


def _one_document(args: argparse.Namespace) -> None:
    """What goes to stdout must read as one document: --json and --dot
    each print one, so neither mixes with another kind (--explain text, --diff, each other).
    --dot is --explain drawn, so the two together are just the picture."""
    if args.json and (args.explain or args.diff or args.dot or args.summary):
        raise ConfigError("--json prints one JSON document: use it without --explain, --dot, --diff and --summary")
    if args.nccl_topo and (args.json or args.explain or args.diff or args.dot or args.summary):
        raise ConfigError("--nccl-topo prints NCCL's topology file: use it without --json, --explain, --dot, --diff and --summary")
    if args.dot and (args.diff or args.summary):
        raise ConfigError("--dot prints one Graphviz document: use it without --diff and --summary")


def _judges_gdr(args: argparse.Namespace, outcome) -> bool:
    """Whether --check fails a GPU that lost GPUDirect RDMA: unless --pairing off or the VMI's
    pcitopo.kubevirt.io/pairing: off says not to."""
    return args.pairing != "off" and getattr(outcome.options, "pairing", "warn") != "off"


def _check(report: CheckReport) -> int:
    """--check's lines on stderr."""
    for line in check_lines(report):
        print(f"xmlfix: {line}", file=sys.stderr)
    return report.exit_code


def _print_nccl_topo(outcome) -> None:
    """--nccl-topo: the file the guest installs, byte for byte what the domain's fw_cfg carries."""
    from pcitopo.serve.options import annotation

    data = outcome.result.nccl_topo.data if outcome.result is not None else b""
    if not data:
        raise ConfigError("no NCCL topology file: the rewrite placed no GPU or NIC"
                          if outcome.result is not None else f"no NCCL topology file: domain left unchanged ({outcome.outcome})")
    if outcome.options is not None and outcome.options.nccl_topo == "off":
        print(f"xmlfix: warning: {annotation('nccl_topo')} is off: the hook passes no such file to this VM", file=sys.stderr)
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
