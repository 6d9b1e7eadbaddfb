"""A parsed host description: NUMA nodes, root complexes and the device lines below them, which
line kinds may sit under which, and the error naming a malformed line."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from pcitopo.errors import SysfsError
from pcitopo.model.tree import Bdf
from pcitopo.synth.looks import Look


class TopoError(SysfsError):
    """A host description is malformed; the message names the file and line."""

    def __init__(self, name: str, line: int, reason: str):
        self.line = line
        super().__init__(f"{name} line {line}: {reason}")


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
    children: list[DeviceSpec] = field(default_factory=list)

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
    # the CPU's (physical, virtual) address bits: the ``cpu`` line, recorded as a capture records
    # the node's /proc/cpuinfo ``address sizes`` (the MMIO check's host width); None: not given
    address_bits: tuple[int, int] | None = None

    def devices(self) -> Iterator[DeviceSpec]:
        """Every device line, depth first in description order."""
        stack = [c for r in reversed(self.roots) for c in reversed(r.children)]
        while stack:
            d = stack.pop()
            yield d
            stack.extend(reversed(d.children))


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
