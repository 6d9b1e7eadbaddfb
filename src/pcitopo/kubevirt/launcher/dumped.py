"""What a cluster dump (``--cluster``, src/pcitopo/kubevirt/cluster.py) adds to a prediction: the instance
type and preference a VM names, and the devices DRA allocated to its claims.

- Instance types (``pkg/instancetype/apply/vmi.go``, ``cpu.go`` ``applyGuestCPUTopology``,
  ``memory.go``, ``gpu.go``, ``hostdevices.go``; ``pkg/instancetype/preference/apply/cpu.go``
  ``GetPreferredTopology``): ``spec.cpu.guest`` vCPUs become sockets (the default
  ``preferSockets``), cores, threads or a spread as the preference says; ``dedicatedCPUPlacement``,
  ``isolateEmulatorThread``, ``numa``, ``memory.guest``, ``memory.hugepages``, ``gpus`` and
  ``hostDevices`` are copied. ``preferredMachine`` and ``preferredEfi`` come from the preference
  when the VM leaves them out. The objects are ``VirtualMachine(Cluster)Instancetype`` and
  ``VirtualMachine(Cluster)Preference`` (``instancetype.kubevirt.io``).
- DRA (``resource.k8s.io/v1``): the pod's ResourceClaim (named by ``resourceClaimName``, or made
  from a template: annotation ``resource.kubernetes.io/pod-claim-name``) lists in
  ``status.allocation.devices.results[]`` the ``driver``, ``pool`` and ``device`` of each request;
  the ResourceSlice of that driver and pool publishes the device's
  ``resource.kubernetes.io/pciBusID`` (what virt-launcher reads back from the KEP-5304 metadata,
  ``pkg/dra/utils.go``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pcitopo.model.tree import Bdf

POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
_TYPES = {"instancetype": ("VirtualMachineClusterInstancetype", "VirtualMachineInstancetype"),
          "preference": ("VirtualMachineClusterPreference", "VirtualMachinePreference")}


def _find(dump, what: str, ref: Mapping[str, Any], namespace: str | None) -> dict | None:
    kinds = _TYPES[what]
    kind = ref.get("kind") or kinds[0]
    for o in dump.of_kind(kind) if dump is not None else []:
        meta = o.get("metadata") or {}
        if meta.get("name") == ref.get("name") and (kind == kinds[0] or meta.get("namespace") in (None, namespace)):
            return o
    return None


def _topology(vcpus: int, preference: Mapping[str, Any]) -> dict[str, int]:
    """``applyGuestCPUTopology``: where the instance type's vCPUs go."""
    topo = ((preference.get("cpu") or {}).get("preferredCPUTopology") or "sockets").lower().removeprefix("prefer")
    if topo == "cores":
        return {"sockets": 1, "cores": vcpus, "threads": 1}
    if topo == "threads":
        return {"sockets": 1, "cores": 1, "threads": vcpus}
    if topo == "spread":
        ratio = (preference.get("preferSpreadSocketToCoreRatio") or 2)
        return {"sockets": vcpus // ratio, "cores": ratio, "threads": 1}
    return {"sockets": vcpus, "cores": 1, "threads": 1}


def expand(doc: dict, vmi: dict, dump) -> tuple[dict, list[str]]:
    """``vmi`` with the VM's instance type and preference applied, and one line per one not
    found in the dump."""
    spec = doc.get("spec") if doc.get("kind") == "VirtualMachine" else None
    if not isinstance(spec, dict) or not (spec.get("instancetype") or spec.get("preference")):
        return vmi, []
    vmi, notes = copy.deepcopy(vmi), []
    ns = (doc.get("metadata") or {}).get("namespace")
    found = {}
    for what in ("instancetype", "preference"):
        ref = spec.get(what)
        if ref:
            found[what] = _find(dump, what, ref, ns)
            if found[what] is None:
                where = "is not in the cluster dump" if dump is not None else "needs the cluster dump (--cluster) that holds it"
                notes.append(f"{what} {ref.get('kind') or _TYPES[what][0]}/{ref.get('name')} {where}: its settings are not applied")
    domain = vmi.setdefault("spec", {}).setdefault("domain", {})
    pref = (found.get("preference") or {}).get("spec") or {}
    it = (found.get("instancetype") or {}).get("spec") or {}
    cpu = domain.setdefault("cpu", {})
    if (it.get("cpu") or {}).get("guest"):
        cpu.update(_topology(int(it["cpu"]["guest"]), pref))
    for key in ("dedicatedCPUPlacement", "isolateEmulatorThread", "numa", "model"):
        if key in (it.get("cpu") or {}):
            cpu["dedicatedCpuPlacement" if key == "dedicatedCPUPlacement" else key] = it["cpu"][key]
    memory = domain.setdefault("memory", {})
    for key in ("guest", "hugepages"):
        if key in (it.get("memory") or {}):
            memory[key] = it["memory"][key]
    devices = domain.setdefault("devices", {})
    for key in ("gpus", "hostDevices"):
        if it.get(key):
            devices[key] = list(it[key])
    _preferred(domain, pref)
    return vmi, notes


def _preferred(domain: dict, pref: Mapping[str, Any]) -> None:
    """The preference's firmware and machine where the VM says nothing."""
    fw = (pref.get("firmware") or {})
    if fw.get("preferredEfi") is not None and not (domain.get("firmware") or {}).get("bootloader"):
        domain.setdefault("firmware", {})["bootloader"] = {"efi": fw["preferredEfi"]}
    machine = (pref.get("machine") or {}).get("preferredMachineType")
    if machine and not (domain.get("machine") or {}).get("type"):
        domain["machine"] = {"type": machine}


def _claim(dump, vmi: Mapping[str, Any], claim: str) -> dict | None:
    """The pod's ResourceClaim for the VMI's claim entry ``claim``."""
    entry = next((c for c in (vmi.get("spec") or {}).get("resourceClaims") or [] if c.get("name") == claim), {})
    ns = (vmi.get("metadata") or {}).get("namespace")
    for o in dump.of_kind("ResourceClaim") if dump is not None else []:
        meta = o.get("metadata") or {}
        if meta.get("namespace") not in (None, ns):
            continue
        if entry.get("resourceClaimName") and meta.get("name") == entry["resourceClaimName"]:
            return o
        if (meta.get("annotations") or {}).get(POD_CLAIM_NAME) == claim:
            return o
    return None


def _pci_bus_id(dump, driver: str, pool: str, device: str) -> Bdf | None:
    for s in dump.of_kind("ResourceSlice"):
        sp = s.get("spec") or {}
        if sp.get("driver") != driver or (sp.get("pool") or {}).get("name") != pool:
            continue
        for d in sp.get("devices") or []:
            if d.get("name") == device:
                attr = (d.get("attributes") or {}).get(PCI_BUS_ID) or (d.get("basic") or {}).get("attributes", {}).get(PCI_BUS_ID)
                if attr and attr.get("string"):
                    return Bdf.parse(attr["string"])
    return None


def dra_device(dump, vmi: Mapping[str, Any], claim: str, request: str) -> tuple[Bdf | None, str]:
    """The PCI function DRA allocated to ``claim``/``request``, or None and why not."""
    rc = _claim(dump, vmi, claim)
    if rc is None:
        return None, f"no ResourceClaim for claim {claim} in the cluster dump"
    results = (((rc.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    for r in results:
        if r.get("request") in (request, ) or str(r.get("request", "")).startswith(request + "/"):
            bdf = _pci_bus_id(dump, r.get("driver"), r.get("pool"), r.get("device"))
            if bdf is None:
                return None, f"no ResourceSlice in the dump gives {PCI_BUS_ID} of {r.get('driver')}/{r.get('pool')}/{r.get('device')}"
            return bdf, f"from ResourceClaim {rc['metadata'].get('name')}"
    return None, f"ResourceClaim {rc['metadata'].get('name')} has no allocation for request {request}"
