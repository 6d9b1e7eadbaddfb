"""Matrices, trees and JSON for people and for tools built on top of us."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from .classify import NvlinkOracle, PairClass, classify, nccl_path, pairs
from .mmio import budget_lines  # issue 11
from .model import Bdf, PciFunction, Role, Topology
from .names import part_name

LABEL_PREFIX = {Role.GPU: "GPU", Role.NIC: "NIC", Role.NVME: "NVME", Role.NVSWITCH: "NVSW"}

NVML_LEGEND = """Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""

NCCL_LEGEND = """NCCL's view (decides GPUDirect RDMA: used only at PXB or closer; NCCL has no NODE):
  PIX = same switch   PXB = several switches, no CPU   PHB = through a CPU   SYS = across CPUs"""


@dataclass(frozen=True, slots=True)
class Labeled:
    label: str
    function: PciFunction
    role: Role


def default_devices(topo: Topology, include_vfs: bool = False) -> list[Bdf]:
    """GPUs and NICs of the host (physical functions only unless asked)."""
    out = []
    for f in topo.functions():
        if topo.role(f) in (Role.GPU, Role.NIC) and (include_vfs or not f.is_vf):
            out.append(f.bdf)
    return out


def label_devices(topo: Topology, bdfs: Iterable[Bdf]) -> list[Labeled]:
    """GPU0.., NIC0.. in BDF order, as nvidia-smi numbers them; other roles DEV0.."""
    fs = sorted((topo.function(b) for b in bdfs), key=lambda f: f.bdf)
    counters: dict[str, int] = {}
    out = []
    for group in ("GPU", "NIC", "NVME", "NVSW", "DEV"):
        for f in fs:
            role = topo.role(f)
            if LABEL_PREFIX.get(role, "DEV") != group:
                continue
            n = counters.get(group, 0)
            counters[group] = n + 1
            out.append(Labeled(f"{group}{n}", f, role))
    return out


def cpus_of(topo: Topology, f: PciFunction) -> str:
    if f.local_cpulist:
        return f.local_cpulist
    node = topo.numa_nodes().get(topo.numa_of(f))
    return node.cpulist if node and node.cpulist else "N/A"


def pair_cell(cls: PairClass, nvlink: int | None, view: str) -> str:
    if nvlink:
        return f"NV{nvlink}"
    return cls.nvml.value if view == "nvml" else cls.nccl.value


def render_matrix(
    rows: Sequence[Labeled],
    cell: Callable[[Labeled, Labeled], str],
    extra_cols: Sequence[tuple[str, Callable[[Labeled], str]]] = (),
) -> str:
    """An ``nvidia-smi topo -m`` shaped table."""
    labels = [r.label for r in rows]
    cells = {(r.label, c.label): ("X" if c is r else cell(r, c)) for r in rows for c in rows}
    width = max([6] + [len(x) + 2 for x in labels] + [len(v) + 2 for v in cells.values()])
    head = " " * width + "".join(f"{x:<{width}}" for x in labels)
    head += "".join(f"{name:<16}" for name, _ in extra_cols)
    lines = [head.rstrip()]
    for r in rows:
        line = f"{r.label:<{width}}"
        for c in rows:
            line += f"{cells[r.label, c.label]:<{width}}"
        line += "".join(f"{fn(r):<16}" for _, fn in extra_cols)
        lines.append(line.rstrip())
    return "\n".join(lines)


def device_legend(topo: Topology, rows: Sequence[Labeled], live_root: str | None = None) -> str:
    lines = ["Device Legend:", ""]
    for r in rows:
        name = part_name(r.function, live_root) or r.function.ids
        vf = f", VF of {r.function.physfn}" if r.function.physfn else ""
        lines.append(f"  {r.label}: {r.function.bdf}  {name}{vf}")
    return "\n".join(lines)


def topo_text(
    topo: Topology,
    bdfs: Sequence[Bdf],
    nvlink: NvlinkOracle,
    live_root: str | None = None,
) -> str:
    rows = label_devices(topo, bdfs)
    classes = {(a.label, b.label): classify(topo, a.function, b.function) for a in rows for b in rows if a is not b}
    links = {(a.label, b.label): nvlink.count(a.function, b.function) for a in rows for b in rows if a is not b}
    affinity = [
        ("CPU Affinity", lambda r: cpus_of(topo, r.function)),
        ("NUMA Affinity", lambda r: str(topo.numa_of(r.function)) if topo.numa_of(r.function) >= 0 else "N/A"),
    ]
    nvml = render_matrix(rows, lambda a, b: pair_cell(classes[a.label, b.label], links[a.label, b.label], "nvml"), affinity)
    nccl = render_matrix(rows, lambda a, b: pair_cell(classes[a.label, b.label], links[a.label, b.label], "nccl"))
    parts = [nvml, "", NVML_LEGEND, "", device_legend(topo, rows, live_root), "", NCCL_LEGEND, "", nccl]
    if any(v for v in links.values()):
        parts += ["", "NV# counts are inferred from the SXM board table (NVLink is not in sysfs)."]
    return "\n".join(parts) + "\n"


def device_json(topo: Topology, lab: Labeled) -> dict:
    f = lab.function
    sw = nccl_path(topo, f).switches
    parent_switch = None
    parent = topo.parent(f)
    if parent is not None:
        up = topo.switch_of(parent)
        parent_switch = str(up.bdf) if up is not None else None
    return {
        "bdf": str(f.bdf),
        "label": lab.label,
        "kind": lab.role.value,
        "numa": topo.numa_of(f),
        "ids": f.ids,
        "subsystem": f.subsystem_ids,
        "class": f"0x{f.class_code:06x}",
        "root_complex": f.root_complex,
        "switch": parent_switch,
        "nccl_switch": str(sw[0]) if sw else None,
        "physfn": str(f.physfn) if f.physfn else None,
        "driver": f.driver,
        "iommu_group": f.iommu_group,
        "link": {
            "max_speed": f.link.max_speed,
            "max_width": f.link.max_width,
            "current_speed": f.link.current_speed,
            "current_width": f.link.current_width,
        },
    }


def topo_json(topo: Topology, bdfs: Sequence[Bdf], nvlink: NvlinkOracle) -> dict:
    rows = label_devices(topo, bdfs)
    out_pairs = []
    for a, b in pairs([r.function.bdf for r in rows]):
        fa, fb = topo.function(a), topo.function(b)
        cls = classify(topo, fa, fb)
        out_pairs.append(
            {"a": str(a), "b": str(b), "nccl": cls.nccl.value, "nvml": cls.nvml.value, "nvlink": nvlink.count(fa, fb)}
        )
    return {
        "host": topo.name,
        "devices": [device_json(topo, r) for r in rows],
        "pairs": out_pairs,
        "nvlink_source": "inferred from the SXM board table",
        "warnings": topo.warnings,
    }


def tree_text(topo: Topology, live_root: str | None = None, labels: dict[Bdf, str] | None = None) -> str:
    """An ``lspci -tv``-like tree annotated with roles, NUMA and switch kinds."""
    from .classify import bcm_gen

    labels = labels or {}
    out: list[str] = []

    def describe(f: PciFunction) -> str:
        role = topo.role(f)
        bits = [str(f.bdf), f"[{f.ids}]", role.value]
        if role == Role.UPSTREAM_PORT:
            if f.vendor == 0x15B3:
                bits.append("(ConnectX integrated switch)")
            elif bcm_gen(f, 0):
                bits.append(f"(Broadcom Gen{bcm_gen(f, 0)} two-level top: NCCL flattens the level below into it)")
            elif bcm_gen(f, 1):
                bits.append(f"(Broadcom Gen{bcm_gen(f, 1)} virtual switch)")
        name = part_name(f, live_root)
        if name:
            bits.append(name)
        if f.physfn:
            bits.append(f"VF of {f.physfn}")
        if f.bdf in labels:
            bits.append(f"<{labels[f.bdf]}>")
        return " ".join(bits)

    def walk(bdf: Bdf, prefix: str, last: bool) -> None:
        f = topo.function(bdf)
        out.append(f"{prefix}{'└─ ' if last else '├─ '}{describe(f)}")
        kids = sorted(topo.children(bdf))
        for i, k in enumerate(kids):
            walk(k, prefix + ("   " if last else "│  "), i == len(kids) - 1)

    for rc in topo.root_complexes():
        kids = sorted(topo.children(rc))
        numas = sorted({topo.numa_of(topo.function(k)) for k in kids})
        out.append(f"{rc} [NUMA {','.join(str(n) for n in numas)}]")
        for i, k in enumerate(kids):
            walk(k, "", i == len(kids) - 1)
    return "\n".join(out) + "\n"




# -- xmlfix --explain --------------------------------------------------------------------------

def explain_text(result, host: Topology, live_root: str | None = None) -> str:
    """Host and predicted guest classes side by side (``HOST>GUEST*`` where they differ), the
    reasons, and the guest tree as ``lspci -tv`` would draw it."""
    report = result.report
    guest = result.guest
    placed = [d.host for d in report.placed]
    rows = label_devices(host, placed)
    by_pair = {}
    for p in report.pairs:
        by_pair[(p.a, p.b)] = by_pair[(p.b, p.a)] = p
    oracle = NvlinkOracle(host)

    def cell(view: str):
        def fn(a: Labeled, b: Labeled) -> str:
            p = by_pair[(a.function.bdf, b.function.bdf)]
            links = oracle.count(a.function, b.function)
            if links:
                return f"NV{links}"
            h = p.host.nvml.value if view == "nvml" else p.host.nccl.value
            if p.guest is None:
                return f"{h}>?*"
            g = p.guest.nvml.value if view == "nvml" else p.guest.nccl.value
            return h if h == g else f"{h}>{g}*"

        return fn

    placed_by_host = {d.host: d for d in report.placed}

    def guest_col(r: Labeled) -> str:
        d = placed_by_host[r.function.bdf]
        return str(d.guest) if d.guest else "unplaced"

    def numa_col(r: Labeled) -> str:
        d = placed_by_host[r.function.bdf]
        cellv = "-" if d.guest_cell is None else str(d.guest_cell)
        return f"{d.host_node if d.host_node >= 0 else '-'}>{cellv}"

    extra = [("Guest BDF", guest_col), ("NUMA>cell", numa_col)]
    out = [
        "Host vs predicted guest, nvidia-smi view (cells read HOST>GUEST* where they differ):",
        "",
        render_matrix(rows, cell("nvml"), extra),
        "",
        "Host vs predicted guest, NCCL view (GPUDirect RDMA needs PXB or closer):",
        "",
        render_matrix(rows, cell("nccl")),
        "",
        device_legend(host, rows, live_root),
        "",
    ]
    diffs = [p for p in report.pairs if p.why]
    if diffs:
        out.append("Differences:")
        label_of = {r.function.bdf: r.label for r in rows}
        for p in diffs:
            g = f"{p.guest.nccl.value}/{p.guest.nvml.value}" if p.guest else "?"
            out.append(
                f"  {label_of[p.a]}-{label_of[p.b]}: host {p.host.nccl.value}/{p.host.nvml.value} "
                f"(NCCL/NVML), guest {g}: {p.why}"
            )
    else:
        out.append("Every pair's guest class equals the host's (NCCL and NVML).")
    numa = ", ".join(f"host {h} -> cell {c}" for h, c in sorted(report.numa_map.items())) or "none"
    out += ["", f"NUMA map ({report.numa_source}): {numa}"]
    for n in report.notes:
        out.append(f"note: {n}")
    out += [""] + budget_lines(report.mmio, report.cliques)  # issue 11 (topology/mmio.py)
    out += ["", "Guest PCI tree (predicted, as lspci -tv would show it):", ""]
    guest_labels = {}
    for r in rows:
        g = placed_by_host[r.function.bdf].guest
        if g is not None:
            guest_labels[g] = f"{r.label} = host {r.function.bdf}"
    out.append(tree_text(guest.topology, None, guest_labels).rstrip("\n"))
    return "\n".join(out) + "\n"
