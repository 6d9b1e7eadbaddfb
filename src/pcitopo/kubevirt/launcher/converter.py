"""What KubeVirt's converter writes from the manifest beyond the first call's shape
(:mod:`.skeleton`), rule by rule (kubevirt/kubevirt, tags v1.6.0 to v1.9.0 and main; docs/SOURCES.md,
"The domain virt-launcher builds"):

- hostdev aliases from the manifest's names: SR-IOV ``ua-sriov-<interface name>``
  (``pkg/network/deviceinfo/sriov.go``, ``device/hostdevice/sriov/hostdev.go``), device-plugin
  GPUs ``ua-gpu-<name>`` and host devices ``ua-hostdevice-<name>`` (``device/hostdevice/gpu``,
  ``generic``), DRA ``ua-dra-gpu-<name>`` and ``ua-dra-hostdevice-<name>``
  (``device/hostdevice/dra/gpu_hostdev.go``, ``generic_hostdev.go``);
- a second disk per ``bus: virtio`` disk of the manifest (the cloud-init volume: ``vdb``); only
  virtio disks are PCI devices, a SATA one sits on q35's built-in AHCI;
- vCPU hotplug (``pkg/defaults/defaults.go`` ``setupCPUHotplug``: maxSockets = sockets × 4,
  capped at 512 vCPUs; ``converter/compute/cpu.go`` ``domainVCPUTopologyForHotplug``);
- the emulator thread pinned to one more pod CPU (``converter/vcpu/vcpu.go``
  ``FormatEmulatorThreadPin``, ``appendDomainEmulatorThreadPin``) with ``isolateEmulatorThread``;
- hugepages per guest cell in bytes, ``memfd`` and ``allocation immediate`` (``converter.go``
  and ``vcpu.go`` ``numaMapping``), the guest memory split over the cells in whole pages;
- the machine type: upstream's default is ``q35`` (``pkg/virt-config/virt-config.go``
  ``DefaultAMD64MachineType``); a KubeVirt CR may set another (a RHEL build's ``pc-q35-rhel9.6.0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.libvirt.device_elements import copy_disk_after, device_elements
from pcitopo.libvirt.machine import (
    add_emulator_pin,
    add_memory_backing,
    numa_cells,
    set_cpu_mode,
    set_cpu_topology,
    set_hugepages,
    set_memory,
    set_vcpus,
)
from pcitopo.libvirt.marshal import Element

UPSTREAM_MACHINE = "q35"
# pkg/virt-config/virt-config.go DefaultMaxHotplugRatio; pkg/defaults/defaults.go maxVCPUs.
MAX_HOTPLUG_RATIO = 4
MAX_HOTPLUG_VCPUS = 512
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(text: Any, field: str = "quantity") -> int:
    """A Kubernetes quantity in bytes (``256Gi``, ``1Gi``, ``512M``, ``1073741824``)."""
    s = str(text).strip()
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if s.endswith(suffix) and s[: -len(suffix)].isdigit():
            return int(s[: -len(suffix)]) * _UNITS[suffix]
    if s.isdigit():
        return int(s)
    raise ConfigError(f"{field}: {s!r} is not a quantity KubeVirt reads (e.g. 256Gi)")


def is_dra(entry: Mapping[str, Any]) -> bool:
    """``pkg/dra/utils.go`` ``IsGPUDRA`` / ``IsHostDeviceDRA``: no deviceName, a claim request."""
    return not entry.get("deviceName") and "claimName" in entry


def hostdev_alias(kind: str, entry: Mapping[str, Any]) -> str:
    """The alias the converter gives the hostdev of a ``gpus``, ``interfaces`` (SR-IOV) or
    ``hostDevices`` entry."""
    if kind == "interfaces":
        return f"ua-sriov-{entry['name']}"
    stem = "gpu" if kind == "gpus" else "hostdevice"
    return f"ua-dra-{stem}-{entry['name']}" if is_dra(entry) else f"ua-{stem}-{entry['name']}"


def max_sockets(cpu: Mapping[str, Any]) -> int:
    """``pkg/defaults/defaults.go`` ``setupCPUHotplug`` with the default live-update rollout: the
    manifest's ``maxSockets`` when it gives one, else sockets × 4, at most 512 vCPUs."""
    if cpu.get("maxSockets"):
        return int(cpu["maxSockets"])
    sockets, per_socket = cpu.get("sockets", 1), cpu.get("cores", 1) * cpu.get("threads", 1)
    most = sockets * MAX_HOTPLUG_RATIO
    if most * per_socket > MAX_HOTPLUG_VCPUS:
        most = max(MAX_HOTPLUG_VCPUS // per_socket, sockets)
    return most


def vcpu_hotplug(root: Element, cpu: Mapping[str, Any]) -> None:
    """``converter/compute/cpu.go`` ``domainVCPUTopologyForHotplug``: ``<vcpu>`` is the maximum,
    ``<vcpus>`` enables the requested ones, the topology has maxSockets."""
    cores, threads = cpu.get("cores", 1), cpu.get("threads", 1)
    enabled = cpu.get("sockets", 1) * cores * threads
    sockets = max_sockets(cpu)
    total = sockets * cores * threads
    set_cpu_topology(root, sockets, cores, threads)
    set_vcpus(root, [(i < enabled, i >= cores * threads) for i in range(total)])


def topology_as_manifest(root: Element, cpu: Mapping[str, Any]) -> None:
    """``<topology>`` with the manifest's sockets, cores and threads (vcpu.go ``GetCPUTopology``)."""
    if cpu:
        set_cpu_topology(root, cpu.get("sockets", 1), cpu.get("cores", 1), cpu.get("threads", 1))


def cpu_model(root: Element, name: str) -> None:
    """``converter/compute/cpu.go``: ``host-model`` and ``host-passthrough`` are modes; any other
    name is a ``custom`` CPU of that model."""
    if name in ("host-model", "host-passthrough"):
        set_cpu_mode(root, name)
    else:
        set_cpu_mode(root, "custom", name)


def emulator_pin(root: Element, cpu: int) -> None:
    """vcpu.go ``appendDomainEmulatorThreadPin``: the pod CPU left after the vCPUs' pins."""
    add_emulator_pin(root, str(cpu))


def guest_memory(root: Element, total: int, page: int | None) -> None:
    """``<memory>`` and each cell's share: vcpu.go ``numaMapping`` divides the memory in whole
    pages, the first cells taking one more page each when the pages do not divide evenly."""
    set_memory(root, total)
    cells = numa_cells(root)
    if not cells:
        return
    page = page or 1
    mod = total % (page * len(cells)) // page
    base = (total - mod * page) // len(cells)
    for i, cell in enumerate(cells):
        cell.set("memory", str(base + (page if i < mod else 0)))


def hugepages_per_cell(root: Element, page_bytes: int) -> None:
    """converter.go (memfd) and vcpu.go (passthrough): one page entry per guest cell, in bytes,
    ``<source type='memfd'/>`` and ``<allocation mode='immediate'/>``."""
    set_hugepages(root, page_bytes, "b", [cell.get("id") for cell in numa_cells(root)] or [None])
    add_memory_backing(root, "memfd", "immediate")


def extra_virtio_disks(root: Element, disks: list[Mapping[str, Any]]) -> None:
    """Every manifest disk after the root disk, as the converter writes a virtio one (vdb, ...);
    a disk on another bus (sata, scsi) is no PCI device and is left out."""
    first = next(iter(device_elements(root, "disk")), None)
    anchor = first
    for n, d in enumerate(disks[1:], start=1):
        if (d.get("disk") or {}).get("bus") != "virtio":
            continue
        anchor = copy_disk_after(anchor, first, f"/var/run/kubevirt-ephemeral-disks/cloud-init-data/{d['name']}/noCloud.iso",
                                 f"vd{chr(ord('a') + n)}", f"ua-{d['name']}")
