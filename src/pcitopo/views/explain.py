"""What ``xmlfix`` shows a person about one rewrite: ``--explain`` (host against predicted guest,
the reasons, the guest tree) and ``--diff`` (what the rewrite changed in meaning).

The host's own matrices, trees and JSON are :mod:`pcitopo.views.report`'s; this module lays
the prediction (:mod:`pcitopo.guest.verdict`) beside them.
"""

from __future__ import annotations

from collections.abc import Callable

from pcitopo.guest.mmio import (
    EDK2_VERSION,
    FIRMWARE_OF,
    OVMF_DEFAULT_APERTURE,
    QEMU_DEFAULT_BITS,
    SEABIOS_MIN_BITS,
    MmioBudget,
)
from pcitopo.guest.seabios import VERSION as SEABIOS_VERSION
from pcitopo.guest.verdict import KUBEVIRT_NUMA_ADVICE, guest_ib_hcas, guest_nvlink, pair_views, verdict
from pcitopo.model.bars import fmt_size
from pcitopo.model.labels import Labeled, label_devices
from pcitopo.model.tree import Role, Topology
from pcitopo.views.report import device_legend, render_matrix, tree_text, wrap_text

WIDTH = 100  # columns of --explain (the text, not the picture)


# -- xmlfix --explain --------------------------------------------------------------------------

def _explain_nvlink(result, host: Topology, fabric) -> tuple[object | None, list[str]]:
    """The NV# the guest will show and the lines that explain it. With a fabric file: NV<n> only
    inside the VM's own partition when the check found it active; without one: the board-table
    inference, marked as such."""
    oracle = guest_nvlink(result, host, fabric)
    if fabric is None and oracle.blocked:  # SXM GPUs, but the table's conditions are not met
        return oracle, [f"NVLink: nvlink_source {oracle.source}: {oracle.reason}"]
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
        render_matrix(rows, cell("nvml"), max_width=WIDTH),
        "",
        "Host vs predicted guest, NCCL view (GPUDirect RDMA needs PXB or closer):",
        "",
        render_matrix(rows, cell("nccl"), max_width=WIDTH),
        "",
        device_legend(host, rows, live_root, suffix=_placement(placed_by_host)),
        "",
    ]
    out += explain_differences(result, host, fabric=fabric)
    out += _placement_notes(result, host, rows, nvlink_lines)
    out += [""] + budget_lines(report.mmio, report.cliques) + hotplug_lines(report.hotplug)
    out += ["", "Guest PCI tree (predicted, as lspci -tv would show it):", ""]
    out.append(_guest_tree(result.guest, rows, placed_by_host))
    return wrap_text("\n".join(out), WIDTH) + "\n"


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


def _placement(placed_by_host: dict) -> Callable[[Labeled], str]:
    """The legend's tail: where each device lands in the guest, its host NUMA node beside its
    guest cell."""

    def tail(r: Labeled) -> str:
        d = placed_by_host[r.function.bdf]
        cellv = "none" if d.guest_cell is None else str(d.guest_cell)
        node = d.host_node if d.host_node >= 0 else "none"
        return f" -> guest {d.guest or 'unplaced'}, NUMA {node} -> cell {cellv}"

    return tail


def _placement_notes(result, host: Topology, rows: list[Labeled], nvlink_lines: list[str]) -> list[str]:
    """The NUMA map, the NVLink lines (only where GPUs are listed), the planner's notes, the
    guest's NCCL_IB_HCA, and KubeVirt's advice when no guest cell could be mapped."""
    report = result.report
    numa = ", ".join(f"host {h} -> cell {c}" for h, c in sorted(report.numa_map.items())) or "none"
    out = ["", f"NUMA map ({report.numa_source}): {numa}"]
    if any(r.role == Role.GPU for r in rows):
        out += nvlink_lines
    for n in report.notes:
        if not n.startswith("NVLink: "):  # said just above
            out.append(f"note: {n}")
    out += ib_hca_lines(result, host)
    if not report.numa_map and report.placed:
        out.append(f"KubeVirt: {KUBEVIRT_NUMA_ADVICE}")
    return out


def ib_hca_lines(result, host: Topology) -> list[str]:
    """What to give NCCL in the guest: its GPUDirect RDMA NICs by the names the guest will use."""
    hcas = guest_ib_hcas(result, host)
    if not hcas:
        return []
    names = ",".join(n for n, _ in hcas)
    which = ", ".join(f"{lab}={n}" for n, lab in hcas)
    return [f'NCCL_IB_HCA="={names}" in the guest: its GPUDirect RDMA NICs ({which}), named as the guest\'s mlx5 '
            "driver names functions, in PCI order (`ls /sys/class/infiniband` there shows them; \"=\" asks NCCL for "
            "exactly these)"]


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
        shown_items = (items if len(items) <= MAX_LISTED
                       else items[:MAX_LISTED] + [f"... and {len(items) - MAX_LISTED} more (all pairs: xmlfix --json)"])
        for item in shown_items:
            if len(line) + len(item) + 2 > width and line.strip():
                out.append(line.rstrip(";"))
                line = " "
            line += f" {item};"
        out.append(line.rstrip(";"))
    hidden = sum(1 for v in views if v.nvlink and v.p.guest != v.p.host)
    if hidden:
        out.append(f"({hidden} GPU pair(s) joined by NVLink differ only in their PCIe class: not listed, both views use NVLink)")
    cells = result.report.missing_cells
    if cells is not None:
        out.append(cells.line)
    if not groups and cells is None:
        out.append("Every pair reads the same in the guest as on the host (NCCL and nvidia-smi).")
    return out


# -- xmlfix --diff -----------------------------------------------------------------------------

def diff_text(before: bytes, after: bytes, name: str) -> str:
    """A unified diff of what the rewrite changed in meaning. Both sides go through the same
    parser and serialiser (the output already has), so a re-serialisation (``<x></x>`` read
    back as ``<x/>``, quote style, attribute escapes) never shows as a change: only the
    elements and attributes the rewrite added, removed or edited do."""
    import difflib

    from pcitopo.libvirt.document import parse_domain, serialize

    def norm(xml: bytes) -> list[str]:
        return serialize(parse_domain(xml), xml).decode("utf-8", "replace").splitlines(keepends=True)

    a, b = norm(before), norm(after)
    # difflib.unified_diff's matcher treats lines frequent in a domain (``</hostdev>``) as junk
    # and then pairs them up badly: match with autojunk off and write the hunks ourselves.
    out = [f"--- {name}\n", f"+++ {name} (xmlfix)\n"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(3):
        (_, i1, _, j1, _), (_, _i2, _, _j2, _) = group[0], group[-1]
        out.append(f"@@ -{i1 + 1},{group[-1][2] - i1} +{j1 + 1},{group[-1][4] - j1} @@\n")
        for tag, a1, a2, b1, b2 in group:
            out += [(" " if tag == "equal" else "-") + line for line in a[a1:a2]]
            if tag != "equal":
                out += ["+" + line for line in b[b1:b2]]
    return "".join(out) if len(out) > 2 else ""


# -- the MMIO budget and the firmware rules behind it ---------------------------------------------

def budget_lines(b: MmioBudget | None, cliques=None) -> list[str]:
    """The MMIO budget, the rule behind it and P2P cliques as text (``xmlfix --explain``)."""
    if b is None:
        out = ["64-bit MMIO: not managed (mmio: off)"]
    else:
        host = f"{b.host_bits} bits" if b.host_bits else "unknown"
        host += f", {b.host_bits_from}"
        out = [f"64-bit MMIO budget ({b.firmware}, CPU {b.cpu_mode}, guest RAM {fmt_size(b.ram)}, host width {host}):"]
        for p in b.ports:
            out.append(f"  {p.alias}: window {fmt_size(p.window)} (largest BAR {fmt_size(p.largest_bar)}, "
                       f"{len(p.devices)} function(s))")
        if b.other:
            out.append(f"  elsewhere (not below pcitopo's root ports): {fmt_size(b.other)}")
        out += _seabios_lines(b) + _ovmf_lines(b)
        out.append("  applied: " + ("; ".join(b.applied) if b.applied else "nothing needed"))
        # what the sums above could not know: the budget (and xmlfix --check) is unknown, not ok
        out += [f"  unknown: {line.removeprefix('MMIO: ')}" for line in b.unknown]
        out += [f"  warning: {w.kind}: {w.reason}" for w in b.warnings]
    if cliques is not None:
        if cliques.members:
            for n, members in sorted(cliques.members.items()):
                out.append(f"P2P clique {n}: {', '.join(str(m) for m in members)}")
        else:
            out.append("P2P cliques: none (no two PCIe GPUs below one host switch)")
    return out


def hotplug_lines(h) -> list[str]:
    """The bare root ports left for disk and NIC hotplug (pcitopo.guest.facts.HotplugPorts),
    and how many fewer than KubeVirt and libvirt give without pcitopo."""
    if h is None:
        return []
    line = (f"Hotplug: {h.kept} free root port(s) on pcie-root for disk and NIC hotplug once libvirt has placed "
            f"the devices without an address ({h.wanted} KubeVirt and libvirt give without pcitopo at most)")
    if h.lost:
        line += (f"; the VM lost {h.lost}: the mirrored tree leaves too few PCI bus numbers for the rest "
                 "(docs/VM.md, \"Hotplug ports\")")
    return [line]


def _mark(b: MmioBudget, fw: str) -> str:
    return "  <- this domain" if fw == b.firmware else ""


def _seabios_lines(b: MmioBudget) -> list[str]:
    head = f"  seabios (SeaBIOS {SEABIOS_VERSION}, {FIRMWARE_OF}):"
    plan = b.seabios
    if plan is None:
        return [f"{head} no 64-bit BARs{_mark(b, 'seabios')}"]
    if b.firmware != "seabios":  # its model's count would read as this domain's failure
        return [f"{head} not this domain's firmware (it boots {b.firmware.upper()}): nothing planned or written for it"]
    rule = ("rule: with RAM above 4 GiB it aligns each root/downstream port to 2^bits/2048 and packs the windows "
            "from the top of 2^bits, so each root port holding a larger BAR reserves a power-of-two window and the "
            f"width is the narrowest from {SEABIOS_MIN_BITS} bits at which every BAR lands on a multiple of its size")
    p, base = plan.placement, plan.baseline
    if plan.bits is None and not plan.reserves:
        what = f"no setting needed, model {p.assigned}/{len(p.bars)} BARs placed at QEMU's default width"
        if not plan.complete:
            what = f"no setting written (none does better), model {p.assigned}/{len(p.bars)} BARs placed"
    else:
        sizes = "/".join(sorted({fmt_size(v) for v in plan.reserves.values()}, reverse=True)) or "none"
        what = (f"{plan.width} bits, pref64-reserve {sizes} on {len(plan.reserves)} root port(s): model "
                f"{p.assigned}/{len(p.bars)} BARs placed (without settings {base.assigned}/{len(base.bars)})")
    return [f"{head} {rule}", f"  seabios: {what}{_mark(b, 'seabios')}"]


def _ovmf_lines(b: MmioBudget) -> list[str]:
    bits = b.ovmf_bits
    need = f"{bits} bits" if bits else f"QEMU's default ({QEMU_DEFAULT_BITS} bits) is enough"
    return [f"  ovmf (edk2 {EDK2_VERSION}, {FIRMWARE_OF}): rule: the 64-bit window is the top eighth of 2^bits "
            f"when the CPU has 1 GiB pages (pdpe1gb), else {fmt_size(OVMF_DEFAULT_APERTURE)}",
            f"  ovmf: total {fmt_size(b.total)}, needs {need}, window {fmt_size(b.ovmf_window(bits))}{_mark(b, 'ovmf')}"]


def summary_lines(result, host: Topology, fabric=None, doctor=None, gdr: bool = True) -> list[str]:
    """``xmlfix --summary``: the story in four lines (``make demo`` ends with them and its
    picture): the host, the guest, what ``--check`` decides and says (``check_verdict``), and the
    placed devices' readiness (``pcitopo doctor``'s verdict, when the doctor ran)."""
    from collections import Counter

    from pcitopo.guest.verdict import check_verdict
    from pcitopo.model.labels import default_devices
    from pcitopo.views.exports import verdict as doctor_verdict

    kinds = Counter(host.role(host.function(b)).value for b in default_devices(host))
    out = [f"host:    {host.label}: {kinds['gpu']} GPUs, {kinds['nic']} NICs, {len(host.numa_nodes())} NUMA node(s)"]
    r = result.report
    placed = Counter(d.role for d in r.placed)
    fw = f", firmware {r.mmio.firmware}" if r.mmio is not None else ""
    out.append(f"guest:   {placed['gpu']} GPUs and {placed['nic']} NICs on {r.created['pcie-root-port']} root port(s) "
               f"of {r.created['pcie-expander-bus']} expander bus(es), {len(set(r.numa_map.values()))} guest NUMA cell(s){fw}")
    v = check_verdict(result, host, fabric, gdr)
    out.append(f"verdict: check {v.state}: {'; '.join(v.unknowns + v.parts if v.state == 'unknown' else v.parts)}")
    out.append("doctor:  " + (doctor_verdict(doctor).removeprefix("verdict: ") if doctor is not None else "not run"))
    if doctor is not None and doctor.failed:
        # --check judges the VM's topology, the doctor its host: a VM on a host that is not ready
        # is not ok whatever the topology says, and the verdict line says that first
        out[2] = f"verdict: not ok: host not ready ({len(doctor.failed)} doctor check(s) failed); " + out[2].removeprefix("verdict: ")
    return out
