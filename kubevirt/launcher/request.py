"""What a domain prediction is asked with, and its answer for a door: the manifest read as the
VM or VMI it is (kubevirt/manifest.py's checks), the cluster dump (kubevirt/cluster.py), the release
(``--kubevirt``, the dump's, else v1.9.0), and the options both doors take (``pcitopo domain``;
``xmlfix --vmi`` without a domain argument): :func:`add_prediction_args`, :func:`predicted_domain`.
Every assumption is a line of :attr:`Predicted.notes`; bad input is one line (ConfigError).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass


def add_prediction_args(p: argparse.ArgumentParser, shared: bool = True) -> None:
    """The options a prediction takes (``pcitopo domain``; ``xmlfix --vmi`` without a domain,
    whose own ``--kubevirt`` and ``--cluster`` serve it too: ``shared`` False)."""
    if shared:
        p.add_argument("--kubevirt", metavar="VERSION", help="the KubeVirt release whose virt-launcher builds the domain: "
                       "v1.6.0 to v1.9.0 or main (default: the dump's observedKubeVirtVersion, else v1.9.0)")
        p.add_argument("--cluster", metavar="FILE", action="append",
                       help="the cluster dump `pcitopo preflight` reads (`kubectl get kubevirt,plugins.plugin.kubevirt.io,"
                       "namespaces,nodes,vmis,vms -A -o yaml`), with resourceclaims,resourceslices,"
                       "virtualmachineclusterinstancetypes,virtualmachineclusterpreferences added for DRA and instance "
                       "types (- for stdin): the release, the machine type, permittedHostDevices, DRA allocations, "
                       "instance types; nothing in it is required")
    p.add_argument("--devices", metavar="BDF,...", help="the functions kubelet hands the pod, in the order of the "
                   "VMI's gpus, SR-IOV interfaces, hostDevices (a running launcher's PCI_RESOURCE_* values); "
                   "default: picked as `pcitopo pairs` pairs them")
    p.add_argument("--cpu-policy", metavar="POLICY", help="how kubelet's static CPU manager places the pod's CPUs: "
                   "distribute (cpuManagerPolicyOptions distribute-cpus-across-numa, docs/DEPLOY.md's), packed (no "
                   "options); default: the --kubelet-config's, else distribute; devices (spread over every NUMA node "
                   "of the devices) is not kubelet's, a what-if")
    from ..kubelet.settings import add_kubelet_args

    add_kubelet_args(p)


@dataclass(frozen=True)
class Predicted:
    xml: bytes
    version: str
    notes: tuple[str, ...]
    vmi: dict  # the VMI the domain is for (instance type applied), for the hook's later calls
    release: object  # pcitopo.kubevirt.launcher.releases.Release
    sizing: str | None = None  # when a device's node gets no guest cell: the vCPU count that gives it one


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


def predicted_domain(args: argparse.Namespace, manifest: bytes, name: str, host) -> Predicted:
    """The prediction for the ``--vmi`` file ``name`` (its bytes: ``manifest``, read once by the
    door, standard input included) on ``host`` with the options :func:`add_prediction_args` adds."""
    from .allocation import parse_devices, permitted_ids
    from .converter import UPSTREAM_MACHINE
    from ..kubelet.settings import resolve
    from .cpus import CpuPolicy
    from .dumped import expand
    from .predict import Inputs, predict

    dump = None
    cluster = getattr(args, "cluster", None)  # xmlfix may carry its own --cluster (one path or several)
    if cluster:
        from ..cluster import read_dump

        dump = read_dump(cluster if isinstance(cluster, (list, tuple)) else [cluster])
    doc = _manifest(manifest, name)
    from ..manifest import as_vmi

    vmi, notes = expand(doc, as_vmi(doc, name), dump)
    release, version, why = _release(args, dump)
    cr = dump.kubevirt if dump is not None else None
    kubelet = resolve(args)
    policy = CpuPolicy.DEVICES if kubelet.spread_over_devices else \
        CpuPolicy.DISTRIBUTE if kubelet.settings.distribute else CpuPolicy.PACKED
    model = ((cr.raw.get("spec") or {}).get("configuration") or {}).get("cpuModel") if cr else None
    inputs = Inputs(release=release, version=version, machine=(cr.machine_type if cr and cr.machine_type else UPSTREAM_MACHINE),
                    cpu_model=model or "host-model",
                    devices=tuple(parse_devices(args.devices)), policy=policy, kubelet=kubelet.settings,
                    permitted=permitted_ids(cr.permitted_pci) if cr else {}, dump=dump)
    p = predict(host, vmi, inputs)
    head = [f"KubeVirt {version} ({why}), machine {inputs.machine}"]
    if kubelet.assumed:
        head.append(kubelet.assumed)
    return Predicted(p.xml, version, tuple(head + notes + list(p.notes)), vmi, release, p.sizing)


def _manifest(data: bytes, name: str) -> dict:
    """The manifest as an object: the one VM or VMI (YAML or JSON; of several documents the one
    VM or VMI), after the checks ``xmlfix --vmi`` makes (kubevirt/manifest.py)."""
    from ..manifest import manifest_document, vmi_as_json

    vmi_as_json(data, name)  # kinds, annotations, labels: the same messages as --vmi
    return manifest_document(data, name)


