"""Devices on host NUMA nodes that have no guest cell: which, why, and what gives them one.

The one line every program prints for it (the hook's log line ``numa_cells``, ``xmlfix --check``,
``xmlfix --explain``) is :attr:`MissingCells.line`.

Why it happens (public sources, docs/SOURCES.md "Guest NUMA cells and kubelet"):
- KubeVirt's ``guestMappingPassthrough`` writes one guest cell per host NUMA node of the pod's
  dedicated CPUs (one ``<numatune><memnode>`` each), not of its devices. A device on a node
  none of the pod's CPUs come from has no cell: the guest shows ``numa_node -1`` for it.
- kubelet's static CPU manager gives a pod the fewest NUMA nodes that hold its CPUs
  (kubernetes/kubernetes ``pkg/kubelet/cm/cpumanager/cpu_assignment.go``: the packed
  allocation fills whole nodes first; ``takeByTopologyNUMADistributed``, the option
  ``distribute-cpus-across-numa``, spreads them evenly but tries node counts from
  ``rangeNUMANodesNeededToSatisfy``'s minimum up). Its topology manager, with a policy other
  than ``none``, picks that set among the devices' nodes when the devices fit in it.
- So the pod's CPUs span every node of the devices only when it asks for more CPUs than one
  node fewer can hold: more than (nodes − 1) × the host's CPUs per node (kubelet's own
  rounding: all CPUs / all nodes, rounded up).
- ``distribute-cpus-across-numa``: alpha in Kubernetes 1.23 (feature gate
  ``CPUManagerPolicyAlphaOptions``), beta in 1.33 (``CPUManagerPolicyBetaOptions``, on by
  default); kubernetes/enhancements ``keps/sig-node/2902-cpumanager-distribute-cpus-policy-option/kep.yaml``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pcitopo.errors import DomainError
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import Bdf, NumaNode

DISTRIBUTE_OPTION = "distribute-cpus-across-numa"
DISTRIBUTE_SINCE = (f'cpuManagerPolicyOptions {{{DISTRIBUTE_OPTION}: "true"}} (beta since Kubernetes 1.33; '
                    "alpha in 1.23-1.32, feature gate CPUManagerPolicyAlphaOptions=true)")
ALIGNING_POLICIES = "topologyManagerPolicy best-effort or restricted"


def _nodes(nodes: Iterable[int]) -> str:
    ns = sorted(set(nodes))
    return f"node{'s' if len(ns) != 1 else ''} {','.join(str(n) for n in ns)}"


def cpus_per_node(numa: Mapping[int, NumaNode]) -> int | None:
    """kubelet's CPUs per NUMA node: all CPUs over all nodes, rounded up (None: not known)."""
    total = 0
    for n in numa.values():
        try:
            total += len(parse_cpuset(n.cpulist or ""))
        except DomainError:
            return None
    return -(-total // len(numa)) if numa and total else None


@dataclass(frozen=True)
class MissingCells:
    """Placed devices whose host node backs no guest cell while other host nodes do."""

    devices: tuple[Bdf, ...]  # by host BDF, in order
    nodes: tuple[int, ...]  # their host nodes
    cell_nodes: tuple[int, ...]  # host nodes that back a guest cell
    device_nodes: tuple[int, ...]  # every host node of the VM's devices
    cpus_per_node: int | None
    sizing: str | None = None  # a predicted pod's advice from kubelet's model (src/pcitopo/kubevirt/launcher/cpus.py sizing_line)

    @property
    def short(self) -> str:
        """The verdict's part: how many devices, which nodes."""
        return f"NUMA: {len(self.devices)} device(s) of host {_nodes(self.nodes)} have no guest cell"

    @property
    def line(self) -> str:
        """Which devices, which nodes, why, and the fix, in one line."""
        bdfs = ", ".join(str(b) for b in self.devices)
        return (f"{self.short} ({bdfs}): the guest shows numa_node -1 for them; KubeVirt's guestMappingPassthrough makes one guest "
                "cell per host node of the pod's CPUs, "
                f"here {_nodes(self.cell_nodes)} only. Fix: {self.fix}")

    @property
    def fix(self) -> str:
        if self.sizing:
            return self.sizing
        want = _nodes(self.device_nodes)
        k = len(self.device_nodes)
        if k == 1:
            return (f"put the pod's CPUs on host {want} (kubelet's static CPU manager with {ALIGNING_POLICIES} "
                    "aligns them with the devices; the default policy none does not)")
        held = (f"{(k - 1) * self.cpus_per_node} dedicated CPUs (what {k - 1} host nodes hold)" if self.cpus_per_node
                else f"the dedicated CPUs {k - 1} host nodes hold")
        return (f"the pod's CPUs must span host {want}: kubelet's static CPU manager gives a pod the fewest NUMA "
                f"nodes that hold its CPUs, so give the VM more than {held}, spread evenly with "
                f"kubelet's {DISTRIBUTE_SINCE} and {ALIGNING_POLICIES} (docs/DEPLOY.md, \"Guest NUMA cells\")")


def missing_cells(placed: Iterable, numa_map: Mapping[int, int], numa: Mapping[int, NumaNode]) -> MissingCells | None:
    """``placed``: the rewrite's placed devices (``host``, ``host_node``, ``guest_cell``). None
    when every device with a host node has a guest cell, or when the VM has no cells at all
    (that is another advice: :data:`pcitopo.guest.verdict.KUBEVIRT_NUMA_ADVICE`)."""
    if not numa_map:
        return None
    placed = list(placed)
    lost = [d for d in placed if d.host_node >= 0 and d.guest_cell is None]
    if not lost:
        return None
    return MissingCells(
        devices=tuple(sorted(d.host for d in lost)),
        nodes=tuple(sorted({d.host_node for d in lost})),
        cell_nodes=tuple(sorted(numa_map)),
        device_nodes=tuple(sorted({d.host_node for d in placed if d.host_node >= 0})),
        cpus_per_node=cpus_per_node(numa),
    )


__all__ = ["DISTRIBUTE_OPTION", "MissingCells", "cpus_per_node", "missing_cells"]
