"""The door-agnostic hook handler: one call of KubeVirt's ``OnDefineDomain``.

The gRPC server (``sidecar.server``) and the sidecar-shim entry point (``sidecar.shim``) are
thin doors around :func:`handle_define_domain`; it reads the hook options from the VMI's own
annotations (``sidecar.config``) and calls the one rewrite function every door shares,
``topology.guest.rewrite.rewrite_domain`` (the same one ``xmlfix`` runs).

What it promises its doors:
- the returned XML is never empty (libvirt gets it raw; empty bytes fail the VM start);
- under ``on-error: passthrough`` a failure of the rewrite returns the input unchanged, with the
  reason, instead of raising; like ``mode: off`` it still gives every PCI hostdev libvirt's
  default ``mode='subsystem'`` (KubeVirt's Plugins pipeline cannot read a domain without it,
  kubevirt/kubevirt#18861; libvirt reads both the same);
- otherwise every failure is a :class:`topology.errors.PcitopoError` with a one-line reason,
  including bugs (wrapped as :class:`InternalError`), so no door ever shows a traceback;
- a bad option (annotation) or malformed VMI JSON always raises, whatever ``on-error`` says;
- so does ``nvlink: require`` when the VM's GPUs will not get NVLink (:func:`nvlink_check`),
  ``pairing: require`` when a GPU got a worse NIC than the host has for it (:func:`pairing_check`),
  and ``doctor: require`` when a readiness check fails (:func:`_doctor`), whatever
  ``on-error`` says: both checks run after a successful rewrite (on the placed devices) and
  after a passthrough too (on the domain's hostdev sources the host has); the NVLink verdict
  lands in the report's notes and the log line's ``nvlink``/``nvlink_reason`` fields, the
  doctor's findings in ``doctor``/``doctor_findings``;
- a bug inside those checks is one line too (:class:`InternalError`): under ``nvlink:
  require`` it stops the VM (NVLink could not be confirmed), otherwise it is logged (``nvlink``
  ``internal-error``, ``doctor.error``) and the VM starts as the rewrite or passthrough left it;
- a typed firmware warning of the rewrite (``topology.guest.mmio.FirmwareWarning``: BARs the firmware
  will leave unassigned whatever we set) fails the call under ``on-error: fail``; under
  ``passthrough`` the rewritten domain boots and the warning is in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Union

from pcitopo.topology.checks.doctor import DoctorError, DoctorReport, allocation_checks
from pcitopo.topology.libvirt.lenient import readable_hostdev_sources, with_hostdev_modes
from pcitopo.topology.errors import DomainError, FabricError, InternalError, NvlinkError, PairingError, PcitopoError
from pcitopo.topology.model.tree import Bdf, Topology
from pcitopo.topology.guest.rewrite import RewriteResult, rewrite_domain

from .config import DEFAULT_OPTIONS, HookOptions, VmiFacts, annotation, options_from_vmi

__all__ = ["HookOutcome", "InternalError", "handle_define_domain", "nvlink_check", "pairing_check", "summarize"]  # InternalError: re-exported

Outcome = Literal["rewritten", "unchanged-off", "passthrough"]
# The host model, or a callable returning it. A callable that also has ``current(topo, bdfs)``
# (the server's sidecar.hooks.HostCache) keeps the model across calls: it is asked whether its
# model is still the host's for the placed devices (a rebind, an IOMMU group change: if not, it
# reads the model again, and the findings kept with the old one go with it).
HostArg = Union[Topology, Callable[[], Topology]]
# The NVLink fabric (topology.paths.fabric.Fabric), a callable returning it (read per call, so a
# refreshed file counts; topology.paths.fabric.FabricFile), or None when the door was started
# without --fabric.
FabricArg = Any


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
        return HookOutcome(with_hostdev_modes(domain_xml)[0], "unchanged-off", f"annotation {annotation('mode')} is off",
                           vmi=vmi, options=options)
    topo: Topology | None = None
    try:
        topo = host() if callable(host) else host
        result = _rewrite(domain_xml, topo, options)
        current = getattr(host, "current", None)
        if current is not None:
            # A model kept across calls must still be the host's for the placed devices (a
            # rebind, an IOMMU group change): if not, the call runs again on the model read afresh.
            fresh = current(topo, [d.host for d in result.report.placed])
            if fresh is not topo:
                topo = fresh
                result = _rewrite(domain_xml, topo, options)
        if result.report.warnings and options.on_error == "fail":
            raise result.report.warnings[0]  # a firmware limit (typed warning): loud under on-error: fail
        xml = result.xml
        if not isinstance(xml, bytes) or not xml:
            raise InternalError("the rewrite returned no XML")
        summary = summarize(result.report)
    except PcitopoError as e:
        if options.on_error == "passthrough":
            return _passthrough(domain_xml, e, vmi, options, topo, fabric)
        raise
    except Exception as e:  # a bug: still one line, still under the operator's on-error policy
        err = InternalError.of(e)
        if options.on_error == "passthrough":
            return _passthrough(domain_xml, err, vmi, options, topo, fabric)
        raise err from e
    summary.update(nvlink_check(result, topo, fabric, options.nvlink))
    summary.update(_pair_counts(result, topo, fabric))
    pairing_check(topo, [d.host for d in result.report.placed], options.pairing, summary, result)
    # a host cache has just compared the placed devices' driver links with its model (``current``)
    doctor = _doctor(topo, [d.host for d in result.report.placed], options, summary, drivers_checked=current is not None)
    return HookOutcome(xml, "rewritten", None, summary, vmi, options, result, doctor)


def _rewrite(domain_xml: bytes, topo: Topology, options: HookOptions) -> RewriteResult:
    # MMIO settings, P2P cliques, link speeds and NCCL's file by option; the host's address
    # width from its source
    return rewrite_domain(domain_xml, topo, mmio=options.mmio == "auto", p2p_clique=options.p2p_clique == "auto",
                          host_phys_bits=topo.host_width() if options.mmio == "auto" else None,
                          link=options.link == "auto", nccl_topo=options.nccl_topo == "fwcfg")


def _pair_counts(result: RewriteResult, topo: Topology, fabric: FabricArg) -> dict[str, int]:
    """``pairs_nccl_equal``/``pairs_nvml_equal`` for the log line, counted as ``xmlfix
    --explain`` counts them (topology/guest/predict.py ``pair_counts``): NV# between GPUs from
    the NVLink check's verdict with a fabric file, else from the board table."""
    from pcitopo.topology.guest.predict import pair_counts

    fab = fabric  # with a fabric file but no verdict (nvlink: off) the guest's NV# is unknown: none counted
    if fabric is not None and result.report.nvlink is not None:
        try:
            fab = fabric() if callable(fabric) else fabric  # read already, by the check
        except PcitopoError:
            fab = None
    return pair_counts(result, topo, fab)


def _doctor(topo: Topology, bdfs: list[Bdf], options: HookOptions, summary: dict[str, Any],
            drivers_checked: bool = False) -> DoctorReport | None:
    """Run the host-readiness checks (``pcitopo doctor``) for the VM's devices (``bdfs``, all on
    the host); findings go into the log summary. Under ``doctor: require`` a failed check
    raises DoctorError (the VM does not start). ``unknown`` (the unprivileged sidecar cannot
    read ACS/ATS) never stops a VM, and a doctor that cannot run at all is logged, not fatal.
    The findings are kept with the model, per allocation (``allocation_checks``): a boot defines
    the same devices three times, and only a rebind can change what they say between its
    defines. ``drivers_checked``: these devices' driver links were compared with the model this
    call already (a host cache's ``current``), so nothing is left to re-read."""
    if options.doctor == "off":
        return None
    try:
        report = allocation_checks(topo, bdfs, recheck_drivers=not drivers_checked)
    except PcitopoError as e:
        summary["doctor"] = {"error": f"{e.kind}: {e.reason}"}
        return None
    except Exception as e:  # a bug in the checks must not stop a VM the rewrite placed
        err = InternalError.of(e)
        summary["doctor"] = {"error": f"{err.kind}: {err.reason[:300]}"}
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


def pairing_check(topo: Topology, bdfs: list[Bdf], policy: str, summary: dict[str, Any],
                  result: RewriteResult | None = None) -> None:
    """The pairing check (``topology.paths.pairing.check_vm_pairs``) on the VM's devices: the
    verdict in the log fields ``pairing`` (and ``pairing_findings``: one line per GPU given a
    worse NIC than the host has for it), on the report and its notes (``xmlfix --explain`` and
    ``--json``). Under ``require`` a finding, or a check that cannot run, raises PairingError."""
    if policy == "off":
        return
    from pcitopo.topology.paths.pairing import check_vm_pairs

    try:
        verdict = check_vm_pairs(topo, bdfs)
    except Exception as e:
        err = e if isinstance(e, PcitopoError) else InternalError.of(e, "pairing check")
        if policy == "require":
            raise PairingError(f"cannot check the GPU-NIC pairs (annotation {annotation('pairing')} is require): "
                               f"{err.kind}: {err.reason}") from None
        summary.update(pairing=f"{err.kind}-error", pairing_reason=err.reason)
        return
    if verdict.status == "no-gpus":
        return
    summary["pairing"] = verdict.status
    if verdict.findings:
        summary["pairing_findings"] = verdict.lines
        if policy == "require":
            raise PairingError(f"a GPU got a worse NIC than the host has for it (annotation {annotation('pairing')} "
                               f"is require): {verdict.message}")
    if result is not None:
        result.report.pairing = (policy, verdict)
        result.report.notes.extend(f"pairing: {line}" for line in verdict.lines)


def nvlink_check(result: RewriteResult, topo: Topology, fabric: FabricArg, policy: str) -> dict[str, Any]:
    """The NVLink fabric check on a rewritten domain's NVIDIA GPUs (:func:`nvlink_fields`); the
    verdict goes on the report (``xmlfix --explain`` predicts the guest's NVLink from it) and,
    when it is a complaint, into the report's notes."""
    fields, verdict = nvlink_fields(topo, fabric, policy, [d.host for d in result.report.placed if d.role == "gpu"])
    result.report.nvlink = verdict
    if "nvlink_reason" in fields:
        result.report.notes.append(nvlink_note(fields))
    return fields


def nvlink_note(fields: dict[str, Any]) -> str:
    """The one-line note (report, xmlfix's warning) for the NVLink log fields; a check that
    could not run (``nvlink`` ``fabric-error``, ``internal-error``, ...) says so."""
    checked = not str(fields.get("nvlink", "")).endswith("-error")
    return f"NVLink: {'' if checked else 'not checked: '}{fields['nvlink_reason']}"


def nvlink_fields(topo: Topology, fabric: FabricArg, policy: str, bdfs: list[Bdf]) -> tuple[dict[str, Any], Any]:
    """The NVLink check on the NVIDIA GPUs among ``bdfs``: the log fields and the verdict
    (``topology.paths.partitions.NvlinkVerdict``, None when the check did not run). Under ``require``
    a GPU set that will not get full NVLink raises NvlinkError (so does a missing fabric file),
    and a fabric file that cannot be read, or a bug, raises too; under ``warn`` they become the
    fields. Without a fabric file and under ``warn`` nothing is said (the operator has not set
    the check up)."""
    if policy == "off" or (fabric is None and policy == "warn"):
        return {}, None  # nothing to check or say: and no import on the sidecar's common path
    from pcitopo.topology.paths.partitions import check_gpu_set, nvidia_gpus

    try:
        fab = fabric() if callable(fabric) else fabric
        verdict = check_gpu_set(fab, nvidia_gpus(topo, bdfs))
    except Exception as e:
        err = e if isinstance(e, PcitopoError) else InternalError.of(e, "NVLink check")
        if policy == "require":
            raise err from (None if err is e else e)
        return {"nvlink": f"{err.kind}-error", "nvlink_reason": err.reason}, None
    if verdict.nvlink_ok:
        return ({"nvlink": verdict.status} if fab is not None and verdict.status == "ok" else {}), verdict
    if policy == "require":
        raise NvlinkError(verdict.message)
    if verdict.status == "no-fabric":
        return {}, verdict
    return {"nvlink": verdict.status, "nvlink_reason": verdict.message}, verdict


def _passthrough(domain_xml: bytes, err: PcitopoError, vmi: VmiFacts, options: HookOptions,
                 topo: Topology | None, fabric: FabricArg) -> HookOutcome:
    """``on-error: passthrough``: the input back unchanged, with the reason. The NVLink, pairing
    and doctor checks still run, on the domain's hostdev sources the host has: their ``require``
    stops the VM whatever ``on-error`` says."""
    summary: dict[str, Any] = {"error": err.kind}
    doctor = None
    unchanged = domain_xml
    domain_xml = with_hostdev_modes(domain_xml)[0]
    if options.nvlink == "off" and options.doctor == "off" and options.pairing == "off":
        return HookOutcome(domain_xml, "passthrough", f"{err.kind}: {err.reason}", summary, vmi, options)
    present, why = None, err  # without a host model the devices cannot be checked
    if topo is not None:
        try:
            present = [b for b in readable_hostdev_sources(unchanged) if topo.find(b) is not None]
        except Exception as e:  # the host model failing on its own devices (or a bug): one line
            why = e if isinstance(e, PcitopoError) else InternalError.of(e)
    if present is None:
        if options.nvlink == "require":
            raise NvlinkError(f"cannot check the GPUs' NVLink (annotation {annotation('nvlink')} is require): "
                              f"{why.kind}: {why.reason}")
        if options.pairing == "require":
            raise PairingError(f"cannot check the GPU-NIC pairs (annotation {annotation('pairing')} is require): "
                               f"{why.kind}: {why.reason}")
        if options.doctor != "off":
            summary["doctor"] = {"error": f"{why.kind}: {why.reason[:300]}"}
    else:
        summary.update(nvlink_fields(topo, fabric, options.nvlink, present)[0])
        pairing_check(topo, present, options.pairing, summary)
        doctor = _doctor(topo, present, options, summary)
    return HookOutcome(domain_xml, "passthrough", f"{err.kind}: {err.reason}", summary, vmi, options, doctor=doctor)
