"""A parsed description → a tree laid out like ``/sys`` (:class:`MemoryTree`): exactly the files,
links and formatting the kernel shows, only the attribute names :mod:`pcitopo.host.sysfs`
reads; the doctor's files come from :mod:`pcitopo.synth.doctorfiles`."""

from __future__ import annotations

import os
import textwrap
from dataclasses import replace

from pcitopo.errors import SysfsError
from pcitopo.host.sources import PCI_DEVICES_DIR, MemoryTree
from pcitopo.host.sysfs import LINK_ATTRS, NODE_ATTRS, NODE_DIR, OPTIONAL_ATTRS, REQUIRED_ATTRS, RESOURCE_ATTRS, SysfsReader
from pcitopo.model.cpuinfo import ADDRESS_SIZES_MEMBER
from pcitopo.model.tree import Bdf, Topology
from pcitopo.synth import doctorfiles as synth_doctor
from pcitopo.synth.looks import Look
from pcitopo.synth.parse import parse_topo
from pcitopo.synth.resources import place_bars
from pcitopo.synth.spec import BRIDGE_KINDS, DeviceSpec, HostSpec, format_cpus


def _attr_values(look: Look, numa: int, cpulist: str) -> dict[str, str]:
    """Attribute file contents exactly as the kernel prints them (without the newline)."""
    return {
        "vendor": f"0x{look.vendor:04x}",
        "device": f"0x{look.device:04x}",
        "class": f"0x{look.class_code:06x}",
        "subsystem_vendor": f"0x{look.sub_vendor:04x}",
        "subsystem_device": f"0x{look.sub_device:04x}",
        "numa_node": str(numa),
        "max_link_speed": look.max_speed,
        "max_link_width": str(look.max_width),
        "current_link_speed": look.cur_speed if look.cur_speed is not None else look.max_speed,
        "current_link_width": str(look.cur_width if look.cur_width is not None else look.max_width),
        "local_cpulist": cpulist,
    }


class _Builder:
    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.tree = MemoryTree(spec.name)
        self.cpulists = {n.node: format_cpus(n.cpus) for n in spec.numa}
        # A function without a node shows every online CPU (pci-sysfs local_cpus_show).
        self.cpulists[-1] = format_cpus([c for n in spec.numa for c in n.cpus])
        self._taken = {d.iommu for d in spec.devices() if d.iommu is not None}
        self._next_group = 0
        self.resources = place_bars(spec)  # one `resource` file per function
        self.doctor = synth_doctor.DoctorFiles()  # pcitopo doctor's files

    def group(self) -> int:
        while self._next_group in self._taken:
            self._next_group += 1
        self._next_group += 1
        return self._next_group - 1

    def build(self) -> MemoryTree:
        for n in self.spec.numa:
            node_values = {"cpulist": self.cpulists[n.node]}
            for attr in NODE_ATTRS:
                if attr not in node_values:
                    raise SysfsError(f"synth does not know how to write the node attribute {attr!r}")
                self.tree.add_file(f"{NODE_DIR}/node{n.node}/{attr}", node_values[attr] + "\n")
        # IOMMU groups are numbered in bus-scan order (roots, then children, by address); VFs
        # appear later, when someone writes sriov_numvfs, so they come last.
        vfs: list[tuple[DeviceSpec, str]] = []
        for root in sorted(self.spec.roots, key=lambda r: (r.domain, r.bus)):
            rc_dir = f"devices/{root.dirname}"
            self.tree.add_dir(rc_dir)
            for child in sorted(root.children, key=lambda c: c.bdf):
                self.add_device(child, rc_dir, None, vfs)
        for dev, parent_dir in vfs:
            vf_look = replace(dev.look, device=dev.look.vf_device, max_speed="Unknown", max_width=0,
                              cur_speed=None, cur_width=None, driver="vfio-pci")
            for vf, pf in dev.vf_bdfs():
                self.add_function(parent_dir, vf, vf_look, dev.numa, self.group(), physfn=pf, kind="vf")
        self.doctor.finish(self.tree)
        if self.spec.address_bits is not None:
            phys, virt = self.spec.address_bits
            self.tree.add_file(ADDRESS_SIZES_MEMBER, f"address sizes\t: {phys} bits physical, {virt} bits virtual\n")
        return self.tree

    def add_device(self, dev: DeviceSpec, parent_dir: str, shared_group: int | None,
                   vfs: list[tuple[DeviceSpec, str]]) -> None:
        group = dev.iommu if dev.iommu is not None else shared_group
        gdr_path = dev.kind in BRIDGE_KINDS and synth_doctor.leads_to_gdr_device(dev)
        for i, bdf in enumerate(dev.function_bdfs()):
            g = group if group is not None else self.group()
            self.add_function(parent_dir, bdf, dev.look, dev.numa, g, kind=dev.kind, gdr_path=gdr_path)
            if dev.rdma:
                self.tree.add_dir(f"{parent_dir}/{bdf}/infiniband/{dev.rdma[i]}")
        if dev.vfs:
            vfs.append((dev, parent_dir))
        # Conventional PCI behind a PCIe-to-PCI bridge cannot be isolated: one group for all.
        child_group = g if dev.kind == "br" else None
        my_dir = f"{parent_dir}/{dev.bdf}"
        for child in sorted(dev.children, key=lambda c: c.bdf):
            self.add_device(child, my_dir, child_group, vfs)

    def add_function(self, parent_dir: str, bdf: Bdf, look: Look, numa: int, group: int,
                     physfn: Bdf | None = None, kind: str = "ep", gdr_path: bool = False) -> None:
        d = f"{parent_dir}/{bdf}"
        to_root = "../" * (d.count("/") + 1)
        self.tree.add_link(f"{PCI_DEVICES_DIR}/{bdf}", "../" * (PCI_DEVICES_DIR.count("/") + 1) + d)
        values = _attr_values(look, numa, self.cpulists[numa])
        for attr in REQUIRED_ATTRS + OPTIONAL_ATTRS:
            if attr in look.omit:
                continue
            if attr not in values:
                raise SysfsError(f"synth does not know how to write the attribute {attr!r}")
            self.tree.add_file(f"{d}/{attr}", values[attr] + "\n")
        for attr in RESOURCE_ATTRS:  # `resource`, written for every function
            if attr not in look.omit and bdf in self.resources:
                self.tree.add_file(f"{d}/{attr}", self.resources[bdf])
        links = {
            "driver": None if look.driver is None or "driver" in look.omit else f"{to_root}bus/pci/drivers/{look.driver}",
            "iommu_group": None if "iommu_group" in look.omit else f"{to_root}kernel/iommu_groups/{group}",
            "physfn": None if physfn is None else f"../{physfn}",
        }
        for attr in LINK_ATTRS:
            if attr not in links:
                raise SysfsError(f"synth does not know how to write the link {attr!r}")
            if links[attr] is not None:
                self.tree.add_link(f"{d}/{attr}", links[attr])
        self.doctor.add_function(self.tree, d, bdf, look, kind, group, gdr_path)


def build_tree(spec: HostSpec) -> MemoryTree:
    """The sysfs-shaped tree for a parsed description."""
    return _Builder(spec).build()


def host_from_topo(text: str, name: str = "test-host") -> Topology:
    """A host model straight from ``.topo`` text (dedented), read by the sidecar's own reader."""
    return Topology(SysfsReader(build_tree(parse_topo(textwrap.dedent(text), name))))


def load_topo_file(path: str | os.PathLike) -> MemoryTree:
    """Parse and build a ``.topo`` file."""
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as e:
        raise SysfsError(f"{name}: cannot read host description ({e})") from None
    return build_tree(parse_topo(text, name))
