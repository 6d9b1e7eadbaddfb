"""The goldens of one node: what ``pcitopo golden make`` writes and ``golden check`` recomputes.

Everything here is a function of the node's bytes and the VM files alone (hermetic): the node is
read as its capture would be read on another machine (its recorded CPU width, never this
machine's /proc/cpuinfo or $PCITOPO_CPUINFO), no ``PCITOPO_*`` variable is read (no fabric file:
NVLink from the board table), and no path as typed reaches an output (the node is named by
``path_label``). The defaults assumed are written into ``golden.json`` (:data:`ASSUMED`).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

from pcitopo import SCHEMA, __version__, stamped
from pcitopo.errors import ConfigError
from pcitopo.model.tree import Role, Topology

GOLDEN_JSON = "golden.json"
GOLDEN_FORMAT = 1  # the layout of a golden directory (files and golden.json's keys)
DEFAULT_VM = "all-gpus-nics"
VM_FILE = "vm.yaml"
# One VM's files, in the order they are written and compared.
FILES = ("domain.xml", "nccl-topo.xml", "prediction.json", "verdict.json", "verdict.txt")
HERMETIC = ("hermetic: no PCITOPO_* variable, no current directory and no /proc/cpuinfo of this machine is read; "
            "the node is read as its capture, named by its file name and digest")
ASSUMED = {
    "kubevirt": "v1.9.0 (the release whose virt-launcher builds the domain and whose start the verdict judges)",
    "door": "the doors the VM asks for (xmlfix --check --vmi without --door); the default VM asks for the hook "
            "sidecar (hooks.kubevirt.io/hookSidecars)",
    "cluster": "none: no permittedHostDevices, DRA claims or instance types beyond the VM file",
    "cpu_policy": "devices: the pod's CPUs spread over every NUMA node of its devices",
    "devices": "every GPU and NIC physical function the node has, GPUs first, in PCI order (the default VM's hostdevs)",
    "fabric": "none: NVLink counts from the board table; PCITOPO_FABRIC is not read",
    "pairing": "judged: a GPU without GPUDirect RDMA in the guest fails the verdict (pcitopo.kubevirt.io/pairing: off to count only)",
    "cpu_width": "the one the node records (pcitopo capture --phys-bits); unknown if it records none",
}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Node:
    host: Topology
    label: str
    digest: str  # of what pcitopo reads from the node, packed as `pcitopo capture` packs it


def read_node(path: str) -> Node:
    """The node as its capture: the same bytes whatever the source (sysfs tree, fixture, capture)."""
    from pcitopo.host.capture import capture_tree
    from pcitopo.host.sources import open_source, path_label
    from pcitopo.host.sysfs import SysfsReader

    tree, _ = capture_tree(open_source(path))
    tree.name = path_label(path)
    tree.cpu_is_local = False  # the node's recorded width, never this machine's
    return Node(Topology(SysfsReader(tree)), tree.name, sha256(tree.tarball_bytes()))


def default_vm(host: Topology) -> bytes:
    """A VMI passing every GPU and NIC of the node through, as the project's own goldens do: EFI
    (a B200 pair's BARs need it), dedicated CPUs with guest NUMA (guestMappingPassthrough), one
    device-plugin resource per PCI id (golden.pcitopo.io/VVVV_DDDD)."""
    import yaml

    gpus, nics = _devices(host)
    if not gpus and not nics:
        raise ConfigError(f"{host.label}: no GPU or NIC to pass through: give the VM with --vmi")
    nodes = {host.numa_of(host.function(b)) for b in gpus + nics}
    vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
           "metadata": {"name": DEFAULT_VM, "namespace": "golden",
                        "annotations": {"hooks.kubevirt.io/hookSidecars": '[{"image": "pcitopo"}]'}},
           "spec": {"domain": {
               "firmware": {"bootloader": {"efi": {"secureBoot": False}}},
               "cpu": {"cores": 4 * max(1, len(nodes)), "dedicatedCpuPlacement": True, "numa": {"guestMappingPassthrough": {}}},
               "memory": {"guest": "64Gi", "hugepages": {"pageSize": "1Gi"}},
               "resources": {"requests": {"memory": "64Gi"}},
               "devices": {"gpus": [{"name": f"gpu{i}", "deviceName": _resource(host, b)} for i, b in enumerate(gpus)],
                           "hostDevices": [{"name": f"nic{i}", "deviceName": _resource(host, b)} for i, b in enumerate(nics)]}}}}
    head = ("# pcitopo golden make's default VM for this node: every GPU and NIC passed through\n"
            "# (golden.json, \"assumed\"). Give your own with --vmi.\n")
    return (head + yaml.safe_dump(vmi, sort_keys=False)).encode()


def _devices(host: Topology) -> tuple[list, list]:
    from pcitopo.model.labels import default_devices

    devs = default_devices(host)
    return ([b for b in devs if host.role(host.function(b)) == Role.GPU],
            [b for b in devs if host.role(host.function(b)) == Role.NIC])


RESOURCE_DOMAIN = "golden.pcitopo.io/"


def _resource(host: Topology, bdf) -> str:
    return RESOURCE_DOMAIN + host.function(bdf).ids.replace(":", "_")


def vm_outputs(node: Node, vm_bytes: bytes) -> dict[str, bytes]:
    """One VM's golden files: the rewritten domain, NCCL's topology file as XML, the --json
    prediction, the verdict (machine-readable and as --check says it)."""
    import argparse

    from pcitopo.cli.check import check_lines, check_report, prediction_doc
    from pcitopo.kubevirt.manifest import vmi_as_json
    from pcitopo.serve.core import handle_define_domain

    host = node.host
    domain = vm_domain(host, vm_bytes)
    args = argparse.Namespace(kubevirt=None, cluster=None, door=None)
    vmi = vmi_as_json(vm_bytes, VM_FILE)
    outcome = handle_define_domain(domain, vmi, host)
    report = check_report(outcome, host, None, vmi, args, getattr(outcome.options, "pairing", "warn") != "off")
    nccl = outcome.result.nccl_topo.data if outcome.result is not None else b""
    return {
        "domain.xml": outcome.xml,
        "nccl-topo.xml": nccl,
        "prediction.json": _json(prediction_doc(outcome, host)),
        "verdict.json": _json(report.record),
        "verdict.txt": ("\n".join(check_lines(report)) + "\n").encode(),
    }


def vm_domain(host: Topology, vm_bytes: bytes) -> bytes:
    """The domain KubeVirt v1.9.0's virt-launcher hands the hook for the VM on the node (``pcitopo
    domain --cpu-policy devices``), the VM's ``golden.pcitopo.io/VVVV_DDDD`` resources standing for
    those PCI ids (as a cluster's permittedHostDevices would say)."""
    from pcitopo.kubevirt.hostdevices import PermittedHostDevices, PermittedPCI
    from pcitopo.kubevirt.launcher.cpus import CpuPolicy
    from pcitopo.kubevirt.launcher.dumped import expand
    from pcitopo.kubevirt.launcher.first_domain import Inputs, predict
    from pcitopo.kubevirt.manifest import as_vmi, manifest_document, vmi_as_json

    vmi_as_json(vm_bytes, VM_FILE)  # the checks and messages of --vmi
    doc = manifest_document(vm_bytes, VM_FILE)
    vmi, _ = expand(doc, as_vmi(doc, VM_FILE), None)
    devices = (vmi.get("spec", {}).get("domain", {}).get("devices") or {})
    names = [d.get("deviceName") or "" for kind in ("gpus", "hostDevices") for d in devices.get(kind) or () if isinstance(d, dict)]
    permitted = PermittedHostDevices(tuple(PermittedPCI(n, n.split("/", 1)[1].replace("_", ":").lower())
                                           for n in names if n.startswith(RESOURCE_DOMAIN)), (), True)
    return predict(host, vmi, Inputs(policy=CpuPolicy.DEVICES, permitted=permitted)).xml


def _json(doc: dict) -> bytes:
    return (json.dumps(stamped(doc), indent=2) + "\n").encode()


def golden_record(node: Node, vms: dict[str, bytes], given: bool, files: dict[str, bytes]) -> bytes:
    """golden.json: who made the goldens, from what (digests), and every default assumed."""
    doc = {"pcitopo": __version__, "schema": SCHEMA, "golden_format": GOLDEN_FORMAT,
           "node": {"name": node.label, "sha256": node.digest},
           "vms": [{"name": name, "file": f"{name}/{VM_FILE}", "sha256": sha256(data), "given": given}
                   for name, data in vms.items()],
           "assumed": ASSUMED, "environment": HERMETIC,
           "files": {rel: sha256(data) for rel, data in sorted(files.items())}}
    return (json.dumps(doc, indent=2) + "\n").encode()


def vm_name(data: bytes, path: str) -> str:
    """The VM's metadata.name: its folder in the golden directory."""
    from pcitopo.kubevirt.manifest import manifest_document

    name = ((manifest_document(data, path).get("metadata") or {}).get("name") or "")
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"{path}: no usable metadata.name (it names the VM's folder in the golden directory)")
    return name


def all_outputs(node: Node, vms: dict[str, bytes], given: bool) -> dict[str, bytes]:
    """Every file of the golden directory, by relative path."""
    files: dict[str, bytes] = {}
    for name, data in vms.items():
        files[f"{name}/{VM_FILE}"] = data
        for fname, content in vm_outputs(node, data).items():
            if content:
                files[f"{name}/{fname}"] = content
    files[GOLDEN_JSON] = golden_record(node, vms, given, {k: v for k, v in files.items()})
    return files


def write_golden(directory: str, files: dict[str, bytes]) -> None:
    """Write the files (each whole or not at all: the one writer, src/pcitopo/host/files.py)."""
    from pcitopo.host.files import write_atomic

    for rel, data in files.items():
        path = os.path.join(directory, rel)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        except OSError as e:
            raise ConfigError(f"cannot create {os.path.dirname(path)}: {e.strerror or e}") from None
        write_atomic(path, data, error=ConfigError)
