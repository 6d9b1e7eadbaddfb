"""Matrices, trees and JSON for people and for tools built on top of us."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pcitopo.host.names import SWITCH_MANAGEMENT, device_name, part_name
from pcitopo.model.labels import Labeled, label_devices, rdma_name
from pcitopo.model.tree import MELLANOX, Bdf, PciFunction, Role, Topology
from pcitopo.paths.classify import NvlinkOracle, PairClass, classify, nccl_path, pairs
from pcitopo.paths.pairing import pcie_root
from pcitopo.paths.vfs import VfGroups, group_vfs, vf_summary, with_vfs

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
    max_width: int | None = None,
) -> str:
    """An ``nvidia-smi topo -m`` shaped table. With ``max_width`` (and no extra columns) a table
    wider than that is cut into blocks of columns, balanced, one under the other."""
    labels = [r.label for r in rows]
    cells = {(r.label, c.label): ("X" if c is r else cell(r, c)) for r in rows for c in rows}
    width = max([6] + [len(x) + 2 for x in labels] + [len(v) + 2 for v in cells.values()])
    per_block = len(rows)
    if max_width is not None and not extra_cols and width * (len(rows) + 1) > max_width:
        fit = max(1, max_width // width - 1)
        blocks = -(-len(rows) // fit)
        per_block = -(-len(rows) // blocks)
    out = []
    for start in range(0, len(rows), per_block):
        cols = rows[start:start + per_block]
        head = " " * width + "".join(f"{c.label:<{width}}" for c in cols)
        head += "".join(f"{name:<16}" for name, _ in extra_cols)
        lines = [head.rstrip()]
        for r in rows:
            line = f"{r.label:<{width}}" + "".join(f"{cells[r.label, c.label]:<{width}}" for c in cols)
            line += "".join(f"{fn(r):<16}" for _, fn in extra_cols)
            lines.append(line.rstrip())
        out.append("\n".join(lines))
    return "\n\n".join(out)


def device_legend(
    topo: Topology, rows: Sequence[Labeled], live_root: str | None = None, groups: VfGroups | None = None,
    suffix: Callable[[Labeled], str] | None = None,
) -> str:
    lines = ["Device Legend:", ""]
    for r in rows:
        name = device_name(topo, r.function, live_root)
        vf = f", VF of {r.function.physfn}" if r.function.physfn else ""
        vf += vf_summary(topo, groups.vfs_of(r.function.bdf)) if groups else ""  # VFs: one legend line under their PF
        rdma = rdma_name(topo, r.function)
        lines.append(f"  {r.label}: {r.function.bdf}  {f'{rdma}  ' if rdma else ''}{name}{vf}{suffix(r) if suffix else ''}")
    return "\n".join(lines)


def wrap_text(text: str, width: int = 100) -> str:
    """Lines longer than ``width`` folded at spaces (or, inside a long comma-separated list, after
    a comma), continued under their own indentation plus four."""
    out = []
    for line in text.split("\n"):
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        words = []
        for w in line.split(" "):
            while len(w) > width - len(indent) and "," in w[: width - len(indent)]:
                cut = w.rindex(",", 0, width - len(indent)) + 1
                words.append(w[:cut])
                w = w[cut:]
            words.append(w)
        cur = ""
        for w in words:
            if cur.strip() and len(cur) + 1 + len(w) > width:
                out.append(cur)
                cur = indent + w
            else:
                cur = f"{cur} {w}" if cur else w
        out.append(cur)
    return "\n".join(out)


def topo_text(
    topo: Topology,
    bdfs: Sequence[Bdf],
    nvlink: NvlinkOracle,
    live_root: str | None = None,
    _gpus_checked: bool = False,
) -> str:
    groups = group_vfs(topo, bdfs)  # VFs are legend lines under their PF, not rows
    rows = label_devices(topo, groups.heads)
    if rows and not _gpus_checked and not any(r.role == Role.GPU for r in rows):
        return _no_gpu_text(topo, bdfs, rows, nvlink, live_root, groups)
    classes = {(a.label, b.label): classify(topo, a.function, b.function) for a in rows for b in rows if a is not b}
    links = {(a.label, b.label): nvlink.count(a.function, b.function) for a in rows for b in rows if a is not b}
    affinity = [
        ("CPU Affinity", lambda r: cpus_of(topo, r.function)),
        ("NUMA Affinity", lambda r: str(topo.numa_of(r.function)) if topo.numa_of(r.function) >= 0 else "N/A"),
    ]
    nvml = render_matrix(rows, lambda a, b: pair_cell(classes[a.label, b.label], links[a.label, b.label], "nvml"), affinity)
    nccl = render_matrix(rows, lambda a, b: pair_cell(classes[a.label, b.label], links[a.label, b.label], "nccl"))
    parts = [nvml, "", NVML_LEGEND, "", device_legend(topo, rows, live_root, groups), "", NCCL_LEGEND, "", nccl]
    source = nvlink.source
    if any(v for v in links.values()):
        parts += ["", f"NV# counts: {source} (NVLink is not in sysfs)."]
    elif hasattr(nvlink, "fabric"):
        parts += ["", f"No NV# between these devices: {source}."]
    elif getattr(nvlink, "blocked", False):  # SXM GPUs, but the board table's conditions are not met
        parts += ["", f"No NV#: nvlink_source {source}: {nvlink.reason}."]
    return "\n".join(parts) + "\n"


def _no_gpu_text(
    topo: Topology, bdfs: Sequence[Bdf], rows: Sequence[Labeled], nvlink: NvlinkOracle, live_root: str | None,
    groups: VfGroups,
) -> str:
    """No GPU among the devices: say so, then still show the NICs: their
    NUMA and CPU affinity, and their matrix when there is more than one."""
    head = [f"no GPUs found: {len(rows)} other device(s) shown ({', '.join(sorted({r.role.value for r in rows}))})", ""]
    if len(rows) > 1:
        body = topo_text(topo, bdfs, nvlink, live_root, _gpus_checked=True)
        return "\n".join(head) + "\n" + body
    r = rows[0]
    numa = topo.numa_of(r.function)
    lines = [device_legend(topo, rows, live_root, groups), "",
             f"  {r.label}: CPU Affinity {cpus_of(topo, r.function)}, NUMA Affinity {numa if numa >= 0 else 'N/A'}"]
    return "\n".join(head + lines) + "\n"


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
        "pcie_root": pcie_root(f),  # Kubernetes' resource.kubernetes.io/pcieRoot (DRA)
        "switch": parent_switch,
        "nccl_switch": str(sw[0]) if sw else None,
        "physfn": str(f.physfn) if f.physfn else None,
        "driver": f.driver,
        "rdma": rdma_name(topo, f),
        "iommu_group": f.iommu_group,
        "link": {
            "max_speed": f.link.max_speed,
            "max_width": f.link.max_width,
            "current_speed": f.link.current_speed,
            "current_width": f.link.current_width,
        },
    }


def topo_json(topo: Topology, bdfs: Sequence[Bdf], nvlink: NvlinkOracle) -> dict:
    groups = group_vfs(topo, bdfs)  # VFs listed under their PF, pairs between heads
    rows = label_devices(topo, groups.heads)
    out_pairs = []
    for a, b in pairs([r.function.bdf for r in rows]):
        fa, fb = topo.function(a), topo.function(b)
        cls = classify(topo, fa, fb)
        out_pairs.append(
            {"a": str(a), "b": str(b), "nccl": cls.nccl.value, "nvml": cls.nvml.value, "nvlink": nvlink.count(fa, fb)}
        )
    return {
        "host": topo.label,
        "devices": [with_vfs(topo, device_json(topo, r), groups.vfs_of(r.function.bdf)) for r in rows],
        "pairs": out_pairs,
        "nvlink_source": nvlink.source,
        "nvlink_reason": getattr(nvlink, "reason", None),  # why the board table gave NV# or not (None: a fabric)
        "warnings": topo.warnings,
    }


def tree_text(topo: Topology, live_root: str | None = None, labels: dict[Bdf, str] | None = None) -> str:
    """An ``lspci -tv``-like tree annotated with roles, NUMA and switch kinds."""
    from pcitopo.paths.classify import bcm_gen

    labels = labels or {}
    out: list[str] = []

    def broadcom_level(f: PciFunction) -> str:
        """Which level of a Broadcom complex ``f`` is. NCCL flattens a switch into the one above
        only when both present as one complex's levels; a Gen4 part's ids are the same at either
        level, so the tree around it decides: a top has a switch of its generation below one of
        its downstream ports, a virtual switch has one above its upstream port."""
        gen = bcm_gen(f, 0) or bcm_gen(f, 1)
        below = [topo.function(us) for ds in topo.children(f.bdf) for us in topo.children(ds)]
        if bcm_gen(f, 0) and any(topo.role(u) == Role.UPSTREAM_PORT and bcm_gen(u, 1) == gen for u in below):
            return f"(Broadcom Gen{gen} two-level top: NCCL flattens the level below into it)"
        ds = topo.parent(f)
        top = topo.parent(ds) if ds is not None else None
        if bcm_gen(f, 1) and top is not None and topo.role(top) == Role.UPSTREAM_PORT and bcm_gen(top, 0) == gen:
            return f"(Broadcom Gen{gen} virtual switch)"
        return f"(Broadcom Gen{gen} switch, one level)"

    def describe(f: PciFunction) -> str:
        role = topo.role(f)
        bits = [str(f.bdf), f"[{f.ids}]", role.value]
        if role == Role.UPSTREAM_PORT:
            if f.vendor == MELLANOX:
                bits.append("(ConnectX integrated switch)")
            elif bcm_gen(f, 0) or bcm_gen(f, 1):
                bits.append(broadcom_level(f))
        name = part_name(f, live_root)
        if name:
            bits.append(name)
        if role == Role.NIC:
            from pcitopo.model.nvswitch_mgmt import management_reason

            why = management_reason(topo, f)
            if why:
                bits.append(f"({SWITCH_MANAGEMENT}: {why})")
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
