"""Which of this node's devices a VMI's devices can be, from what virt-handler sends a node hook.

KubeVirt v1.9.0 and main (docs/SOURCES.md, "The node hook's devices"): virt-handler marshals
its ``*v1.VirtualMachineInstance`` with Go's encoding/json (``ExecuteNodeHook``,
``pkg/hooks/plugins/v1alpha1/client.go``), so the hook gets exactly the fields of
``staging/src/kubevirt.io/api/core/v1`` at that tag. Since v1.8 those hold no host address of
any device: ``status.deviceStatus`` (and its DRA ``pciAddress``) was removed, and a DRA device's
PCI address lives only in the KEP-5304 metadata file inside the VM's pod (``pkg/dra/utils.go``).
What the VMI does hold, per entry of ``spec.domain.devices.gpus[]`` and ``hostDevices[]``:
- ``deviceName``: a device-plugin resource. With the KubeVirt CR's ``permittedHostDevices`` it
  names a vendor:device, so the pod got ``count`` of this node's vfio-pci functions of that
  vendor:device (KubeVirt's device plugin offers only vfio-bound functions);
- ``claimName``/``requestName`` and no ``deviceName`` (``IsGPUDRA``/``IsHostDeviceDRA``): a DRA
  device, which can be any vfio-pci GPU (``gpus``) or GPU or NIC (``hostDevices``) of the node.
So each request becomes a :class:`Group`: ``count`` devices out of ``candidates``, the functions
the one rule (``src/pcitopo/kubevirt/hostdevices.py`` ``reach``) says it can get. Only a group
whose candidates are all the VM's (``certain``) is known device by device; for the others the
node hook can still be sure by counting: if more candidates fail than the VM can avoid
(``failing > len(candidates) - count``), at least one of the VM's devices fails.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pcitopo.kubevirt.hostdevices import PermittedHostDevices, reach
from pcitopo.model.tree import Bdf, Topology

# The VMI entries (gpus[] + hostDevices[] + SR-IOV interfaces[]) looked at: far more than any
# node can hold, and a VMI listing more cannot make the hook's work or memory grow.
MAX_REQUESTS = 256
MAX_SHOWN = 4  # names listed in a log field or a refusal before "and N more"
_SAFE = re.compile(r"[^A-Za-z0-9._/-]")


def shown(name: Any) -> str:
    """A name from the VMI as it may appear in a log line or a refusal: the characters of a
    Kubernetes name, at most 80 of them."""
    text = _SAFE.sub("?", name if isinstance(name, str) else "?")
    return text[:80] + ("..." if len(text) > 80 else "")


def listed(names: Sequence[str]) -> str:
    more = f" and {len(names) - MAX_SHOWN} more" if len(names) > MAX_SHOWN else ""
    return ", ".join(names[:MAX_SHOWN]) + more


@dataclass(frozen=True)
class Group:
    """``count`` of the VM's devices, each one of ``candidates`` on this node."""

    what: str  # "resource nvidia.com/GH100_H100", "DRA gpus (claim gpu/req)"
    count: int
    candidates: tuple[Bdf, ...]
    known: bool  # the candidates are exactly what the request can be given (not a guess by role)

    @property
    def certain(self) -> bool:
        """Every candidate is the VM's (the node has no more of them than the VM asks for)."""
        return self.known and len(self.candidates) <= self.count


@dataclass(frozen=True)
class Request:
    """What a VMI asks of this node: its groups, and what the node cannot know."""

    groups: tuple[Group, ...]
    unknown: tuple[str, ...]  # requests whose devices cannot be told apart here

    @property
    def source(self) -> str:
        """``device-plugin`` (every group's candidates are its resource's devices),
        ``any-vfio-of-kind`` (none: DRA, or a resource the KubeVirt CR does not map), ``mixed``,
        or ``none`` (the VMI asks for no GPU or host device)."""
        if not self.groups:
            return "none"
        known = {g.known for g in self.groups}
        return "mixed" if len(known) == 2 else ("device-plugin" if known == {True} else "any-vfio-of-kind")

    @property
    def devices(self) -> tuple[Bdf, ...]:
        return tuple(dict.fromkeys(b for g in self.groups for b in g.candidates))


def _dig(doc: Any, *keys: str) -> Any:
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def _entries(doc: dict) -> tuple[list[tuple[str, dict]], int]:
    """(kind, entry) for the first MAX_REQUESTS device entries, and how many more there were."""
    out: list[tuple[str, dict]] = []
    total = 0
    for kind in ("gpus", "hostDevices", "interfaces"):
        items = _dig(doc, "spec", "domain", "devices", kind)
        if not isinstance(items, list):
            continue
        total += len(items)
        out += [(kind, e) for e in items[:MAX_REQUESTS - len(out)] if isinstance(e, dict)]
    return out, max(0, total - MAX_REQUESTS)


def requested_devices(doc: dict, topo: Topology, permitted: PermittedHostDevices | None) -> Request:
    """The groups of this node's devices the VMI ``doc`` (parsed JSON) can be given."""
    counts: dict[tuple[str, str], int] = {}
    unknown: list[str] = []
    entries, beyond = _entries(doc)
    for kind, e in entries:
        resource, claim, request = e.get("deviceName"), e.get("claimName"), e.get("requestName")
        if kind == "interfaces":
            if "sriov" in e:
                unknown.append(f"interfaces/{shown(e.get('name'))} (SR-IOV)")
        elif isinstance(resource, str) and resource:
            key = (kind, f"resource {shown(resource)}")
            counts[key] = counts.get(key, 0) + 1
        elif isinstance(claim, str) and claim:
            key = (kind, f"DRA {kind}")
            counts[key] = counts.get(key, 0) + 1
            unknown.append(f"{kind}/{shown(e.get('name'))} (DRA claim {shown(claim)}/{shown(request)})")
    if beyond:  # first: the log and the refusal list only the first few
        unknown.insert(0, f"{beyond} more device requests (past the first {MAX_REQUESTS})")
    groups = []
    for (kind, what), count in counts.items():
        resource = what[len("resource "):] if what.startswith("resource ") else None
        can = reach(topo, kind, resource, permitted)  # the one rule (src/pcitopo/kubevirt/hostdevices.py)
        if resource and not can.known:
            unknown.append(f"{what} (no permittedHostDevices entry)")
        groups.append(Group(what, count, can.functions, can.known))
    return Request(tuple(groups), tuple(unknown))


def paths_of(topo: Topology, bdfs: Sequence[Bdf]) -> set[str]:
    """The devices and every bridge above them (where a failed check makes a device fail)."""
    return {str(b) for b in bdfs} | {str(a.bdf) for b in bdfs for a in topo.ancestry(topo.function(b))}


def failing_candidates(topo: Topology, group: Group, failed_at: set[str]) -> list[Bdf]:
    """The group's candidates that fail: a failed check on the device or on a bridge above it."""
    return [b for b in group.candidates if paths_of(topo, (b,)) & failed_at]
