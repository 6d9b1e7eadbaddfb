"""Which CPUs kubelet's static CPU manager gives a VM's pod, and so which guest cells KubeVirt's
``guestMappingPassthrough`` writes (one per host node of the pod's CPUs; src/pcitopo/guest/cells.py
says why that matters).

The CPUs are kubelet's own choice, modelled from kubelet's source in :mod:`pcitopo.kubevirt.kubelet`
(docs/SOURCES.md "kubelet's CPU allocation"): the static policy's reservation, the Topology
Manager's merge of the CPU hints with the pod's device hints under the node's
``topologyManagerPolicy``, then ``allocateCPUs`` with the packed or the
``distribute-cpus-across-numa`` algorithm. The settings come from :mod:`pcitopo.kubevirt.kubelet.settings`.

A pod kubelet refuses (``restricted`` or ``single-numa-node`` with devices on several nodes,
``full-pcpus-only`` with an odd request) gets no CPUs: :class:`PodRefused`, exit 1.

The devices' hints are computed from the functions the prediction gives the pod, one resource
per ``deviceName``: kubelet computes them from all the resource's free devices, the same set
when the pod takes every device of its resource (the shipped examples do).

``--cpu-policy devices`` is not kubelet's: an even share on every node of the devices, kept for
old command lines that asked what such a spread would give.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from pcitopo.errors import ConfigError, PcitopoError
from pcitopo.kubevirt.kubelet.cputopo import CpuTopology, from_numa
from pcitopo.kubevirt.kubelet.static import DeviceResource, KubeletSettings, place
from pcitopo.model.tree import NumaNode


class CpuPolicy(str, Enum):  # noqa: UP042 - a StrEnum's str() differs, and argparse prints these
    """``--cpu-policy``: kubelet's two CPU choices, and the devices' spread as a what-if."""

    DISTRIBUTE = "distribute"
    PACKED = "packed"
    DEVICES = "devices"


class PodRefused(PcitopoError):
    """kubelet refuses the pod at admission: no pod, no domain (the check's failure, exit 1)."""

    kind = "kubelet"
    exit_code = 1


@dataclass(frozen=True)
class PodCpus:
    """The pod's dedicated CPUs in the order KubeVirt pins vCPUs to them, per host node."""

    by_node: tuple[tuple[int, tuple[int, ...]], ...]
    said: str  # under which settings

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(c for _, cs in self.by_node for c in cs)

    @property
    def line(self) -> str:
        shares = ", ".join(f"{len(cs)} on node {n}" for n, cs in self.by_node)
        return f"pod CPUs: {len(self.cpus)} ({shares}) under {self.said}"


def _by_node(topo: CpuTopology, cpus: Sequence[int]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    out: dict[int, list[int]] = {}
    for c in sorted(cpus):
        out.setdefault(topo.details[c].node, []).append(c)
    return tuple((n, tuple(cs)) for n, cs in sorted(out.items()))


def _spread(topo: CpuTopology, count: int, nodes: Sequence[int]) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """``--cpu-policy devices``: an even share on each node, the first nodes one more."""
    nodes = sorted({n for n in nodes if n in topo.all.nodes()}) or sorted(topo.all.nodes())[:1]
    base, extra = divmod(count, len(nodes))
    return tuple((n, tuple(sorted(topo.all.cpus_in_nodes(n))[: base + (1 if i < extra else 0)])) for i, n in enumerate(nodes))


def _refusal(settings: KubeletSettings, count: int, resources: Sequence[DeviceResource], reason: str) -> str:
    nodes = sorted({n for r in resources for n in r.nodes if n is not None})
    why = ""
    if reason.startswith("TopologyAffinityError") and settings.topology_policy == "single-numa-node":
        why = f"; the pod's devices are on host nodes {','.join(map(str, nodes))}, not on one node with its CPUs"
    elif reason.startswith("TopologyAffinityError"):
        why = (f"; the pod's devices need host nodes {','.join(map(str, nodes))} and its CPUs fit in fewer, "
               "so no merged hint is preferred")
    return (f"kubelet refuses the pod at admission ({count} dedicated CPUs; {settings.text.removeprefix('kubelet ')}): "
            f"{reason}{why} (docs/DEPLOY.md, \"Guest NUMA cells\"): no pod, no domain")


def pod_cpus(numa: Mapping[int, NumaNode], count: int, resources: Sequence[DeviceResource], settings: KubeletSettings,
             spread_over_devices: bool = False) -> PodCpus:
    """The ``count`` CPUs kubelet gives the pod, next to its device ``resources``."""
    topo, assumed = from_numa(numa)
    if count > topo.num_cpus:
        raise ConfigError(f"spec.domain.cpu: the VM asks for {count} dedicated CPUs, the node has {topo.num_cpus}")
    if spread_over_devices:
        nodes = [n for r in resources for n in r.nodes if n is not None]
        return PodCpus(_spread(topo, count, nodes), "the pod's CPUs spread over every NUMA node of its devices "
                       "(--cpu-policy devices: not kubelet's)")
    got = place(topo, count, resources, settings)
    if not got.admitted:
        raise PodRefused(_refusal(settings, count, resources, got.reason))
    return PodCpus(_by_node(topo, got.cpus), f"{settings.text}; reserved CPUs {','.join(map(str, got.reserved))}; "
                   f"{assumed}")


def cell_shares(pod: PodCpus, emulator: bool, threads: int) -> list[int]:
    """vCPUs per host node of the pod: with ``isolateEmulatorThread`` the emulator takes one
    CPU, the one KubeVirt's FitCores leaves over (whole cores of ``threads`` vCPUs each fit
    first: a node whose share is not a whole number of cores, else the last)."""
    shares = [len(cs) for _, cs in pod.by_node]
    if emulator:
        odd = [i for i, k in enumerate(shares) if k % threads]
        shares[odd[0] if odd else len(shares) - 1] -= 1
    return shares


def smallest_vcpus(numa: Mapping[int, NumaNode], resources: Sequence[DeviceResource], settings: KubeletSettings,
                   emulator: bool, threads: int, spread_over_devices: bool = False) -> int | None:
    """The fewest vCPUs (a multiple of ``threads``) whose pod gives every device's host node a
    guest cell under ``settings``; None when no count does."""
    from pcitopo.kubevirt.kubelet.assignment import NotEnoughCpus

    want = {n for r in resources for n in r.nodes if n is not None}
    topo, _ = from_numa(numa)
    for vcpus in range(threads, topo.num_cpus + 1, threads):
        try:
            pod = pod_cpus(numa, vcpus + int(emulator), resources, settings, spread_over_devices)
        except (PodRefused, NotEnoughCpus):
            continue
        except ConfigError:
            break  # more CPUs than the node has
        if want <= {n for (n, _), k in zip(pod.by_node, cell_shares(pod, emulator, threads)) if k}:
            return vcpus
    return None


def sizing_line(numa: Mapping[int, NumaNode], resources: Sequence[DeviceResource], settings: KubeletSettings,
                emulator: bool, threads: int, spread_over_devices: bool = False) -> str:
    """The check's advice when a device's node has no guest cell: the smallest vCPU count that
    gives every device's node one, or that none does."""
    nodes = ",".join(str(n) for n in sorted({n for r in resources for n in r.nodes if n is not None}))
    under = "--cpu-policy devices" if spread_over_devices else settings.text
    count = smallest_vcpus(numa, resources, settings, emulator, threads, spread_over_devices)
    if count is None:
        return (f"no vCPU count gives every device's host node ({nodes}) a guest cell under {under}: "
                "change the kubelet's settings (docs/DEPLOY.md, \"Guest NUMA cells\")")
    pod = f" ({count + 1} pod CPUs with the emulator thread)" if emulator else ""
    return (f"give the VM {count} vCPUs{pod} (the smallest count whose pod CPUs span host nodes {nodes} "
            f"under {under}; docs/DEPLOY.md, \"Guest NUMA cells\")")


__all__ = ["CpuPolicy", "PodCpus", "PodRefused", "cell_shares", "pod_cpus", "sizing_line", "smallest_vcpus"]
