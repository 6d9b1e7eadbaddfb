"""The one path classifier: what NCCL and what ``nvidia-smi topo -m`` say about two devices.

Both the host and the guest are judged by these functions, on the same :class:`Topology` type.

NCCL (src/graph, xml.cc): walking up from a device, the port directly above is skipped and the
component above that becomes a node only if it is a BDF, so only switch upstream ports become
PCI nodes; the first non-BDF component is a CPU node whose NUMA id is the ``numa_node`` of the
top-most PCI node, and CPU nodes with the same NUMA id are one node. Broadcom PEX parts that
present two levels are flattened into one switch by a separate pass
(:func:`nccl_switch_rep`), exactly as NCCL's ``ncclTopoFlattenBcmSwitches`` does.

NVML: PIX at most one switch on the path, PXB several switches without a host bridge, PHB through
a host bridge, NODE between host bridges of one NUMA node, SYS across NUMA nodes. NVML does not
flatten Broadcom complexes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable

from pcitopo import SLOTS
from pcitopo.model.keep import PerModel
from pcitopo.model.tree import NVIDIA, Bdf, PciFunction, Role, Topology, component_bdf, is_bdf


class Nccl(str, Enum):
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    SYS = "SYS"


class Nvml(str, Enum):
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"


@dataclass(frozen=True, **SLOTS)
class PairClass:
    nccl: Nccl
    nvml: Nvml


_NCCL_ORDER = {c: i for i, c in enumerate(Nccl)}
_NVML_ORDER = {c: i for i, c in enumerate(Nvml)}


def closeness(cls: PairClass) -> tuple[int, int]:
    """How close a pair is, for picking a GPU's NIC (smaller is closer): NCCL's class decides,
    as it decides GPUDirect RDMA; nvidia-smi's breaks ties (inside a flattened Broadcom complex
    a GPU is PIX to both NICs for NCCL, PIX to its own only for nvidia-smi)."""
    return _NCCL_ORDER[cls.nccl], _NVML_ORDER[cls.nvml]


# -- Broadcom flattening (a named pass, not a special case inside the path rule) -------------

def bcm_gen(f: PciFunction, level: int) -> int:
    """NCCL's getBcmGen: the Broadcom PEX generation if ``f`` presents as that level of a
    two-level complex (level 0 = top, level 1 = virtual ports below), else 0."""
    if f.vendor != 0x1000 or f.subsystem_vendor != 0x1000 or f.subsystem_device is None:
        return 0
    top_nibble = f.subsystem_device & 0xF000
    if f.device == 0xC010 and top_nibble == 0xA000:
        return 4
    if f.device == 0xC030 and top_nibble == level * 0x1000:
        return 5
    return 0


def nccl_switch_chain(topo: Topology, f: PciFunction) -> tuple[list[PciFunction], int]:
    """NCCL's parent walk from a device: the PCI (switch) nodes above it, nearest first, and the
    NUMA id of the CPU node it ends at. No flattening here."""
    switches: list[PciFunction] = []
    node = f
    while True:
        path = node.path
        # Rewind two '/': the port above is skipped, the component above it is the parent
        # only if it looks like a BDF; otherwise this node hangs off a CPU.
        if len(path) >= 3 and is_bdf(path[-2]) and is_bdf(path[-3]):
            parent = topo.function(component_bdf(path[-3]))
            switches.append(parent)
            node = parent
            continue
        return switches, node.numa_node


def nccl_switch_rep(switches_top_down: list[PciFunction]) -> list[Bdf]:
    """The flattening pass: each switch node's representative after NCCL's
    ``ncclTopoFlattenBcmSwitches``. A level-0 Broadcom switch absorbs its *direct* level-1
    sub-switches of the same generation, then marks itself (subsystem |= 0xffff) so it never
    absorbs again: the absorbed switches' own sub-switches stay separate nodes, and a switch
    that was absorbed absorbs nothing. Three Broadcom tiers therefore stay PXB, as on bare metal.
    ``switches_top_down`` is one device's chain of NCCL switch nodes, parent before child."""
    reps: list[Bdf] = []
    parent: PciFunction | None = None
    parent_absorbed = False
    for sw in switches_top_down:
        gen = bcm_gen(parent, 0) if parent is not None and not parent_absorbed else 0
        absorbed = bool(gen) and bcm_gen(sw, 1) == gen
        reps.append(parent.bdf if absorbed and parent is not None else sw.bdf)
        parent, parent_absorbed = sw, absorbed
    return reps


def nccl_device(topo: Topology, f: PciFunction) -> PciFunction:
    """The NCCL node a device is: NICs merge their ports (function 0) and their VFs (the PF)."""
    if topo.role(f) != Role.NIC:
        return f
    if f.physfn is not None:
        pf = topo.find(f.physfn)
        if pf is not None:
            f = pf
    if f.bdf.function != 0:
        f0 = topo.find(f.bdf.with_function(0))
        if f0 is not None:
            f = f0
    return f


@dataclass(frozen=True, **SLOTS)
class NcclPath:
    """A device's place in NCCL's tree: its node, switch nodes (after flattening, nearest
    first, consecutive duplicates removed) and its CPU node's NUMA id."""

    device: Bdf
    switches: tuple[Bdf, ...]
    cpu: int


# A device's NCCL path and a pair's class are facts of the tree: kept per topology (the
# sidecar's host model answers every call's host pairs from here; a guest tree's go with it).
_NCCL_PATHS: PerModel[dict[Bdf, NcclPath]] = PerModel(lambda topo: {})
_CLASSES: PerModel[dict[tuple[Bdf, Bdf], PairClass]] = PerModel(lambda topo: {})


def nccl_path(topo: Topology, f: PciFunction) -> NcclPath:
    paths = _NCCL_PATHS(topo)
    got = paths.get(f.bdf)
    if got is None:
        got = paths[f.bdf] = _nccl_path(topo, f)
    return got


def _nccl_path(topo: Topology, f: PciFunction) -> NcclPath:
    dev = nccl_device(topo, f)
    switches, numa = nccl_switch_chain(topo, dev)
    reps_top_down = nccl_switch_rep(list(reversed(switches)))
    dedup: list[Bdf] = []
    for r in reps_top_down:
        if not dedup or dedup[-1] != r:
            dedup.append(r)
    return NcclPath(dev.bdf, tuple(reversed(dedup)), numa)


def nccl_class(a: NcclPath, b: NcclPath) -> Nccl:
    if a.device == b.device:
        return Nccl.PIX
    if a.cpu != b.cpu:
        return Nccl.SYS
    up_b = {sw: i for i, sw in enumerate(b.switches)}
    for hops_a, sw in enumerate(a.switches):
        if sw in up_b:
            # device→switch hops are PIX; any switch→switch hop makes the path PXB.
            return Nccl.PIX if hops_a == 0 and up_b[sw] == 0 else Nccl.PXB
    return Nccl.PHB


# -- NVML -------------------------------------------------------------------------------------

def nvml_class(topo: Topology, fa: PciFunction, fb: PciFunction) -> Nvml:
    if fa.bdf.device_key == fb.bdf.device_key:
        return Nvml.PIX
    if fa.root_complex != fb.root_complex:
        return Nvml.NODE if topo.numa_of(fa) == topo.numa_of(fb) else Nvml.SYS
    pa, pb = fa.path, fb.path
    k = 0
    while k < min(len(pa), len(pb)) and pa[k] == pb[k]:
        k += 1
    if k <= 1:
        return Nvml.PHB
    switches: set[Bdf] = set()
    # Bridges on the path: the common ancestor and everything below it, endpoints excluded.
    for comp in list(pa[k - 1 : -1]) + list(pb[k:-1]):
        bdf = component_bdf(comp)
        if bdf is None:
            continue
        sw = topo.switch_of(topo.function(bdf))
        if sw is not None:
            switches.add(sw.bdf)
    return Nvml.PIX if len(switches) <= 1 else Nvml.PXB


def classify(topo: Topology, a: Bdf | str | PciFunction, b: Bdf | str | PciFunction) -> PairClass:
    fa = a if isinstance(a, PciFunction) else topo.function(a)
    fb = b if isinstance(b, PciFunction) else topo.function(b)
    # Both classes are symmetric, so (a, b) and (b, a) share one entry.
    key = (fa.bdf, fb.bdf) if fa.bdf <= fb.bdf else (fb.bdf, fa.bdf)
    classes = _CLASSES(topo)
    got = classes.get(key)
    if got is None:
        got = classes[key] = PairClass(nccl_class(nccl_path(topo, fa), nccl_path(topo, fb)), nvml_class(topo, fa, fb))
    return got


# -- NVLink (not in sysfs: inferred from a small table of SXM boards) -------------------------

@dataclass(frozen=True)
class NvlinkBoard:
    """GPUs of one SXM board family and the NVLink count between any two of them, valid only
    when the host also shows the board's NVSwitch functions (if any are listed)."""

    name: str
    gpus: tuple[str, ...]  # vendor:device ids of the board's GPUs
    links: int
    nvswitches: tuple[str, ...] = ()  # vendor:device ids that must be present


@dataclass(frozen=True)
class NvlinkTable:
    boards: tuple[NvlinkBoard, ...]


# Inferred, not measured: nvidia-smi on HGX/DGX H100, H200, B200 and B300 8-GPU boards prints
# NV18 between every GPU pair (B300: DeepEP issue #590); A100 SXM4 8-GPU boards print NV12. The
# Blackwell boards' NVLink switch chips are not assumed to be visible on PCIe, so those entries
# require none.
DEFAULT_NVLINK_TABLE = NvlinkTable(
    boards=(
        NvlinkBoard("HGX H100/H200 8-GPU", ("10de:2330", "10de:2335", "10de:2324"), 18, ("10de:22a3",)),
        NvlinkBoard("HGX B200 8-GPU", ("10de:2901",), 18),
        NvlinkBoard("HGX B300 8-GPU", ("10de:3182",), 18),
        NvlinkBoard("HGX A100 8-GPU", ("10de:20b0", "10de:20b2"), 12, ("10de:1af1",)),
    )
)


INFERRED = "inferred from the SXM board table"
NOT_INFERRED = "none"


class NvlinkOracle:
    """Answers NVLink counts for GPU pairs of one topology. The NVSwitch presence check reads
    the whole device list once, lazily, only when a GPU pair of a board that needs it is asked.

    ``source`` says whether the table gave any NV# on this host (``inferred ...``) or not
    (``none``), and ``reason`` why, with ``hint``: what the caller can be given instead."""

    def __init__(self, topo: Topology, table: NvlinkTable | None = None, hint: str = "pass --fabric"):
        self.topo = topo
        self.table = table or DEFAULT_NVLINK_TABLE
        self.hint = hint
        self._present: set[str] | None = None

    def _gpus_by_board(self) -> dict[NvlinkBoard, int]:
        count: dict[NvlinkBoard, int] = {}
        for f in self.topo.functions():
            board = self.board(f) if self.topo.role(f) == Role.GPU else None
            if board is not None:
                count[board] = count.get(board, 0) + 1
        return count

    def _met(self, board: NvlinkBoard) -> bool:
        """The board's condition: the NVSwitch functions it lists (if any) are on the host."""
        return not board.nvswitches or bool(set(board.nvswitches) & self._ids_present())

    @property
    def blocked(self) -> bool:
        """The host has SXM GPUs of the table, and no board's condition is met (NV# would be
        expected, and none is inferred)."""
        boards = self._gpus_by_board()
        return bool(boards) and not any(self._met(b) for b in boards)

    @property
    def source(self) -> str:
        return INFERRED if any(self._met(b) for b in self._gpus_by_board()) else NOT_INFERRED

    @property
    def reason(self) -> str:
        """Why the table gave NV# on this host, or why not (``8 SXM GPUs (HGX H100/H200 8-GPU),
        no NVSwitch seen: NV# not inferred; pass --fabric``)."""
        boards = self._gpus_by_board()
        met = [f"{n} SXM GPUs ({b.name})" + (", NVSwitch seen" if b.nvswitches else "") for b, n in boards.items() if self._met(b)]
        if met:
            return "; ".join(met)
        unmet = [f"{n} SXM GPUs ({b.name}), no NVSwitch seen" for b, n in boards.items()]
        head = "; ".join(unmet) if unmet else "no GPU of a board in the SXM board table"
        return f"{head}: NV# not inferred; {self.hint}"

    def _ids_present(self) -> set[str]:
        if self._present is None:
            self._present = {
                f.ids for f in self.topo.functions() if f.vendor == NVIDIA and self.topo.role(f) == Role.NVSWITCH
            }
        return self._present

    def board(self, f: PciFunction) -> NvlinkBoard | None:
        for board in self.table.boards:
            if f.ids in board.gpus:
                return board
        return None

    def count(self, fa: PciFunction, fb: PciFunction) -> int | None:
        if self.topo.role(fa) != Role.GPU or self.topo.role(fb) != Role.GPU:
            return None
        board = self.board(fa)
        if board is None or board is not self.board(fb):
            return None
        if not self._met(board):
            return None
        return board.links


def pairs(items: Iterable[Bdf]) -> list[tuple[Bdf, Bdf]]:
    seq = list(items)
    return [(seq[i], seq[j]) for i in range(len(seq)) for j in range(i + 1, len(seq))]
