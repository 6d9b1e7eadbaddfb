"""NCCL's PCI tree over sysfs plus a topology file, and the bandwidth of its paths.

Standard library only, Python 3.8 or newer (it runs in guests, see :mod:`ncclxml`). What it
follows (NCCL ``src/graph/xml.cc`` ``ncclTopoGetXmlFromSys``, ``topo.cc``):

- A PCI node's link comes from the file when the file gives it; otherwise from sysfs: the lower
  of the device's ``max_link_speed`` and the port above it, and the lower of the two widths
  (:func:`ncclxml.sysfs_link`).
- A node's parent comes from the file when the file nests it; otherwise from sysfs: the port
  directly above is skipped, the component above that is the parent if it is a PCI address,
  else the node hangs off the CPU of its ``numa_node``.
- Broadcom PEX switches presenting two levels are flattened into one (``getBcmGen``).
- A path's bandwidth is its narrowest PCIe link.
"""

import os
from typing import List, Optional, Sequence, Set

from pcitopo.nccl.topoxml import MAX_STR_LEN, TOPO_XML_VERSION, XmlNode, bandwidth, is_busid, strtol, sysfs_link

# -- sysfs and NCCL's tree --------------------------------------------------------------------

class SysfsView:
    """What NCCL reads of a PCI function: its path below ``devices/`` and its attribute files.
    :class:`DirSysfs` reads a sysfs directory; the host side adapts its own model."""

    def path(self, busid: str) -> Optional[Sequence[str]]:
        raise NotImplementedError

    def attr(self, path: Sequence[str], name: str) -> str:
        """The file's first line, or "" when it cannot be read (ncclOsTopoGetStrFromSys)."""
        raise NotImplementedError


class DirSysfs(SysfsView):
    def __init__(self, root: str = "/sys"):
        self.root = root

    def path(self, busid: str) -> Optional[Sequence[str]]:
        link = os.path.join(self.root, "bus", "pci", "devices", busid)
        if not os.path.lexists(link):
            return None
        real = os.path.realpath(link)
        devices = os.path.realpath(os.path.join(self.root, "devices"))
        rel = os.path.relpath(real, devices)
        return tuple(rel.split(os.sep))

    def attr(self, path: Sequence[str], name: str) -> str:
        try:
            with open(os.path.join(self.root, "devices", *path, name), "rb") as fh:
                return fh.read(MAX_STR_LEN).decode("ascii", "replace").split("\n")[0]
        except OSError:
            return ""


class NcclTree:
    """NCCL's PCI tree for some devices: a topology file (if any) overlaid on sysfs, filled in
    the way ncclTopoGetXmlFromSys does it, then priced link by link. One thread at a time: the
    tree the host side shares across calls is :class:`ncclprice.SharedNcclTree`."""

    def __init__(self, sysfs: SysfsView, system: Optional[XmlNode] = None):
        self.sysfs = sysfs
        self.system = system if system is not None else XmlNode("system", [("version", TOPO_XML_VERSION)])
        self._by_busid = {n.get("busid"): n for n in self.system.walk() if n.name == "pci"}
        self._filled: Set[int] = set()  # ids of nodes filled already (filling again changes nothing)

    def node(self, busid: str) -> XmlNode:
        """The pci node of ``busid``, created and filled from sysfs where the file is silent."""
        n = self._by_busid.get(busid)
        if n is None:
            n = XmlNode("pci", [("busid", busid)])
            self._by_busid[busid] = n
        self._fill(n)
        return n

    def _fill(self, n: XmlNode) -> None:
        if id(n) in self._filled:
            return
        self._filled.add(id(n))
        busid = n.get("busid") or ""
        path = self.sysfs.path(busid)
        if path is not None:
            n.set("class", self.sysfs.attr(path, "class") or (n.get("class") or ""))
            for key in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
                if n.get(key) is None:
                    n.set(key, self.sysfs.attr(path, key))
            if n.get("link_speed") is None or n.get("link_width") is None:
                port = tuple(path[:-1])
                speed, width = sysfs_link(self.sysfs.attr(path, "max_link_speed"), self.sysfs.attr(port, "max_link_speed"),
                                          self.sysfs.attr(path, "max_link_width"), self.sysfs.attr(port, "max_link_width"))
                if n.get("link_speed") is None:
                    n.set("link_speed", speed)
                if n.get("link_width") is None:
                    n.set("link_width", width)
        else:
            for key in ("link_speed", "link_width"):
                if n.get(key) is None:
                    n.set(key, "")
        if n.parent is None:
            self._attach(n, path)
        if n.parent is not None and n.parent.name == "pci":
            self._fill(n.parent)

    def _attach(self, n: XmlNode, path: Optional[Sequence[str]]) -> None:
        numa = self.sysfs.attr(path, "numa_node") if path is not None else "-1"
        parent: Optional[XmlNode] = None
        if path is not None and len(path) >= 2 and is_busid(path[-2]):
            if len(path) >= 3 and is_busid(path[-3]):
                parent = self._by_busid.get(path[-3])
                if parent is None:
                    parent = XmlNode("pci", [("busid", path[-3])])
                    self._by_busid[path[-3]] = parent
        if parent is None:
            parent = next((c for c in self.system.subs if c.name == "cpu" and c.get("numaid") == numa), None)
            if parent is None:
                parent = XmlNode("cpu", [("numaid", numa)], self.system)
                self.system.subs.append(parent)
        n.parent = parent
        parent.subs.append(n)

    # -- prices ---------------------------------------------------------------------------------

    def chain(self, busid: str) -> List[XmlNode]:
        """The pci nodes from ``busid`` up to its CPU, nearest first, after Broadcom flattening
        (a level-1 switch folded into its level-0 parent leaves the chain)."""
        out: List[XmlNode] = []
        n: Optional[XmlNode] = self.node(busid)
        while n is not None and n.name == "pci":
            out.append(n)
            n = n.parent
        return _flatten(out)

    def cpu_of(self, busid: str) -> str:
        n = self.node(busid)
        while n.parent is not None and n.name != "cpu":
            n = n.parent
        return n.get("numaid") or ""

    def to_cpu(self, busid: str) -> float:
        """GB/s from a device up to its CPU: the narrowest link on the way."""
        return min(bandwidth(n.get("link_speed"), n.get("link_width")) for n in self.chain(busid))

    def between(self, a: str, b: str) -> float:
        """GB/s between two devices over PCIe: the narrowest link on NCCL's path (through the
        nearest common switch, or up to the CPUs; the CPU-to-CPU link is not a PCIe link and
        is not counted)."""
        ca, cb = self.chain(a), self.chain(b)
        ids_b = [id(n) for n in cb]
        links: List[XmlNode] = []
        for i, n in enumerate(ca):
            if id(n) in ids_b and self.cpu_of(a) == self.cpu_of(b):
                links = ca[:i] + cb[:ids_b.index(id(n))]
                break
        else:
            links = ca + cb
        return min((bandwidth(n.get("link_speed"), n.get("link_width")) for n in links), default=float("inf"))


def bcm_gen(n: XmlNode, level: int) -> int:
    """NCCL's getBcmGen over the 64-bit id vendor:device:subsystem_vendor:subsystem_device."""
    ids = [strtol(n.get(k) or "") & 0xFFFF for k in ("vendor", "device", "subsystem_vendor", "subsystem_device")]
    if ids[0] != 0x1000 or ids[2] != 0x1000:
        return 0
    top = ids[3] & 0xF000
    if ids[1] == 0xC010 and top == 0xA000:
        return 4
    if ids[1] == 0xC030 and top == level * 0x1000:
        return 5
    return 0


def link_order(node: XmlNode, flat_parent: Optional[XmlNode]) -> tuple:
    """Where NCCL's graph lists ``node`` among the down links of ``flat_parent`` (its parent after
    flattening; None: a CPU). NCCL keeps a topology file's element order and the host's sysfs
    order is by bus id (``ncclTopoGetXmlFromSys``), so a switch links its own children in bus-id
    order; ``ncclTopoFlattenBcmSwitches`` then removes each folded sub-switch's link and appends
    that sub-switch's children after the switch's own, sub-switch by sub-switch; and
    ``ncclTopoSort`` only moves the up link last. A search that breaks ties by link order (GPU
    order in a ring, NIC order per channel) sees the guest's file in this order or not at all."""
    raw = node.parent
    busid = node.get("busid") or ""
    if flat_parent is None or raw is None or raw is flat_parent or raw.name != "pci":
        return (0, busid)
    return (1, raw.get("busid") or "", busid)


def _flatten(chain: List[XmlNode]) -> List[XmlNode]:
    """Drop from a chain (nearest first) every switch NCCL folds into its parent: a level-1
    Broadcom switch directly below a level-0 one of the same generation that has not itself
    been folded. The device at the chain's start is never a switch to fold."""
    top_down = list(reversed(chain))
    keep: List[XmlNode] = []
    parent: Optional[XmlNode] = None
    parent_folded = False
    for n in top_down:
        gen = bcm_gen(parent, 0) if parent is not None and not parent_folded else 0
        folded = n is not top_down[-1] and bool(gen) and bcm_gen(n, 1) == gen
        if not folded:
            keep.append(n)
        parent, parent_folded = n, folded
    return list(reversed(keep))
