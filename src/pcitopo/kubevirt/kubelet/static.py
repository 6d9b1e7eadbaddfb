"""kubelet's static CPU manager policy for one Guaranteed pod, from kubernetes/kubernetes v1.33
``pkg/kubelet/cm/cpumanager/policy_static.go``:

- the reservation (``NewStaticPolicy``): ``reservedSystemCPUs`` when set; else the number of CPUs
  kube-reserved plus system-reserved imply, taken by the policy's own ``takeByTopology`` from all
  CPUs (the lowest core first; with no setting this model reserves one core, the smallest
  reservation kubelet starts with on an SMT host);
- ``full-pcpus-only`` (``Allocate``): a request that is not a multiple of the threads per core,
  or larger than the free whole cores, is refused (``SMTAlignmentError``);
- the Topology Manager's admission (:mod:`.topologymanager`) from the CPU hints and the device
  hints;
- ``allocateCPUs``: first ``min(request, aligned)`` CPUs from the merged affinity's nodes, then
  the rest from all free CPUs, each with ``takeByTopology`` (distributed with
  ``distribute-cpus-across-numa``, CPU groups of one core under ``full-pcpus-only``, else packed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pcitopo.kubevirt.kubelet.assignment import take_distributed, take_packed
from pcitopo.kubevirt.kubelet.cputopo import CpuTopology
from pcitopo.kubevirt.kubelet.topologymanager import Admission, admit, cpu_hints, device_hints

DISTRIBUTE = "distribute-cpus-across-numa"
FULL_PCPUS = "full-pcpus-only"


@dataclass(frozen=True)
class KubeletSettings:
    """What of a kubelet's configuration decides a pod's CPUs."""

    topology_policy: str = "best-effort"
    distribute: bool = True  # cpuManagerPolicyOptions distribute-cpus-across-numa
    full_pcpus_only: bool = False  # cpuManagerPolicyOptions full-pcpus-only
    reserved_cpus: frozenset[int] | None = None  # reservedSystemCPUs
    reserved_count: int | None = None  # ceil(kubeReserved.cpu + systemReserved.cpu); None: one core

    @property
    def text(self) -> str:
        options = [o for o, on in ((DISTRIBUTE, self.distribute), (FULL_PCPUS, self.full_pcpus_only)) if on]
        return (f"kubelet cpuManagerPolicy static, options {', '.join(options) or 'none'}, "
                f"topologyManagerPolicy {self.topology_policy}")


@dataclass(frozen=True)
class DeviceResource:
    """One device-plugin resource the pod asks for: how many, and the free devices' nodes."""

    name: str
    request: int
    nodes: tuple[int | None, ...]


@dataclass(frozen=True)
class Placement:
    """The pod's CPUs, or kubelet's refusal (``reason``)."""

    cpus: tuple[int, ...]
    reserved: tuple[int, ...]
    affinity: frozenset[int] | None
    reason: str | None = None

    @property
    def admitted(self) -> bool:
        return self.reason is None


def _take(topo: CpuTopology, settings: KubeletSettings, available: frozenset[int], count: int) -> frozenset[int]:
    if settings.distribute:
        group = topo.cpus_per_core() if settings.full_pcpus_only else 1
        return take_distributed(topo, available, count, group)
    return take_packed(topo, available, count)


def reserved_cpus(topo: CpuTopology, settings: KubeletSettings) -> frozenset[int]:
    if settings.reserved_cpus:
        return frozenset(settings.reserved_cpus)
    count = settings.reserved_count if settings.reserved_count is not None else topo.cpus_per_core()
    return _take(topo, settings, topo.all.cpus, count)


def _smt_refusal(topo: CpuTopology, reserved: frozenset[int], free: frozenset[int], count: int) -> str | None:
    per_core = topo.cpus_per_core()
    if count % per_core:
        return f"SMTAlignmentError: requested {count} cpus not multiple cpus per core = {per_core}"
    physical = free - topo.all.cpus_in_cores(*{topo.details[c].core for c in reserved})
    if count > len(physical):
        return (f"SMTAlignmentError: not enough free physical CPUs: available physical CPUs = {len(physical)}, "
                f"requested CPUs = {count}, CPUs per core = {per_core}")
    return None


def allocate_cpus(topo: CpuTopology, settings: KubeletSettings, available: frozenset[int], count: int,
                  affinity: frozenset[int] | None) -> frozenset[int]:
    """policy_static.go ``allocateCPUs``: the affinity's CPUs first, then the rest."""
    got: frozenset[int] = frozenset()
    if affinity is not None:
        aligned = topo.all.keep_only(available).cpus_in_nodes(*affinity)
        got = _take(topo, settings, aligned, min(count, len(aligned)))
    return got | _take(topo, settings, available - got, count - len(got))


def place(topo: CpuTopology, count: int, devices: Sequence[DeviceResource], settings: KubeletSettings,
          free: frozenset[int] | None = None) -> Placement:
    """The ``count`` exclusive CPUs kubelet gives a new pod when ``free`` (default: all) are
    the shared pool; :class:`NotEnoughCpus` when the pool cannot hold them."""
    reserved = reserved_cpus(topo, settings)
    free = topo.all.cpus if free is None else frozenset(free)
    available = free - reserved
    empty = Placement((), tuple(sorted(reserved)), None)
    if settings.full_pcpus_only and (why := _smt_refusal(topo, reserved, free, count)):
        return replace(empty, reason=why)
    providers = [cpu_hints(topo, available, count)]
    providers += [device_hints(topo.all.nodes(), d.nodes, d.request) for d in devices]
    admission: Admission = admit(settings.topology_policy, topo.all.nodes(), providers)
    if not admission.admitted:
        return replace(empty, affinity=admission.affinity, reason=admission.reason)
    got = allocate_cpus(topo, settings, available, count, admission.affinity)
    return Placement(tuple(sorted(got)), tuple(sorted(reserved)), admission.affinity)


__all__ = ["DISTRIBUTE", "FULL_PCPUS", "DeviceResource", "KubeletSettings", "Placement", "allocate_cpus", "place",
           "reserved_cpus"]
