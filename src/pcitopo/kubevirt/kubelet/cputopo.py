"""The CPU topology kubelet's CPU manager works on (``pkg/kubelet/cm/cpumanager/topology/topology.go``
at v1.33: ``CPUTopology``, ``CPUDetails``), and how this project gets it from a node capture.

kubelet reads sockets, cores and threads from cAdvisor; a core's id is its lowest thread's CPU
id (``getUniqueCoreID``). A node capture has only each NUMA node's ``cpulist``, so
:func:`from_numa` infers the rest and says what it assumed:

- threads: two per core when CPU ``c`` and ``c + total/2`` are on the same node for every CPU
  (Linux's enumeration on x86: all first threads, then all second threads), else one;
- sockets: ``sockets`` when given, else two when the node count is even (the dual-socket HGX
  boards this project targets; sub-NUMA clustering gives 2 nodes per socket), else one; the
  nodes split into sockets in id order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from pcitopo.errors import ConfigError, DomainError
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import NumaNode


@dataclass(frozen=True)
class CpuInfo:
    core: int
    socket: int
    node: int


class CpuTopology:
    """Every CPU's core, socket and NUMA node (kubelet's ``CPUTopology``)."""

    def __init__(self, details: Mapping[int, CpuInfo]):
        self.details = dict(details)
        self.num_cpus = len(self.details)
        self.num_sockets = len({i.socket for i in self.details.values()})
        self.num_nodes = len({i.node for i in self.details.values()})
        self.num_cores = len({i.core for i in self.details.values()})
        self.all = Details(self, frozenset(self.details))

    def cpus_per_core(self) -> int:
        return self.num_cpus // self.num_cores if self.num_cores else 0

    def cpus_per_socket(self) -> int:
        return self.num_cpus // self.num_sockets if self.num_sockets else 0

    @cached_property
    def _index(self) -> dict[str, dict[int, frozenset[int]]]:
        out: dict[str, dict[int, set[int]]] = {"node": {}, "socket": {}, "core": {}}
        for cpu, info in self.details.items():
            for key in out:
                out[key].setdefault(getattr(info, key), set()).add(cpu)
        return {k: {i: frozenset(v) for i, v in d.items()} for k, d in out.items()}


class Details:
    """kubelet's ``CPUDetails`` kept to a set of CPUs (the free ones, as allocation goes)."""

    def __init__(self, topo: CpuTopology, cpus: Iterable[int]):
        self.topo = topo
        self.cpus = frozenset(cpus)

    def keep_only(self, cpus: Iterable[int]) -> Details:
        return Details(self.topo, self.cpus & frozenset(cpus))

    def _ids(self, key: str, cpus: Iterable[int] | None = None) -> set[int]:
        return {getattr(self.topo.details[c], key) for c in (self.cpus if cpus is None else cpus)}

    def _in(self, key: str, ids: Iterable[int]) -> frozenset[int]:
        index = self.topo._index[key]
        out: set[int] = set()
        for i in ids:
            out |= index.get(i, frozenset())
        return frozenset(out & self.cpus)

    def nodes(self) -> set[int]:
        return self._ids("node")

    def sockets(self) -> set[int]:
        return self._ids("socket")

    def cpus_in_nodes(self, *ids: int) -> frozenset[int]:
        return self._in("node", ids)

    def cpus_in_sockets(self, *ids: int) -> frozenset[int]:
        return self._in("socket", ids)

    def cpus_in_cores(self, *ids: int) -> frozenset[int]:
        return self._in("core", ids)

    def sockets_in_nodes(self, *ids: int) -> set[int]:
        return self._ids("socket", self.cpus_in_nodes(*ids))

    def nodes_in_sockets(self, *ids: int) -> set[int]:
        return self._ids("node", self.cpus_in_sockets(*ids))

    def cores_in_sockets(self, *ids: int) -> set[int]:
        return self._ids("core", self.cpus_in_sockets(*ids))

    def cores_in_nodes(self, *ids: int) -> set[int]:
        return self._ids("core", self.cpus_in_nodes(*ids))


def _node_cpus(numa: Mapping[int, NumaNode]) -> dict[int, frozenset[int]]:
    out = {}
    for nid, n in sorted(numa.items()):
        try:
            cpus = frozenset(parse_cpuset(n.cpulist or ""))
        except DomainError:
            raise ConfigError(f"NUMA node {nid}: cannot read its cpulist {n.cpulist!r}") from None
        if cpus:
            out[nid] = cpus
    if not out:
        raise ConfigError("the node capture lists no NUMA node with CPUs: no pod CPUs to place the guest cells on")
    return out


def from_numa(numa: Mapping[int, NumaNode], sockets: int | None = None) -> tuple[CpuTopology, str]:
    """kubelet's CPU topology of a capture's NUMA nodes, and one line saying what was assumed."""
    node_cpus = _node_cpus(numa)
    node_of = {c: n for n, cs in node_cpus.items() for c in cs}
    total = len(node_of)
    half = total // 2
    smt = total % 2 == 0 and sorted(node_of) == list(range(total)) and \
        all(node_of[c] == node_of[(c + half) % total] for c in node_of)
    nodes = sorted(node_cpus)
    count = sockets or (2 if len(nodes) % 2 == 0 else 1)
    if len(nodes) % count:
        raise ConfigError(f"{len(nodes)} NUMA nodes do not split evenly into {count} sockets")
    per_socket = len(nodes) // count
    socket_of = {n: i // per_socket for i, n in enumerate(nodes)}
    details = {c: CpuInfo(c % half if smt else c, socket_of[n], n) for c, n in node_of.items()}
    said = (f"host CPUs as kubelet sees them (assumed from the NUMA nodes' cpulists): {count} socket(s), "
            f"{len(nodes)} NUMA node(s), {2 if smt else 1} thread(s) per core"
            + (f" (CPU c and c+{half} siblings)" if smt else ""))
    return CpuTopology(details), said


__all__ = ["CpuInfo", "CpuTopology", "Details", "from_numa"]
