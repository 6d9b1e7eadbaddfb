"""What ``xmlfix`` shows a person about one rewrite: ``--explain`` (host against predicted guest,
the reasons, the guest tree) and ``--diff`` (what the rewrite changed in meaning).

The host's own matrices, trees and JSON are :mod:`topology.views.report`'s; this module lays
the prediction (:mod:`topology.guest.predict`) beside them.
"""

from __future__ import annotations

from typing import Callable

from ..guest.mmio import budget_lines
from ..guest.predict import KUBEVIRT_NUMA_ADVICE, cell_less_devices, guest_nvlink, pair_views, verdict
from ..model.labels import Labeled, label_devices
from ..model.tree import Role, Topology
from .report import device_legend, render_matrix, tree_text


# -- xmlfix --explain --------------------------------------------------------------------------

def _explain_nvlink(result, host: Topology, fabric) -> tuple[object | None, list[str]]:
    """The NV# the guest will show and the lines that explain it. With a fabric file: NV<n> only
    inside the VM's own partition when the check found it active; without one: the board-table
    inference, marked as such."""
    oracle = guest_nvlink(result, host, fabric)
    if fabric is None:
        return oracle, ["NVLink: NV# inferred from the SXM board table (no fabric file): the guest has NVLink only "
                        "if its GPUs are exactly one active Fabric Manager partition (xmlfix --fabric checks that)"]
    head = f"NVLink (fabric file {fabric.path}, {fabric.bdf_origin}): "
    verdict = result.report.nvlink
    if verdict is None:
        return None, [head + "not checked (pcitopo.kubevirt.io/nvlink: off)"]
    return oracle, [head + verdict.message]


def explain_text(result, host: Topology, live_root: str | None = None, fabric=None) -> str:
    """Host and predicted guest classes side by side (``HOST>GUEST*`` where they differ), the
    reasons, and the guest tree as ``lspci -tv`` would draw it."""
    report = result.report
    rows = label_devices(host, [d.host for d in report.placed])
    placed_by_host = {d.host: d for d in report.placed}
    oracle, nvlink_lines = _explain_nvlink(result, host, fabric)
    cell = _host_vs_guest_cell(report, oracle)
    out = [
        f"Verdict: {verdict(result, host, fabric)}",
        "",
        "Host vs predicted guest, nvidia-smi view (cells read HOST>GUEST* where they differ):",
        "",
        render_matrix(rows, cell("nvml"), _placement_columns(placed_by_host)),
        "",
        "Host vs predicted guest, NCCL view (GPUDirect RDMA needs PXB or closer):",
        "",
        render_matrix(rows, cell("nccl")),
        "",
        device_legend(host, rows, live_root),
        "",
    ]
    out += explain_differences(result, host, fabric=fabric)
    out += _placement_notes(report, rows, nvlink_lines)
    out += [""] + budget_lines(report.mmio, report.cliques)
    out += ["", "Guest PCI tree (predicted, as lspci -tv would show it):", ""]
    out.append(_guest_tree(result.guest, rows, placed_by_host))
    return "\n".join(out) + "\n"


def _host_vs_guest_cell(report, oracle) -> Callable[[str], Callable[[Labeled, Labeled], str]]:
    """For a view (``nvml`` or ``nccl``), the matrix cell of a pair: NV# where the guest has
    NVLink between them, else the host's class, then ``>GUEST*`` where the guest's differs."""
    by_pair = {}
    for p in report.pairs:
        by_pair[(p.a, p.b)] = by_pair[(p.b, p.a)] = p

    def cell(view: str) -> Callable[[Labeled, Labeled], str]:
        def fn(a: Labeled, b: Labeled) -> str:
            p = by_pair[(a.function.bdf, b.function.bdf)]
            links = oracle.count(a.function, b.function) if oracle is not None else None
            if links:
                return f"NV{links}"
            h = p.host.nvml.value if view == "nvml" else p.host.nccl.value
            if p.guest is None:
                return f"{h}>?*"
            g = p.guest.nvml.value if view == "nvml" else p.guest.nccl.value
            return h if h == g else f"{h}>{g}*"

        return fn

    return cell


def _placement_columns(placed_by_host: dict) -> list[tuple[str, Callable[[Labeled], str]]]:
    """The columns after the nvidia-smi matrix: where each device lands in the guest, and its
    host NUMA node beside its guest cell."""

    def guest_col(r: Labeled) -> str:
        d = placed_by_host[r.function.bdf]
        return str(d.guest) if d.guest else "unplaced"

    def numa_col(r: Labeled) -> str:
        d = placed_by_host[r.function.bdf]
        cellv = "-" if d.guest_cell is None else str(d.guest_cell)
        return f"{d.host_node if d.host_node >= 0 else '-'}>{cellv}"

    return [("Guest BDF", guest_col), ("NUMA>cell", numa_col)]


def _placement_notes(report, rows: list[Labeled], nvlink_lines: list[str]) -> list[str]:
    """The NUMA map, the NVLink lines (only where GPUs are listed), the planner's notes, and
    KubeVirt's advice when no guest cell could be mapped."""
    numa = ", ".join(f"host {h} -> cell {c}" for h, c in sorted(report.numa_map.items())) or "none"
    out = ["", f"NUMA map ({report.numa_source}): {numa}"]
    if any(r.role == Role.GPU for r in rows):
        out += nvlink_lines
    for n in report.notes:
        if not n.startswith("NVLink: "):  # said just above
            out.append(f"note: {n}")
    if not report.numa_map and report.placed:
        out.append(f"KubeVirt: {KUBEVIRT_NUMA_ADVICE}")
    return out


def _guest_tree(guest, rows: list[Labeled], placed_by_host: dict) -> str:
    """The predicted guest tree, each placed device labelled with its host BDF."""
    guest_labels = {}
    for r in rows:
        g = placed_by_host[r.function.bdf].guest
        if g is not None:
            guest_labels[g] = f"{r.label} = host {r.function.bdf}"
    return tree_text(guest.topology, None, guest_labels).rstrip("\n")


MAX_LISTED = 12  # pairs listed per reason in --explain; the rest are counted


def explain_differences(result, host: Topology, width: int = 100, fabric=None) -> list[str]:
    """The pairs a reader would see differ, grouped by reason (each reason once), naming for
    each pair only the view that differs; NVLink-joined GPU pairs are left out (both views use
    NVLink), and devices the guest shows without a NUMA cell are listed."""
    views = pair_views(result, host, fabric)
    groups: dict[str, list[str]] = {}
    for v in views:
        shown = [f"{t} {v.transition(k)}" for k, t in (("nccl", "NCCL"), ("nvml", "nvidia-smi")) if v.differs(k)]
        if shown:
            groups.setdefault(str(v.p.why), []).append(f"{v.name} {', '.join(shown)}")
    out = []
    for why, items in groups.items():
        out.append(f"Differences ({len(items)} pair(s)): {why}")
        line = " "
        shown_items = items if len(items) <= MAX_LISTED else items[:MAX_LISTED] + [f"... and {len(items) - MAX_LISTED} more (all pairs: xmlfix --json)"]
        for item in shown_items:
            if len(line) + len(item) + 2 > width and line.strip():
                out.append(line.rstrip(";"))
                line = " "
            line += f" {item};"
        out.append(line.rstrip(";"))
    hidden = sum(1 for v in views if v.nvlink and v.p.guest != v.p.host)
    if hidden:
        out.append(f"({hidden} GPU pair(s) joined by NVLink differ only in their PCIe class: not listed, both views use NVLink)")
    cell_less = cell_less_devices(result)
    for node, bdfs in sorted(cell_less.items()):
        out.append(f"NUMA: {len(bdfs)} device(s) of host node {node} have no guest cell (numa_node -1 in the guest): "
                   + ", ".join(str(b) for b in bdfs))
    if not groups and not cell_less:
        out.append("Every pair reads the same in the guest as on the host (NCCL and nvidia-smi).")
    return out


# -- xmlfix --diff -----------------------------------------------------------------------------

def diff_text(before: bytes, after: bytes, name: str) -> str:
    """A unified diff of what the rewrite changed in meaning. Both sides go through the same
    parser and serialiser (the output already has), so a re-serialisation (``<x></x>`` read
    back as ``<x/>``, quote style, attribute escapes) never shows as a change: only the
    elements and attributes the rewrite added, removed or edited do."""
    import difflib

    from ..libvirt.document import parse_domain, serialize

    def norm(xml: bytes) -> list[str]:
        return serialize(parse_domain(xml), xml).decode("utf-8", "replace").splitlines(keepends=True)

    a, b = norm(before), norm(after)
    # difflib.unified_diff's matcher treats lines frequent in a domain (``</hostdev>``) as junk
    # and then pairs them up badly: match with autojunk off and write the hunks ourselves.
    out = [f"--- {name}\n", f"+++ {name} (xmlfix)\n"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3):
        (_, i1, _, j1, _), (_, i2, _, j2, _) = group[0], group[-1]
        out.append(f"@@ -{i1 + 1},{group[-1][2] - i1} +{j1 + 1},{group[-1][4] - j1} @@\n")
        for tag, a1, a2, b1, b2 in group:
            out += [(" " if tag == "equal" else "-") + line for line in a[a1:a2]]
            if tag != "equal":
                out += ["+" + line for line in b[b1:b2]]
    return "".join(out) if len(out) > 2 else ""
