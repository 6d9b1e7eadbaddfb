"""The node hook (VEP 190 ``NodeHookService``): before virt-handler starts a VM on this node
(``PreVMStart``), is the node able to give the VM's GPUs and NICs GPUDirect RDMA?

Which devices the VM gets is decided for its pod, which the node hook cannot see; what it can
know from the VMI virt-handler sends is the one rule the prediction and the check use too
(``src/pcitopo/kubevirt/hostdevices.py`` ``reach``: device-plugin resources through the KubeVirt CR's
``permittedHostDevices``, known; DRA devices and unmapped names only as "one of this node's
vfio-pci GPUs or NICs", not known), applied per request by ``pcitopo.serve.plugin.devices``.
It runs ``pcitopo doctor``'s checks on every candidate, takes
the checks it cannot make unprivileged (ACS, ATS) from the doctor's report
(``pcitopo.serve.plugin.doctorfile``), and, with ``doctor: require`` (the VMI's annotation
``pcitopo.kubevirt.io/doctor``), refuses the start in one line only for what is surely the
VM's: a host-wide check, a failing device of a request whose candidates are all the VM's, or a
request more of whose candidates fail than the VM can avoid (named by its resource, never by
another VM's device). ``warn`` logs and lets it start. Hook points fire again while the VM is
not running, so this is a pure function of the node, the doctor's report and the VMI.

It is an early, best-effort refusal, never an admission: the domain hook (``pcitopo.serve.core``)
sees the VM's exact devices at define and decides ``require`` there, also for what the node
hook lets through. A DRA device's address is only in the KEP-5304 file inside the VM's pod; the
kubelet's pod-resources socket would name it, but would also show this DaemonSet every pod's
devices on the node, so DRA VMs are left to the domain hook (docs/VM.md, "What `doctor:
require` guarantees").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pcitopo.checks.doctor import DoctorReport
from pcitopo.errors import ConfigError, DoctorError, VmiError
from pcitopo.host.files import read_bounded
from pcitopo.host.yamltext import yaml_documents
from pcitopo.kubevirt.hostdevices import PermittedHostDevices, read_permitted
from pcitopo.model.tree import Topology
from pcitopo.serve.plugin.devices import Request, failing_candidates, listed, paths_of, requested_devices
from pcitopo.serve.plugin.doctorfile import DoctorFile, owner_text, with_doctor_file


def read_permitted_file(path: str) -> PermittedHostDevices:
    """``serve --node-hook --permitted-host-devices FILE``: the KubeVirt CR (``kubectl get kubevirt
    -n kubevirt kubevirt -o yaml``, a List of them, or just its ``permittedHostDevices``) as YAML or
    JSON, read by the one reader (src/pcitopo/kubevirt/hostdevices.py); one line on any error."""
    docs = yaml_documents(read_bounded(path, 4 * 1024 * 1024, "KubeVirt CR"), f"KubeVirt CR {path}")  # YAML reads JSON too
    if len(docs) > 1:
        raise ConfigError(f"KubeVirt CR {path} holds {len(docs)} YAML documents: give the one KubeVirt CR")
    doc = docs[0] if docs else None
    if isinstance(doc, dict) and doc.get("kind") == "List":
        doc = next(iter(doc.get("items") or []), {})
    if isinstance(doc, dict) and "spec" in doc:
        doc = ((doc.get("spec") or {}).get("configuration") or {}).get("permittedHostDevices") or {}
    if not isinstance(doc, dict) or not isinstance(doc.get("pciHostDevices"), list):
        raise ConfigError(f"{path}: no permittedHostDevices.pciHostDevices (give the KubeVirt CR as "
                          f"`kubectl get kubevirt -n kubevirt kubevirt -o yaml` prints it)")
    return read_permitted(doc, strict=path)


# The largest VMI JSON the node hook reads: etcd's default request limit (--max-request-bytes,
# 1.5 MiB), the most a Kubernetes object holds on a default cluster, so no VMI virt-handler sends
# there is larger. It follows from the memory a call takes: the server's peak (VmHWM) with both
# workers parsing a VMI this large at once stays well under the container's 160Mi
# (tests/sidecar/test_plugin_nodehook.py, the peak test; docs/SECURITY.md gives the figures).
MAX_VMI_BYTES = 3 * 512 * 1024


@dataclass(frozen=True)
class NodeSettings:
    """What ``pcitopo serve --node-hook`` is told besides the host: the KubeVirt CR's
    permittedHostDevices and the doctor's report."""

    permitted: PermittedHostDevices | None = None
    doctor: DoctorFile | None = None


def node_settings(permitted_path: str | None, doctor_report: str | None) -> NodeSettings:
    """``serve --node-hook``'s settings from its arguments (the doctor's report at its default
    path unless another is named)."""
    from pcitopo.serve.plugin.doctorfile import DEFAULT_DOCTOR_REPORT

    permitted = read_permitted_file(permitted_path) if permitted_path else None
    return NodeSettings(permitted, DoctorFile(doctor_report or DEFAULT_DOCTOR_REPORT))


def _blames(report: DoctorReport, topo: Topology, req: Request) -> list[str]:
    """What is surely the VM's among the failures, each in one line for its owner: host-wide
    checks, failing devices of a certain group, and groups more of whose candidates fail than
    the VM can avoid."""
    failed = report.failed
    out = [owner_text(f) for f in failed if f.bdf is None]
    failed_at = {f.bdf for f in failed if f.bdf}
    for g in req.groups:
        if g.certain:
            mine = paths_of(topo, g.candidates)
            out += [owner_text(f, mine) for f in failed if f.bdf in mine]
            continue
        bad = failing_candidates(topo, g, failed_at)
        if len(bad) > len(g.candidates) - g.count:
            checks = sorted({f.check for f in failed if f.bdf in paths_of(topo, bad)})
            out.append(f"{g.what}: {len(bad)} of the {len(g.candidates)} devices it can be given on this node "
                       f"fail {', '.join(checks)}, so at least one of this VM's {g.count} does")
    return list(dict.fromkeys(out))


def refusal(blames: list[str], req: Request, node: str, policy_note: str) -> DoctorError:
    """One line: the first sure failure, how many more, and what the hook could not know."""
    more = f" (and {len(blames) - 1} more)" if len(blames) > 1 else ""
    unknown = f"; could not tell which devices are the VM's for {listed(req.unknown)}" if req.unknown else ""
    return DoctorError(f"{node or 'this node'} cannot give this VM GPUDirect RDMA ({policy_note}): {blames[0]}{more}{unknown}")


def findings_summary(report: DoctorReport) -> list[str]:
    return [f"{f.status} {f.check} {f.bdf or 'host'}: {f.message}" for f in report.findings if f.status in ("fail", "warn")][:64]


@dataclass(frozen=True)
class NodeVerdict:
    """What one ExecuteNodeHook call found: the log line's fields, and the refusal (under
    ``doctor: require``, a failure that is surely the VM's) or None."""

    outcome: str  # ready | not-ready | skipped
    fields: dict[str, Any]
    refusal: DoctorError | None = None


def _request(doc: dict, host: Any, settings: NodeSettings) -> tuple[Topology, Request]:
    """The host model (fresh for the candidates: re-read after a rebind) and the request on it."""
    topo = host()
    req = requested_devices(doc, topo, settings.permitted)
    fresh = host.current(topo, req.devices)
    if fresh is not topo:  # a device was rebound since the model was read
        topo, req = fresh, requested_devices(doc, fresh, settings.permitted)
    return topo, req


@dataclass(frozen=True)
class NodeVmi:
    """The VMI of one ExecuteNodeHook call, parsed once: the document, who it is, its options."""

    doc: dict
    facts: Any  # pcitopo.serve.options.VmiFacts
    options: Any  # pcitopo.serve.options.HookOptions

    @classmethod
    def read(cls, vmi_json: bytes) -> NodeVmi:
        """Raises VmiError for a VMI over :data:`MAX_VMI_BYTES` (before parsing: a parse takes
        several times the bytes in memory) or malformed, ConfigError for a bad annotation."""
        from pcitopo.serve.options import load_vmi, options_from_annotations, vmi_facts

        if len(vmi_json) > MAX_VMI_BYTES:
            raise VmiError(f"the VMI is {len(vmi_json)} bytes, over the node hook's {MAX_VMI_BYTES} (etcd's default "
                           f"object limit): not a VMI virt-handler sends")
        doc = load_vmi(vmi_json) or {}
        facts = vmi_facts(doc)
        return cls(doc, facts, options_from_annotations(facts.annotations))


def check_node(vmi: NodeVmi | bytes, node: str, host: Any, settings: NodeSettings | None) -> NodeVerdict:
    """The doctor's checks for the devices this VMI can have on this node. ``host`` is the
    server's HostCache (the model, kept fresh for these devices); the findings are kept with the model
    per allocation, as the domain hook keeps them (``allocation_checks``).
    Raises PcitopoError for a malformed VMI or annotation, or a node that cannot be read."""
    from pcitopo.checks.doctor import allocation_checks
    from pcitopo.serve.options import annotation

    settings = settings or NodeSettings()
    vmi = vmi if isinstance(vmi, NodeVmi) else NodeVmi.read(vmi)
    options = vmi.options
    fields: dict[str, Any] = {"vmi": vmi.facts.ref}
    if options.doctor == "off":
        return NodeVerdict("skipped", {**fields, "reason": f"annotation {annotation('doctor')} is off"})
    topo, req = _request(vmi.doc, host, settings)
    fields.update(device_source=req.source, vm_devices={g.what: g.count for g in req.groups[:16]} or None,
                  devices=len(req.devices), could_not_know=list(req.unknown[:16]) or None)
    if not req.devices:
        fields["reason"] = "no vfio-pci GPU or NIC on this node for this VM: nothing to check"
        return NodeVerdict("skipped", fields)
    # _request has just compared these devices' driver links with the model (``host.current``)
    report, doctor_report = with_doctor_file(allocation_checks(topo, req.devices, recheck_drivers=False), settings.doctor)
    blames = _blames(report, topo, req)
    fields.update(doctor=report.summary(), doctor_findings=findings_summary(report) or None,
                  doctor_report=doctor_report, sure_failures=len(blames))
    if not blames:
        if not report.failed:
            fields["reason"] = DECIDED_AT_DEFINE
            return NodeVerdict("ready", fields)
        fields["reason"] = ("no failing check is surely this VM's: it may get other devices than the failing ones"
                            + (f" (could not tell which devices are the VM's for {listed(req.unknown)})" if req.unknown else "")
                            + f"; {DECIDED_AT_DEFINE}")
        return NodeVerdict("not-ready", fields)
    if options.doctor == "require":
        return NodeVerdict("not-ready", fields, refusal(blames, req, node, f"annotation {annotation('doctor')} is require"))
    return NodeVerdict("not-ready", fields)


# What a node hook that does not refuse says: it never admits for the domain hook, which sees the
# VM's exact devices when the domain is defined and decides there (docs/VM.md, "doctor: require").
DECIDED_AT_DEFINE = "the domain hook decides at define, on the VM's exact devices"
