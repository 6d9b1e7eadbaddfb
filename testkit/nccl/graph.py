"""NCCL's PCI graph as ``ncclTopoGetSystemFromXml`` builds it, for tests: nodes created while
walking the XML (``ncclTopoAddPci``), links in the order NCCL makes them, then
``ncclTopoFlattenBcmSwitches`` and ``ncclTopoSort`` run as NCCL runs them, over the whole graph.

Read from NVIDIA/nccl, tag v2.30.7-1, ``src/graph/topo.cc``:
- ``ncclTopoAddPci``: a switch node is created before its children are walked; each child links
  to its parent, both ways, once the child's own subtree is done (so a switch's links are its
  children in XML order, then its parent). A ``pci`` element with a ``gpu`` or ``nic`` below it
  is a device node, not a switch.
- ``ncclTopoFlattenBcmSwitches``: the PCI nodes are scanned in creation order. A node whose
  64-bit id gives ``getBcmGen(id, 0)`` folds every linked PCI node with ``getBcmGen(id, 1)`` equal
  to it (its parent link included, as NCCL does not tell them apart): the link goes, and the
  folded node's other links are appended to the folding node's, which then gets
  ``device |= 0xffff`` so it never folds again; the scan restarts from the first node.
- ``ncclTopoSort``: from each CPU down, each node's up link moves last; nothing else moves.

This model is kept apart from the product's (``pcitopo.nccl.pcitree`` and
``classify``): tests hold the two equal on every fixture.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pcitopo.nccl.topoxml import XmlNode, strtol


def bcm_gen(device_id: int, level: int) -> int:
    """``getBcmGen`` over NCCL's 64-bit id vendor:device:subsystem_vendor:subsystem_device."""
    if (device_id & 0xFFFFFFFFFFFFF000) == 0x1000C0101000A000:
        return 4
    if (device_id & 0xFFFFFFFFFFFFF000) == (0x1000C03010000000 | level * 0x1000):
        return 5
    return 0


@dataclass(eq=False)
class Node:
    kind: str  # "cpu", "pci" (a switch), "dev" (a GPU or NIC)
    busid: str
    device_id: int = 0
    links: list[Node] = field(default_factory=list)


def device_id(x: XmlNode) -> int:
    out = 0
    for key in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
        out = (out << 16) | (strtol(x.get(key) or "") & 0xFFFF)
    return out


class Graph:
    """The graph of one NCCL system XML (``system`` element). ``from_sysfs``: the XML was read
    from sysfs, where NCCL inserts each element among its siblings by bus id (its issue #820);
    a topology file's order is kept as written."""

    def __init__(self, system: XmlNode, devices: set[str], from_sysfs: bool = False):
        self.devices = devices
        self.from_sysfs = from_sysfs
        self.pci: list[Node] = []  # system->nodes[PCI], in creation order
        self.cpus: list[Node] = []
        self.by_busid: dict[str, Node] = {}
        for cpu_x in system.subs:
            if cpu_x.name == "cpu":
                cpu = Node("cpu", "cpu" + (cpu_x.get("numaid") or ""))
                self.cpus.append(cpu)
                for sub in self._subs(cpu_x):
                    self._add(sub, cpu)
        self._flatten()
        for cpu in self.cpus:
            self._sort(cpu, None)

    def _add(self, x: XmlNode, parent: Node) -> None:
        if x.name != "pci":
            return
        busid = x.get("busid") or ""
        if busid in self.devices:
            node = Node("dev", busid)
        elif (x.get("class") or "").startswith("0x0604"):
            node = Node("pci", busid, device_id(x))
            self.pci.append(node)
            for sub in self._subs(x):
                self._add(sub, node)
        else:
            return  # NCCL skips what is neither (its XML holds only GPU and NIC paths)
        self.by_busid[busid] = node
        node.links.append(parent)
        parent.links.append(node)

    def _subs(self, x: XmlNode) -> list[XmlNode]:
        return sorted(x.subs, key=lambda c: c.get("busid") or "") if self.from_sysfs else list(x.subs)

    def _flatten(self) -> None:
        s = 0
        while s < len(self.pci):
            switch = self.pci[s]
            gen = bcm_gen(switch.device_id, 0)
            s += 1
            if not gen:
                continue
            subs = [n for n in switch.links if n.kind == "pci" and bcm_gen(n.device_id, 1) == gen]
            switch.links = [n for n in switch.links if n not in subs]
            for sub in subs:
                for rem in sub.links:
                    if rem is switch:
                        continue
                    switch.links.append(rem)
                    rem.links[rem.links.index(sub)] = switch
                self.pci.remove(sub)
            switch.device_id |= 0xFFFF
            s = 0

    def _sort(self, node: Node, up: Node | None) -> None:
        if up is not None:
            node.links.remove(up)
            node.links.append(up)
        for n in node.links:
            if n is not up and n.kind != "cpu":
                self._sort(n, node)

    def chain(self, busid: str) -> list[str]:
        """The switches from a device up to its CPU, nearest first (its up links)."""
        out = []
        node = self.by_busid[busid].links[-1]
        while node.kind == "pci":
            out.append(node.busid)
            node = node.links[-1]
        return out

    def down(self, node: Node) -> list[Node]:
        """A node's down links in NCCL's order (every link but the last, the up link)."""
        return node.links if node.kind == "cpu" else node.links[:-1]
