"""NCCL's topology file for a guest, written from the prediction.

The guest keeps the host's path classes but not its link speeds: QEMU's emulated switch
upstream port reports 2.5 GT/s x1 and its downstream port an unknown speed, so NCCL would price
every link from a switch up to the CPU at 0.19 GB/s. NCCL lets a topology file override sysfs
(``/var/run/nvidia-topologyd/virtualTopology.xml`` when ``NCCL_TOPO_FILE`` is unset). This file
names the guest's own addresses (the predicted guest BDF of every GPU and NIC and of every
emulated switch NCCL will see above them), nests them as NCCL will see them, on the guest's
NUMA cells, and gives each the host's link speed and width, spelled as NCCL's table has them.

A guest switch stands for the host switch at the same depth of the device's NCCL path (after
Broadcom flattening; the plan mirrors one switch per host switch, so the depths agree). A
switch node carries its bridge class and no vendor or device ids: NCCL flattens Broadcom switch
pairs by those ids, and the guest already shows the flattened shape. A device whose guest path
has another number of switches than its host path is left out (NCCL reads it from sysfs) and
named in a note.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lxml import etree

from pcitopo.model.tree import Bdf, Role, Topology
from pcitopo.nccl import topoxml as ncclxml
from pcitopo.nccl.pcitree import link_order
from pcitopo.nccl.price import nccl_busid, nccl_tree


@dataclass
class NcclFile:
    """The file's bytes (empty when there was no GPU or NIC to describe) and what was left out."""

    data: bytes = b""
    devices: int = 0  # PCI devices in the file (a multi-function NIC is one, by its function 0)
    gpus: int = 0  # the placed GPU and NIC functions the file describes, as the legend counts them
    nics: int = 0
    notes: list[str] = field(default_factory=list)


def _guest_busid(host: Topology, hb: Bdf, gb: Bdf) -> str:
    return str(gb.with_function(0)) if host.role(host.function(hb)) == Role.NIC else str(gb)


def write_nccl_file(host: Topology, guest: Topology, host_to_guest: dict[Bdf, Bdf], placed: Sequence[Bdf]) -> NcclFile:
    htree, gtree = nccl_tree(host), nccl_tree(guest)
    system = etree.Element("system", version=ncclxml.TOPO_XML_VERSION)
    nodes: dict[str, etree._Element] = {}
    order: dict[etree._Element, tuple] = {}  # each element's place among its siblings, as on the host
    out = NcclFile()
    functions: dict[Bdf, list[Role]] = {}
    for b in placed:
        role = host.role(host.function(b))
        if role in (Role.GPU, Role.NIC):
            functions.setdefault(Bdf.parse(nccl_busid(host, host.function(b))), []).append(role)
    for hb in sorted(functions):
        gb = host_to_guest.get(hb)
        if gb is None:
            continue
        gbusid = _guest_busid(host, hb, gb)
        hchain, gchain = htree.chain(str(hb)), gtree.chain(gbusid)
        if len(hchain) != len(gchain):
            out.notes.append(f"NCCL file: {hb} has {len(hchain) - 1} switch(es) above it on the host and "
                             f"{len(gchain) - 1} in the guest; left to the guest's sysfs")
            continue
        numaid = gtree.cpu_of(gbusid)
        parent = nodes.get("cpu " + numaid)
        if parent is None:
            parent = nodes["cpu " + numaid] = etree.SubElement(system, "cpu", numaid=numaid)
        for depth in range(len(gchain) - 1, -1, -1):
            parent = _node(nodes, parent, gchain[depth], hchain[depth], depth == 0, out.notes)
            order.setdefault(parent, link_order(hchain[depth], hchain[depth + 1] if depth + 1 < len(hchain) else None))
        out.devices += 1
        out.gpus += functions[hb].count(Role.GPU)
        out.nics += functions[hb].count(Role.NIC)
    if not out.devices:
        return out
    system[:] = sorted(system, key=lambda c: c.get("numaid") or "")
    for el in system.iter("cpu", "pci"):  # NCCL keeps the file's order: the host's, not the guest's bus ids
        el[:] = sorted(el, key=order.__getitem__)
    etree.indent(system, space="  ")
    out.data = etree.tostring(system, encoding="ascii") + b"\n"
    ncclxml.parse(out.data)  # a file NCCL would refuse is our bug: fail loudly here, not in the guest
    return out


def _node(nodes: dict[str, etree._Element], parent: etree._Element, gnode: ncclxml.XmlNode,
          hnode: ncclxml.XmlNode, device: bool, notes: list[str]) -> etree._Element:
    """The file's ``pci`` element for one guest node, created below ``parent`` on first use."""
    busid = gnode.get("busid") or ""
    speed = ncclxml.canonical_speed(hnode.get("link_speed") or "")
    width = hnode.get("link_width") or ""
    el = nodes.get(busid)
    if el is None:
        cls = (hnode.get("class") or "") if device else ncclxml.BRIDGE_CLASS
        el = nodes[busid] = etree.SubElement(parent, "pci", busid=busid)
        el.set("class", cls)
        el.set("link_speed", speed)
        el.set("link_width", width)
    elif (el.get("link_speed"), el.get("link_width")) != (speed, width):
        notes.append(f"NCCL file: guest switch {busid} stands for host links {el.get('link_speed')} "
                     f"x{el.get('link_width')} and {speed} x{width}; kept the first")
    return el
