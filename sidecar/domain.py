"""``pcitopo domain``: the domain XML virt-launcher would hand the hook at the first
``OnDefineDomain`` / ``MutateDomain`` call, for a VM or VMI manifest on a node, before anything
is deployed (pcitopo.kubevirt.launcher.predict is the model).

    pcitopo domain --vmi FILE --sysfs NODE [--kubevirt VERSION | --cluster FILE] [--devices BDF,...]
                   [--cpu-policy distribute|packed|devices] [--call N [--hook pcitopo|none]] [-o FILE]

The domain goes to stdout (or ``-o``); what was assumed (the release, the CPU policy, the
functions picked, an instance type missing from the dump) goes to stderr, one line each,
prefixed ``pcitopo domain:``. Bad input is one line naming the field, exit 2.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from pcitopo.topology.errors import ConfigError

PREFIX = "pcitopo domain"
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # as xmlfix --vmi reads one


def add_prediction_args(p: argparse.ArgumentParser, shared: bool = True) -> None:
    """The options a prediction takes (``pcitopo domain``; ``xmlfix --vmi`` without a domain,
    whose own ``--kubevirt`` and ``--cluster`` serve it too: ``shared`` False)."""
    if shared:
        p.add_argument("--kubevirt", metavar="VERSION", help="the KubeVirt release whose virt-launcher builds the domain: "
                       "v1.6.0 to v1.9.0 or main (default: the dump's observedKubeVirtVersion, else v1.9.0)")
        p.add_argument("--cluster", metavar="FILE", action="append",
                       help="`kubectl get kubevirt,resourceclaims,resourceslices,virtualmachineclusterinstancetypes,"
                       "virtualmachineclusterpreferences -A -o yaml` output (- for stdin): the release, the machine type, "
                       "permittedHostDevices, DRA allocations, instance types; nothing in it is required")
    p.add_argument("--devices", metavar="BDF,...", help="the functions kubelet hands the pod, in the order of the "
                   "VMI's gpus, SR-IOV interfaces, hostDevices (a running launcher's PCI_RESOURCE_* values); "
                   "default: picked as `pcitopo pairs` pairs them")
    p.add_argument("--cpu-policy", metavar="POLICY", help="how kubelet's static CPU manager places the pod's CPUs: "
                   "distribute (distribute-cpus-across-numa, docs/DEPLOY.md's; default), packed, devices (spread "
                   "over every NUMA node of the devices)")


@dataclass(frozen=True)
class Predicted:
    xml: bytes
    version: str
    notes: tuple[str, ...]
    vmi: dict  # the VMI the domain is for (instance type applied), for the hook's later calls
    release: object  # pcitopo.kubevirt.launcher.releases.Release


def _release(args: argparse.Namespace, dump):
    from pcitopo.kubevirt.launcher.releases import DEFAULT_VERSION, release_of, version_text

    cr = dump.kubevirt if dump is not None else None
    if args.kubevirt:
        version, why = args.kubevirt, "--kubevirt"
    elif cr is not None and cr.version:
        version, why = cr.version, "the dump's KubeVirt CR"
    else:
        version, why = DEFAULT_VERSION, "assumed: give --kubevirt or --cluster"
    return release_of(version), version_text(version), why


def predicted_domain(args: argparse.Namespace, vmi_path: str, host) -> Predicted:
    """The prediction for ``--vmi`` on ``host`` with the options :func:`add_prediction_args` adds."""
    from pcitopo.kubevirt.launcher.allocation import parse_devices, permitted_ids
    from pcitopo.kubevirt.launcher.converter import UPSTREAM_MACHINE
    from pcitopo.kubevirt.launcher.cpus import DEFAULT_POLICY, policy_of
    from pcitopo.kubevirt.launcher.dumped import expand
    from pcitopo.kubevirt.launcher.predict import Inputs, predict

    dump = None
    cluster = getattr(args, "cluster", None)  # xmlfix may carry its own --cluster (one path or several)
    if cluster:
        from pcitopo.kubevirt.cluster import read_dump

        dump = read_dump(cluster if isinstance(cluster, (list, tuple)) else [cluster])
    doc = _manifest(vmi_path)
    from pcitopo.kubevirt.manifest import as_vmi

    vmi, notes = expand(doc, as_vmi(doc, vmi_path), dump)
    release, version, why = _release(args, dump)
    cr = dump.kubevirt if dump is not None else None
    policy = policy_of(args.cpu_policy)
    model = ((cr.raw.get("spec") or {}).get("configuration") or {}).get("cpuModel") if cr else None
    inputs = Inputs(release=release, version=version, machine=(cr.machine_type if cr and cr.machine_type else UPSTREAM_MACHINE),
                    cpu_model=model or "host-model",
                    devices=tuple(parse_devices(args.devices)), policy=policy,
                    permitted=permitted_ids(cr.permitted_pci) if cr else {}, dump=dump)
    p = predict(host, vmi, inputs)
    head = [f"KubeVirt {version} ({why}), machine {inputs.machine}"]
    if args.cpu_policy is None and policy is DEFAULT_POLICY:
        head.append(f"CPU policy {policy.value} assumed (--cpu-policy to change)")
    return Predicted(p.xml, version, tuple(head + notes + list(p.notes)), vmi, release)


def _manifest(path: str) -> dict:
    """The manifest as an object: one VM or VMI (YAML or JSON; the first VM/VMI of a file with
    several documents, as the deploy/ examples are), after the checks ``xmlfix --vmi`` makes."""
    import json

    import yaml

    from pcitopo.kubevirt.manifest import vmi_as_json

    data = _read(path)
    try:
        docs = [json.loads(data)] if data.lstrip()[:1] in (b"{", b"[") else list(yaml.safe_load_all(data))
    except (ValueError, yaml.YAMLError) as e:
        raise ConfigError(f"VMI {path} is neither JSON nor YAML: {str(e).splitlines()[0]}") from None
    if len(docs) == 1 and isinstance(docs[0], dict) and isinstance(docs[0].get("items"), list) and len(docs[0]["items"]) == 1:
        docs = docs[0]["items"]
    kinds = [d for d in docs if isinstance(d, dict) and d.get("kind") in ("VirtualMachine", "VirtualMachineInstance")]
    raw = kinds[0] if kinds else (docs[0] if len(docs) == 1 else None)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: no VirtualMachine or VirtualMachineInstance in it")
    vmi_as_json(data if len(docs) == 1 else json.dumps(raw).encode(), path)  # kinds, annotations, as --vmi reads them
    return raw


def _read(path: str) -> bytes:
    """The manifest's bytes, at most :data:`MAX_MANIFEST_BYTES` (``-``: standard input)."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(MAX_MANIFEST_BYTES + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"cannot read VMI {path}: {e.strerror or e}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ConfigError(f"VMI {path} is larger than {MAX_MANIFEST_BYTES} bytes")
    return data


def hook_input(pred: Predicted, call: int, hook: str, host) -> tuple[bytes, str]:
    """The hook's input at ``call`` of the boot (``allocateHotplugPorts``'s defines, the release's
    re-parse and libvirt's define between them), with pcitopo's rewrite (``hook`` pcitopo) or
    nothing (``none``) answering the earlier calls; and the line that says so."""
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


def domain_command(args: argparse.Namespace) -> int:
    from pcitopo.topology.host.sysfs import open_host

    host = open_host(args.sysfs)
    pred = predicted_domain(args, args.vmi, host)
    xml, notes = pred.xml, list(pred.notes)
    if args.call is not None:
        xml, line = hook_input(pred, args.call, args.hook, host)
        notes.append(line)
    for line in notes:
        print(f"{PREFIX}: {line}", file=sys.stderr)
    if args.output and args.output != "-":
        try:
            with open(args.output, "wb") as fh:
                fh.write(xml)
        except OSError as e:
            raise ConfigError(f"cannot write {args.output}: {e.strerror or e}") from None
    else:
        sys.stdout.buffer.write(xml)
        sys.stdout.flush()
    return 0


def add_domain_parser(sub, default_sysfs: str) -> None:
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
