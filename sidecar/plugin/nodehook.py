"""The node hook (VEP 190 ``NodeHookService``): before virt-handler starts a VM on this node
(``PreVMStart``), is the node able to give the VM's GPUs and NICs GPUDirect RDMA?

Which devices the VM gets is decided inside its pod, which the node hook cannot see, so it works
out the candidates from the VMI, most precise first:
1. DRA (KubeVirt ``GPUsWithDRA``/``HostDevicesWithDRA``): virt-controller writes each claimed
   device's PCI address into the VMI's status (``status.deviceStatus.gpuStatuses[]`` and
   ``hostDeviceStatuses[]``, ``deviceResourceClaimStatus.attributes.pciAddress``; KubeVirt
   v1.9.0 ``pkg/virt-launcher/virtwrap/device/hostdevice/dra``): exactly those devices;
2. device plugins: the ``deviceName`` of ``spec.domain.devices.gpus[]`` and ``hostDevices[]``,
   mapped through the KubeVirt CR's ``permittedHostDevices.pciHostDevices`` (resource name ->
   ``pciVendorSelector``) to every vfio-bound device of that vendor:device on the node (the pod
   gets some of them; any of them may be the one);
3. otherwise every vfio-bound GPU and NIC of the node.
Then it runs ``pcitopo doctor``'s checks on them, as the hook does with ``doctor: warn|require``
(the VMI's annotation ``pcitopo.kubevirt.io/doctor``): ``require`` refuses the start in one
line naming the check, the device and its fix; ``warn`` logs and lets it start. Hook points fire
again while the VM is not running, so this is a pure function of the node and the VMI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pcitopo.topology.checks.doctor import VFIO, DoctorReport
from pcitopo.topology.errors import ConfigError, DoctorError, VmiError
from pcitopo.topology.model.labels import default_devices
from pcitopo.topology.model.tree import Bdf, Topology



@dataclass(frozen=True)
class Request:
    """The devices a VMI asks for on this node, and how they were found."""

    devices: tuple[Bdf, ...]
    source: str  # dra | device-plugin | all-vfio
    unmatched: tuple[str, ...] = ()  # resource names no permittedHostDevices entry names


@dataclass(frozen=True)
class PermittedDevices:
    """``permittedHostDevices.pciHostDevices`` of the KubeVirt CR: resource name -> vendor:device."""

    selectors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def read(cls, path: str) -> "PermittedDevices":
        """From a file holding the KubeVirt CR as YAML or JSON (one line on any error)."""
        import yaml  # PyYAML reads JSON too

        try:
            with open(path, "rb") as f:
                doc = yaml.safe_load(f.read(4 * 1024 * 1024))
        except OSError as e:
            raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is neither YAML nor JSON: {getattr(e, 'problem', None) or e}") from None
        return cls.from_kubevirt_cr(doc, path)

    @classmethod
    def from_kubevirt_cr(cls, doc: Any, name: str) -> "PermittedDevices":
        """The KubeVirt CR (``kubectl get kubevirt -n kubevirt kubevirt -o yaml``, a list of
        them, or just its ``permittedHostDevices``), as parsed YAML/JSON."""
        if isinstance(doc, dict) and doc.get("kind") == "List":
            doc = next(iter(doc.get("items") or []), {})
        if isinstance(doc, dict) and "spec" in doc:
            doc = ((doc.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices") or {}
        entries = doc.get("pciHostDevices") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise ConfigError(f"{name}: no permittedHostDevices.pciHostDevices (give the KubeVirt CR as "
                              f"`kubectl get kubevirt -n kubevirt kubevirt -o yaml` prints it)")
        out: dict[str, list[str]] = {}
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("resourceName"), str) or not isinstance(e.get("pciVendorSelector"), str):
                raise ConfigError(f"{name}: a pciHostDevices entry without resourceName and pciVendorSelector strings")
            out.setdefault(e["resourceName"], []).append(e["pciVendorSelector"].lower())
        return cls({k: tuple(v) for k, v in out.items()})


def _vmi_doc(vmi_json: bytes) -> dict:
    try:
        doc = json.loads(vmi_json) if vmi_json else {}
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise VmiError(f"VMI JSON is malformed: {e}") from None
    if not isinstance(doc, dict):
        raise VmiError("VMI JSON is not an object")
    return doc


def _dig(doc: Any, *keys: str) -> Any:
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc


def requested_devices(doc: dict, topo: Topology, permitted: PermittedDevices | None) -> Request:
    """The devices the VMI ``doc`` (parsed JSON) asks for on ``topo``, most precise source first."""
    dra = []
    for kind in ("gpuStatuses", "hostDeviceStatuses"):
        for st in _dig(doc, "status", "deviceStatus", kind) or []:
            address = _dig(st, "deviceResourceClaimStatus", "attributes", "pciAddress")
            if isinstance(address, str):
                dra.append(Bdf.parse(address))
    if dra:
        return Request(tuple(dict.fromkeys(dra)), "dra")
    vfio = [b for b in default_devices(topo) if topo.function(b).driver == VFIO]
    names = [d.get("deviceName") for kind in ("gpus", "hostDevices")
             for d in _dig(doc, "spec", "domain", "devices", kind) or [] if isinstance(d, dict)]
    names = [n for n in names if isinstance(n, str)]
    if not names or permitted is None:
        return Request(tuple(vfio), "all-vfio")
    chosen, unmatched = [], []
    for n in dict.fromkeys(names):
        selectors = permitted.selectors.get(n)
        if not selectors:
            unmatched.append(n)
            continue
        chosen += [f.bdf for f in topo.functions() if f.driver == VFIO and f.ids in selectors]
    if unmatched and not chosen:
        return Request(tuple(vfio), "all-vfio", tuple(unmatched))
    return Request(tuple(dict.fromkeys(chosen)), "device-plugin", tuple(unmatched))


def refusal(report: DoctorReport, node: str, policy_note: str) -> DoctorError:
    """One line: the first failing check, its device, its fix, and how many more."""
    first = report.failed[0]
    more = f" (and {len(report.failed) - 1} more)" if len(report.failed) > 1 else ""
    fix = f"; fix: {first.fix}" if first.fix else ""
    where = f"{first.label} {first.bdf}" if first.bdf else "the host"
    return DoctorError(f"{node or 'this node'} cannot give this VM GPUDirect RDMA ({policy_note}): {first.check} "
                       f"{where}: {first.message}{fix}{more}")


def findings_summary(report: DoctorReport) -> list[str]:
    return [f"{f.status} {f.check} {f.bdf or 'host'}: {f.message}" for f in report.findings if f.status in ("fail", "warn")]


def known_devices(topo: Topology, devices: Sequence[Bdf]) -> tuple[list[Bdf], list[Bdf]]:
    """(devices this node has, devices it does not): a DRA address from another node's claim
    cannot be checked here."""
    have = [b for b in devices if topo.find(b) is not None]
    return have, [b for b in devices if topo.find(b) is None]


@dataclass(frozen=True)
class NodeVerdict:
    """What one ExecuteNodeHook call found: the log line's fields, and the refusal (under
    ``doctor: require``, a failed check) or None."""

    outcome: str  # ready | not-ready | skipped
    fields: dict[str, Any]
    refusal: DoctorError | None = None


def check_node(vmi_json: bytes, node: str, host: Any, permitted: PermittedDevices | None) -> NodeVerdict:
    """The doctor's checks for the devices this VMI asks for on this node. ``host`` is the
    server's HostCache (the model, kept fresh for these devices, and the findings per model).
    Raises PcitopoError for a malformed VMI or annotation, or a node that cannot be read."""
    from pcitopo.topology.checks.doctor import run_checks

    from ..config import annotation, options_from_vmi

    vmi, options = options_from_vmi(vmi_json)
    fields: dict[str, Any] = {"vmi": vmi.ref}
    if options.doctor == "off":
        return NodeVerdict("skipped", {**fields, "reason": f"annotation {annotation('doctor')} is off"})
    doc = _vmi_doc(vmi_json)
    topo = host()
    req = requested_devices(doc, topo, permitted)
    fresh = host.current(topo, [b for b in req.devices if topo.find(b) is not None])
    if fresh is not topo:  # a device was rebound since the model was read
        topo, req = fresh, requested_devices(doc, fresh, permitted)
    have, missing = known_devices(topo, req.devices)
    fields.update(devices=len(have), device_source=req.source, unmatched_resources=list(req.unmatched) or None,
                  not_on_node=[str(b) for b in missing] or None)
    if not have:
        fields["reason"] = "no vfio-pci GPU or NIC on this node for this VM: nothing to check"
        return NodeVerdict("skipped", fields)
    report = host.doctor(topo, have, run_checks)
    fields.update(doctor=report.summary(), doctor_findings=findings_summary(report) or None)
    if not report.failed:
        return NodeVerdict("ready", fields)
    if options.doctor == "require":
        return NodeVerdict("not-ready", fields, refusal(report, node, f"annotation {annotation('doctor')} is require"))
    return NodeVerdict("not-ready", fields)
