"""What a domain prediction is asked with, and its answer for a door: the manifest read as the
VM or VMI it is (kubevirt/manifest.py's checks), the cluster dump (kubevirt/cluster.py), the release
(``--kubevirt``, the dump's, else v1.9.0), and the options both doors take (``pcitopo domain``;
``xmlfix --vmi`` without a domain argument): :func:`add_prediction_args`, :func:`predicted_domain`.
Every assumption is a line of :attr:`Predicted.notes`; bad input is one line (ConfigError).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from pcitopo.topology.errors import ConfigError

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
    from .releases import DEFAULT_VERSION, release_of, version_text

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
    from .allocation import parse_devices, permitted_ids
    from .converter import UPSTREAM_MACHINE
    from .cpus import DEFAULT_POLICY, policy_of
    from .dumped import expand
    from .predict import Inputs, predict

    dump = None
    cluster = getattr(args, "cluster", None)  # xmlfix may carry its own --cluster (one path or several)
    if cluster:
        from ..cluster import read_dump

        dump = read_dump(cluster if isinstance(cluster, (list, tuple)) else [cluster])
    doc = _manifest(vmi_path)
    from ..manifest import as_vmi

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

    from ..manifest import vmi_as_json

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


