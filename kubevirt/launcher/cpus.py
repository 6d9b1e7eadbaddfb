"""Which CPUs kubelet's static CPU manager gives a VM's pod, and so which guest cells KubeVirt's
``guestMappingPassthrough`` writes (one per host node of the pod's CPUs; topology/guest/cells.py
says why that matters).

The model (kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/cpu_assignment.go``, docs/SOURCES.md
"Guest NUMA cells and kubelet"): the pod gets the fewest NUMA nodes that hold its CPUs, counted
with kubelet's own rounding (all CPUs / all nodes, rounded up); the topology manager (policy
``best-effort`` or ``restricted``) takes those nodes among the devices' nodes first, lowest
first (the narrowest hint that ties first). Then

- ``distribute`` (``distribute-cpus-across-numa``, ``takeByTopologyNUMADistributed``; what
  docs/DEPLOY.md recommends, the default): an even share on each of those nodes, the first
  nodes one more when it does not divide;
- ``packed`` (the static policy without options, ``takeByTopologyNUMAPacked``): whole nodes
  first, in order;
- ``devices``: an even share on every node of the devices (what kubelet gives once the VM asks
  for more CPUs than one node fewer holds; the deploy/ examples' stand-in domains assume it).

Simplified: CPUs are taken in the node's ``cpulist`` order, not core by core (thread siblings
are not in a node capture), and no CPUs are reserved (``reservedSystemCPUs``); only which nodes
the CPUs come from decides the cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Mapping, Sequence

from pcitopo.topology.errors import ConfigError
from pcitopo.topology.libvirt.domain import parse_cpuset
from pcitopo.topology.model.tree import NumaNode


class CpuPolicy(str, Enum):
    DISTRIBUTE = "distribute"
    PACKED = "packed"
    DEVICES = "devices"

    @property
    def text(self) -> str:
        return {CpuPolicy.DISTRIBUTE: "kubelet cpuManagerPolicy static with distribute-cpus-across-numa, "
                                      "topologyManagerPolicy best-effort (docs/DEPLOY.md's)",
                CpuPolicy.PACKED: "kubelet cpuManagerPolicy static without options, topologyManagerPolicy best-effort",
                CpuPolicy.DEVICES: "the pod's CPUs spread over every NUMA node of its devices"}[self]


DEFAULT_POLICY = CpuPolicy.DISTRIBUTE
CPU_POLICIES = tuple(p.value for p in CpuPolicy)


@dataclass(frozen=True)
class PodCpus:
    """The pod's dedicated CPUs in the order KubeVirt pins vCPUs to them, per host node."""

    policy: CpuPolicy
    by_node: tuple[tuple[int, tuple[int, ...]], ...]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(c for _, cs in self.by_node for c in cs)

    @property
    def line(self) -> str:
        shares = ", ".join(f"{len(cs)} on node {n}" for n, cs in self.by_node)
        return f"pod CPUs: {len(self.cpus)} ({shares}) under {self.policy.text}"


def policy_of(name: str | None) -> CpuPolicy:
    if name is None:
        return DEFAULT_POLICY
    try:
        return CpuPolicy(name)
    except ValueError:
        raise ConfigError(f"--cpu-policy {name}: unknown (one of {', '.join(CPU_POLICIES)})") from None


def _node_cpus(numa: Mapping[int, NumaNode]) -> dict[int, list[int]]:
    return {nid: sorted(parse_cpuset(n.cpulist or "")) for nid, n in sorted(numa.items()) if n.cpulist}


def _nodes_for(count: int, node_cpus: Mapping[int, list[int]], device_nodes: Sequence[int]) -> list[int]:
    """The fewest nodes that hold ``count`` CPUs (kubelet's rounding), the devices' first."""
    total = sum(len(c) for c in node_cpus.values())
    per_node = -(-total // len(node_cpus))
    needed = max(1, min(len(node_cpus), -(-count // per_node)))
    order = [n for n in sorted(set(device_nodes)) if n in node_cpus] + [n for n in node_cpus if n not in device_nodes]
    return sorted(order[:needed])


def _even(count: int, nodes: list[int], node_cpus: Mapping[int, list[int]]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    base, extra = divmod(count, len(nodes))
    return tuple((n, tuple(node_cpus[n][: base + (1 if i < extra else 0)])) for i, n in enumerate(nodes))


def pod_cpus(numa: Mapping[int, NumaNode], count: int, device_nodes: Sequence[int], policy: CpuPolicy) -> PodCpus:
    """The ``count`` CPUs kubelet gives the pod under ``policy``, next to devices on ``device_nodes``."""
    node_cpus = _node_cpus(numa)
    if not node_cpus:
        raise ConfigError("the node capture lists no NUMA node with CPUs: no pod CPUs to place the guest cells on")
    if count > sum(len(c) for c in node_cpus.values()):
        raise ConfigError(f"spec.domain.cpu: the VM asks for {count} dedicated CPUs, the node has "
                          f"{sum(len(c) for c in node_cpus.values())}")
    if policy is CpuPolicy.DEVICES:
        nodes = [n for n in sorted(set(device_nodes)) if n in node_cpus] or [next(iter(node_cpus))]
        return PodCpus(policy, _even(count, nodes, node_cpus))
    nodes = _nodes_for(count, node_cpus, device_nodes)
    if policy is CpuPolicy.DISTRIBUTE:
        return PodCpus(policy, _even(count, nodes, node_cpus))
    out, left = [], count
    for n in nodes:
        take = node_cpus[n][:left]
        out.append((n, tuple(take)))
        left -= len(take)
    return PodCpus(policy, tuple((n, cs) for n, cs in out if cs))
