"""One reading of the KubeVirt CR's ``permittedHostDevices``, one rule for which of a node's
functions a device request can get, and one judgement of a request's resource name. The node
hook (``src/pcitopo/serve/plugin/devices.py``), the prediction (``launcher/allocation.py``), the check
(``xmlfix --check --cluster``, ``pcitopo domain --cluster``) and preflight all use these.

KubeVirt (docs/SOURCES.md, "Device requests and permittedHostDevices"):

- virt-controller refuses to render the launcher pod of a VMI whose ``gpus[]`` or
  ``hostDevices[]`` ``deviceName`` is in none of ``permittedHostDevices.pciHostDevices``,
  ``mediatedDevices`` or ``usb`` (``validatePermittedHostDevices``,
  ``pkg/virt-controller/services/renderresources.go``), but only when the CR has
  ``permittedHostDevices`` at all; DRA entries (``claimName``) are judged by DRA instead.
  Without the key, the pod asks kubelet for the resource and stays Pending unless a node
  advertises it (``status.allocatable``).
- Several ``pciHostDevices`` entries may share one ``resourceName``: its device plugin offers
  every ``vfio-pci`` function of any of their ``pciVendorSelector`` s
  (``discoverPermittedHostPCIDevices``, ``pkg/virt-handler/device-manager/pci_device.go``).

The rule (:func:`reach`): a request whose resource ``permittedHostDevices.pciHostDevices`` maps
can get exactly this node's ``vfio-pci`` functions of those vendor:device ids (``known``); any
other request (a DRA claim, a name the CR does not map) can get any ``vfio-pci`` GPU
(``gpus``) or GPU or compute NIC (``hostDevices``) of the node, physical functions only, and
which ones is not known. The node hook counts as surely the VM's only what a ``known`` reach
gives: every candidate when there are no more of them than the VM asks for, or, by counting,
at least one when more candidates fail than the VM can avoid (the candidates of a reach that is
not known are a superset of the whole GPUs and NICs the VM can get, so the counting stays sound
for them; a VF from a plugin the CR does not map is outside it). The
prediction picks within a reach that is not known by the name's usual owner
(``launcher/allocation.py``): a guess, said as one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.host.sources import LEFT_OUT, is_whole
from pcitopo.model.labels import default_devices
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology

VFIO = "vfio-pci"
MAX_NAMES = 6  # resource names listed in one line before "and N more"


@dataclass(frozen=True)
class PermittedPCI:
    """One ``permittedHostDevices.pciHostDevices[]`` entry: the resource name a VMI asks for and
    the ``VENDOR:DEVICE`` the node's functions must carry for it."""

    resource: str
    vendor_device: str  # lower case, "10de:2330"
    external: bool = False  # externalResourceProvider: another device plugin advertises it


@dataclass(frozen=True)
class PermittedHostDevices:
    """The KubeVirt CR's ``spec.configuration.permittedHostDevices``: ``listed`` False when the CR
    has no such key (then virt-controller judges no name)."""

    pci: tuple[PermittedPCI, ...] = ()
    # mediatedDevices[] and usb[] resource names: KubeVirt writes those hostdevs with
    # mode='subsystem' (createMDEVHostDevice, createUSBHostDevice), unlike PCI ones
    not_pci: tuple[str, ...] = ()
    listed: bool = False

    def selectors(self, resource: str | None) -> tuple[str, ...]:
        """The vendor:device ids ``resource`` stands for (every entry of that name)."""
        return tuple(p.vendor_device for p in self.pci if p.resource == resource)

    @property
    def names(self) -> tuple[str, ...]:
        """Every resource name the CR permits, PCI, mediated and USB, in the CR's order."""
        return tuple(dict.fromkeys([p.resource for p in self.pci] + list(self.not_pci)))



def read_permitted(value: Any, strict: str | None = None) -> PermittedHostDevices:
    """``permittedHostDevices`` as parsed YAML/JSON (None or absent: not listed). Entries without
    ``resourceName`` and ``pciVendorSelector`` strings are skipped, or, with ``strict`` (the file's
    name: the node hook's own setting), one line naming it."""
    if not isinstance(value, Mapping):
        return PermittedHostDevices()
    pci = []
    for e in value.get("pciHostDevices") or []:
        if isinstance(e, Mapping) and isinstance(e.get("resourceName"), str) and isinstance(e.get("pciVendorSelector"), str):
            pci.append(PermittedPCI(e["resourceName"], e["pciVendorSelector"].lower(), bool(e.get("externalResourceProvider"))))
        elif strict:
            raise ConfigError(f"{strict}: a pciHostDevices entry without resourceName and pciVendorSelector strings")
    not_pci = tuple(str(e["resourceName"]) for kind in ("mediatedDevices", "usb") for e in value.get(kind) or []
                    if isinstance(e, Mapping) and e.get("resourceName"))
    return PermittedHostDevices(tuple(pci), not_pci, True)


# -- the rule: which of the node's functions a request can get ---------------------------------

@dataclass(frozen=True)
class Reach:
    """The functions of this node a device request can be given: exactly those when ``known``
    (the CR maps its resource), else every function it could possibly be (a superset)."""

    functions: tuple[Bdf, ...]
    known: bool


def may_be_vfio(topo: Topology, f: PciFunction) -> bool:
    """Bound to ``vfio-pci``, or without a driver link in a source that may have left it out (a
    copy of sysfs, not a live one: ``src/pcitopo/host/sources.py`` ``is_whole``); the prediction says
    so as unknown (:func:`driver_gaps`)."""
    return f.driver == VFIO or (f.driver is None and not is_whole(getattr(topo.loader, "source", None)))


def driver_gaps(topo: Topology, bdfs: Iterable[Bdf]) -> tuple[str, ...]:
    """One line for the functions taken as ``vfio-pci`` because the source has no driver link."""
    lacking = [str(b) for b in bdfs if topo.function(b).driver is None and may_be_vfio(topo, topo.function(b))]
    if not lacking:
        return ()
    shown = ", ".join(lacking[:3]) + (f", and {len(lacking) - 3} more" if len(lacking) > 3 else "")
    return (f"{topo.name} gives no driver for {len(lacking)} device(s) ({shown}): {LEFT_OUT['driver']}; "
            f"taken as {VFIO}, xmlfix --check says unknown for them",)


def reach(topo: Topology, kind: str, resource: str | None, permitted: PermittedHostDevices | None) -> Reach:
    """The rule, for a ``gpus`` or ``hostDevices`` entry asking for ``resource`` (None: DRA)."""
    ids = permitted.selectors(resource) if permitted is not None and resource else ()
    if ids:
        return Reach(tuple(f.bdf for f in topo.functions() if may_be_vfio(topo, f) and f.ids in ids), True)
    vfio = [topo.function(b) for b in default_devices(topo) if may_be_vfio(topo, topo.function(b))]
    return Reach(tuple(f.bdf for f in vfio if kind != "gpus" or topo.role(f) == Role.GPU), False)


def why_not(topo: Topology, f: PciFunction, resource: str | None, permitted: PermittedHostDevices | None) -> str | None:
    """Why ``f`` is not what a request for a resource the CR maps can get (None: it is, or the CR
    does not map the resource: the caller's guess decides then)."""
    ids = permitted.selectors(resource) if permitted is not None and resource else ()
    if not ids:
        return None
    if not may_be_vfio(topo, f):
        return f"is bound to {f.driver or 'no driver'}, not {VFIO} (no device plugin hands it out)"
    if f.ids not in ids:
        return f"is a {topo.role(f).value} {f.ids}, {resource} stands for {' or '.join(ids)} (permittedHostDevices)"
    return None


# -- the names: does the cluster have what the VMI asks for? ------------------------------------

@dataclass(frozen=True)
class NameVerdict:
    """What the check says of a VMI's resource names on a cluster dump: lines that fail it, lines
    it cannot tell (exit 4), one per resource name."""

    failed: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()


def _requests(vmi: Mapping[str, Any]) -> dict[str, list[str]]:
    """resource name -> the fields that ask for it (``gpus[0]``), DRA entries aside."""
    spec = vmi.get("spec") if isinstance(vmi.get("spec"), Mapping) else {}
    devices = ((spec.get("domain") or {}).get("devices") or {}) if isinstance(spec.get("domain"), Mapping) else {}
    out: dict[str, list[str]] = {}
    for kind in ("gpus", "hostDevices"):
        entries = devices.get(kind) if isinstance(devices, Mapping) else None
        for i, e in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(e, Mapping) and isinstance(e.get("deviceName"), str) and not e.get("claimName"):
                out.setdefault(e["deviceName"], []).append(f"{kind}[{i}]")
    return out


def advertised(nodes: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The extended resources the dump's nodes advertise (``status.allocatable``, vendor/name),
    KubeVirt's own (``devices.kubevirt.io/``) aside."""
    names: dict[str, None] = {}
    for node in nodes:
        status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
        alloc = status.get("allocatable") if isinstance(status.get("allocatable"), Mapping) else {}
        names.update((str(k), None) for k in alloc if "/" in str(k) and not str(k).startswith("devices.kubevirt.io/"))
    return tuple(names)


def _listed(names: Iterable[str]) -> str:
    names = list(names)
    more = f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else ""
    return ", ".join(names[:MAX_NAMES]) + more if names else "none"


def judge_names(vmi: Mapping[str, Any], permitted: PermittedHostDevices | None, nodes: Iterable[Mapping[str, Any]]) -> NameVerdict:
    """Each resource name the VMI asks for, on the dump: not permitted (the CR lists
    ``permittedHostDevices`` without it) fails; not listed and no node advertising it is unknown."""
    nodes = list(nodes)
    on_nodes = advertised(nodes)
    failed, unknown = [], []
    for name, fields in _requests(vmi).items():
        more = f" and {len(fields) - 1} more" if len(fields) > 1 else ""
        where = f"spec.domain.devices.{fields[0]}{more} ask{'' if more else 's'} for {name}"
        if permitted is not None and permitted.listed:
            if name not in permitted.names:
                failed.append(f"devices: {where}, which the KubeVirt CR's permittedHostDevices does not list, so "
                              f"virt-controller renders no pod for it; the cluster has {_listed(permitted.names)} "
                              f"(permittedHostDevices), {_listed(on_nodes)} (nodes' allocatable)")
        elif name not in on_nodes:
            cr = "the dump's KubeVirt CR has no permittedHostDevices" if permitted is not None else "the dump has no KubeVirt CR"
            unknown.append(f"devices: {where}: {cr}, and {'no node in the dump advertises it' if nodes else 'no Node object'}, "
                           f"so whether the cluster has it is unknown; nodes advertise {_listed(on_nodes)}")
    return NameVerdict(tuple(failed), tuple(unknown))


def names_on(vmi: Mapping[str, Any], dump: Any) -> NameVerdict:
    """:func:`judge_names` on a cluster dump (src/pcitopo/kubevirt/cluster.py ClusterDump); nothing to say
    without one."""
    if dump is None:
        return NameVerdict()
    cr = dump.kubevirt
    return judge_names(vmi, cr.permitted if cr is not None else None, dump.nodes)
