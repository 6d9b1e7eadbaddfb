"""Judge a booted guest against what the rewrite promised.

The rewrite's report (``pcitopo.guest.rewrite.RewriteResult.report``) promises, per placed hostdev,
a guest BDF and a guest NUMA cell (``numa_map[host node]``, or none), and per pair of placed
devices a guest class (NCCL and NVML, ``PairReport.guest``). ``check_booted`` reads the booted
guest's PCI printout with the project's own reader (``pcitopo.host.sysfs.open_host`` on a
sysfs-shaped tree), maps every guest BDF back to its hostdev through the stand-in that replaced
it (matched by place, see guesttree.py), classifies every promised pair with the project's own
classifier and lists every difference as a :class:`Problem`. ``GuestCheck.assert_ok()`` raises
``AssertionError`` carrying everything needed to diagnose a failure from CI output alone: the
problems, the booted guest's tree next to the predicted one (root complex by root complex, ``≠``
where they differ), the guest's own ``lspci -tvnn`` and where the run's files are.

Stand-ins keep vendor/device ids of their own (virtio/bochs display for GPUs, e1000e for NICs),
so only the role (display class → gpu, network class → nic) may carry over from the host; the
checker verifies that our role detection reads the stand-ins as the host roles (kind ``role``)
before it trusts any class.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pcitopo.errors import PcitopoError
from pcitopo.guest.rewrite import Report, RewriteResult
from pcitopo.host.sysfs import open_host
from pcitopo.model.tree import Bdf, Topology, root_complex_sort_key
from pcitopo.paths.classify import classify
from pcitopo.views.report import label_devices, tree_text

from .guestboot import GuestResult
from .guesttree import bus_overlaps

# Problem kinds, in the order they are listed.
KINDS = ("missing", "overlap", "unplaced", "alias", "reader", "bdf", "role", "numa", "report", "nccl", "nvml")
MAX_PAIR_LINES = 40


@dataclass(frozen=True)
class Problem:
    kind: str  # one of KINDS
    text: str
    hosts: tuple[Bdf, ...] = ()  # the host BDFs concerned (one device, or a pair)


@dataclass
class GuestCheck:
    """The verdict on one booted guest. ``problems`` empty ⇔ the guest is what was promised."""

    case: str
    problems: list[Problem]
    host_to_guest: dict[Bdf, Bdf] = field(default_factory=dict)  # as booted
    labels: dict[Bdf, str] = field(default_factory=dict)  # host BDF -> GPU0 / NIC3 ...
    pairs_checked: int = 0
    devices_checked: int = 0
    guest: Topology | None = None  # our reader on the booted guest
    diagnostics: str = ""

    def kinds(self) -> set[str]:
        return {p.kind for p in self.problems}

    def render(self) -> str:
        order = {k: i for i, k in enumerate(KINDS)}
        probs = sorted(self.problems, key=lambda p: order.get(p.kind, len(KINDS)))
        lines = [f"{self.case}: the booted guest differs from the rewrite's promise "
                 f"({len(self.problems)} problem(s); {self.devices_checked} devices, "
                 f"{self.pairs_checked} pairs checked)"]
        pair_lines = 0
        hidden = 0
        for p in probs:
            if p.kind in ("nccl", "nvml"):
                pair_lines += 1
                if pair_lines > MAX_PAIR_LINES:
                    hidden += 1
                    continue
            lines.append(f"  [{p.kind}] {p.text}")
        if hidden:
            lines.append(f"  ... and {hidden} more pair differences")
        return "\n".join(lines) + "\n\n" + self.diagnostics

    def assert_ok(self) -> None:
        if self.problems:
            raise AssertionError(self.render())


def check_booted(
    case: str, host: Topology, result: RewriteResult, booted: GuestResult, sysfs_dir: Path
) -> GuestCheck:
    """Compare the booted guest with ``result.report``'s promises; never raises on a mismatch
    (see :meth:`GuestCheck.assert_ok`)."""
    report = result.report
    problems: list[Problem] = []
    host_bdfs = [d.host for d in report.placed]

    # GPU0.., NIC0.. numbered by host BDF, as `xmlfix --explain` labels them
    labels = {lab.function.bdf: lab.label for lab in label_devices(host, host_bdfs)}

    def name(h: Bdf) -> str:
        return f"{labels.get(h, '?')} (host {h})"

    # 1. every stand-in is where the domain put it, and the firmware's bus ranges do not collide
    _placement_problems(booted, problems)
    # 2. our own reader on the guest's tree; guest BDF -> host BDF through the stand-ins
    guest = open_host(booted.sysfs_tree(sysfs_dir))
    h2g = _host_to_guest(report, booted, name, problems)
    # 3. per device: placed, predicted BDF, role, NUMA node
    _device_problems(report, guest, h2g, name, problems)
    # 4. per pair: the class our classifier gives the booted guest = the promised guest class
    pairs_checked = _pair_problems(report, guest, h2g, labels, problems)

    check = GuestCheck(case, problems, h2g, labels, pairs_checked, len(host_bdfs), guest)
    if problems:
        check.diagnostics = diagnostics(result, booted, guest, h2g, labels)
    return check


def _placement_problems(booted: GuestResult, problems: list[Problem]) -> None:
    for s in booted.unmapped():
        problems.append(Problem(
            "missing", f"stand-in {s.alias} for host {s.source} ({s.kind}) is not at its guest "
                       f"address: its hierarchy vanished or moved",
            (Bdf.parse(s.source),) if s.source else ()))
    for o in bus_overlaps(booted.printout):
        problems.append(Problem("overlap", o))


def _host_to_guest(report: Report, booted: GuestResult, name: Callable[[Bdf], str],
                   problems: list[Problem]) -> dict[Bdf, Bdf]:
    by_source = {s.source: Bdf.parse(g) for g, s in booted.bdf_map.items() if s.source}
    by_alias = {s.alias: (Bdf.parse(g), s) for g, s in booted.bdf_map.items()}
    h2g: dict[Bdf, Bdf] = {}
    for d in report.placed:
        g = by_source.get(str(d.host))
        if g is None and d.alias in by_alias:
            g = by_alias[d.alias][0]
        if g is not None:
            h2g[d.host] = g
            s = booted.bdf_map[str(g)]
            if d.alias and s.alias != d.alias:
                problems.append(Problem("alias", f"{name(d.host)}: report alias {d.alias}, "
                                                 f"stand-in alias {s.alias}", (d.host,)))
    return h2g


def _device_problems(report: Report, guest: Topology, h2g: dict[Bdf, Bdf], name: Callable[[Bdf], str],
                     problems: list[Problem]) -> None:
    for d in report.placed:
        if d.guest is None:
            problems.append(Problem("unplaced", f"{name(d.host)}: the report gives it no guest BDF", (d.host,)))
        g = h2g.get(d.host)
        if g is None:
            if not any(p.kind == "missing" and d.host in p.hosts for p in problems):
                problems.append(Problem("missing", f"{name(d.host)}: not found in the guest", (d.host,)))
            continue
        if d.guest is not None and g != d.guest:
            problems.append(Problem("bdf", f"{name(d.host)}: predicted guest BDF {d.guest}, booted {g}",
                                    (d.host,)))
        try:
            gf = guest.function(g)
            grole = guest.role(gf).value
        except PcitopoError as e:
            problems.append(Problem("reader", f"{name(d.host)} at guest {g}: our reader fails on "
                                              f"the guest's tree: {e}", (d.host,)))
            continue
        if grole != d.role:
            problems.append(Problem(
                "role", f"{name(d.host)}: host role {d.role}, our reader sees its stand-in "
                        f"{gf.ids} class 0x{gf.class_code:06x} at {g} as {grole}", (d.host,)))
        want = report.numa_map.get(d.host_node)
        if d.guest_cell != want:
            problems.append(Problem(
                "report", f"{name(d.host)}: report says guest cell {d.guest_cell}, but numa_map "
                          f"maps host node {d.host_node} to {want}", (d.host,)))
        want_node = -1 if want is None else want
        if gf.numa_node != want_node:
            problems.append(Problem(
                "numa", f"{name(d.host)} at guest {g}: numa_node {gf.numa_node}, promised "
                        f"{want_node} (host node {d.host_node}, numa_map {dict(report.numa_map)})",
                (d.host,)))


def _pair_problems(report: Report, guest: Topology, h2g: dict[Bdf, Bdf], labels: dict[Bdf, str],
                   problems: list[Problem]) -> int:
    pairs_checked = 0
    for p in report.pairs:
        ga, gb = h2g.get(p.a), h2g.get(p.b)
        if ga is None or gb is None or p.guest is None:
            continue  # reported above (missing / unplaced)
        where = (f"{labels.get(p.a, '?')}-{labels.get(p.b, '?')} (host {p.a}-{p.b}, "
                 f"guest {ga}-{gb})")
        try:
            got = classify(guest, ga, gb)
        except PcitopoError as e:
            problems.append(Problem("reader", f"{where}: our classifier fails on the guest: {e}",
                                    (p.a, p.b)))
            continue
        pairs_checked += 1
        if got.nccl != p.guest.nccl:
            problems.append(Problem(
                "nccl", f"{where}: NCCL promised {p.guest.nccl.value}, booted {got.nccl.value} "
                        f"(host {p.host.nccl.value})", (p.a, p.b)))
        if got.nvml != p.guest.nvml:
            problems.append(Problem(
                "nvml", f"{where}: NVML promised {p.guest.nvml.value}, booted {got.nvml.value} "
                        f"(host {p.host.nvml.value})", (p.a, p.b)))
    return pairs_checked


# -- diagnostics -------------------------------------------------------------------------------

_LINE_RE = re.compile(r"^(?P<prefix>[│├└─ ]*)(?P<bdf>\S+) \[[0-9a-f]{4}:[0-9a-f]{4}\] (?P<role>\S+)")
_LABEL_RE = re.compile(r"<[^>]*>")


def _norm(line: str) -> str:
    """What must agree between the booted and the predicted tree line: position, BDF, role and
    label (stand-ins have ids and names of their own)."""
    m = _LINE_RE.match(line)
    if not m:
        return line.strip()
    lab = _LABEL_RE.search(line)
    return f"{m['prefix']}{m['bdf']} {m['role']} {lab.group(0) if lab else ''}"


def _blocks(text: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("pci"):
            cur = out.setdefault(line.split()[0], [])
        if cur is not None:
            cur.append(line)
    return out


def side_by_side(booted_tree: str, predicted_tree: str, width: int | None = None) -> str:
    """Two ``tree_text`` outputs aligned root complex by root complex; ``≠`` marks lines whose
    position, BDF, role or label differ (ids and names of stand-ins are ignored)."""
    left, right = _blocks(booted_tree), _blocks(predicted_tree)
    rcs = sorted(set(left) | set(right), key=root_complex_sort_key)
    w = width or max([len(x) for b in left.values() for x in b] + [40]) + 1
    head = f"  {'booted guest (our reader on its sysfs)':<{w}} | predicted (report.tree_text(result.guest.topology))"
    lines = [head, "  " + "-" * w + "-+-" + "-" * 50]
    for rc in rcs:
        a, b = left.get(rc, []), right.get(rc, [])
        if rc == "pci0000:00":
            # pcie-root also carries devices the predicted model leaves out (host bridge,
            # the domain's own NIC/disk/video...): compare only lines with a label.
            a = [x for x in a[1:] if "<" in x]
            b = [x for x in b[1:] if "<" in x]
            if not a and not b:
                continue
            lines.append(f"  {rc + ' (labelled lines only)':<{w}} | {rc}")
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else "(nothing)"
            y = b[i] if i < len(b) else "(nothing)"
            mark = " " if _norm(x) == _norm(y) else "≠"
            lines.append(f"{mark} {x:<{w}} | {y}")
    return "\n".join(lines)


def diagnostics(result: RewriteResult, booted: GuestResult, guest: Topology,
                h2g: dict[Bdf, Bdf], labels: dict[Bdf, str]) -> str:
    report = result.report
    pred_labels = {d.guest: f"{labels.get(d.host, '?')} = host {d.host}" for d in report.placed
                   if d.guest is not None}
    booted_labels = {g: f"{labels.get(h, '?')} = host {h}" for h, g in h2g.items()}
    try:
        booted_tree = tree_text(guest, None, booted_labels)
    except Exception as e:  # a tree our reader cannot draw is itself a finding
        booted_tree = f"(tree_text failed on the booted guest: {type(e).__name__}: {e})\n"
    predicted_tree = tree_text(result.guest.topology, None, pred_labels)
    numa = ", ".join(f"host {h} -> cell {c}" for h, c in sorted(report.numa_map.items())) or "none"
    parts = [
        "Guest PCI tree, booted vs predicted:",
        side_by_side(booted_tree, predicted_tree),
        "",
        f"NUMA map ({report.numa_source}): {numa}; guest NUMA nodes seen: "
        f"{sorted(booted.printout.nodes)}; ACPI tables: {booted.printout.info.get('acpi_tables', '?')}",
        "",
        "The guest's own `lspci -tvnn`:",
        booted.printout.lspci_tree,
        "",
        f"Run files (bootable.xml, defined.xml, serial.log): {booted.work_dir}",
    ]
    return "\n".join(parts) + "\n"


__all__ = ["GuestCheck", "Problem", "check_booted", "side_by_side", "KINDS"]
