"""The PCI tree model: functions, their place in the tree, roles, NUMA nodes.

One :class:`Topology` type serves the host (read lazily from sysfs) and the guest (built from a
rewritten domain), so one classifier judges both. A topology is immutable from the outside; it
caches what it has read, and it reads only what it is asked about plus that thing's ancestry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Iterable, Mapping, NamedTuple, Protocol

from pcitopo import SLOTS
from pcitopo.errors import MalformedBdfError, SysfsError, UnknownDeviceError
from pcitopo.model.address import MAX_SLOT
from pcitopo.model.bars import Bar
from pcitopo.model.cpuinfo import HostWidth, local_width

# The one BDF pattern: [DDDD:]BB:DD.F, hex, as lspci and sysfs print it (shorter fields accepted).
BDF_RE = re.compile(r"^(?:([0-9a-fA-F]{1,4}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


class Bdf(NamedTuple):
    """A PCI address: domain, bus, device (slot), function."""

    domain: int
    bus: int
    slot: int
    function: int

    @classmethod
    def parse(cls, text: str) -> Bdf:
        """``[DDDD:]BB:DD.F``; anything else is a :class:`MalformedBdfError`."""
        m = BDF_RE.match(text.strip())
        if not m:
            raise MalformedBdfError(f"malformed BDF: not a PCI address: {text!r} (want DDDD:BB:DD.F)")
        dom, bus, slot, fn = m.groups()
        b = cls(int(dom or "0", 16), int(bus, 16), int(slot, 16), int(fn))
        if b.slot > MAX_SLOT:
            raise MalformedBdfError(f"malformed BDF: not a PCI address: {text!r} (device number above 0x{MAX_SLOT:x})")
        return b

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    @property
    def device_key(self) -> tuple[int, int, int]:
        """What the functions of one multi-function device share."""
        return (self.domain, self.bus, self.slot)

    def with_function(self, function: int) -> Bdf:
        return self._replace(function=function)


def is_bdf(component: str) -> bool:
    """NCCL's checkBDFFormat: 'DDDD:BB:DD.F', exact shape."""
    return (
        len(component) == 12
        and component[4] == ":"
        and component[7] == ":"
        and component[10] == "."
        and BDF_RE.match(component) is not None
    )


@lru_cache(maxsize=65536)
def component_bdf(component: str) -> Bdf | None:
    """The BDF a sysfs path component names, or None (root complexes, other wrappers). Cached:
    every classification walks the same few ancestors."""
    return Bdf.parse(component) if is_bdf(component) else None


class Link(NamedTuple):
    """PCIe link attributes as sysfs prints them (strings, since formats vary by kernel)."""

    max_speed: str | None = None
    max_width: int | None = None
    current_speed: str | None = None
    current_width: int | None = None


class Role(str, Enum):
    ROOT_PORT = "root-port"
    UPSTREAM_PORT = "upstream-port"
    DOWNSTREAM_PORT = "downstream-port"
    GPU = "gpu"
    NIC = "nic"
    NVSWITCH = "nvswitch"
    NVME = "nvme"
    DISPLAY = "display"
    HOST_BRIDGE = "host-bridge"
    OTHER = "other"


# Display-class devices from these vendors are BMC consoles, not compute GPUs.
BMC_DISPLAY_VENDORS = frozenset({0x1A03, 0x102B})  # ASPEED, Matrox
NVIDIA = 0x10DE
MELLANOX = 0x15B3  # ConnectX and BlueField: mlx5 devices


@dataclass(frozen=True, **SLOTS)
class PciFunction:
    """One PCI function and its place in the tree.

    ``path`` is the realpath below ``devices/`` from the root complex down to this function,
    e.g. ``("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0")``.
    """

    bdf: Bdf
    path: tuple[str, ...]
    vendor: int
    device: int
    class_code: int
    subsystem_vendor: int | None = None
    subsystem_device: int | None = None
    numa_node: int = -1
    link: Link = Link()
    driver: str | None = None
    iommu_group: int | None = None
    physfn: Bdf | None = None
    local_cpulist: str | None = None
    # BARs from the optional ``resource`` file (src/pcitopo/model/bars.py); None when it is absent.
    bars: tuple[Bar, ...] | None = None

    @property
    def root_complex(self) -> str:
        return self.path[0]

    @property
    def parent_bdf(self) -> Bdf | None:
        """The bridge directly above, or None when this function sits on a root bus."""
        if len(self.path) >= 2:
            return component_bdf(self.path[-2])
        return None

    @property
    def is_bridge(self) -> bool:
        return (self.class_code >> 8) == 0x0604

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    @property
    def ids(self) -> str:
        return f"{self.vendor:04x}:{self.device:04x}"

    @property
    def subsystem_ids(self) -> str | None:
        if self.subsystem_vendor is None or self.subsystem_device is None:
            return None
        return f"{self.subsystem_vendor:04x}:{self.subsystem_device:04x}"

    def endpoint_role(self) -> Role:
        """Role from the class code alone (bridges get theirs from their position)."""
        base, sub = self.class_code >> 16, (self.class_code >> 8) & 0xFF
        if base == 0x03:
            return Role.DISPLAY if self.vendor in BMC_DISPLAY_VENDORS else Role.GPU
        if base == 0x02:
            return Role.NIC
        if base == 0x06 and sub == 0x80 and self.vendor == NVIDIA:
            return Role.NVSWITCH
        if base == 0x01 and sub == 0x08:
            return Role.NVME
        if base == 0x06 and sub == 0x00:
            return Role.HOST_BRIDGE
        return Role.OTHER


@dataclass(frozen=True, **SLOTS)
class NumaNode:
    id: int
    cpulist: str | None


class FunctionLoader(Protocol):
    """Where a topology gets its facts from (sysfs reader, or a guest layout)."""

    name: str

    def load(self, bdf: Bdf) -> PciFunction | None: ...

    def all_bdfs(self) -> Iterable[Bdf]: ...

    def numa_nodes(self) -> Mapping[int, NumaNode]: ...


class Topology:
    """A PCI tree, read lazily through a loader and cached."""

    @property
    def label(self) -> str:
        """The name outputs carry (src/pcitopo/host/sources.py ``path_label``), the same however the
        path was typed; ``name`` (as typed) is for error messages."""
        return getattr(self._loader, "label", self.name)

    def __init__(self, loader: FunctionLoader):
        self._loader = loader
        self.name = loader.name
        self._functions: dict[Bdf, PciFunction | None] = {}
        self._all: tuple[Bdf, ...] | None = None
        self._numa: Mapping[int, NumaNode] | None = None
        self._roles: dict[Bdf, Role] = {}
        self._children: dict[Bdf | str, list[Bdf]] | None = None
        # the model's own facts beyond functions (what the layers above derive from it they
        # keep themselves: src/pcitopo/model/keep.py)
        self._extra: dict[tuple[str, Bdf], object] = {}
        self._width: HostWidth | None = None

    def extra(self, what: str, bdf: Bdf):
        """A fact only some loaders know (the sysfs reader: ``vpd``, ``class_dirs``; see
        src/pcitopo/model/nvswitch_mgmt.py), read once; None where the loader has no such reader."""
        read = getattr(self._loader, f"read_{what}", None)
        if read is None:
            return None
        try:
            return self._extra[(what, bdf)]
        except KeyError:
            value = self._extra[(what, bdf)] = read(bdf)
            return value

    def host_width(self) -> HostWidth:
        """The physical-address width of this host's CPU and where it came from
        (src/pcitopo/model/cpuinfo.py ``HostWidth``): the loader's (a capture records it), else this
        machine's /proc/cpuinfo. Read once per topology (the hook keeps one per process)."""
        if self._width is None:
            read = getattr(self._loader, "host_width", None)
            self._width = read() if read is not None else local_width()
        return self._width

    @property
    def loader(self) -> FunctionLoader:
        """Where this topology reads from (pcitopo doctor reads more files through its source)."""
        return self._loader

    @property
    def warnings(self) -> list[str]:
        """What the loader skipped or could not read (optional attributes only)."""
        return list(getattr(self._loader, "warnings", ()))

    # -- lookups ----------------------------------------------------------------------------
    def find(self, bdf: Bdf | str) -> PciFunction | None:
        if isinstance(bdf, str):
            bdf = Bdf.parse(bdf)
        if bdf not in self._functions:
            self._functions[bdf] = self._loader.load(bdf)
        return self._functions[bdf]

    def function(self, bdf: Bdf | str) -> PciFunction:
        f = self.find(bdf)
        if f is None:
            raise UnknownDeviceError(f"{self.name}: no PCI function {bdf}")
        return f

    def bdfs(self) -> tuple[Bdf, ...]:
        """Every function on the host (this one reads the whole PCI device list)."""
        if self._all is None:
            self._all = tuple(sorted(set(self._loader.all_bdfs())))
        return self._all

    def functions(self) -> list[PciFunction]:
        return [self.function(b) for b in self.bdfs()]

    def numa_nodes(self) -> Mapping[int, NumaNode]:
        if self._numa is None:
            self._numa = self._loader.numa_nodes()
        return self._numa

    # -- the tree ---------------------------------------------------------------------------
    def parent(self, f: PciFunction) -> PciFunction | None:
        p = f.parent_bdf
        if p is None:
            return None
        parent = self.find(p)
        if parent is None:
            raise SysfsError(f"{self.name}: {f.bdf} sits below {p}, which has no readable attributes")
        return parent

    def ancestry(self, f: PciFunction) -> list[PciFunction]:
        """The bridges above ``f``, top (root port) first."""
        chain: list[PciFunction] = []
        p = self.parent(f)
        while p is not None:
            chain.append(p)
            p = self.parent(p)
        chain.reverse()
        return chain

    def role(self, f: PciFunction | Bdf | str) -> Role:
        """Bridges are told apart by position (an unprivileged reader cannot see PCIe
        capabilities): on a root bus → root port; below a root or downstream port → upstream
        port; below an upstream port → downstream port."""
        if not isinstance(f, PciFunction):
            f = self.function(f)
        cached = self._roles.get(f.bdf)
        if cached is not None:
            return cached
        if not f.is_bridge:
            role = f.endpoint_role()
        else:
            parent = self.parent(f)
            if parent is None:
                role = Role.ROOT_PORT
            elif self.role(parent) == Role.UPSTREAM_PORT:
                role = Role.DOWNSTREAM_PORT
            else:
                role = Role.UPSTREAM_PORT
        self._roles[f.bdf] = role
        return role

    def switch_of(self, f: PciFunction) -> PciFunction | None:
        """The upstream port of the switch a port belongs to (None for root ports/endpoints)."""
        role = self.role(f)
        if role == Role.UPSTREAM_PORT:
            return f
        if role == Role.DOWNSTREAM_PORT:
            return self.parent(f)
        return None

    def numa_of(self, f: PciFunction) -> int:
        """A function's NUMA node; where the function itself says -1, the first known value on
        its way up (firmware often fills it in only for some functions)."""
        if f.numa_node >= 0:
            return f.numa_node
        for a in reversed(self.ancestry(f)):
            if a.numa_node >= 0:
                return a.numa_node
        return -1

    def children(self, bdf: Bdf | str) -> list[Bdf]:
        """Functions directly below a bridge BDF or a root complex name (reads the whole host)."""
        if self._children is None:
            kids: dict[Bdf | str, list[Bdf]] = {}
            for b in self.bdfs():
                f = self.function(b)
                key: Bdf | str = f.parent_bdf if f.parent_bdf is not None else f.root_complex
                kids.setdefault(key, []).append(b)
            self._children = kids
        if isinstance(bdf, str) and is_bdf(bdf):
            bdf = Bdf.parse(bdf)
        return list(self._children.get(bdf, []))

    def root_complexes(self) -> list[str]:
        return sorted({self.function(b).root_complex for b in self.bdfs()}, key=root_complex_sort_key)


def root_complex_sort_key(name: str) -> tuple[int, int, str]:
    m = re.match(r"^pci([0-9a-f]{4}):([0-9a-f]{2})$", name)
    if m:
        return (int(m.group(1), 16), int(m.group(2), 16), name)
    return (0x10000, 0, name)
