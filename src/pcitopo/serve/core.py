"""The door-agnostic hook handler: one call of KubeVirt's ``OnDefineDomain``.

The gRPC server (``pcitopo.serve.server``) and the sidecar-shim entry point (``pcitopo.serve.shim``) are
thin wrappers around :func:`handle_define_domain`; it reads the hook options from the VMI's own
annotations (``pcitopo.serve.options``) and calls the one rewrite function every entry point shares,
``pcitopo.guest.rewrite.rewrite_domain`` (the same one ``xmlfix`` runs).

What it promises its callers:
- the returned XML is never empty (libvirt gets it raw; empty bytes fail the VM start);
- under ``on-error: passthrough`` a failure of the rewrite returns the input unchanged, with the
  reason, instead of raising; like ``mode: off`` it still gives every PCI hostdev libvirt's
  default ``mode='subsystem'`` (KubeVirt's Plugins pipeline cannot read a domain without it,
  kubevirt/kubevirt#18861; libvirt reads both the same);
- otherwise every failure is a :class:`pcitopo.errors.PcitopoError` with a one-line reason,
  including bugs (wrapped as :class:`InternalError`), so no caller ever shows a traceback;
- a bad option (annotation) or malformed VMI JSON always raises, whatever ``on-error`` says;
- so does ``nvlink: require`` when the VM's GPUs will not get NVLink (:func:`nvlink_check`),
  ``pairing: require`` when a GPU got a worse NIC than the host has for it (:func:`pairing_check`),
  and ``doctor: require`` when a readiness check on one of the VM's devices or a bridge above
  it fails or cannot be confirmed (:func:`_doctor`), whatever ``on-error`` says: the checks run
  after a successful rewrite (on the placed devices) and after a passthrough too (on the
  domain's hostdev sources; under ``doctor: require`` also with ``mode: off``); the NVLink
  verdict lands in the report's notes and the log line's ``nvlink``/``nvlink_reason`` fields,
  the doctor's findings in ``doctor``/``doctor_findings``;
- ``doctor: require`` fails closed: a host that cannot be read, a hostdev the host model does
  not have, a bug inside the checks, and a check the hook cannot make itself (ACS, ATS
  unprivileged) that the doctor's report (``pcitopo.serve.plugin.doctorfile``; missing or stale)
  does not answer, each stop the VM with one line naming the check;
- a bug inside those checks is one line too (:class:`InternalError`): under ``nvlink:
  require`` or ``doctor: require`` it stops the VM, otherwise it is logged (``nvlink``
  ``internal-error``, ``doctor.error``) and the VM starts as the rewrite or passthrough left it;
- a typed firmware warning of the rewrite (``pcitopo.guest.mmio.FirmwareWarning``: BARs the firmware
  will leave unassigned whatever we set) fails the call under ``on-error: fail``; under
  ``passthrough`` the rewritten domain boots and the warning is in the summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pcitopo.checks.doctor import DoctorError, DoctorReport, allocation_checks
from pcitopo.errors import DomainError, InternalError, NvlinkError, PairingError, PcitopoError
from pcitopo.guest.rewrite import RewriteResult, rewrite_domain
from pcitopo.libvirt.lenient import readable_hostdev_sources, with_hostdev_modes
from pcitopo.model.tree import Bdf, Topology
from pcitopo.serve.options import DEFAULT_OPTIONS, HookOptions, VmiFacts, annotation, options_from_vmi
from pcitopo.serve.plugin.devices import paths_of
from pcitopo.serve.plugin.doctorfile import DoctorFile, owner_text, with_doctor_file

# InternalError: re-exported
__all__ = ["HookOutcome", "InternalError", "handle_define_domain", "nvlink_check", "pairing_check", "summarize"]

Outcome = Literal["rewritten", "unchanged-off", "passthrough"]
# The host model, or a callable returning it. A callable that also has ``current(topo, bdfs)``
# (the server's pcitopo.serve.hooks.HostCache) keeps the model across calls: it is asked whether its
# model is still the host's for the placed devices (a rebind, an IOMMU group change: if not, it
# reads the model again, and the findings kept with the old one go with it).
HostArg = Topology | Callable[[], Topology]
# The NVLink fabric (pcitopo.paths.fabric.Fabric), a callable returning it (read per call, so a
# refreshed file counts; pcitopo.paths.fabric.FabricFile), or None when the server was started
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


def handle_define_domain(domain_xml: bytes, vmi_json: bytes | None, host: HostArg, fabric: FabricArg = None,
                         doctor_file: DoctorFile | None = None) -> HookOutcome:
    """Rewrite one domain as the hook's options say.

    ``host`` is the host model, or a callable returning it (called only when the options ask
    for a rewrite or ``doctor: require``, so ``mode: off`` works even where sysfs cannot be
    read). ``doctor_file``: the doctor's report, for the checks this process cannot make
    (None: they stay unknown). Raises PcitopoError (see the module docstring for when)."""
    if not domain_xml or not domain_xml.strip():
        # Nothing to hand back: libvirt would fail on it anyway, so say why here.
        raise DomainError("the domain XML is empty")
    vmi, options = options_from_vmi(vmi_json)
    if options.mode == "off":
        off = HookOutcome(with_hostdev_modes(domain_xml)[0], "unchanged-off", f"annotation {annotation('mode')} is off",
                          vmi=vmi, options=options)
        # doctor: require is the VM owner's condition to start, whatever is rewritten
        return off if options.doctor != "require" else _checked_as_sent(domain_xml, off, host, doctor_file)
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
            return _passthrough(domain_xml, e, vmi, options, topo, fabric, doctor_file)
        raise
    except Exception as e:  # a bug: still one line, still under the operator's on-error policy
        err = InternalError.of(e)
        if options.on_error == "passthrough":
            return _passthrough(domain_xml, err, vmi, options, topo, fabric, doctor_file)
        raise err from e
    summary.update(nvlink_check(result, topo, fabric, options.nvlink))
    summary.update(_pair_counts(result, topo, fabric))
    pairing_check(topo, [d.host for d in result.report.placed], options.pairing, summary, result)
    # a host cache has just compared the placed devices' driver links with its model (``current``)
    doctor = _doctor(topo, [d.host for d in result.report.placed], options, summary, drivers_checked=current is not None,
                     doctor_file=doctor_file)
    return HookOutcome(xml, "rewritten", None, summary, vmi, options, result, doctor)


def _rewrite(domain_xml: bytes, topo: Topology, options: HookOptions) -> RewriteResult:
    # MMIO settings, P2P cliques, link speeds and NCCL's file by option; the host's address
    # width from its source
    return rewrite_domain(domain_xml, topo, mmio=options.mmio == "auto", p2p_clique=options.p2p_clique == "auto",
                          host_phys_bits=topo.host_width() if options.mmio == "auto" else None,
                          link=options.link == "auto", nccl_topo=options.nccl_topo == "fwcfg")


def _pair_counts(result: RewriteResult, topo: Topology, fabric: FabricArg) -> dict[str, int]:
    """``pairs_nccl_equal``/``pairs_nvml_equal`` for the log line, counted as ``xmlfix
    --explain`` counts them (src/pcitopo/guest/verdict.py ``pair_counts``): NV# between GPUs from
    the NVLink check's verdict with a fabric file, else from the board table."""
    from pcitopo.guest.verdict import pair_counts

    fab = fabric  # with a fabric file but no verdict (nvlink: off) the guest's NV# is unknown: none counted
    if fabric is not None and result.report.nvlink is not None:
        try:
            fab = fabric() if callable(fabric) else fabric  # read already, by the check
        except PcitopoError:
            fab = None
    return pair_counts(result, topo, fab)


def _doctor(topo: Topology, bdfs: list[Bdf], options: HookOptions, summary: dict[str, Any],
            drivers_checked: bool = False, doctor_file: DoctorFile | None = None) -> DoctorReport | None:
    """Run the host-readiness checks (``pcitopo doctor``) for the VM's devices (``bdfs``, all on
    the host) and the bridges above them; findings go into the log summary. A check this
    process cannot make (``unknown``: ACS, ATS unprivileged) is taken from the doctor's report
    where it answers (``with_doctor_file``). Under ``doctor: require`` a failed check, one still
    unknown, or checks that cannot run at all raise DoctorError (the VM does not start); under
    ``warn`` they are logged. The findings are kept with the model, per allocation
    (``allocation_checks``): a boot defines the same devices three times, and only a rebind can
    change what they say between its defines. ``drivers_checked``: these devices' driver links
    were compared with the model this call already (a host cache's ``current``)."""
    if options.doctor == "off":
        return None
    try:
        report = allocation_checks(topo, bdfs, recheck_drivers=not drivers_checked)
        report, note = with_doctor_file(report, doctor_file) if doctor_file is not None else (report, None)
    except Exception as e:  # a doctor that cannot run (or a bug in it): one line
        err = e if isinstance(e, PcitopoError) else InternalError.of(e)
        if options.doctor == "require":
            raise DoctorError(f"cannot check the host's readiness (annotation {annotation('doctor')} is require): "
                              f"{err.kind}: {err.reason[:300]}") from None
        summary["doctor"] = {"error": f"{err.kind}: {err.reason[:300]}"}
        return None
    summary["doctor"] = report.summary()
    summary["doctor_findings"] = [
        f"{f.status} {f.check} {f.bdf or 'host'}: {f.message}" for f in report.findings if f.status in ("fail", "warn")
    ]
    if note:
        summary["doctor_report"] = note
    unknown = sorted({f.check for f in report.findings if f.status == "unknown"})
    if unknown:
        summary["doctor_unknown"] = unknown
    if options.doctor == "require":
        _require_ready(report, paths_of(topo, bdfs))
    return report


def _require_ready(report: DoctorReport, mine: set[str]) -> None:
    """``doctor: require``: every check on the VM's devices and above them says ok or warn.
    The refusal is one line for the VM's owner: the first failure (else the first check that
    could not be confirmed), how many more, no other device's address (``owner_text``)."""
    failed = report.failed
    unconfirmed = [f for f in report.findings if f.status == "unknown"]
    if not failed and not unconfirmed:
        return
    first = (failed or unconfirmed)[0]
    more = len(failed) + len(unconfirmed) - 1
    what = "host not ready" if failed else "host readiness not confirmed"
    raise DoctorError(f"{what} (annotation {annotation('doctor')} is require): {owner_text(first, mine)}"
                      + (f" (and {more} more)" if more else ""))


def pairing_check(topo: Topology, bdfs: list[Bdf], policy: str, summary: dict[str, Any],
                  result: RewriteResult | None = None) -> None:
    """The pairing check (``pcitopo.paths.pairing.check_vm_pairs``) on the VM's devices: the
    verdict in the log fields ``pairing`` (and ``pairing_findings``: one line per GPU given a
    worse NIC than the host has for it), on the report and its notes (``xmlfix --explain`` and
    ``--json``). Under ``require`` a finding, or a check that cannot run, raises PairingError."""
    if policy == "off":
        return
    from pcitopo.paths.pairing import check_vm_pairs

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
    (``pcitopo.paths.partitions.NvlinkVerdict``, None when the check did not run). Under ``require``
    a GPU set that will not get full NVLink raises NvlinkError (so does a missing fabric file),
    and a fabric file that cannot be read, or a bug, raises too; under ``warn`` they become the
    fields. Without a fabric file and under ``warn`` nothing is said (the operator has not set
    the check up)."""
    if policy == "off" or (fabric is None and policy == "warn"):
        return {}, None  # nothing to check or say: and no import on the sidecar's common path
    from pcitopo.paths.partitions import check_gpu_set, nvidia_gpus

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
                 topo: Topology | None, fabric: FabricArg, doctor_file: DoctorFile | None = None) -> HookOutcome:
    """``on-error: passthrough``: the input back unchanged, with the reason. The NVLink, pairing
    and doctor checks still run, on the domain's hostdev sources (:func:`_check_sources`): their
    ``require`` stops the VM whatever ``on-error`` says."""
    summary: dict[str, Any] = {"error": err.kind}
    out = with_hostdev_modes(domain_xml)[0]
    if options.nvlink == "off" and options.doctor == "off" and options.pairing == "off":
        return HookOutcome(out, "passthrough", f"{err.kind}: {err.reason}", summary, vmi, options)
    doctor = _check_sources(domain_xml, topo, err, options, fabric, doctor_file, summary)
    return HookOutcome(out, "passthrough", f"{err.kind}: {err.reason}", summary, vmi, options, doctor=doctor)


def _checked_as_sent(domain_xml: bytes, off: HookOutcome, host: HostArg, doctor_file: DoctorFile | None) -> HookOutcome:
    """``mode: off`` under ``doctor: require``: the domain goes back as sent, after the doctor's
    checks on its hostdev sources (:func:`_check_sources`); a host that cannot be read stops it."""
    topo, why = None, None
    try:
        topo = host() if callable(host) else host
    except Exception as e:
        why = e if isinstance(e, PcitopoError) else InternalError.of(e)
    summary: dict[str, Any] = {}
    options = off.options.model_copy(update={"nvlink": "off", "pairing": "off"})  # mode: off rewrites nothing to judge
    doctor = _check_sources(domain_xml, topo, why, options, None, doctor_file, summary)
    return dataclasses.replace(off, summary=summary, doctor=doctor)


def _check_sources(domain_xml: bytes, topo: Topology | None, why: PcitopoError | None, options: HookOptions,
                   fabric: FabricArg, doctor_file: DoctorFile | None, summary: dict[str, Any]) -> DoctorReport | None:
    """The NVLink, pairing and doctor checks on a domain left as sent, for its hostdev sources
    the host has. Without a host model (``why`` says what failed) nothing can be checked: each
    ``require`` stops the VM; so does ``doctor: require`` for a hostdev the host model lacks."""
    present, missing = None, []
    if topo is not None:
        try:
            sources = readable_hostdev_sources(domain_xml)
            present = [b for b in sources if topo.find(b) is not None]
            missing = [b for b in sources if b not in present]
        except Exception as e:  # the host model failing on its own devices (or a bug): one line
            why = e if isinstance(e, PcitopoError) else InternalError.of(e)
            present = None
    if present is None:
        why = why or InternalError("no host model")
        for policy, error, what in (("nvlink", NvlinkError, "the GPUs' NVLink"), ("pairing", PairingError, "the GPU-NIC pairs"),
                                    ("doctor", DoctorError, "the host's readiness")):
            if getattr(options, policy) == "require":
                raise error(f"cannot check {what} (annotation {annotation(policy)} is require): {why.kind}: {why.reason[:300]}")
        if options.doctor != "off":
            summary["doctor"] = {"error": f"{why.kind}: {why.reason[:300]}"}
        return None
    summary.update(nvlink_fields(topo, fabric, options.nvlink, present)[0])
    pairing_check(topo, present, options.pairing, summary)
    doctor = _doctor(topo, present, options, summary, doctor_file=doctor_file)
    if missing and options.doctor == "require":  # after the devices it could check: a failure there says more
        raise DoctorError(f"cannot check the host's readiness (annotation {annotation('doctor')} is require): the host has "
                          f"no device {missing[0]}, a hostdev of this domain")
    return doctor
