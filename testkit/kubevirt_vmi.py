"""The domain virt-launcher would hand the hook for a VMI manifest on a given node, so the shipped
examples (``deploy/*.yaml``) can be run through ``xmlfix --check`` against the fixture that
stands in for their node.

What is taken from the manifest, as KubeVirt's converter uses it
(``pkg/virt-launcher/virtwrap/converter``; docs/SOURCES.md):

- the devices: ``spec.domain.devices.gpus`` become that many of the node's GPUs bound to
  ``vfio-pci`` (or the ones given, e.g. one fabric partition), each ``sriov`` interface and
  ``hostDevices`` entry one ``vfio-pci`` NIC, the nearest one to the chosen GPUs first
  (what a topology-aware allocation hands out);
- guest NUMA cells with ``guestMappingPassthrough`` (one per host node of the devices), the
  vCPUs (sockets × cores × threads) spread over them, ``memory.guest`` split across them;
- the CPU mode: ``spec.domain.cpu.model`` (``host-passthrough``), otherwise KubeVirt's default
  ``host-model``;
- the firmware: ``firmware.bootloader.efi`` gives OVMF from a pflash loader (``secure='yes'``
  unless ``secureBoot: false``), anything else SeaBIOS, KubeVirt's default.

A ``VirtualMachine`` becomes the VMI virt-controller creates from it: the template's metadata
(annotations) and spec.
"""

from __future__ import annotations

from typing import Any, Sequence

from lxml import etree

from pcitopo.topology.paths.classify import classify
from pcitopo.topology.model.tree import Bdf, Role, Topology

from .kubevirt_sim import DomainSpec, kubevirt_domain, to_kubevirt_bytes, with_efi

VM_KINDS = ("VirtualMachine", "VirtualMachineInstance")
_CLASS_ORDER = ("PIX", "PXB", "PHB", "SYS")
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def as_vmi(doc: dict[str, Any]) -> dict[str, Any]:
    """The VMI a manifest starts: itself, or a VirtualMachine's template."""
    if doc.get("kind") == "VirtualMachine":
        tmpl = doc["spec"]["template"]
        meta = dict(tmpl.get("metadata") or {})
        meta.setdefault("name", doc["metadata"]["name"])
        meta.setdefault("namespace", doc["metadata"].get("namespace", "default"))
        return {"apiVersion": doc["apiVersion"], "kind": "VirtualMachineInstance", "metadata": meta, "spec": tmpl["spec"]}
    return doc


def quantity(text: str) -> int:
    for suffix, factor in _UNITS.items():
        if str(text).endswith(suffix):
            return int(str(text)[: -len(suffix)]) * factor
    return int(text)


def _assignable(host: Topology, role: Role) -> list[Bdf]:
    return [f.bdf for f in host.functions() if host.role(f) == role and f.driver == "vfio-pci" and not f.is_vf]


def _nearest_nics(host: Topology, gpus: Sequence[Bdf], count: int) -> list[Bdf]:
    def rank(nic: Bdf) -> tuple:
        best = min((_CLASS_ORDER.index(classify(host, g, nic).nccl.value) for g in gpus), default=len(_CLASS_ORDER))
        return best, nic

    return sorted(_assignable(host, Role.NIC), key=rank)[:count]


def vmi_devices(host: Topology, vmi: dict[str, Any], gpus: Sequence[Bdf] | None = None) -> tuple[Bdf, ...]:
    devices = vmi["spec"]["domain"].get("devices", {})
    wanted = len(devices.get("gpus") or [])
    chosen = list(gpus) if gpus is not None else _assignable(host, Role.GPU)[:wanted]
    if len(chosen) != wanted:
        raise ValueError(f"the VMI asks for {wanted} GPUs, the node offers {len(chosen)}")
    nics = sum(1 for i in devices.get("interfaces") or [] if "sriov" in i) + len(devices.get("hostDevices") or [])
    picked = _nearest_nics(host, chosen, nics)
    if len(picked) != nics:
        raise ValueError(f"the VMI asks for {nics} NICs, the node offers {len(picked)}")
    return tuple(chosen + picked)


def domain_for_vmi(host: Topology, vmi: dict[str, Any], gpus: Sequence[Bdf] | None = None) -> bytes:
    """KubeVirt's first ``OnDefineDomain`` input for ``vmi`` on ``host``."""
    domain = vmi["spec"]["domain"]
    cpu = domain.get("cpu") or {}
    devices = vmi_devices(host, vmi, gpus)
    guest_numa = "guestMappingPassthrough" in (cpu.get("numa") or {})
    cells = (len({host.numa_of(host.function(b)) for b in devices} - {-1}) or 1) if guest_numa else 1
    vcpus = cpu.get("sockets", 1) * cpu.get("cores", 1) * cpu.get("threads", 1)
    spec = DomainSpec(vmi["metadata"]["name"], devices, guest_numa=guest_numa, vcpus_per_cell=max(1, vcpus // cells))
    root = etree.fromstring(kubevirt_domain(host, spec))
    root.find("cpu").set("mode", cpu.get("model", "host-model"))
    guest = (domain.get("memory") or {}).get("guest")
    if guest is not None:
        total = quantity(guest)
        root.find("memory").text = str(total)
        for cell in root.findall("cpu/numa/cell"):
            cell.set("memory", str(total // cells))
    xml = to_kubevirt_bytes(root)
    efi = ((domain.get("firmware") or {}).get("bootloader") or {}).get("efi")
    if efi is None:
        return xml
    root = etree.fromstring(with_efi(xml))
    root.find("os/loader").set("secure", "no" if efi.get("secureBoot") is False else "yes")
    return to_kubevirt_bytes(root)
