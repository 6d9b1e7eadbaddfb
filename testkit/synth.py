"""Synthetic hosts: a short indented description (``.topo``) → a tree laid out like ``/sys``.

The format is documented in ``fixtures/README.md``. In short::

    numa 0 cpus=0-55,112-167
    rc 0000:15 numa=0
      rp 15:01.0 preset=intel-rp
        us 16:00.0 preset=pex-gen5-oem
          ds 17:00.0
            ep 18:00.0 preset=h100

The builder writes exactly what the kernel shows (relative ``bus/pci/devices`` links, one
directory per function nested along the PCI hierarchy, attribute files with the kernel's
formatting) and nothing else: only the attribute names :mod:`topology.host.sysfs` reads.
"""

from __future__ import annotations

import os
import re
import textwrap
from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

from pcitopo.topology.model.bars import Bar, format_resource
from pcitopo.topology.libvirt.domain import parse_cpuset
from pcitopo.topology.errors import PcitopoError, SysfsError
from pcitopo.topology.model.tree import Bdf, Topology
from pcitopo.topology.host.sysfs import (
    LINK_ATTRS,
    NODE_ATTRS,
    NODE_DIR,
    OPTIONAL_ATTRS,
    REQUIRED_ATTRS,
    RESOURCE_ATTRS,
    SysfsReader,
)
from pcitopo.topology.host.sources import MemoryTree, PCI_DEVICES_DIR

from . import synth_doctor


class TopoError(SysfsError):
    """A host description is malformed; the message names the file and line."""

    def __init__(self, name: str, line: int, reason: str):
        self.line = line
        super().__init__(f"{name} line {line}: {reason}")


# -- what a function looks like -----------------------------------------------------------------

# The kernel's pci_speed_string(); "Unknown" is what a function without link registers shows.
_SPEEDS = {
    "2.5": "2.5 GT/s PCIe",
    "5": "5.0 GT/s PCIe",
    "8": "8.0 GT/s PCIe",
    "16": "16.0 GT/s PCIe",
    "32": "32.0 GT/s PCIe",
    "64": "64.0 GT/s PCIe",
    "unknown": "Unknown",
}
_WIDTHS = (0, 1, 2, 4, 8, 12, 16, 32)
_LINK_FILES = ("max_link_speed", "max_link_width", "current_link_speed", "current_link_width")
# Names `omit=` accepts besides the optional attribute files; "link" is shorthand for the four
# link files (conventional PCI functions have none).
_OMITTABLE = frozenset(OPTIONAL_ATTRS) | frozenset(RESOURCE_ATTRS) | {"driver", "iommu_group"}

BRIDGE_KINDS = ("rp", "us", "ds", "br")
KINDS = ("rc",) + BRIDGE_KINDS + ("ep",)
# Which line kinds may sit directly under which: PCIe's own rules (a root port only on a root
# bus, a downstream port only inside a switch, a switch only below a port).
PARENTS: dict[str, tuple[str, ...]] = {
    "rp": ("rc",),
    "us": ("rp", "ds"),
    "ds": ("us",),
    "br": ("rp", "ds"),
    "ep": ("rc", "rp", "ds", "br"),
}


@dataclass(frozen=True, slots=True)
class Look:
    """Everything a function shows in sysfs apart from its place in the tree."""

    vendor: int
    device: int
    class_code: int
    sub_vendor: int = 0
    sub_device: int = 0
    max_speed: str = "Unknown"
    max_width: int = 0
    cur_speed: str | None = None  # None: same as max (a link trained at full speed)
    cur_width: int | None = None
    driver: str | None = None
    omit: frozenset[str] = frozenset()
    vf_device: int | None = None  # the SR-IOV VF device id, if the function can have VFs
    # pcitopo doctor (issue 13): planted faults, driver_override, IOMMU group type
    faults: frozenset[str] = frozenset()
    override: str | None = None
    iommu_type: str | None = None
    bars: tuple[tuple[int, int, int], ...] = ()  # (BAR index, size, kernel flags): see _BARS

    @property
    def is_bridge(self) -> bool:
        return self.class_code >> 8 == 0x0604


def _look(ids: str, sub: str, cls: int, speed: str, width: int, driver: str | None,
          omit: tuple[str, ...] = (), vf: int | None = None) -> Look:
    v, d = (int(x, 16) for x in ids.split(":"))
    sv, sd = (int(x, 16) for x in sub.split(":"))
    return Look(v, d, cls, sv, sd, _SPEEDS[speed], width, None, None, driver, frozenset(omit), vf)


_MLX_VF = 0x101E  # ConnectX-5 and later, BlueField: "ConnectX Family mlx5Gen Virtual Function"

# Ids from the PCI ID Repository (pci.ids) where it has them; the rest is marked "guess" and
# listed in fixtures/README.md (sources: docs/SOURCES.md, "the fixture hosts"). GPUs default to vfio-pci (a GPU passthrough node binds all of them);
# NICs to mlx5_core (the host's own driver) and fixtures say driver=vfio-pci where a NIC is
# handed to VMs whole.
PRESETS: dict[str, Look] = {
    # GPUs and NVSwitches
    "h100": _look("10de:2330", "10de:16c1", 0x030200, "32", 16, "vfio-pci"),
    "h200": _look("10de:2335", "10de:18be", 0x030200, "32", 16, "vfio-pci"),
    "b200": _look("10de:2901", "10de:1999", 0x030200, "32", 16, "vfio-pci"),  # sub: guess
    "b300": _look("10de:3182", "10de:20ea", 0x030200, "64", 16, "vfio-pci"),  # sub: guess
    "a100-pcie": _look("10de:20f1", "10de:145f", 0x030200, "16", 16, "vfio-pci"),
    "l40s": _look("10de:26b9", "10de:1851", 0x030200, "16", 16, "vfio-pci"),
    "nvswitch-h100": _look("10de:22a3", "10de:1796", 0x068000, "16", 2, "vfio-pci"),  # sub, link: guess
    # NVIDIA/Mellanox networking
    "cx7-ib": _look("15b3:1021", "15b3:0023", 0x020700, "32", 16, "mlx5_core", vf=_MLX_VF),
    "cx7-eth": _look("15b3:1021", "15b3:0023", 0x020000, "32", 16, "mlx5_core", vf=_MLX_VF),
    "cx7-switch": _look("15b3:1979", "15b3:0023", 0x060400, "32", 16, "pcieport"),  # sub: guess
    # ConnectX-8 SuperNIC: NIC 15b3:1023; its integrated switch presents 15b3:197c and 15b3:1979
    # ports (rdma-core's rdma_topo lists both as "USP/DSP of a CX switch"; which level carries
    # which id is a guess); the Data Direct DMA function 15b3:2100 (class: guess)
    "cx8-ib": _look("15b3:1023", "15b3:0026", 0x020700, "64", 16, "mlx5_core", vf=_MLX_VF),  # sub: guess
    "cx8-switch": _look("15b3:197c", "15b3:0026", 0x060400, "64", 16, "pcieport"),  # sub: guess
    "cx8-switch-l2": _look("15b3:1979", "15b3:0026", 0x060400, "64", 16, "pcieport"),  # sub: guess
    "cx8-dd": _look("15b3:2100", "15b3:0026", 0x080100, "64", 16, "mlx5_core"),  # sub, class: guess
    "cx6-dx": _look("15b3:101d", "15b3:0016", 0x020000, "16", 16, "mlx5_core", vf=_MLX_VF),  # sub: guess
    "bf3": _look("15b3:a2dc", "15b3:0051", 0x020000, "32", 16, "mlx5_core", vf=_MLX_VF),  # sub: guess
    # Broadcom PEX switches. NCCL flattens c030 with subsystem 1000:0xxx over 1000:1xxx and
    # c010 with 1000:a0xx; an OEM subsystem vendor (Supermicro 15d9 here) is never flattened.
    "pex-gen5-top": _look("1000:c030", "1000:0144", 0x060400, "32", 16, "pcieport"),  # 0144: guess
    "pex-gen5-virt": _look("1000:c030", "1000:100b", 0x060400, "32", 16, "pcieport"),
    "pex-gen5-oem": _look("1000:c030", "15d9:1d25", 0x060400, "32", 16, "pcieport"),
    "pex-gen4": _look("1000:c010", "1000:a064", 0x060400, "16", 16, "pcieport"),  # a064: guess
    # CPU root complexes
    "intel-rp": _look("8086:352a", "0000:0000", 0x060400, "32", 16, "pcieport"),
    "intel-vtd": _look("8086:09a2", "8086:0000", 0x088000, "unknown", 0, None),  # RCiEP: no link
    "amd-rp": _look("1022:1483", "0000:0000", 0x060400, "16", 16, "pcieport"),
    "amd-rc": _look("1022:1480", "1022:1480", 0x060000, "unknown", 0, None, omit=_LINK_FILES),
    "amd-iommu": _look("1022:1481", "1022:1481", 0x080600, "unknown", 0, None, omit=_LINK_FILES),
    # Storage and the BMC. The ASPEED display sits behind the BMC's PCIe-to-PCI bridge and is
    # conventional PCI: the kernel shows no link files for it.
    "nvme": _look("144d:a80a", "144d:a812", 0x010802, "16", 4, "nvme"),
    "aspeed-bridge": _look("1a03:1150", "0000:0000", 0x060400, "5", 1, None),
    "bmc-vga": _look("1a03:2000", "1a03:2000", 0x030000, "unknown", 0, "ast", omit=_LINK_FILES),
}


# --- BARs (issue 11; the `resource` file) --------------------------------------------------------
# Real sizes per device id (facts and guesses listed in fixtures/README.md). Flags as the kernel
# prints them: 32-bit memory, 64-bit prefetchable memory, 64-bit non-prefetchable, I/O.
_M32, _P64, _N64, _IO = 0x40200, 0x14220C, 0x140204, 0x40101
_MiB, _GiB = 1 << 20, 1 << 30
_BARS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "h100": ((0, 16 * _MiB, _M32), (1, 128 * _GiB, _P64), (3, 32 * _MiB, _P64)),
    "h200": ((0, 16 * _MiB, _M32), (1, 128 * _GiB, _P64), (3, 32 * _MiB, _P64)),
    "b200": ((0, 64 * _MiB, _M32), (1, 256 * _GiB, _P64), (3, 32 * _MiB, _P64)),
    "b300": ((0, 64 * _MiB, _M32), (1, 256 * _GiB, _P64), (3, 32 * _MiB, _P64)),  # guess: B200's
    "a100-pcie": ((0, 16 * _MiB, _M32), (1, 64 * _GiB, _P64), (3, 32 * _MiB, _P64)),  # guess
    "l40s": ((0, 16 * _MiB, _M32), (1, 64 * _GiB, _P64), (3, 32 * _MiB, _P64)),  # guess
    "nvswitch-h100": ((0, 32 * _MiB, _M32),),  # guess
    "cx7-ib": ((0, 32 * _MiB, _P64),),
    "cx7-eth": ((0, 32 * _MiB, _P64),),
    "cx8-ib": ((0, 32 * _MiB, _P64),),  # guess: ConnectX-7's
    "cx6-dx": ((0, 32 * _MiB, _P64),),  # guess
    "bf3": ((0, 32 * _MiB, _P64),),  # guess
    "nvme": ((0, 16 * 1024, _N64),),
    "bmc-vga": ((0, 64 * _MiB, _M32), (1, 256 * 1024, _M32), (2, 128, _IO)),  # guess
}
_VF_BAR = (0, 1 * _MiB, _P64)  # an mlx5 VF's BAR0 (guess); its PF shows VF BAR0 x numvfs on line 7
PRESETS = {k: replace(v, bars=_BARS.get(k, ())) for k, v in PRESETS.items()}
# --- end BARs ------------------------------------------------------------------------------------


# -- the description ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NumaSpec:
    node: int
    cpus: tuple[int, ...]
    line: int


@dataclass(slots=True)
class DeviceSpec:
    """One line below a root complex: a bridge, or an endpoint with its functions and VFs."""

    kind: str
    bdf: Bdf
    look: Look
    numa: int
    line: int
    functions: int = 1
    vfs: int = 0  # per physical function
    iommu: int | None = None  # None: one group per function, numbered in scan order
    # RDMA device names (infiniband/<name>/ below each function, as mlx5_ib registers them),
    # one per function in function order; empty: none
    rdma: tuple[str, ...] = ()
    children: list["DeviceSpec"] = field(default_factory=list)

    def function_bdfs(self) -> list[Bdf]:
        return [self.bdf.with_function(self.bdf.function + f) for f in range(self.functions)]

    def vf_bdfs(self) -> list[tuple[Bdf, Bdf]]:
        """(VF, its PF) pairs. Like SR-IOV with offset/stride 1: routing ids right after the
        last physical function, PF by PF; past function 255 they spill onto the next buses."""
        if not self.vfs:
            return []
        rid0 = (self.bdf.bus << 8) | (self.bdf.slot << 3) | self.bdf.function
        out = []
        for pf_index, pf in enumerate(self.function_bdfs()):
            for i in range(self.vfs):
                rid = rid0 + self.functions + pf_index * self.vfs + i
                out.append((Bdf(self.bdf.domain, rid >> 8, (rid >> 3) & 0x1F, rid & 7), pf))
        return out


@dataclass(slots=True)
class RootSpec:
    domain: int
    bus: int
    numa: int
    line: int
    children: list[DeviceSpec] = field(default_factory=list)

    @property
    def dirname(self) -> str:
        return f"pci{self.domain:04x}:{self.bus:02x}"


@dataclass(slots=True)
class HostSpec:
    name: str
    numa: list[NumaSpec]
    roots: list[RootSpec]

    def devices(self) -> Iterator[DeviceSpec]:
        """Every device line, depth first in description order."""
        stack = [c for r in reversed(self.roots) for c in reversed(r.children)]
        while stack:
            d = stack.pop()
            yield d
            stack.extend(reversed(d.children))


# -- parsing ------------------------------------------------------------------------------------

_HEX = r"[0-9a-fA-F]"
_RC_RE = re.compile(rf"^({_HEX}{{4}}):({_HEX}{{2}})$")
_BDF_RE = re.compile(rf"^(?:({_HEX}{{4}}):)?({_HEX}{{2}}):({_HEX}{{2}})\.([0-7])$")
_IDS_RE = re.compile(rf"^({_HEX}{{4}}):({_HEX}{{4}})$")

_DEVICE_KEYS = {"preset", "ids", "sub", "class", "numa", "speed", "width", "cur-speed", "cur-width",
                "driver", "iommu", "omit",
                "fault", "override", "iommu-type"}  # the last three: pcitopo doctor (synth_doctor.py)
_EP_KEYS = _DEVICE_KEYS | {"functions", "vfs", "rdma"}
_RDMA_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def format_cpus(cpus: tuple[int, ...] | list[int]) -> str:
    """The kernel's %*pbl: sorted, ranges collapsed ('0-55,112-167')."""
    out: list[str] = []
    seq = sorted(cpus)
    i = 0
    while i < len(seq):
        j = i
        while j + 1 < len(seq) and seq[j + 1] == seq[j] + 1:
            j += 1
        out.append(str(seq[i]) if i == j else f"{seq[i]}-{seq[j]}")
        i = j + 1
    return ",".join(out)


class _Parser:
    def __init__(self, text: str, name: str):
        self.text = text
        self.name = name
        self.numa: list[NumaSpec] = []
        self.roots: list[RootSpec] = []
        self.lineno = 0
        # (indent, node, indent its children use or None) for the open lines, outermost first
        self.stack: list[tuple[int, RootSpec | DeviceSpec, int | None]] = []
        self.seen: dict[Bdf, tuple[int, str]] = {}  # every function and VF → (line, what)
        self.secondary: dict[int, int] = {}  # id(bridge) → its secondary bus (from its first child)

    def fail(self, reason: str, line: int | None = None) -> TopoError:
        return TopoError(self.name, line if line is not None else self.lineno, reason)

    def parse(self) -> HostSpec:
        for self.lineno, raw in enumerate(self.text.splitlines(), 1):
            body = raw.split("#", 1)[0].rstrip()
            if not body.strip():
                continue
            stripped = body.lstrip(" ")
            if stripped.startswith("\t") or "\t" in body[: len(body) - len(stripped)]:
                raise self.fail("indent with spaces, not tabs")
            self.line(len(body) - len(stripped), stripped.split())
        if not self.numa:
            raise self.fail("no 'numa' line: every host has at least node 0", 1)
        spec = HostSpec(self.name, self.numa, self.roots)
        _check(spec, self)
        return spec

    def line(self, indent: int, tokens: list[str]) -> None:
        head = tokens[0]
        if head not in KINDS and head != "numa":
            raise self.fail(f"unknown line kind {head!r} (want numa, {', '.join(KINDS)})")
        if len(tokens) < 2:
            raise self.fail(f"{head} needs an address")
        if head in ("numa", "rc"):
            if indent:
                raise self.fail(f"'{head}' lines are not indented")
            self.stack = []
            if head == "numa":
                self.numa_line(tokens)
            else:
                self.rc_line(tokens)
            return
        while self.stack and self.stack[-1][0] >= indent:
            self.stack.pop()
        if not self.stack:
            raise self.fail(f"{head} {tokens[1]} must be indented below an rc or a bridge")
        top_indent, parent, child_indent = self.stack[-1]
        if child_indent is not None and child_indent != indent:
            raise self.fail("indentation does not line up with the lines above")
        self.stack[-1] = (top_indent, parent, indent)
        dev = self.device_line(head, tokens, parent)
        parent.children.append(dev)
        self.stack.append((indent, dev, None))

    def keyvals(self, tokens: list[str], allowed: set[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for tok in tokens:
            key, eq, value = tok.partition("=")
            if not eq or not value:
                raise self.fail(f"expected key=value, got {tok!r}")
            if key not in allowed:
                raise self.fail(f"unknown key {key!r} (want one of {', '.join(sorted(allowed))})")
            if key in out:
                raise self.fail(f"{key}= given twice")
            out[key] = value
        return out

    def int_value(self, key: str, value: str, lo: int, hi: int, base: int = 10) -> int:
        try:
            n = int(value, base)
        except ValueError:
            raise self.fail(f"{key}={value!r} is not a number") from None
        if not lo <= n <= hi:
            raise self.fail(f"{key}={value} is out of range {lo}..{hi}")
        return n

    def numa_line(self, tokens: list[str]) -> None:
        node = self.int_value("numa", tokens[1], 0, 1023)
        kv = self.keyvals(tokens[2:], {"cpus"})
        if "cpus" not in kv:
            raise self.fail(f"numa {node} needs cpus=LIST")
        try:
            cpus = tuple(sorted(parse_cpuset(kv["cpus"])))  # the kernel's and libvirt's list syntax
        except PcitopoError as e:
            raise self.fail(e.reason) from None
        if not cpus:
            raise self.fail(f"numa {node}: cpus={kv['cpus']} names no CPU")
        for other in self.numa:
            if other.node == node:
                raise self.fail(f"numa {node} is already declared on line {other.line}")
            if set(other.cpus) & set(cpus):
                raise self.fail(f"numa {node} shares CPUs with numa {other.node} (line {other.line})")
        self.numa.append(NumaSpec(node, cpus, self.lineno))

    def rc_line(self, tokens: list[str]) -> None:
        m = _RC_RE.match(tokens[1])
        if not m:
            raise self.fail(f"rc address {tokens[1]!r} is not DDDD:BB")
        kv = self.keyvals(tokens[2:], {"numa"})
        if "numa" not in kv:
            raise self.fail("rc needs numa=N (numa=-1 if the firmware does not say)")
        domain, bus = int(m.group(1), 16), int(m.group(2), 16)
        for other in self.roots:
            if (other.domain, other.bus) == (domain, bus):
                raise self.fail(f"rc {tokens[1]} is already declared on line {other.line}")
        numa = self.int_value("numa", kv["numa"], -1, 1023)
        root = RootSpec(domain, bus, numa, self.lineno)
        self.roots.append(root)
        self.stack = [(0, root, None)]

    def device_line(self, kind: str, tokens: list[str], parent: RootSpec | DeviceSpec) -> DeviceSpec:
        where = f"{kind} {tokens[1]}"
        parent_kind = "rc" if isinstance(parent, RootSpec) else parent.kind
        if parent_kind not in PARENTS[kind]:
            raise self.fail(f"{where} cannot sit under {parent_kind} (only under {' or '.join(PARENTS[kind])})")
        domain = parent.domain if isinstance(parent, RootSpec) else parent.bdf.domain
        m = _BDF_RE.match(tokens[1])
        if not m:
            raise self.fail(f"{tokens[1]!r} is not a PCI address (BB:DD.F or DDDD:BB:DD.F)")
        if m.group(1) is not None and int(m.group(1), 16) != domain:
            raise self.fail(f"{where} is in another PCI domain than its rc")
        bdf = Bdf(domain, int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))
        if bdf.slot > 31:
            raise self.fail(f"{where}: device number above 1f")
        self.check_bus(where, bdf, parent)

        kv = self.keyvals(tokens[2:], _EP_KEYS if kind == "ep" else _DEVICE_KEYS)
        look = self.resolve_look(where, kind, kv, parent)
        numa = parent.numa
        if "numa" in kv:
            numa = self.int_value("numa", kv["numa"], -1, 1023)
        dev = DeviceSpec(kind, bdf, look, numa, self.lineno)
        if "functions" in kv:
            dev.functions = self.int_value("functions", kv["functions"], 1, 8)
            if bdf.function != 0:
                raise self.fail(f"{where}: functions= counts from function 0; write {bdf.with_function(0)}")
        if "vfs" in kv:
            dev.vfs = self.int_value("vfs", kv["vfs"], 0, 65535)
            if dev.vfs and look.vf_device is None:
                raise self.fail(f"{where}: this device has no SR-IOV VF id (vfs= needs a NIC preset)")
        if "iommu" in kv:
            dev.iommu = self.int_value("iommu", kv["iommu"], 0, 1_000_000)
        if "rdma" in kv:
            dev.rdma = tuple(kv["rdma"].split(","))
            if len(dev.rdma) != dev.functions or not all(_RDMA_RE.match(n) for n in dev.rdma):
                raise self.fail(f"{where}: rdma= takes one RDMA device name per function ({dev.functions}), comma-separated")
        for b in dev.function_bdfs():
            self.claim(b, where, "")
        for vf, pf in dev.vf_bdfs():
            if vf.bus > 0xFF:
                raise self.fail(f"{where}: {dev.vfs} VFs run past bus ff")
            self.claim(vf, where, f" (a VF of {pf})")
        return dev

    def claim(self, bdf: Bdf, where: str, what: str) -> None:
        if bdf in self.seen:
            line, other = self.seen[bdf]
            raise self.fail(f"{where}: {bdf}{what} is already used on line {line}{other}")
        self.seen[bdf] = (self.lineno, what)

    def check_bus(self, where: str, bdf: Bdf, parent: RootSpec | DeviceSpec) -> None:
        if isinstance(parent, RootSpec):
            if bdf.bus != parent.bus:
                raise self.fail(f"{where} must be on its root bus {parent.bus:02x}")
            return
        if bdf.bus <= parent.bdf.bus:
            raise self.fail(f"{where} must be on a bus above its bridge's bus {parent.bdf.bus:02x}")
        sec = self.secondary.setdefault(id(parent), bdf.bus)
        if bdf.bus != sec:
            raise self.fail(f"{where}: all children of {parent.kind} {parent.bdf} share one bus ({sec:02x})")
        if parent.kind in ("rp", "ds") and bdf.slot != 0:
            raise self.fail(f"{where}: below a port, the one device on the link is device 00")

    def resolve_look(self, where: str, kind: str, kv: dict[str, str], parent: RootSpec | DeviceSpec) -> Look:
        if "preset" in kv:
            if kv["preset"] not in PRESETS:
                raise self.fail(f"{where}: unknown preset {kv['preset']!r} (known: {', '.join(sorted(PRESETS))})")
            look = PRESETS[kv["preset"]]
        elif kind == "ds" and isinstance(parent, DeviceSpec):
            look = parent.look  # a downstream port looks like the switch it belongs to
        elif "ids" in kv and "class" in kv:
            look = Look(0, 0, 0)
        else:
            raise self.fail(f"{where} needs preset= (or ids= and class=)")
        if "ids" in kv:
            v, d = self.ids(kv["ids"])
            look = replace(look, vendor=v, device=d)
        if "sub" in kv:
            sv, sd = self.ids(kv["sub"])
            look = replace(look, sub_vendor=sv, sub_device=sd)
        if "class" in kv:
            if not re.match(rf"^0x{_HEX}{{6}}$", kv["class"]):
                raise self.fail(f"class={kv['class']!r} is not 0xCCCCCC")
            look = replace(look, class_code=int(kv["class"], 16))
        for key, attr in (("speed", "max_speed"), ("cur-speed", "cur_speed")):
            if key in kv:
                if kv[key].lower() not in _SPEEDS:
                    raise self.fail(f"{key}={kv[key]} is not one of {', '.join(_SPEEDS)}")
                look = replace(look, **{attr: _SPEEDS[kv[key].lower()]})
        for key, attr in (("width", "max_width"), ("cur-width", "cur_width")):
            if key in kv:
                w = self.int_value(key, kv[key], 0, 32)
                if w not in _WIDTHS:
                    raise self.fail(f"{key}={w} is not a PCIe link width")
                look = replace(look, **{attr: w})
        if "driver" in kv:
            look = replace(look, driver=None if kv["driver"] == "none" else kv["driver"])
        if "omit" in kv:
            names: set[str] = set()
            for n in kv["omit"].split(","):
                if n == "link":
                    names.update(_LINK_FILES)
                elif n in _OMITTABLE:
                    names.add(n)
                else:
                    raise self.fail(f"omit={n!r}: only optional files can be left out "
                                    f"({', '.join(sorted(_OMITTABLE))}, or link)")
            look = replace(look, omit=look.omit | names)
        look = self.doctor_keys(kv, look)
        is_bridge_kind = kind in BRIDGE_KINDS
        if look.is_bridge != is_bridge_kind:
            want = "a bridge class (0x0604xx)" if is_bridge_kind else "a non-bridge class"
            raise self.fail(f"{where} needs {want}, has class 0x{look.class_code:06x}")
        return look

    def doctor_keys(self, kv: dict[str, str], look: Look) -> Look:
        """pcitopo doctor (issue 13): fault=, override=, iommu-type= (see synth_doctor.py)."""
        if "fault" in kv:
            names = kv["fault"].split(",")
            problem = synth_doctor.check_faults(names)
            if problem:
                raise self.fail(problem)
            look = replace(look, faults=look.faults | frozenset(names))
            if "bar-unassigned" in names and not look.bars:
                raise self.fail("fault=bar-unassigned: this function has no BARs (use a preset that has them)")
        if "override" in kv:
            look = replace(look, override=kv["override"])
        if "iommu-type" in kv:
            if kv["iommu-type"] not in synth_doctor.GROUP_TYPES:
                raise self.fail(f"iommu-type={kv['iommu-type']!r} is not one of {', '.join(synth_doctor.GROUP_TYPES)}")
            look = replace(look, iommu_type=kv["iommu-type"])
        return look

    def ids(self, text: str) -> tuple[int, int]:
        m = _IDS_RE.match(text)
        if not m:
            raise self.fail(f"{text!r} is not VVVV:DDDD")
        return int(m.group(1), 16), int(m.group(2), 16)


def _check(spec: HostSpec, p: _Parser) -> None:
    """Whole-description checks: NUMA nodes exist, and bus ranges nest like a real bus scan
    (every bridge's subtree, VF buses included, is a range of its own that no sibling shares)."""
    nodes = {n.node for n in spec.numa}
    for r in spec.roots:
        if r.numa != -1 and r.numa not in nodes:
            raise p.fail(f"rc numa={r.numa}: no 'numa {r.numa}' line", r.line)
    for d in spec.devices():
        if d.numa != -1 and d.numa not in nodes:
            raise p.fail(f"numa={d.numa}: no 'numa {d.numa}' line", d.line)

    def spans(children: list[DeviceSpec]) -> list[tuple[int, int, DeviceSpec]]:
        """The bus range each child occupies below the bus it sits on: a bridge's subtree, or
        the extra buses an endpoint's VFs spill onto."""
        out = []
        for c in children:
            vf_hi = max((vf.bus for vf, _ in c.vf_bdfs()), default=c.bdf.bus)
            if vf_hi > c.bdf.bus:
                out.append((c.bdf.bus + 1, vf_hi, c))
            e = extent(c)
            if e is not None:
                out.append((e[0], e[1], c))
        _disjoint(out, p)
        return out

    def extent(d: DeviceSpec) -> tuple[int, int] | None:
        """Buses below ``d`` (its secondary .. subordinate), None for a leaf or an empty port."""
        if not d.children:
            return None
        sec = d.children[0].bdf.bus
        hi = sec
        for lo, top, c in spans(d.children):
            if lo <= sec:
                raise p.fail(f"{c.kind} {c.bdf}: the buses below it must be above {sec:02x}", c.line)
            hi = max(hi, top)
        return sec, hi

    by_domain: dict[int, list[tuple[int, int, RootSpec | DeviceSpec]]] = {}
    for r in spec.roots:
        hi = max([r.bus] + [top for _, top, _ in spans(r.children)])
        by_domain.setdefault(r.domain, []).append((r.bus, hi, r))
    for ranges in by_domain.values():
        _disjoint(ranges, p)


def _disjoint(spans: Sequence[tuple[int, int, RootSpec | DeviceSpec]], p: _Parser) -> None:
    ordered = sorted(spans, key=lambda s: (s[0], s[1]))
    for (alo, ahi, a), (blo, bhi, b) in zip(ordered, ordered[1:]):
        if blo <= ahi:
            raise p.fail(f"{_label(b)} uses buses {blo:02x}-{bhi:02x}, overlapping {_label(a)} "
                         f"(line {a.line}, buses {alo:02x}-{ahi:02x})", b.line)


def _label(x: RootSpec | DeviceSpec) -> str:
    return f"rc {x.domain:04x}:{x.bus:02x}" if isinstance(x, RootSpec) else f"{x.kind} {x.bdf}"


def parse_topo(text: str, name: str) -> HostSpec:
    """Parse a host description. Raises :class:`TopoError` (a SysfsError) naming the line."""
    return _Parser(text, name).parse()


# -- building the tree --------------------------------------------------------------------------

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


# --- BAR placement (issue 11) ---------------------------------------------------------------------
_ENDPOINT_LINES, _BRIDGE_LINES = 13, 17  # resource lines the kernel prints (6 BARs, ROM, 6 IOV, 4 windows)
_IOV_LINE = 7
_WINDOW_LINES = {"io": (13, 0x101), "m32": (14, 0x200), "p64": (15, 0x102201)}
_WINDOW_ALIGN = {"io": 0x1000, "m32": _MiB, "p64": _MiB}


def _bar_kind(flags: int) -> str:
    if flags & 0x100:
        return "io"
    return "p64" if flags & 0x2000 and flags & 0x100000 else "m32"


def _align_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _unassigned_bar(dev: DeviceSpec) -> int | None:
    """The BAR the ``bar-unassigned`` fault (testkit/synth_doctor.py) leaves unplaced: the
    function's largest; None without the fault."""
    if "bar-unassigned" not in dev.look.faults or not dev.look.bars:
        return None  # (the parser refuses the fault on a function without BARs)
    return max(dev.look.bars, key=lambda b: b[1])[0]


class _BarPlacer:
    """Places every BAR the way a BIOS bump allocator would (per kind, in bus-scan order, each
    aligned to its size) and gives bridges windows spanning their subtree: a plausible `resource`
    file for every function, nothing more (the sizes are the facts; addresses are made up)."""

    def __init__(self) -> None:
        self.next = {"io": 0x1000, "m32": 0x80000000, "p64": 0x200000000000}
        self.files: dict[Bdf, str] = {}

    def take(self, kind: str, size: int) -> int:
        base = _align_up(self.next[kind], size)
        self.next[kind] = base + size
        return base

    def device(self, dev: DeviceSpec) -> None:
        lines_n = _BRIDGE_LINES if dev.look.is_bridge else _ENDPOINT_LINES
        for pf_index, bdf in enumerate(dev.function_bdfs()):
            lines = [Bar(i, 0, 0, 0) for i in range(lines_n)]
            unassigned = _unassigned_bar(dev)
            for i, size, flags in dev.look.bars:
                # a BAR the firmware could not place keeps its size at start 0 and takes no space
                base = 0 if i == unassigned else self.take(_bar_kind(flags), size)
                lines[i] = Bar(i, base, base + size - 1, flags)
            if dev.vfs:
                i, size, flags = _VF_BAR
                base = self.take(_bar_kind(flags), size * dev.vfs)
                lines[_IOV_LINE] = Bar(_IOV_LINE, base, base + size * dev.vfs - 1, flags)
                for k, (vf, _pf) in enumerate(dev.vf_bdfs()[pf_index * dev.vfs:(pf_index + 1) * dev.vfs]):
                    vf_lines = [Bar(j, 0, 0, 0) for j in range(_ENDPOINT_LINES)]
                    vf_lines[i] = Bar(i, base + k * size, base + (k + 1) * size - 1, flags)
                    self.files[vf] = format_resource(vf_lines)
            if dev.look.is_bridge and bdf == dev.bdf:
                self.windows(dev, lines)
            self.files[bdf] = format_resource(lines)

    def windows(self, dev: DeviceSpec, lines: list[Bar]) -> None:
        for kind, a in _WINDOW_ALIGN.items():
            self.next[kind] = _align_up(self.next[kind], a)
        lo = dict(self.next)
        for child in sorted(dev.children, key=lambda c: c.bdf):
            self.device(child)
        for kind, (i, flags) in _WINDOW_LINES.items():
            self.next[kind] = _align_up(self.next[kind], _WINDOW_ALIGN[kind])
            if self.next[kind] > lo[kind]:
                lines[i] = Bar(i, lo[kind], self.next[kind] - 1, flags)


def place_bars(spec: HostSpec) -> dict[Bdf, str]:
    """The `resource` file text of every function (and VF) of a description."""
    placer = _BarPlacer()
    for root in sorted(spec.roots, key=lambda r: (r.domain, r.bus)):
        for child in sorted(root.children, key=lambda c: c.bdf):
            placer.device(child)
    return placer.files
# --- end BAR placement ----------------------------------------------------------------------------


class _Builder:
    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.tree = MemoryTree(spec.name)
        self.cpulists = {n.node: format_cpus(n.cpus) for n in spec.numa}
        # A function without a node shows every online CPU (pci-sysfs local_cpus_show).
        self.cpulists[-1] = format_cpus([c for n in spec.numa for c in n.cpus])
        self._taken = {d.iommu for d in spec.devices() if d.iommu is not None}
        self._next_group = 0
        self.resources = place_bars(spec)  # issue 11: one `resource` file per function
        self.doctor = synth_doctor.DoctorFiles()  # pcitopo doctor's files (issue 13)

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
        for attr in RESOURCE_ATTRS:  # issue 11: `resource`, written for every function
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


__all__ = [
    "DeviceSpec", "HostSpec", "Look", "NumaSpec", "PRESETS", "RootSpec", "TopoError",
    "build_tree", "format_cpus", "host_from_topo", "load_topo_file", "parse_topo",
]
