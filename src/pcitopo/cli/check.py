"""``xmlfix --check``'s report: the guest's verdict (src/pcitopo/guest/verdict.py) and the VM's on its
cluster (src/pcitopo/kubevirt/vmjudge.py, what preflight judges), one verdict with coded reasons, the lines
people read and the record ``--json`` carries. ``pcitopo golden`` writes the same."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from pcitopo.program import EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNKNOWN


@dataclass(frozen=True)
class CheckReport:
    """What ``--check`` decides: the verdict (``ok``, ``failed``, ``unknown``), its reasons with
    their codes (src/pcitopo/guest/verdict.py ``REASON_CODES``), what is unknown, the verdict line's
    parts, and the machine-readable record ``--check --json`` adds to the prediction."""

    verdict: str
    reasons: tuple
    unknowns: tuple[str, ...]
    why: str
    record: dict

    @property
    def exit_code(self) -> int:
        return {"ok": EXIT_OK, "failed": EXIT_CHECK_FAILED, "unknown": EXIT_UNKNOWN}[self.verdict]


def check_report(outcome, host, fabric=None, vmi: bytes | None = None, args: argparse.Namespace | None = None,
                 gdr: bool = True) -> CheckReport:
    """--check's judgement: ok only if the guest will see what the host has, and, given the VMI's
    JSON, the VMI starts with every setting on the KubeVirt release judged (src/pcitopo/kubevirt/starts.py);
    unknown when nothing failed but something the check needs is missing."""
    from pcitopo.guest.verdict import Reason, check_pairs_json, check_verdict, gdr_pairs_json

    if outcome.result is None:
        r = Reason("not-rewritten", f"the hook would not rewrite this domain ({outcome.outcome})")
        return CheckReport("failed", (r,), (), r.text, {"verdict": "failed", "reasons": [r.as_json()]})
    judged = _judge_vm(vmi, args, outcome.xml) if vmi is not None else None
    detached = [Reason(code, line) for code, line in judged.failures] if judged is not None else []
    v = check_verdict(outcome.result, host, fabric, gdr)
    reasons = tuple(detached) + v.reasons
    unknowns = tuple(v.unknowns) + (judged.unknowns if judged is not None else ())
    # the verdict counts pairs and cells and names the release judged; what else fails the check
    # (NVLink, firmware, the door, the release, the policy, device names) joins it by name, its
    # sentence printed above
    here = [args.here] if getattr(args, "here", None) else []  # no --sysfs: this machine was the node
    why = "; ".join(list(v.parts[:1]) + ([judged.on] if judged is not None and judged.on else [])
                    + [f"{kind} (above)" for kind in v.parts[1:]] + [f"{r.text.split(':', 1)[0]} (above)" for r in detached] + here)
    verdict = "failed" if reasons else "unknown" if unknowns else "ok"
    pairs, accepted = check_pairs_json(outcome.result, host, fabric)
    record = {"verdict": verdict, "reasons": [r.as_json() for r in reasons], "unknowns": list(unknowns), "summary": why,
              "pairs": pairs, "accepted": accepted, "gdr": gdr_pairs_json(outcome.result, host), "gdr_judged": gdr}
    return CheckReport(verdict, reasons, unknowns, why, record)


def _judge_vm(vmi: bytes, args: argparse.Namespace | None, domain_xml: bytes):
    """The VMI on its cluster as preflight judges it (src/pcitopo/kubevirt/vmjudge.py), from xmlfix's options."""
    import json

    from pcitopo.kubevirt.vmjudge import VmQuestion, judge_vm

    try:
        doc = json.loads(vmi)
    except ValueError:
        doc = None
    q = VmQuestion(tuple(getattr(args, "cluster", None) or ()), getattr(args, "kubevirt", None),
                   getattr(args, "assume_release", None), getattr(args, "door", None),
                   tuple(getattr(args, "image", None) or ()), getattr(args, "target", None), getattr(args, "vmi", None) or "VMI")
    pred = getattr(args, "predicted", None)
    return judge_vm(doc if isinstance(doc, dict) else {}, q, domain_xml, pred.names if pred is not None else None)


def check_lines(report: CheckReport) -> list[str]:
    """--check's lines: each reason, what is unknown, then the verdict line."""
    rewritten = "pairs" in report.record  # else the one reason is the verdict line itself
    out = [f"check: {r.text}" for r in (report.reasons if rewritten else ())]
    if report.verdict == "failed":  # a failure wins over what is unknown, which is still said
        out += [f"check: unknown: {line}" for line in report.unknowns]
        out.append(f"check: failed: {report.why}")
    elif report.verdict == "unknown":
        out.append(f"check: unknown: {'; '.join(report.unknowns)}; {report.why}")
    else:
        out.append(f"check: ok: {report.why}")
    return out


def prediction_doc(outcome, host, fabric=None, check: CheckReport | None = None) -> dict:
    """--json: what `pcitopo verify --expect` checks in the guest; with --check, the verdict under "check"."""
    from pcitopo.guest.verdict import prediction

    doc = prediction(outcome.result, host, fabric) if outcome.result is not None else {
        "devices": [], "pairs": [], "notes": [f"domain left unchanged ({outcome.outcome}): {outcome.reason}"]}
    if check is not None:
        doc["check"] = check.record
    return doc


