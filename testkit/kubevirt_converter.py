"""What KubeVirt v1.9.0's converter writes beyond :func:`testkit.kubevirt_sim.kubevirt_domain`'s
minimal shape, row by row as issue 27 measured it (kubevirt/kubevirt tag v1.9.0; docs/SOURCES.md,
"What KubeVirt v1.9 hands the hook"):

- hostdev aliases from the manifest's names: SR-IOV ``ua-sriov-<interface name>``
  (``pkg/network/deviceinfo/sriov.go``, ``device/hostdevice/sriov/hostdev.go``), device-plugin
  GPUs ``ua-gpu-<name>`` and host devices ``ua-hostdevice-<name>`` (``device/hostdevice/gpu``,
  ``generic``), DRA ``ua-dra-gpu-<name>`` and ``ua-dra-hostdevice-<name>``
  (``device/hostdevice/dra/gpu_hostdev.go``, ``generic_hostdev.go``) whose source address is
  the ``resource.kubernetes.io/pciBusID`` attribute of the KEP-5304 metadata file
  (``pkg/dra/utils.go``: ``{base}/resourceclaimtemplates/{claim}/{request}/{driver}-metadata.json``,
  apiVersion ``metadata.resource.k8s.io/v1alpha1``, ``pkg/dra/metadata/types.go``);
- a second disk per ``bus: virtio`` disk of the manifest (the cloud-init volume: ``vdb``); only
  virtio disks are PCI devices, a SATA one sits on q35's built-in AHCI;
- vCPU hotplug (``pkg/defaults/defaults.go`` ``setupCPUHotplug``: maxSockets = sockets × 4,
  capped at 512 vCPUs; ``converter/compute/cpu.go`` ``domainVCPUTopologyForHotplug``):
  ``<vcpu>`` is the maximum, ``<vcpus>`` enables the requested ones, the topology has maxSockets;
- the emulator thread pinned (``converter/vcpu/vcpu.go`` ``appendDomainEmulatorThreadPin``)
  with ``isolateEmulatorThread``;
- hugepages per guest cell in bytes, ``memfd`` and ``allocation immediate``
  (``converter/converter.go`` and ``converter/vcpu/vcpu.go``, guest mapping passthrough);
- the EFI loader: v1.9.0's ``efi/efi.go`` prefers ``OVMF_CODE.secboot.fd`` even with secure boot
  off (:func:`testkit.kubevirt_releases.Release.ovmf_code`);
- the machine type: upstream's default is ``q35`` (``pkg/virt-config/virt-config.go``
  ``DefaultAMD64MachineType``); ``pc-q35-rhel9.6.0`` is what a RHEL/OpenShift build's KubeVirt CR
  sets (:data:`RHEL_MACHINE`), an option the tests run through too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from lxml import etree

from pcitopo.topology.model.tree import Bdf

UPSTREAM_MACHINE = "q35"
RHEL_MACHINE = "pc-q35-rhel9.6.0"
# pkg/virt-config/virt-config.go DefaultMaxHotplugRatio; pkg/defaults/defaults.go maxVCPUs.
MAX_HOTPLUG_RATIO = 4
MAX_HOTPLUG_VCPUS = 512
# pkg/dra/utils.go, pkg/dra/metadata/types.go (KEP-5304).
DRA_METADATA_API = "metadata.resource.k8s.io/v1alpha1"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
DRA_TEMPLATES = "resourceclaimtemplates"


def _is_dra(entry: dict[str, Any]) -> bool:
    """pkg/dra/utils.go IsGPUDRA / IsHostDeviceDRA: no deviceName, a claim request."""
    return not entry.get("deviceName") and "claimName" in entry


def hostdev_aliases(vmi: dict[str, Any]) -> list[str]:
    """The aliases of the hostdevs :func:`testkit.kubevirt_vmi.vmi_devices` lists (GPUs, then
    SR-IOV interfaces, then host devices), as v1.9.0's converter names them."""
    devices = vmi["spec"]["domain"].get("devices", {})
    out = [f"ua-dra-gpu-{g['name']}" if _is_dra(g) else f"ua-gpu-{g['name']}" for g in devices.get("gpus") or []]
    out += [f"ua-sriov-{i['name']}" for i in devices.get("interfaces") or [] if "sriov" in i]
    out += [f"ua-dra-hostdevice-{h['name']}" if _is_dra(h) else f"ua-hostdevice-{h['name']}"
            for h in devices.get("hostDevices") or []]
    return out


def write_dra_metadata(base: Path, vmi: dict[str, Any], devices: Sequence[Bdf], driver: str = "gpu.example.com") -> None:
    """The KEP-5304 files kubelet writes for the VMI's DRA requests (one device per request), in
    the order :func:`hostdev_aliases` lists them."""
    spec = vmi["spec"]["domain"].get("devices", {})
    entries = list(spec.get("gpus") or []) + [i for i in spec.get("interfaces") or [] if "sriov" in i]
    entries += list(spec.get("hostDevices") or [])
    for entry, bdf in zip(entries, devices):
        if not _is_dra(entry):
            continue
        d = base / DRA_TEMPLATES / entry["claimName"] / entry["requestName"]
        d.mkdir(parents=True, exist_ok=True)
        doc = {"apiVersion": DRA_METADATA_API, "kind": "DeviceMetadata", "podClaimName": entry["claimName"],
               "requests": [{"name": entry["requestName"], "devices": [
                   {"driver": driver, "pool": "node-a", "name": f"dev-{bdf}",
                    "attributes": {PCI_BUS_ID: {"string": str(bdf)}}}]}]}
        (d / f"{driver}-metadata.json").write_text(json.dumps(doc))


def dra_pci_address(base: Path, claim: str, request: str) -> Bdf:
    """pkg/dra/utils.go GetPCIAddressForClaim for a template claim: the one metadata file of the
    request, the first object of a supported apiVersion, its one device's pciBusID."""
    (path,) = sorted((base / DRA_TEMPLATES / claim / request).glob("*-metadata.json"))
    dec, text, pos = json.JSONDecoder(), path.read_text(), 0
    while pos < len(text):
        doc, pos = dec.raw_decode(text, pos)
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if doc.get("apiVersion") == DRA_METADATA_API:
            (req,) = [r for r in doc["requests"] if r["name"] == request]
            (device,) = req["devices"]
            return Bdf.parse(device["attributes"][PCI_BUS_ID]["string"])
    raise ValueError(f"{path}: no {DRA_METADATA_API} object")


def dra_sources(base: Path, vmi: dict[str, Any]) -> list[Bdf | None]:
    """Per hostdev (in :func:`hostdev_aliases` order) the address DRA's metadata gives, None for
    a device-plugin one."""
    spec = vmi["spec"]["domain"].get("devices", {})
    entries = list(spec.get("gpus") or []) + [i for i in spec.get("interfaces") or [] if "sriov" in i]
    entries += list(spec.get("hostDevices") or [])
    return [dra_pci_address(base, e["claimName"], e["requestName"]) if _is_dra(e) else None for e in entries]


def max_sockets(cpu: dict[str, Any]) -> int:
    """pkg/defaults/defaults.go setupCPUHotplug with the default live-update rollout."""
    sockets, per_socket = cpu.get("sockets", 1), cpu.get("cores", 1) * cpu.get("threads", 1)
    most = sockets * MAX_HOTPLUG_RATIO
    if most * per_socket > MAX_HOTPLUG_VCPUS:
        most = max(MAX_HOTPLUG_VCPUS // per_socket, sockets)
    return most


def vcpu_hotplug(root: etree._Element, cpu: dict[str, Any]) -> None:
    """converter/compute/cpu.go domainVCPUTopologyForHotplug."""
    cores, threads = cpu.get("cores", 1), cpu.get("threads", 1)
    enabled = cpu.get("sockets", 1) * cores * threads
    sockets = max_sockets(cpu)
    total = sockets * cores * threads
    topo = root.find("cpu/topology")
    topo.attrib.update({"sockets": str(sockets), "cores": str(cores), "threads": str(threads)})
    root.find("vcpu").text = str(total)
    vcpus = etree.Element("vcpus")
    for i in range(total):
        etree.SubElement(vcpus, "vcpu", id=str(i), enabled="yes" if i < enabled else "no",
                         hotpluggable="yes" if i >= cores * threads else "no")
    root.find("vcpu").addnext(vcpus)


def emulator_pin(root: etree._Element) -> None:
    """vcpu.go appendDomainEmulatorThreadPin: one more dedicated CPU of the pod (the one after
    the last vCPU's)."""
    tune = root.find("cputune")
    pins = [int(p.get("cpuset")) for p in tune.findall("vcpupin")]
    etree.SubElement(tune, "emulatorpin", cpuset=str(max(pins, default=0) + 1))


def hugepages_per_cell(root: etree._Element, page_bytes: int) -> None:
    """converter.go (memfd) and vcpu.go (passthrough): one page entry per guest cell, in bytes,
    ``<source type='memfd'/>`` and ``<allocation mode='immediate'/>``."""
    mb = root.find("memoryBacking")
    hp = mb.find("hugepages")
    for page in list(hp):
        hp.remove(page)
    for cell in root.findall("cpu/numa/cell") or [None]:
        attrs = {"size": str(page_bytes), "unit": "b"}
        if cell is not None:
            attrs["nodeset"] = cell.get("id")
        etree.SubElement(hp, "page", attrs)
    etree.SubElement(mb, "source", type="memfd")
    etree.SubElement(mb, "allocation", mode="immediate")


def extra_virtio_disks(root: etree._Element, vmi: dict[str, Any]) -> None:
    """Every manifest disk after the root disk, as the converter writes a virtio one (vdb, ...);
    a disk on another bus (sata, scsi) is no PCI device and is left out."""
    disks = vmi["spec"]["domain"].get("devices", {}).get("disks") or []
    first = root.find("devices/disk")
    anchor = first
    for n, d in enumerate(disks[1:], start=1):
        if (d.get("disk") or {}).get("bus") != "virtio":
            continue
        el = etree.fromstring(etree.tostring(first))
        el.tail = None
        el.find("source").set("file", f"/var/run/kubevirt-ephemeral-disks/cloud-init-data/{d['name']}/noCloud.iso")
        el.find("target").set("dev", f"vd{chr(ord('a') + n)}")
        el.find("alias").set("name", f"ua-{d['name']}")
        anchor.addnext(el)
        anchor = el
