"""Graphviz pictures: the host's PCIe tree and the predicted guest's, side by side.

Root complexes are clusters labelled with their NUMA node (host) or guest cell (guest); switches
are boxes (a switch's downstream ports are drawn inside its box, not as nodes); root ports are
small ellipses; each GPU and the NIC it pairs with for GPUDirect RDMA (the closest NIC by NCCL's
class, PXB or closer) share one colour on both sides, so a reader sees at a glance whether every
GPU still sits next to its NIC in the guest. ``pcitopo topo --dot`` and ``xmlfix --explain --dot``
write this; ``dot -Tsvg`` renders it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pcitopo.host.names import part_name
from pcitopo.libvirt.machine import sketch_domain
from pcitopo.model.labels import Labeled, label_devices
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology
from pcitopo.paths.classify import Nccl, classify

# Distinct fills that stay readable with black text (ColorBrewer Set3 / Pastel1 tones).
PALETTE = (
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
    "#bc80bd", "#ccebc5", "#ffed6f", "#d9d9d9",
)
UNPAIRED = "#ffffff"
SWITCH_FILL = "#eeeeee"
_RANK = {Nccl.PIX: 0, Nccl.PXB: 1}


def _q(text: str) -> str:
    """A DOT double-quoted string (newlines become centred line breaks)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def pair_colours(host: Topology, rows: list[Labeled]) -> dict[Bdf, str]:
    """GPU → its NIC: the closest NIC by NCCL class (PIX, then PXB; a NIC pairs with one GPU
    while another is free), each pair one palette colour; everything else white."""
    gpus = [r.function for r in rows if r.role == Role.GPU]
    nics = [r.function for r in rows if r.role == Role.NIC]
    taken: set[Bdf] = set()
    colours: dict[Bdf, str] = {}
    for g in gpus:
        best: tuple[int, int, Bdf] | None = None
        for n in nics:
            rank = _RANK.get(classify(host, g, n).nccl)
            if rank is not None:
                key = (rank, n.bdf in taken, n.bdf)
                best = min(best, key) if best else key
        colour = PALETTE[len({c for c in colours.values()}) % len(PALETTE)]
        colours[g.bdf] = colour
        if best is not None and best[2] not in taken:
            taken.add(best[2])
            colours[best[2]] = colour
    return colours


@dataclass
class _Side:
    """One tree (host or guest) being drawn: DOT lines per root complex, and edges."""

    prefix: str
    topo: Topology
    mirrored: bool = False  # edges drawn leaf → root, so this tree grows to the right
    clusters: dict[str, list[str]] = field(default_factory=dict)
    edges: list[str] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)
    leaves: list[str] = field(default_factory=list)

    def node_id(self, key: str) -> str:
        return _q(f"{self.prefix}:{key}")

    def add(self, rc: str, key: str, attrs: str) -> str:
        nid = self.node_id(key)
        if nid not in self.seen:
            self.seen.add(nid)
            self.clusters.setdefault(rc, []).append(f"    {nid} [{attrs}];")
        return nid

    def edge(self, a: str, b: str) -> None:
        line = f"  {b} -> {a};" if self.mirrored else f"  {a} -> {b};"
        if line not in self.seen:
            self.seen.add(line)
            self.edges.append(line)


def _switch_label(topo: Topology, up: PciFunction, live_root: str | None) -> str:
    name = part_name(up, live_root) or up.ids
    ports = len(topo.children(up.bdf))
    return f"switch {up.bdf}\n{name}\n{ports} downstream port{'s' if ports != 1 else ''}"


def _draw_chain(side: _Side, f: PciFunction, live_root: str | None) -> str | None:
    """Root ports and switch boxes above ``f``; returns the id of the node ``f`` hangs from."""
    topo = side.topo
    rc = f.root_complex
    parent: str | None = None
    for a in topo.ancestry(f):
        role = topo.role(a)
        if role == Role.DOWNSTREAM_PORT:
            continue  # inside its switch's box
        if role == Role.UPSTREAM_PORT:
            nid = side.add(rc, str(a.bdf),
                           f"shape=box, style=filled, fillcolor={_q(SWITCH_FILL)}, label={_q(_switch_label(topo, a, live_root))}")
        else:
            nid = side.add(rc, str(a.bdf), f"shape=ellipse, fontsize=10, label={_q('root port ' + str(a.bdf))}")
        if parent is not None:
            side.edge(parent, nid)
        parent = nid
    return parent


def _draw_devices(side: _Side, items: Iterable[tuple[PciFunction, str, str]], live_root: str | None) -> None:
    """``items``: (function in this tree, label text, fill colour)."""
    for f, text, colour in items:
        above = _draw_chain(side, f, live_root)
        nid = side.add(f.root_complex, str(f.bdf), f"shape=ellipse, style=filled, fillcolor={_q(colour)}, label={_q(text)}")
        side.leaves.append(nid)
        if above is not None:
            side.edge(above, nid)


def _emit(side: _Side, title: str, rc_label: dict[str, str]) -> list[str]:
    out = [f"  subgraph {_q('cluster_' + side.prefix)} {{", f"    label={_q(title)}; fontsize=16; style=rounded;"]
    for i, (rc, lines) in enumerate(sorted(side.clusters.items())):
        out.append(f"    subgraph {_q(f'cluster_{side.prefix}_{i}')} {{")
        out.append(f"      label={_q(rc_label.get(rc, rc))}; style=dashed; fontsize=12;")
        out += ["  " + ln for ln in lines]
        out.append("    }")
    out.append("  }")
    # All devices of one side in one column: host devices meet their guest selves in the middle.
    same = f"  {{rank=same; {'; '.join(side.leaves)}}}" if side.leaves else ""
    return out + side.edges + ([same] if same else [])


def render(host: Topology, rows: list[Labeled], guest: Topology | None, host_to_guest: dict[Bdf, Bdf],
           guest_cells: dict[str, int | None], title: str, live_root: str | None = None) -> str:
    colours = pair_colours(host, rows)
    hs = _Side("host", host)
    _draw_devices(hs, ((r.function, f"{r.label}\n{r.function.bdf}\n{part_name(r.function, live_root) or r.function.ids}",
                        colours.get(r.function.bdf, UNPAIRED)) for r in rows), live_root)
    host_rc = {rc: f"{rc} · NUMA {_rc_numa(host, rc)}" for rc in hs.clusters}
    lines = ["digraph pcitopo {", f"  label={_q(title)}; labelloc=t; fontsize=18; fontname=Helvetica;",
             "  rankdir=LR; nodesep=0.15; ranksep=0.4; newrank=true;",
             "  node [fontname=Helvetica, fontsize=11]; edge [arrowhead=none];"]
    lines += _emit(hs, f"host {host.name}", host_rc)
    if guest is not None:
        gs = _Side("guest", guest, mirrored=True)
        items = []
        for r in rows:
            g = host_to_guest.get(r.function.bdf)
            if g is not None:
                items.append((guest.function(g), f"{r.label}\nguest {g}\nhost {r.function.bdf}", colours.get(r.function.bdf, UNPAIRED)))
                # host device → its guest self: puts the guest tree to the right, mirrored
                gs.edges.append(f"  {hs.node_id(str(r.function.bdf))} -> {gs.node_id(str(g))} [style=dotted, color=gray40];")
        _draw_devices(gs, items, None)
        guest_rc = {}
        for rc in gs.clusters:
            cell = guest_cells.get(rc)
            kind = "pcie-root" if rc == "pci0000:00" else f"expander bus {rc[-2:]}"
            guest_rc[rc] = f"{kind} · " + (f"guest cell {cell}" if cell is not None else "no guest cell")
        lines += _emit(gs, "predicted guest", guest_rc)
    lines.append("}")
    return "\n".join(lines) + "\n"


def _rc_numa(topo: Topology, rc: str) -> str:
    nodes = sorted({topo.numa_of(topo.function(k)) for k in topo.children(rc)})
    return ",".join(str(n) for n in nodes if n >= 0) or "unknown"


def _verdict(result, host: Topology, fabric=None, gdr: bool = True) -> str:
    """What ``xmlfix --check`` decides and says (src/pcitopo/guest/verdict.py ``check_verdict``,
    whose first part is ``--explain``'s verdict), one part a line."""
    from pcitopo.guest.verdict import check_verdict

    v = check_verdict(result, host, fabric, gdr)
    lines = v.parts[0].split("; ") + [f"{kind} (xmlfix --check says why)" for kind in v.parts[1:]]
    return "\n".join([f"check: {v.state}", *lines])


def explain_dot(result, host: Topology, reason: str | None = None, live_root: str | None = None,
                guest_is: str | None = None, fabric=None, gdr: bool = True) -> str:
    """``xmlfix --explain --dot``: the host devices the domain passes through and their guest
    places. ``result`` None (the domain was left unchanged): the host side only, and why."""
    if result is None:
        return render(host, [], None, {}, {}, f"domain left unchanged: {reason}", live_root)
    rows = label_devices(host, [d.host for d in result.report.placed])
    g = result.guest
    verdict = _verdict(result, host, fabric, gdr)
    guest_is = guest_is or f"predicted guest of this domain ({len(rows)} devices)"
    title = (f"pcitopo: host (left), {guest_is} (right)\n{verdict}\n"
             "one colour = a GPU and its GPUDirect RDMA NIC (PIX/PXB); boxes = switches; dashed frames = root complexes")
    return render(host, rows, g.topology, g.host_to_guest, g.cells, title, live_root)


def topo_dot(host: Topology, bdfs: list[Bdf], live_root: str | None = None) -> str:
    """``pcitopo topo --dot``: the listed devices on the host and the guest a VM given all of
    them would see (one guest cell per host NUMA node, as guestMappingPassthrough gives)."""
    from pcitopo.guest.rewrite import rewrite_domain

    nodes = sorted({host.numa_of(host.function(b)) for b in bdfs} - {-1})
    result = rewrite_domain(sketch_domain(bdfs, nodes), host)
    guest_is = f"predicted guest of a VM given all {len(bdfs)} devices, one guest cell per host NUMA node"
    return explain_dot(result, host, None, live_root, guest_is)
