"""NCCL's PCIe bandwidth of GPU paths on a :class:`Topology` (a host, or a guest read from its
sysfs), and the host link a guest root port stands for. The rules themselves (NCCL's tree, its
link table, the narrowest link of a path) are :mod:`ncclxml`'s; this module reads a topology
the way NCCL reads sysfs.

Which paths: GPU–NIC, GPU–GPU and each GPU to its CPU, the paths NCCL prices when it chooses
between GPUDirect and host memory, rings and trees, and its channel counts. A NIC is its NCCL
node (ports and VFs merge into function 0 / the PF).
"""

from __future__ import annotations

import threading
import weakref
from typing import Sequence

from pcitopo.model.keep import PerModel
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology, component_bdf
from pcitopo.nccl import topoxml as ncclxml
from pcitopo.nccl.pcitree import NcclTree, SysfsView
from pcitopo.paths.classify import nccl_device

GPU_PATH_ROLES = (Role.GPU, Role.NIC)


class TopologySysfs(SysfsView):
    """A :class:`Topology` as NCCL reads sysfs: the realpath of a function, its attribute files."""

    def __init__(self, topo: Topology):
        self.topo = topo

    def path(self, busid: str) -> Sequence[str] | None:
        f = self.topo.find(Bdf.parse(busid))
        return f.path if f is not None else None

    def attr(self, path: Sequence[str], name: str) -> str:
        bdf = component_bdf(path[-1]) if path else None
        f = self.topo.find(bdf) if bdf is not None else None
        return _attr(f, name) if f is not None else ""


def _attr(f: PciFunction, name: str) -> str:
    if name == "class":
        return f"0x{f.class_code:06x}"
    if name in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
        v = getattr(f, name)
        return "" if v is None else f"0x{v:04x}"
    if name == "numa_node":
        return str(f.numa_node)
    if name == "max_link_speed":
        return f.link.max_speed or ""
    if name == "max_link_width":
        return "" if f.link.max_width is None else str(f.link.max_width)
    return ""


class SharedNcclTree(NcclTree):
    """The tree kept with a topology: every call on that host model asks it for nodes, from as
    many threads as the server runs. :class:`NcclTree` fills a node when first asked and marks it
    filled before its attributes and parent are in, so a second thread asking meanwhile would get
    it half-built (a device without the switches above it, dropped from an NCCL file as a shape
    mismatch). Here a node is filled under a lock: one handed out is complete, and nothing
    changes it afterwards."""

    def __init__(self, sysfs: SysfsView, system: ncclxml.XmlNode | None = None):
        super().__init__(sysfs, system)
        self._lock = threading.RLock()

    def node(self, busid: str) -> ncclxml.XmlNode:
        with self._lock:
            return super().node(busid)


def nccl_tree(topo: Topology, system: ncclxml.XmlNode | None = None) -> NcclTree:
    """NCCL's tree over ``topo`` (with a topology file's nodes when given); without a file, one
    per topology, kept with it like its other derived facts (and shared across threads)."""
    if system is not None:
        return NcclTree(TopologySysfs(topo), system)
    return _TREES(topo)


# NCCL's tree over a topology without a file, one per topology. The tree reads the topology
# through a weak proxy: a kept value holding its model would keep the model alive
# (src/pcitopo/model/keep.py).
_TREES: PerModel[SharedNcclTree] = PerModel(lambda topo: SharedNcclTree(TopologySysfs(weakref.proxy(topo))))


def nccl_busid(topo: Topology, f: PciFunction) -> str:
    """The address NCCL knows a device by (a NIC by its function 0 / PF)."""
    return str(nccl_device(topo, f).bdf)


def path_bandwidth(tree: NcclTree, topo: Topology, a: PciFunction, b: PciFunction | None) -> float | None:
    """GB/s NCCL gives the path a–b (b None: a to its CPU), for GPU–GPU, GPU–NIC and GPU–CPU
    paths; None for any other pair."""
    roles = (topo.role(a), None if b is None else topo.role(b))
    if b is None:
        return tree.to_cpu(nccl_busid(topo, a)) if roles[0] == Role.GPU else None
    if Role.GPU not in roles or not all(r in GPU_PATH_ROLES for r in roles):
        return None
    return tree.between(nccl_busid(topo, a), nccl_busid(topo, b))


def port_link(rp: PciFunction, below: PciFunction | None) -> tuple[str | None, str | None]:
    """(max_link_speed, max_link_width) of the host link below root port ``rp``: to the switch
    upstream port ``below`` as NCCL reads it (the lower end), or the root port's own when an
    endpoint sits below it (``below`` None)."""
    width = None if rp.link.max_width is None else str(rp.link.max_width)
    if below is None:
        return rp.link.max_speed, width
    return ncclxml.sysfs_link(below.link.max_speed or "", rp.link.max_speed or "",
                              "" if below.link.max_width is None else str(below.link.max_width), width or "")
