"""``pcitopo doctor``'s report for people: one line per kind of finding, naming the devices it
covers, so that a node with one fault on every device (the IOMMU off) fits on a screen.

Findings of one check, status and kind (:attr:`Finding.kind`) whose fixes differ only by the
device's address are one line: how many devices of each sort (``8 GPUs, 7 NICs``), what was
found, which devices (``GPU0-7, NIC0-2,5-8,11``; bridges by the devices below them), and the
fix once, its commands in a loop over the devices' addresses. A kind found on one device keeps
the device's own line, with the full message. ``--verbose`` prints every finding, one line per
check and device, passed ones too (:func:`pcitopo.views.exports.doctor_text`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from pcitopo.checks.findings import DoctorReport, Finding
from pcitopo.model.labels import mark_host_labels
from pcitopo.views.exports import doctor_text, verdict

_NUMBERED = re.compile(r"([A-Za-z]+)(\d+)")
_SEVERITY = {"fail": 0, "warn": 1, "unknown": 2}


def report_text(report: DoctorReport, verbose: bool = False, beside_vm_labels: bool = False) -> str:
    """The findings that are not ok, one line per kind (failures first); then the kubelet's lines
    and the verdict.
    ``beside_vm_labels``: labels marked as the host's (``xmlfix --explain`` numbers the VM's)."""
    if verbose:
        return doctor_text(report, True, beside_vm_labels)
    groups: dict[tuple, list[Finding]] = {}
    for f in report.findings:
        if f.status != "ok":
            groups.setdefault(_kind_key(f), []).append(f)
    # what fails first, then warnings, then what could not be read; else in the checks' order
    lines = [_group_line(fs) for fs in sorted(groups.values(), key=lambda fs: _SEVERITY[fs[0].status])]
    if beside_vm_labels:
        lines = [mark_host_labels(line) for line in lines]
    if report.kubelet is not None:
        lines += report.kubelet.lines()
    lines.append(verdict(report))
    return "\n".join(lines) + "\n"


def _kind_key(f: Finding) -> tuple:
    """Findings with equal keys share a line: same check, status and kind, and a fix that is the
    same but for the device's address. A finding without a kind, or host-wide, is its own."""
    if f.kind is None or f.bdf is None or not _made_here(f):
        return (f.check, f.status, f.bdf, f.message)
    r = f.remedy
    fix = None if r is None else (r.loop_over(f.bdf), r.setup, r.first, r.after)
    return (f.check, f.status, f.kind, fix)


def _made_here(f: Finding) -> bool:
    """Whether ``kind`` and ``remedy`` still describe ``f``: a finding changed after the doctor
    made it (the node hook puts the doctor report's status, message and fix on its own) keeps
    its old parts, and is shown by its own message and fix."""
    return (f.remedy.text() if f.remedy is not None else None) == f.fix


def _group_line(fs: Sequence[Finding]) -> str:
    f = fs[0]
    if len(fs) == 1:
        who = " ".join(x for x in (f.label, f.bdf) if x) or "host"
        text = f"{who}: {f.message}"
        fix = f.fix
    else:
        text = f"{devices_counted(fs)} {f.kind}: {devices_named(fs)}"
        fix = group_fix(fs)
    return f"{f.status.upper():<7} {f.check:<11} {text}" + (f"  fix: {fix}" if fix else "")


def group_fix(fs: Sequence[Finding]) -> str | None:
    """The fix for every device of a line: its commands once per device, in a ``for`` loop over
    their addresses (``$d`` in the commands), the words around them once."""
    r = fs[0].remedy
    if r is None:
        return None
    if len(fs) == 1 or not r.run:
        return r.text()
    body = r.loop_over(fs[0].bdf)
    return r.text(run=f"for d in {' '.join(f.bdf for f in fs)}; do {body}; done")


def _sort_of(f: Finding) -> str:
    """``GPU`` for GPU3, ``downstream port`` for a bridge labelled ``downstream-port above ...``."""
    if f.above:
        return (f.label or "bridge").split(" above ")[0].replace("-", " ")
    m = _NUMBERED.fullmatch(f.label or "")
    return m.group(1) if m else (f.label or "device").split("@")[0]


def devices_counted(fs: Sequence[Finding]) -> str:
    """``8 GPUs, 7 NICs``: how many of each sort, in the order they first appear."""
    counts: dict[str, int] = {}
    for f in fs:
        counts[_sort_of(f)] = counts.get(_sort_of(f), 0) + 1
    return ", ".join(f"{n} {sort}{'s' if n != 1 else ''}" for sort, n in counts.items())


def devices_named(fs: Sequence[Finding]) -> str:
    """The devices by label, numbers as ranges (``GPU0-7, NIC0-2,5``); bridges by the devices
    below them (``above GPU0-7, NIC0-11``)."""
    if all(f.above for f in fs):
        return "above " + compact(label for f in fs for label in f.above)
    return compact(f.label or f.bdf or "host" for f in fs)


def compact(labels) -> str:
    """Labels with the same prefix as one entry with number ranges, in first-seen order;
    anything not ``<letters><number>`` as itself, once."""
    numbers: dict[str, set[int]] = {}
    for label in labels:
        m = _NUMBERED.fullmatch(label)
        if m:
            numbers.setdefault(m.group(1), set()).add(int(m.group(2)))
        else:
            numbers.setdefault(label, set())
    return ", ".join(prefix + _ranges(sorted(ns)) for prefix, ns in numbers.items())


def _ranges(ns: list[int]) -> str:
    out: list[str] = []
    i = 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else f"{ns[i]}-{ns[j]}")
        i = j + 1
    return ",".join(out)


__all__ = ["compact", "devices_counted", "devices_named", "group_fix", "report_text"]
