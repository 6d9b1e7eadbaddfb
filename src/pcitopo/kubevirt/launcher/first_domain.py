"""The domain virt-launcher of a release hands the hook at the first ``OnDefineDomain`` /
``MutateDomain`` call, for a VM or VMI manifest on a node: ``pcitopo domain``, and ``xmlfix --vmi``
without a domain argument.

In order: the VM read as the VMI its template starts (src/pcitopo/kubevirt/manifest.py), its instance type
and preference applied (:mod:`.dumped`), the manifest checked as KubeVirt's API would (one line
naming the field), the hostdevs allocated (:mod:`.allocation`), the pod's CPUs placed as
kubelet would (:mod:`.cpus`), then KubeVirt's converter (:mod:`.skeleton`, :mod:`.converter`)
and the release's EFI loader (:mod:`.releases`). Every assumption is a line in
:attr:`Prediction.notes`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.kubelet.static import DeviceResource, KubeletSettings
from pcitopo.kubevirt.launcher import converter as conv
from pcitopo.kubevirt.launcher.allocation import DeviceRequest, allocate, check_given, converter_order, device_requests
from pcitopo.kubevirt.launcher.cpus import CpuPolicy, PodCpus, cell_shares, pod_cpus, sizing_line
from pcitopo.kubevirt.launcher.dumped import dra_device
from pcitopo.kubevirt.launcher.release_groups import Release, ovmf_code
from pcitopo.kubevirt.launcher.skeleton import GuestCell, Hostdev, LauncherSpec, launcher_domain, with_efi
from pcitopo.libvirt.machine import set_loader_secure, set_machine_type
from pcitopo.libvirt.marshal import parse_plain, to_kubevirt_bytes
from pcitopo.model.tree import Bdf, Topology


@dataclass(frozen=True)
class Inputs:
    """What a prediction depends on beyond the manifest and the node."""

    release: Release = Release.V1_9
    version: str = "v1.9.0"
    machine: str = conv.UPSTREAM_MACHINE
    cpu_model: str = "host-model"  # KubeVirt's default; the CR's spec.configuration.cpuModel overrides it
    devices: tuple[Bdf, ...] = ()  # the functions kubelet hands the pod, in request order
    policy: CpuPolicy = CpuPolicy.DISTRIBUTE  # decides distribute-cpus-across-numa (devices: not kubelet's spread)
    kubelet: KubeletSettings = KubeletSettings()  # the rest of the node's kubelet settings
    permitted: Any = None  # src/pcitopo/kubevirt/hostdevices.py PermittedHostDevices, the dump's KubeVirt CR's (--cluster)
    dump: Any = None  # src/pcitopo/kubevirt/cluster.py ClusterDump, for DRA claims


@dataclass(frozen=True)
class Prediction:
    xml: bytes
    hostdevs: tuple[Hostdev, ...]
    notes: tuple[str, ...]
    sizing: str | None = None  # the vCPU count that gives every device's node a guest cell (cpus.sizing_line)


def check_manifest(vmi: Mapping[str, Any]) -> None:
    """What KubeVirt's API (its OpenAPI schema and ``pkg/virt-api/webhooks``) rejects before any
    domain exists, as one line naming the field (``vmi-create-admitter.go``: ``validateNUMA``
    among others)."""
    spec = vmi.get("spec")
    domain = spec.get("domain") if isinstance(spec, dict) else None
    if not isinstance(domain, dict):
        raise ConfigError("spec.domain: missing (KubeVirt's API requires it)")
    devices = domain.get("devices")
    if not isinstance(devices, dict):
        raise ConfigError("spec.domain.devices: missing (KubeVirt's API requires it, {} at least)")
    for kind in ("gpus", "hostDevices"):
        entries = devices.get(kind) or []
        if not isinstance(entries, list):
            raise ConfigError(f"spec.domain.devices.{kind}: not a list")
        for i, e in enumerate(entries):
            where = f"spec.domain.devices.{kind}[{i}]"
            if not isinstance(e, dict) or not e.get("name"):
                raise ConfigError(f"{where}.name: missing (KubeVirt's API requires it)")
            if not e.get("deviceName") and not (e.get("claimName") and e.get("requestName")):
                raise ConfigError(f"{where}.deviceName: missing (KubeVirt's API requires it, or claimName and requestName for DRA)")
    cpu = domain.get("cpu") or {}
    if "guestMappingPassthrough" in (cpu.get("numa") or {}):  # vmi-create-admitter.go validateNUMA
        if not cpu.get("dedicatedCpuPlacement"):
            raise ConfigError("spec.domain.cpu.dedicatedCpuPlacement: must be true with spec.domain.cpu.numa.guestMappingPassthrough")
        if not (domain.get("memory") or {}).get("hugepages"):
            raise ConfigError("spec.domain.memory.hugepages: must be requested with spec.domain.cpu.numa.guestMappingPassthrough")
    for key in ("sockets", "cores", "threads"):
        if key in cpu and (not isinstance(cpu[key], int) or cpu[key] < 1):
            raise ConfigError(f"spec.domain.cpu.{key}: {cpu[key]!r} is not a positive count")


def _given(host: Topology, vmi: Mapping[str, Any], requests: list[DeviceRequest], inputs: Inputs,
           notes: list[str]) -> dict[int, Bdf]:
    """Request index -> function: ``--devices`` in request order, then DRA claims from the dump."""
    if len(inputs.devices) > len(requests):
        raise ConfigError(f"--devices: {len(inputs.devices)} functions given, the VMI asks for {len(requests)} host devices")
    given = {i: check_given(host, requests[i], b, inputs.permitted, "--devices") for i, b in enumerate(inputs.devices)}
    for i, req in enumerate(requests):
        if i in given or req.claim is None or inputs.dump is None:
            continue
        bdf, why = dra_device(inputs.dump, vmi, *req.claim)
        if bdf is None:
            notes.append(f"{req.field} (claim {req.claim[0]}, request {req.claim[1]}): {why}")
            continue
        given[i] = check_given(host, req, bdf, inputs.permitted, f"ResourceClaim {req.claim[0]}")
        notes.append(f"{req.alias}: {bdf} {why}")
    return given


def hostdevs_for(host: Topology, vmi: Mapping[str, Any], inputs: Inputs, notes: list[str]) -> tuple[Hostdev, ...]:
    requests = device_requests(vmi["spec"]["domain"]["devices"])
    given = _given(host, vmi, requests, inputs, notes)
    bdfs, picked = allocate(host, requests, given, inputs.permitted)
    if picked:
        notes.append("picked as `pcitopo pairs` pairs them (give --devices to name them): "
                     + ", ".join(f"{requests[i].alias} {bdfs[i]}" for i in picked))
    return tuple(Hostdev(bdfs[i], requests[i].alias) for i in converter_order(requests))


def device_resources(host: Topology, vmi: Mapping[str, Any], hostdevs: Sequence[Hostdev]) -> tuple[DeviceResource, ...]:
    """The pod's device-plugin resources (one per ``deviceName``; SR-IOV interfaces one
    together) with their functions' host nodes: what the Topology Manager's device hints are
    computed from. DRA claims give kubelet no hint."""
    requests = {r.alias: r for r in device_requests(vmi["spec"]["domain"]["devices"])}
    nodes: dict[str, list[int | None]] = {}
    for h in hostdevs:
        req = requests.get(h.alias)
        if req is None or req.claim is not None:
            continue
        node = host.numa_of(host.function(h.source))
        nodes.setdefault(req.resource or "sriov", []).append(node if node is not None and node >= 0 else None)
    return tuple(DeviceResource(name, len(ns), tuple(ns)) for name, ns in nodes.items())


def kubelet_of(inputs: Inputs) -> tuple[KubeletSettings, bool]:
    """The kubelet settings and whether ``--cpu-policy devices`` asked for the devices' spread."""
    if inputs.policy is CpuPolicy.DEVICES:
        return inputs.kubelet, True
    return replace(inputs.kubelet, distribute=inputs.policy is CpuPolicy.DISTRIBUTE), False


def _cells(host: Topology, vmi: Mapping[str, Any], hostdevs: Sequence[Hostdev], inputs: Inputs,
           notes: list[str]) -> tuple[tuple[GuestCell, ...], int | None, str | None]:
    """The guest cells (vCPU pins per host node), the emulator thread's CPU, and, when a
    device's node gets no cell, the sizing advice; no cells without ``guestMappingPassthrough``."""
    cpu = vmi["spec"]["domain"].get("cpu") or {}
    if "guestMappingPassthrough" not in (cpu.get("numa") or {}):
        return (), None, None
    vcpus = cpu.get("sockets", 1) * cpu.get("cores", 1) * cpu.get("threads", 1)
    emulator = bool(cpu.get("isolateEmulatorThread"))
    resources = device_resources(host, vmi, hostdevs)
    settings, spread = kubelet_of(inputs)
    pod: PodCpus = pod_cpus(host.numa_nodes(), vcpus + int(emulator), resources, settings, spread)
    notes.append(pod.line)
    shares = cell_shares(pod, emulator, cpu.get("threads", 1))
    cells = tuple(GuestCell(n, cs[:k]) for (n, cs), k in zip(pod.by_node, shares) if k)
    used = {c for cell in cells for c in cell.pins}
    spare = next((c for c in pod.cpus if c not in used), None) if emulator else None
    wanted = {n for r in resources for n in r.nodes if n is not None}
    sizing = None
    if not wanted <= {c.node for c in cells}:
        sizing = sizing_line(host.numa_nodes(), resources, settings, emulator, cpu.get("threads", 1), spread)
    return cells, spare, sizing


def predict(host: Topology, vmi: dict[str, Any], inputs: Inputs = Inputs()) -> Prediction:
    """KubeVirt's first hook input for ``vmi`` on ``host`` under ``inputs``."""
    check_manifest(vmi)
    notes: list[str] = []
    domain = vmi["spec"]["domain"]
    cpu = domain.get("cpu") or {}
    hostdevs = hostdevs_for(host, vmi, inputs, notes)
    cells, emulator, sizing = _cells(host, vmi, hostdevs, inputs, notes)
    vcpus = cpu.get("sockets", 1) * cpu.get("cores", 1) * cpu.get("threads", 1)
    spec = LauncherSpec(vmi["metadata"].get("name") or "vmi", hostdevs, cells, vcpus=vcpus,
                        namespace=vmi["metadata"].get("namespace") or "default")
    root = parse_plain(launcher_domain(spec))
    conv.cpu_model(root, cpu.get("model") or inputs.cpu_model)
    set_machine_type(root, (domain.get("machine") or {}).get("type") or inputs.machine)
    conv.extra_virtio_disks(root, (domain.get("devices") or {}).get("disks") or [])
    conv.topology_as_manifest(root, cpu)
    memory = domain.get("memory") or {}
    page = (memory.get("hugepages") or {}).get("pageSize")
    page_bytes = conv.quantity(page, "spec.domain.memory.hugepages.pageSize") if page else None
    guest = memory.get("guest") or (((domain.get("resources") or {}).get("requests") or {}).get("memory"))
    if guest is not None:
        conv.guest_memory(root, conv.quantity(guest, "spec.domain.memory.guest"), page_bytes)
    if page_bytes:
        conv.hugepages_per_cell(root, page_bytes)
    if emulator is not None:
        conv.emulator_pin(root, emulator)
    conv.vcpu_hotplug(root, cpu)  # every release since v1.6 (defaults.go setupCPUHotplug, LiveUpdate default)
    efi = ((domain.get("firmware") or {}).get("bootloader") or {}).get("efi")
    if efi is None:
        return Prediction(to_kubevirt_bytes(root), hostdevs, tuple(notes), sizing)
    root = parse_plain(with_efi(to_kubevirt_bytes(root), ovmf_code(inputs.version)))
    set_loader_secure(root, efi.get("secureBoot") is not False)
    return Prediction(to_kubevirt_bytes(root), hostdevs, tuple(notes), sizing)
