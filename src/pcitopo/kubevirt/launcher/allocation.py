"""Which of the node's functions the pod gets for each host device the VMI asks for.

The requests, in the manifest's order: ``gpus``, then SR-IOV ``interfaces``, then
``hostDevices`` (the order ``--devices`` fills them in); the domain lists the hostdevs in the
converter's order instead (:func:`converter_order`).

Which functions a device-plugin resource may be (``deviceName``):

1. the KubeVirt CR's ``permittedHostDevices.pciHostDevices`` entries of that ``resourceName``
   (``--cluster``): their ``pciVendorSelector`` ``VENDOR:DEVICE`` s, exactly the functions the one
   rule (``src/pcitopo/kubevirt/hostdevices.py`` ``reach``, which the node hook uses too) says it can get;
2. else, among the functions that rule says it could get, a guess: the ids the name's usual owner publishes it for: NVIDIA's KubeVirt GPU
   device plugin names a resource ``nvidia.com/`` + the pci.ids device name with spaces and brackets turned
   to ``_`` (``nvidia.com/GH100_H100_SXM5_80GB`` is 10de:2330); :data:`KNOWN_RESOURCES`;
3. else the vendor of the name's domain (``nvidia.com/`` 10de, ``mellanox.com/`` 15b3,
   ``amd.com/`` 1002, ``intel.com/`` 8086), any device of it;
4. else any function of the request's kind.

Always only functions bound to ``vfio-pci`` (what the device plugins hand out). A GPU request
takes a GPU, an SR-IOV interface a virtual function of a NIC (the PF itself when the node
binds whole NICs to ``vfio-pci``), a host device a NIC unless its resource says otherwise.

Which functions kubelet hands the pod is not in the manifest: ``given`` (``--devices``, or a
DRA claim's allocation) fills the requests in order; the rest are picked as ``pcitopo pairs``
pairs them: the GPUs in the node's order, each NIC request the best free NIC of a chosen GPU
(its PIX NIC first), then the closest. A given function not on the node, not bound to
``vfio-pci`` or of another kind is one line naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.hostdevices import VFIO, PermittedHostDevices, may_be_vfio, reach, why_not
from pcitopo.kubevirt.launcher.converter import hostdev_alias, is_dra
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology
from pcitopo.paths.classify import classify, closeness

# NVIDIA's KubeVirt GPU device plugin: resource names from pci.ids device names.
KNOWN_RESOURCES = {
    "nvidia.com/GA100_A100_SXM4_40GB": "10de:20b0", "nvidia.com/GA100_A100_SXM4_80GB": "10de:20b2",
    "nvidia.com/GA100_A100_PCIE_80GB": "10de:20b5", "nvidia.com/GH100_H100_SXM5_80GB": "10de:2330",
    "nvidia.com/GH100_H100_PCIe": "10de:2331", "nvidia.com/GH100_H200_SXM_141GB": "10de:2335",
    "nvidia.com/GB100_B200": "10de:2901", "nvidia.com/GB110_B300_SXM6_AC": "10de:3182",
}
VENDOR_DOMAINS = {"nvidia.com": 0x10DE, "mellanox.com": 0x15B3, "amd.com": 0x1002, "intel.com": 0x8086}


@dataclass(frozen=True)
class DeviceRequest:
    """One hostdev the VMI asks for: where it is in the manifest, its alias, what it takes."""

    field: str  # spec.domain.devices.gpus[0]
    alias: str
    role: Role
    resource: str | None  # deviceName; None for SR-IOV and DRA
    vf: bool = False  # an SR-IOV interface
    claim: tuple[str, str] | None = None  # DRA: (claimName, requestName)

    @property
    def kind(self) -> str:
        """``gpus``, ``interfaces`` or ``hostDevices``: the list of the manifest it is in."""
        return self.field.split(".")[3].split("[")[0]

    @property
    def any_role(self) -> bool:
        """A device-plugin host device: its resource, not a class, says what it is."""
        return self.field.startswith("spec.domain.devices.hostDevices") and bool(self.resource)


def device_requests(devices: Mapping[str, Any]) -> list[DeviceRequest]:
    """Every hostdev request of ``spec.domain.devices``, in the converter's order."""
    out = []
    for i, g in enumerate(devices.get("gpus") or []):
        claim = (g["claimName"], g.get("requestName", "")) if is_dra(g) else None
        out.append(DeviceRequest(f"spec.domain.devices.gpus[{i}]", hostdev_alias("gpus", g), Role.GPU,
                                 g.get("deviceName"), claim=claim))
    for i, iface in enumerate(devices.get("interfaces") or []):
        if "sriov" in iface:
            out.append(DeviceRequest(f"spec.domain.devices.interfaces[{i}]", hostdev_alias("interfaces", iface),
                                     Role.NIC, None, vf=True))
    for i, h in enumerate(devices.get("hostDevices") or []):
        claim = (h["claimName"], h.get("requestName", "")) if is_dra(h) else None
        out.append(DeviceRequest(f"spec.domain.devices.hostDevices[{i}]", hostdev_alias("hostDevices", h),
                                 Role.NIC, h.get("deviceName"), claim=claim))
    return out


def converter_order(requests: Sequence[DeviceRequest]) -> list[int]:
    """The order the converter writes the hostdevs in (``compute/host_device.go``
    ``NewHostDeviceDomainConfigurator(GenericHostDevices, GPUHostDevices, SRIOVDevices)``, filled
    in ``manager.go`` ``generateConverterContext``: device-plugin host devices then DRA ones, GPUs
    then DRA GPUs (``getGPUDevices``), SR-IOV interfaces)."""
    group = {"hostDevices": 0, "gpus": 1, "interfaces": 2}

    def key(i: int) -> tuple[int, bool, int]:
        return group[requests[i].kind], requests[i].claim is not None, i

    return sorted(range(len(requests)), key=key)


def resource_ids(resource: str | None) -> tuple[str | None, int | None]:
    """(``VENDOR:DEVICE`` or None, vendor or None) a resource the CR does not map is guessed to
    stand for (rules 2-3)."""
    if not resource:
        return None, None
    ids = KNOWN_RESOURCES.get(resource)
    if ids:
        return ids.lower(), int(ids.split(":")[0], 16)
    return None, VENDOR_DOMAINS.get(resource.split("/", 1)[0])


def _fits(host: Topology, f: PciFunction, req: DeviceRequest, permitted: PermittedHostDevices | None) -> str | None:
    """Why ``f`` cannot serve ``req`` (None: it can)."""
    if permitted is not None and permitted.selectors(req.resource):  # rule 1: the CR decides alone
        return why_not(host, f, req.resource, permitted)
    ids, vendor = resource_ids(req.resource)
    if not may_be_vfio(host, f):
        return f"is bound to {f.driver or 'no driver'}, not {VFIO} (no device plugin hands it out)"
    role = host.role(f)
    if ids:  # an exact id decides alone: a permitted device may be of any class
        return None if f.ids == ids else f"is a {role.value} {f.ids}, {req.resource} stands for {ids}"
    if role != req.role and not (req.any_role and vendor is not None):
        return f"is a {role.value}, not a {req.role.value}"
    if vendor is not None and f.vendor != vendor:
        return f"is a {role.value} of vendor {f.vendor:04x}, {req.resource} is a vendor {vendor:04x} resource"
    return None


def _candidates(host: Topology, req: DeviceRequest, permitted: PermittedHostDevices | None) -> list[PciFunction]:
    if not req.vf:  # what the one rule says it can get; where that is not known, the guess within it
        can = reach(host, req.kind, req.resource, permitted)
        return [host.function(b) for b in can.functions if can.known or _fits(host, host.function(b), req, permitted) is None]
    fs = [f for f in host.functions() if _fits(host, f, req, permitted) is None]
    if any(f.is_vf for f in fs):
        return [f for f in fs if f.is_vf]
    return [f for f in fs if not f.is_vf]


def check_given(host: Topology, req: DeviceRequest, bdf: Bdf, permitted: PermittedHostDevices | None, where: str) -> Bdf:
    """A function named for ``req``: on the node and of its kind, else one line naming it. An
    SR-IOV interface given a PF takes the PF's first free ``vfio-pci`` VF (see :func:`allocate`)."""
    f = host.find(bdf)
    if f is None:
        raise ConfigError(f"{where}: {bdf} is not a PCI function of the node ({host.name})")
    why = _fits(host, f, req, permitted)
    if why is not None and not (req.vf and _vfs_of(host, bdf)):
        raise ConfigError(f"{where}: {bdf} {why} ({req.field}, {req.alias})")
    return bdf


def _vfs_of(host: Topology, pf: Bdf) -> list[Bdf]:
    return [f.bdf for f in host.functions() if f.physfn == pf and may_be_vfio(host, f)]


def _nic_rank(host: Topology, gpus: Sequence[Bdf], nic: PciFunction) -> tuple:
    """The NIC's closeness to the nearest chosen GPU, in ``pcitopo pairs``'s order."""
    ranks = [closeness(classify(host, host.function(g), nic)) for g in gpus]
    return (min(ranks) if ranks else (99,), nic.bdf)


def _pick(host: Topology, req: DeviceRequest, taken: set[Bdf], gpus: list[Bdf], permitted: PermittedHostDevices | None) -> Bdf:
    free = [f for f in _candidates(host, req, permitted) if f.bdf not in taken]
    if req.vf and free and free[0].is_vf:  # a VF of the best PF with a free one
        pfs = {f.physfn for f in free}
        best = min((host.function(p) for p in pfs), key=lambda pf: _nic_rank(host, gpus, pf))
        return next(f.bdf for f in free if f.physfn == best.bdf)
    if not free:
        what = f"{req.resource} " if req.resource else ""
        raise ConfigError(f"{req.field}: the node has no free {what}{req.role.value} bound to {VFIO} for {req.alias}")
    if req.role is Role.GPU and host.role(free[0]) == Role.GPU:
        return free[0].bdf
    return min(free, key=lambda f: _nic_rank(host, gpus, f)).bdf


def allocate(host: Topology, requests: Sequence[DeviceRequest], given: Mapping[int, Bdf],
             permitted: PermittedHostDevices | None) -> tuple[list[Bdf], list[int]]:
    """One function per request: ``given`` (request index -> function) where named, the rest
    picked (GPUs first, so that NICs can pair with them). Returns the functions and the indexes
    that were picked."""
    out: dict[int, Bdf] = {}
    for i, bdf in given.items():
        vfs = _vfs_of(host, bdf) if requests[i].vf and not host.function(bdf).is_vf else []
        out[i] = next((v for v in vfs if v not in out.values()), bdf)
    taken = set(out.values())
    picked, paired = [], set()
    for i in sorted(range(len(requests)), key=lambda i: requests[i].role is not Role.GPU):
        if i in out:
            continue
        gpus = [b for j, b in sorted(out.items()) if requests[j].role is Role.GPU]
        alone = [g for g in gpus if g not in paired][:1]  # a GPU and its NIC together, GPU by GPU
        out[i] = _pick(host, requests[i], taken, alone or gpus, permitted)
        paired.update(alone if requests[i].role is not Role.GPU else ())
        taken.add(out[i])
        picked.append(i)
    return [out[i] for i in range(len(requests))], sorted(picked)


def parse_devices(text: str | None) -> list[Bdf]:
    """``--devices 0000:18:00.0,0000:19:00.0`` (a ``PCI_RESOURCE_*`` value as it is, commas)."""
    out = []
    for word in (text or "").replace(" ", ",").split(","):
        if word:
            try:
                out.append(Bdf.parse(word))
            except ValueError:
                raise ConfigError(f"--devices: {word!r} is not a PCI address (0000:18:00.0)") from None
    return out
