"""kubelet's Topology Manager for one pod: each provider's NUMA hints and their merge, as
kubernetes/kubernetes v1.33 has them:

- ``pkg/kubelet/cm/topologymanager/bitmask/bitmask.go``: ``IterateBitMasks`` (every node
  combination, smallest first), ``IsNarrowerThan`` (fewer nodes; on a tie the lower mask value);
- ``pkg/kubelet/cm/cpumanager/policy_static.go`` ``generateCPUTopologyHints`` and
  ``pkg/kubelet/cm/devicemanager/topology_hints.go`` ``generateDeviceTopologyHints``: a hint
  for every mask that holds the request, preferred when it has as few nodes as the narrowest
  mask that could ever hold it;
- ``pkg/kubelet/cm/topologymanager/policy.go`` (``filterProvidersHints``, ``mergePermutation``,
  ``HintMerger``): every permutation of one hint per provider, the masks ANDed, preferred only
  when all agree and all are preferred; the best preferred merge is the narrowest; with none
  preferred, the one whose node count is nearest (not above) the widest provider's narrowest;
- ``policy_best_effort.go`` admits whatever the merge gives, ``policy_restricted.go`` only a
  preferred one, ``policy_single_numa_node.go`` only single-node hints, and a merge of all
  nodes becomes no affinity; ``policy_none.go`` gives no affinity.

A mask is a frozenset of node ids here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations, product

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.kubelet.cputopo import CpuTopology

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
Mask = frozenset


@dataclass(frozen=True)
class Hint:
    """``TopologyHint``: ``nodes`` None is "any node" (a provider without a preference)."""

    nodes: Mask | None
    preferred: bool


def value(mask: Mask) -> int:
    return sum(1 << n for n in mask)


def narrower(a: Mask, b: Mask) -> bool:
    """bitmask.go ``IsNarrowerThan``."""
    return value(a) < value(b) if len(a) == len(b) else len(a) < len(b)


def masks(nodes: Iterable[int]) -> list[Mask]:
    """bitmask.go ``IterateBitMasks``: every combination of ``nodes``, one node first."""
    nodes = sorted(nodes)
    return [Mask(c) for k in range(1, len(nodes) + 1) for c in combinations(nodes, k)]


def _mark(hints: list[Mask], narrowest: int) -> list[Hint]:
    return [Hint(m, len(m) == narrowest) for m in hints]


def cpu_hints(topo: CpuTopology, available: frozenset[int], request: int) -> list[Hint]:
    """policy_static.go ``generateCPUTopologyHints`` (no reusable CPUs: a new pod)."""
    narrowest, out = topo.num_nodes, []
    for mask in masks(topo.all.nodes()):
        if len(topo.all.cpus_in_nodes(*mask)) >= request:
            narrowest = min(narrowest, len(mask))
        if sum(1 for c in available if topo.details[c].node in mask) >= request:
            out.append(mask)
    return _mark(out, narrowest)


def device_hints(all_nodes: Iterable[int], devices: Sequence[int | None], request: int) -> list[Hint] | None:
    """devicemanager ``generateDeviceTopologyHints`` for one resource whose free devices sit on
    ``devices`` (a node each; None: no NUMA node); None when no device has a node (kubelet
    then gives no hint for the resource)."""
    if all(d is None for d in devices):
        return None
    all_nodes = sorted(all_nodes)
    narrowest, out = len(all_nodes), []
    for mask in masks(all_nodes):
        inside = sum(1 for d in devices if d is not None and d in mask)
        if inside >= request:
            narrowest = min(narrowest, len(mask))
            out.append(mask)
    return _mark(out, narrowest)


def _merge_permutation(default: Mask, permutation: Sequence[Hint]) -> Hint:
    preferred, merged, first = True, default, None
    for h in permutation:
        if h.nodes is not None:
            first = h.nodes if first is None else first
            preferred = preferred and h.nodes == first
            merged = merged & h.nodes
        preferred = preferred and h.preferred
    return Hint(Mask(merged), preferred)


def _fitter(current: Hint, candidate: Hint) -> Hint:
    if candidate.nodes == current.nodes:
        return current
    return current if narrower(current.nodes, candidate.nodes) else candidate


def _compare(best_count: int, current: Hint | None, candidate: Hint) -> Hint | None:
    """policy.go ``HintMerger.compare``."""
    if not candidate.nodes:
        return current
    if current is None or (not current.preferred and candidate.preferred):
        return candidate
    if current.preferred and not candidate.preferred:
        return current
    if current.preferred:
        return _fitter(current, candidate)
    cur, cand = len(current.nodes), len(candidate.nodes)
    if cur > best_count:
        return _fitter(current, candidate)
    if cur == best_count:
        return _fitter(current, candidate) if cand == best_count else current
    if cand > best_count:
        return current
    if cand == best_count or cand > cur:
        return candidate
    return current if cand < cur else _fitter(current, candidate)


def filter_providers(providers: Sequence[list[Hint] | None]) -> list[list[Hint]]:
    """policy.go ``filterProvidersHints``: no hints is "any node, preferred"; an empty list is
    "any node, not preferred" (the provider cannot satisfy the request)."""
    return [[Hint(None, True)] if p is None else (p or [Hint(None, False)]) for p in providers]


def merge(all_nodes: Iterable[int], filtered: Sequence[list[Hint]]) -> Hint:
    """policy.go ``HintMerger.Merge`` over :func:`filter_providers`' lists."""
    default = Mask(all_nodes)
    counts = [min(len(h.nodes) for h in p if h.nodes is not None) for p in filtered
              if any(h.nodes is not None for h in p)]
    best_count = max(counts, default=0)  # maxOfMinAffinityCounts
    best: Hint | None = None
    for permutation in product(*filtered):
        best = _compare(best_count, best, _merge_permutation(default, permutation))
    return best or Hint(default, False)


@dataclass(frozen=True)
class Admission:
    """The Topology Manager's answer for a pod: the affinity (None: any node) or a rejection."""

    affinity: Mask | None
    admitted: bool

    @property
    def reason(self) -> str:
        return "TopologyAffinityError: Resources cannot be allocated with Topology locality"


def admit(policy: str, all_nodes: Iterable[int], providers: Sequence[list[Hint] | None]) -> Admission:
    """The pod's admission under ``policy`` (``none``, ``best-effort``, ``restricted``,
    ``single-numa-node``)."""
    if policy not in POLICIES:
        raise ConfigError(f"--topology-policy {policy}: unknown (one of {', '.join(POLICIES)})")
    if policy == "none":
        return Admission(None, True)
    all_nodes = frozenset(all_nodes)
    filtered = filter_providers(providers)
    if policy == "single-numa-node":  # filterSingleNumaHints
        filtered = [[h for h in p if h.preferred and (h.nodes is None or len(h.nodes) == 1)] for p in filtered]
    best = merge(all_nodes, filtered)
    if policy == "single-numa-node" and best.nodes == all_nodes:
        best = Hint(None, best.preferred)
    return Admission(best.nodes, policy == "best-effort" or best.preferred)


__all__ = ["Admission", "Hint", "POLICIES", "admit", "cpu_hints", "device_hints", "filter_providers", "merge", "narrower"]
