"""The door-agnostic hook handler: one call of KubeVirt's ``OnDefineDomain``.

The gRPC server (``sidecar.server``) and the sidecar-shim entry point (``sidecar.shim``) are
thin doors around :func:`handle_define_domain`; it reads the hook options from the VMI's own
annotations (``sidecar.config``) and calls the one rewrite function every door shares,
``topology.rewrite.rewrite_domain`` (the same one ``xmlfix`` runs).

What it promises its doors:
- the returned XML is never empty (libvirt gets it raw; empty bytes fail the VM start);
- under ``on-error: passthrough`` a failure of the rewrite returns the input bytes unchanged,
  with the reason, instead of raising;
- otherwise every failure is a :class:`topology.errors.PcitopoError` with a one-line reason,
  including bugs (wrapped as :class:`InternalError`), so no door ever shows a traceback;
- a bad option (annotation) or malformed VMI JSON always raises, whatever ``on-error`` says;
- so does ``nvlink: require`` when the VM's GPUs will not get NVLink (:func:`nvlink_check`):
  the fabric check runs after a successful rewrite, its verdict lands in the report's notes
  and the log line's ``nvlink``/``nvlink_reason`` fields;
- a typed firmware warning of the rewrite (``topology.mmio.FirmwareWarning``: BARs the firmware
  will leave unassigned whatever we set) fails the call under ``on-error: fail``; under
  ``passthrough`` the rewritten domain boots and the warning is in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

from topology.doctor import DoctorError, DoctorReport, run_checks
from topology.errors import DomainError, FabricError, NvlinkError, PcitopoError
from topology.model import Topology
from topology.rewrite import RewriteResult, rewrite_domain

from .config import DEFAULT_OPTIONS, HookOptions, VmiFacts, annotation, options_from_vmi

Outcome = Literal["rewritten", "unchanged-off", "passthrough"]
HostArg = Union[Topology, Callable[[], Topology]]
# The NVLink fabric (topology.fabric.Fabric), a callable returning it (read per call, so a
# refreshed file counts), or None when the door was started without --fabric.
FabricArg = Any


class InternalError(PcitopoError):
    """An unexpected exception inside the rewrite (a bug of ours), as a one-line error."""

    kind = "internal"


@dataclass(frozen=True)
class HookOutcome:
    xml: bytes
    outcome: Outcome
    reason: str | None
    # Flat, JSON-friendly facts for the per-call log line (devices placed, pxbs, switches,
    # fidelity, warnings); empty unless the rewrite ran.
    summary: dict[str, Any] = field(default_factory=dict)
    vmi: VmiFacts = field(default_factory=VmiFacts)
    options: HookOptions = DEFAULT_OPTIONS
    # The full rewrite result (report, guest view) when the rewrite ran; xmlfix explains it.
    result: RewriteResult | None = None
    # pcitopo doctor's findings for the placed devices (option doctor: warn|require), or None.
    doctor: DoctorReport | None = None


def summarize(report: Any) -> dict[str, Any]:
    """The report's short summary as flat fields for a JSON log line."""
    summary = getattr(report, "summary", None)
    if callable(summary):
        summary = summary()
    if isinstance(summary, dict):
        return dict(summary)
    return {"report": str(summary if summary is not None else report)}


def handle_define_domain(domain_xml: bytes, vmi_json: bytes | None, host: HostArg, fabric: FabricArg = None) -> HookOutcome:
    """Rewrite one domain as the hook's options say.

    ``host`` is the host model, or a callable returning it (called only when the options ask
    for a rewrite, so ``mode: off`` works even where sysfs cannot be read). Raises
    PcitopoError (see the module docstring for when)."""
    if not domain_xml or not domain_xml.strip():
        # Nothing to hand back: libvirt would fail on it anyway, so say why here.
        raise DomainError("the domain XML is empty")
    vmi, options = options_from_vmi(vmi_json)
    if options.mode == "off":
        return HookOutcome(domain_xml, "unchanged-off", f"annotation {annotation('mode')} is off", vmi=vmi, options=options)
    try:
        topo = host() if callable(host) else host
        # issue 11: MMIO settings and P2P cliques by option; the host's address width from its source
        result = rewrite_domain(domain_xml, topo, mmio=options.mmio == "auto", p2p_clique=options.p2p_clique == "auto",
                                host_phys_bits=topo.host_width() if options.mmio == "auto" else None)
        if result.report.warnings and options.on_error == "fail":
            raise result.report.warnings[0]  # a firmware limit (typed warning): loud under on-error: fail
        xml = result.xml
        if not isinstance(xml, bytes) or not xml:
            raise InternalError("the rewrite returned no XML")
        summary = summarize(result.report)
    except PcitopoError as e:
        if options.on_error == "passthrough":
            return _passthrough(domain_xml, e, vmi, options)
        raise
    except Exception as e:  # a bug: still one line, still under the operator's on-error policy
        err = InternalError(f"{type(e).__name__}: {e}")
        if options.on_error == "passthrough":
            return _passthrough(domain_xml, err, vmi, options)
        raise err from e
    summary.update(nvlink_check(result, topo, fabric, options.nvlink))
    doctor = _doctor(topo, result, options, summary)
    return HookOutcome(xml, "rewritten", None, summary, vmi, options, result, doctor)


def _doctor(topo: Topology, result: RewriteResult, options: HookOptions, summary: dict[str, Any]) -> DoctorReport | None:
    """Run the host-readiness checks (``pcitopo doctor``) for the devices just placed; findings
    go into the log summary. Under ``doctor: require`` a failed check raises DoctorError (the
    VM does not start). ``unknown`` (the unprivileged sidecar cannot read ACS/ATS) never stops a
    VM, and a doctor that cannot run at all is logged, not fatal."""
    if options.doctor == "off":
        return None
    placed = [d.host for d in result.report.placed]
    try:
        report = run_checks(topo, placed)
    except PcitopoError as e:
        summary["doctor"] = {"error": f"{e.kind}: {e.reason}"}
        return None
    except Exception as e:  # a bug in the checks must not stop a VM the rewrite placed
        summary["doctor"] = {"error": f"internal: {type(e).__name__}: {' '.join(str(e).split())[:300]}"}
        return None
    summary["doctor"] = report.summary()
    summary["doctor_findings"] = [
        f"{f.status} {f.check} {f.bdf or 'host'}: {f.message}" for f in report.findings if f.status in ("fail", "warn")
    ]
    unknown = sorted({f.check for f in report.findings if f.status == "unknown"})
    if unknown:
        summary["doctor_unknown"] = unknown
    if options.doctor == "require" and report.failed:
        first = report.failed[0]
        more = f" (and {len(report.failed) - 1} more)" if len(report.failed) > 1 else ""
        raise DoctorError(f"host not ready (annotation {annotation('doctor')} is require): "
                          f"{first.check} {first.bdf or 'host'}: {first.message}{more}")
    return report


def nvlink_check(result: RewriteResult, topo: Topology, fabric: FabricArg, policy: str) -> dict[str, Any]:
    """The NVLink fabric check on a rewritten domain's NVIDIA GPUs. Returns the log fields;
    under ``require`` a GPU set that will not get full NVLink raises NvlinkError (so does a
    missing fabric file); under ``warn`` the verdict becomes a report note. Without a fabric
    file and under ``warn`` nothing is said (the operator has not set the check up)."""
    if policy == "off" or (fabric is None and policy == "warn"):
        return {}  # nothing to check or say: and no import on the sidecar's common path
    from topology.partitions import check_gpu_set, nvidia_gpus

    try:
        fab = fabric() if callable(fabric) else fabric
    except FabricError as e:
        if policy == "require":
            raise
        result.report.notes.append(f"NVLink: not checked: {e.reason}")
        return {"nvlink": "fabric-error", "nvlink_reason": e.reason}
    gpus = nvidia_gpus(topo, [d.host for d in result.report.placed if d.role == "gpu"])
    verdict = check_gpu_set(fab, gpus)
    result.report.nvlink = verdict  # xmlfix --explain predicts the guest's NVLink from it
    if verdict.nvlink_ok:
        return {"nvlink": verdict.status} if fab is not None and verdict.status == "ok" else {}
    if policy == "require":
        raise NvlinkError(verdict.message)
    if verdict.status == "no-fabric":
        return {}
    result.report.notes.append(f"NVLink: {verdict.message}")
    return {"nvlink": verdict.status, "nvlink_reason": verdict.message}


def _passthrough(domain_xml: bytes, err: PcitopoError, vmi: VmiFacts, options: HookOptions) -> HookOutcome:
    return HookOutcome(domain_xml, "passthrough", f"{err.kind}: {err.reason}", {"error": err.kind}, vmi, options)

