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
- a typed firmware warning of the rewrite (``topology.mmio.FirmwareWarning``: BARs the firmware
  will leave unassigned whatever we set) fails the call under ``on-error: fail``; under
  ``passthrough`` the rewritten domain boots and the warning is in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Union

from topology.errors import DomainError, PcitopoError
from topology.mmio import host_phys_bits
from topology.model import Topology
from topology.rewrite import RewriteResult, rewrite_domain

from .config import DEFAULT_OPTIONS, DefaultOptions, VmiFacts, options_from_vmi

if TYPE_CHECKING:
    from .config import HookOptions

Outcome = Literal["rewritten", "unchanged-off", "passthrough"]
HostArg = Union[Topology, Callable[[], Topology]]


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
    # HookOptions (pydantic) when the VMI carries our annotations, else DEFAULT_OPTIONS.
    options: HookOptions | DefaultOptions = DEFAULT_OPTIONS
    # The full rewrite result (report, guest view) when the rewrite ran; xmlfix explains it.
    result: RewriteResult | None = None


def summarize(report: Any) -> dict[str, Any]:
    """The report's short summary as flat fields for a JSON log line."""
    summary = getattr(report, "summary", None)
    if callable(summary):
        summary = summary()
    if isinstance(summary, dict):
        return dict(summary)
    return {"report": str(summary if summary is not None else report)}


def handle_define_domain(domain_xml: bytes, vmi_json: bytes | None, host: HostArg) -> HookOutcome:
    """Rewrite one domain as the hook's options say.

    ``host`` is the host model, or a callable returning it (called only when the options ask
    for a rewrite, so ``mode: off`` works even where sysfs cannot be read). Raises
    PcitopoError (see the module docstring for when)."""
    if not domain_xml or not domain_xml.strip():
        # Nothing to hand back: libvirt would fail on it anyway, so say why here.
        raise DomainError("the domain XML is empty")
    vmi, options = options_from_vmi(vmi_json)
    if options.mode == "off":
        return HookOutcome(domain_xml, "unchanged-off", f"annotation {_mode_annotation()} is off", vmi=vmi, options=options)
    try:
        topo = host() if callable(host) else host
        # issue 11: MMIO settings and P2P cliques by option; the host's address width from cpuinfo
        result = rewrite_domain(domain_xml, topo, mmio=options.mmio == "auto", p2p_clique=options.p2p_clique == "auto",
                                host_phys_bits=host_phys_bits() if options.mmio == "auto" else None)
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
    return HookOutcome(xml, "rewritten", None, summary, vmi, options, result)


def _passthrough(domain_xml: bytes, err: PcitopoError, vmi: VmiFacts, options: HookOptions | DefaultOptions) -> HookOutcome:
    return HookOutcome(domain_xml, "passthrough", f"{err.kind}: {err.reason}", {"error": err.kind}, vmi, options)


def _mode_annotation() -> str:
    from .config import PREFIX

    return f"{PREFIX}mode"
