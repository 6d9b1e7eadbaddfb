"""kubelet's choice of a container's exclusive CPUs among the free ones: a port of
kubernetes/kubernetes v1.33 ``pkg/kubelet/cm/cpumanager/cpu_assignment.go``
(``cpuAccumulator``, ``takeByTopologyNUMAPacked``, ``takeByTopologyNUMADistributed``), for the
default CPU sorting (``CPUSortingStrategyPacked``) without the uncore-cache and
spread-across-cores options (off by default; this project's prediction never sets them).

What decides a VM's guest cells, in kubelet's order:

- packed: whole sockets or whole NUMA nodes first (NUMA nodes first when there are at least as
  many sockets as nodes, ``numaFirst``; else sockets first), then whole cores, then single
  CPUs; every level sorted by free CPUs ascending, then id;
- distributed (``distribute-cpus-across-numa``): a request that is not a multiple of the CPU
  group size falls back to packed; else the fewest NUMA nodes (from
  ``rangeNUMANodesNeededToSatisfy``) whose even share fits; among those combinations the lowest
  balance score (standard deviation of the free CPUs on every node after the allocation, both
  rounded to 3 decimals as kubelet does), the first on a tie; each node's share is then taken
  packed from that node.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from itertools import combinations

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.kubelet.cputopo import CpuTopology, Details


class NotEnoughCpus(ConfigError):
    """kubelet's ``not enough cpus available to satisfy request``."""


def _round3(x: float) -> float:
    return math.floor(x * 1000 + 0.5) / 1000  # Go's math.Round(x*1000)/1000 for x >= 0


def standard_deviation(xs: list[int]) -> float:
    """cpu_assignment.go ``standardDeviation``: the mean and the result rounded to 3 decimals."""
    mean = _round3(sum(xs) / len(xs))
    return _round3(math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)))


class Accumulator:
    """``cpuAccumulator``: the free CPUs left (``details``), those taken, how many still needed."""

    def __init__(self, topo: CpuTopology, available: Iterable[int], count: int):
        self.topo = topo
        self.details = Details(topo, available)
        self.needed = count
        self.result: set[int] = set()
        self.numa_first = topo.num_sockets >= topo.num_nodes

    def take(self, cpus: Iterable[int]) -> None:
        cpus = set(cpus)
        self.result |= cpus
        self.details = Details(self.topo, self.details.cpus - self.result)
        self.needed -= len(cpus)

    def needs(self, n: int) -> bool:
        return self.needed >= n

    def satisfied(self) -> bool:
        return self.needed < 1

    def failed(self) -> bool:
        return self.needed > len(self.details.cpus)

    @staticmethod
    def _sort(ids: Iterable[int], cpus_of: Callable[..., frozenset]) -> list[int]:
        return sorted(ids, key=lambda i: (len(cpus_of(i)), i))

    def sorted_nodes(self) -> list[int]:
        d = self.details
        if self.numa_first:
            return self._sort(d.nodes(), d.cpus_in_nodes)
        return [n for s in self.sorted_sockets() for n in self._sort(d.nodes_in_sockets(s), d.cpus_in_nodes)]

    def sorted_sockets(self) -> list[int]:
        d = self.details
        if self.numa_first:
            return [s for n in self.sorted_nodes() for s in self._sort(d.sockets_in_nodes(n), d.cpus_in_sockets)]
        return self._sort(d.sockets(), d.cpus_in_sockets)

    def sorted_cores(self) -> list[int]:
        d = self.details
        if self.numa_first:
            return [c for s in self.sorted_sockets() for c in self._sort(d.cores_in_sockets(s), d.cpus_in_cores)]
        return [c for n in self.sorted_nodes() for c in self._sort(d.cores_in_nodes(n), d.cpus_in_cores)]

    def sorted_cpus(self) -> list[int]:
        return [c for core in self.sorted_cores() for c in sorted(self.details.cpus_in_cores(core))]

    def _take_full(self, ids: list[int], cpus_of: Callable[..., frozenset]) -> None:
        for i in ids:  # the free list is computed once, as kubelet's range over freeX() is
            cpus = cpus_of(i)
            if self.needs(len(cpus)):
                self.take(cpus)

    def take_full_nodes(self) -> None:
        full = self.topo.all.cpus_in_nodes
        self._take_full([n for n in self.sorted_nodes() if len(self.details.cpus_in_nodes(n)) == len(full(n))], full)

    def take_full_sockets(self) -> None:
        per = self.topo.cpus_per_socket()
        free = [s for s in self.sorted_sockets() if len(self.details.cpus_in_sockets(s)) == per]
        self._take_full(free, self.topo.all.cpus_in_sockets)

    def take_full_cores(self) -> None:
        per = self.topo.cpus_per_core()
        free = [c for c in self.sorted_cores() if len(self.details.cpus_in_cores(c)) == per]
        self._take_full(free, self.topo.all.cpus_in_cores)

    def take_remaining_cpus(self) -> None:
        for cpu in self.sorted_cpus():
            self.take([cpu])
            if self.satisfied():
                return

    def numa_range(self, group: int) -> tuple[int, int]:
        """``rangeNUMANodesNeededToSatisfy``: the fewest and the most NUMA nodes to try."""
        groups = (self.topo.num_cpus - 1) // group + 1
        per_node = (groups - 1) // self.topo.num_nodes + 1
        needed = (self.needed - 1) // group + 1
        return (needed - 1) // per_node + 1, min(needed, len(self.details.nodes()))


def _start(topo: CpuTopology, available: Iterable[int], count: int) -> Accumulator:
    acc = Accumulator(topo, available, count)
    if not acc.satisfied() and acc.failed():
        raise NotEnoughCpus(f"not enough cpus available to satisfy request: requested={count}, "
                            f"available={len(acc.details.cpus)}")
    return acc


def take_packed(topo: CpuTopology, available: Iterable[int], count: int) -> frozenset[int]:
    """``takeByTopologyNUMAPacked``."""
    acc = _start(topo, available, count)
    steps = ((acc.take_full_nodes, acc.take_full_sockets) if acc.numa_first
             else (acc.take_full_sockets, acc.take_full_nodes)) + (acc.take_full_cores, acc.take_remaining_cpus)
    for step in steps:
        if acc.satisfied():
            break
        step()
    if not acc.satisfied():
        raise NotEnoughCpus("failed to allocate cpus")
    return frozenset(acc.result)


def _spill(free: dict[int, int], subset: tuple[int, ...], remainder: int, group: int) -> dict[int, int]:
    """The free CPUs per node after handing ``remainder`` out over ``subset``, ``group`` at a time."""
    free = dict(free)
    while remainder > 0:
        for n in subset:
            if remainder == 0:
                break
            if free[n] < group:
                continue
            free[n] -= group
            remainder -= group
    return free


def _combo_score(acc: Accumulator, nodes: list[int], combo: tuple[int, ...], count: int,
                 group: int) -> tuple[float, tuple[int, ...]] | None:
    """A combination's best balance score and the nodes that take the remainder; None when
    it cannot hold an even share."""
    d = acc.details
    if len(d.cpus_in_nodes(*combo)) < count or sum(len(d.cpus_in_nodes(n)) // group for n in combo) * group < count:
        return None
    share = (count // len(combo) // group) * group
    if any(len(d.cpus_in_nodes(n)) < share for n in combo):
        return None
    free = {n: len(d.cpus_in_nodes(n)) for n in nodes}
    for n in combo:
        free[n] -= share
    remainder = count - share * len(combo)
    if remainder == 0:
        return standard_deviation(list(free.values())), ()
    takers = [n for n in combo if free[n] >= group]
    best: tuple[float, tuple[int, ...]] = (math.inf, ())
    for k in range(len(takers), 0, -1):
        for subset in combinations(takers, k):
            if sum(free[n] for n in subset) < remainder:
                continue
            balance = standard_deviation(list(_spill(free, subset, remainder, group).values()))
            if balance < best[0]:
                best = (balance, subset)
    return best


def take_distributed(topo: CpuTopology, available: Iterable[int], count: int, group: int) -> frozenset[int]:
    """``takeByTopologyNUMADistributed`` (KEP-2902) with CPU groups of ``group`` CPUs."""
    available = frozenset(available)
    if count % group:
        return take_packed(topo, available, count)
    acc = _start(topo, available, count)
    if acc.satisfied():
        return frozenset()
    nodes = acc.sorted_nodes()
    low, high = acc.numa_range(group)
    for k in range(low, high + 1):
        best: tuple[float, tuple[int, ...], tuple[int, ...]] | None = None
        for combo in combinations(nodes, k):
            scored = _combo_score(acc, nodes, combo, count, group)
            if scored is not None and (best is None or scored[0] < best[0]):
                best = (scored[0], scored[1], combo)
        if best is None or best[0] == math.inf:
            continue
        _, takers, combo = best
        share = (count // len(combo) // group) * group
        for n in combo:
            acc.take(take_packed(topo, acc.details.cpus_in_nodes(n), share))
        remainder = count - share * len(combo)
        while remainder > 0:
            for n in takers:
                if remainder == 0:
                    break
                if len(acc.details.cpus_in_nodes(n)) < group:
                    continue
                acc.take(take_packed(topo, acc.details.cpus_in_nodes(n), group))
                remainder -= group
        return frozenset(acc.result)
    return take_packed(topo, available, count)


__all__ = ["Accumulator", "NotEnoughCpus", "standard_deviation", "take_distributed", "take_packed"]
