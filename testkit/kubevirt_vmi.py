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
(annotations) and spec. What v1.9.0's converter adds to that (aliases from the manifest's names,
DRA addresses from KEP-5304 metadata, the cloud-init disk, vCPU hotplug, the emulator pin,
hugepages per cell, the EFI loader, the machine type) is :mod:`testkit.kubevirt_converter`'s;
the defines around the hook calls are :mod:`testkit.kubevirt_define`'s.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Sequence

from lxml import etree

from pcitopo.topology.paths.classify import classify
from pcitopo.topology.model.tree import Bdf, Role, Topology

from . import kubevirt_converter as conv
from .kubevirt_releases import Release
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


def domain_for_vmi(host: Topology, vmi: dict[str, Any], gpus: Sequence[Bdf] | None = None,
                   release: Release = Release.V1_9, machine: str = conv.UPSTREAM_MACHINE) -> bytes:
    """KubeVirt's first ``OnDefineDomain`` input for ``vmi`` on ``host`` (before placeholders,
    :func:`testkit.kubevirt_define.with_placeholders`), as ``release`` converts it."""
    domain = vmi["spec"]["domain"]
    cpu = domain.get("cpu") or {}
    devices = vmi_devices(host, vmi, gpus)
    with tempfile.TemporaryDirectory() as tmp:  # kubelet's KEP-5304 files, read back as virt-launcher does
        conv.write_dra_metadata(Path(tmp), vmi, devices)
        sources = conv.dra_sources(Path(tmp), vmi)
    devices = tuple(s if s is not None else d for s, d in zip(sources, devices))
    guest_numa = "guestMappingPassthrough" in (cpu.get("numa") or {})
    cells = (len({host.numa_of(host.function(b)) for b in devices} - {-1}) or 1) if guest_numa else 1
    vcpus = cpu.get("sockets", 1) * cpu.get("cores", 1) * cpu.get("threads", 1)
    spec = DomainSpec(vmi["metadata"]["name"], devices, guest_numa=guest_numa, vcpus_per_cell=max(1, vcpus // cells),
                      namespace=vmi["metadata"].get("namespace") or "default")
    root = etree.fromstring(kubevirt_domain(host, spec))
    root.find("cpu").set("mode", cpu.get("model", "host-model"))
    root.find("os/type").set("machine", machine)
    for hd, alias in zip(root.findall("devices/hostdev"), conv.hostdev_aliases(vmi)):
        hd.find("alias").set("name", alias)
    conv.extra_virtio_disks(root, vmi)
    _topology_as_manifest(root, cpu)
    memory = domain.get("memory") or {}
    if memory.get("guest") is not None:
        total = quantity(memory["guest"])
        root.find("memory").text = str(total)
        for cell in root.findall("cpu/numa/cell"):
            cell.set("memory", str(total // cells))
    if (memory.get("hugepages") or {}).get("pageSize"):
        conv.hugepages_per_cell(root, quantity(memory["hugepages"]["pageSize"]))
    if cpu.get("isolateEmulatorThread") and root.find("cputune") is not None:
        conv.emulator_pin(root)
    conv.vcpu_hotplug(root, cpu)  # every release since v1.6 (defaults.go setupCPUHotplug, LiveUpdate default)
    efi = ((domain.get("firmware") or {}).get("bootloader") or {}).get("efi")
    if efi is None:
        return to_kubevirt_bytes(root)
    root = etree.fromstring(with_efi(to_kubevirt_bytes(root), code=release.ovmf_code))
    root.find("os/loader").set("secure", "no" if efi.get("secureBoot") is False else "yes")
    return to_kubevirt_bytes(root)


def _topology_as_manifest(root: etree._Element, cpu: dict[str, Any]) -> None:
    """``<topology>`` with the manifest's sockets, cores and threads (vcpu.go GetCPUTopology)."""
    if cpu:
        root.find("cpu/topology").attrib.update({k: str(cpu.get(k, 1)) for k in ("sockets", "cores", "threads")})


def deploy_examples(repo: Path) -> list[tuple[str, Topology, dict[str, Any], list[Bdf] | None]]:
    """Every VM/VMI of deploy/ with the stand-in node its ``# xmlfix --check`` comment names and,
    for a fabric example, the active partition's GPUs: (file name, host, VMI, GPUs or None)."""
    import json
    import re

    import yaml

    from pcitopo.topology.host.sysfs import open_host

    out = []
    for path in sorted((repo / "deploy").rglob("*.yaml")):
        words = re.search(r"^#\s+xmlfix --check (.*?)\s*$", path.read_text(), re.M)
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") not in VM_KINDS or words is None:
                continue
            w = words[1].split()
            args = {w[i]: w[i + 1] for i in range(len(w) - 1) if w[i].startswith("--")}
            vmi = as_vmi(doc)
            gpus = None
            if "--fabric" in args:
                size = len(vmi["spec"]["domain"]["devices"]["gpus"])
                data = json.loads((repo / args["--fabric"]).read_text())
                (part,) = [p for p in data["partitionInfo"] if p["isActive"] and p["numGpus"] == size]
                gpus = [Bdf.parse(g["pciBusId"][4:]) for g in part["gpuInfo"]]
            out.append((path.name, open_host(repo / args["--sysfs"]), vmi, gpus))
    return out
