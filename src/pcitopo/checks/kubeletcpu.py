"""``pcitopo doctor``'s report of the node's kubelet CPU manager: the settings that decide which
host NUMA nodes a VM's pod gets CPUs from, and so which guest cells KubeVirt's
``guestMappingPassthrough`` writes (src/pcitopo/guest/cells.py says why that matters).

Two files, both optional, read when the doctor runs on the node itself (``--kubelet-dir``):
- ``cpu_manager_state``, the CPU manager's checkpoint (JSON ``{policyName, defaultCpuSet,
  entries: {pod uid: {container: cpuset}}, checksum}``; kubernetes/kubernetes
  ``pkg/kubelet/cm/cpumanager/state/checkpoint.go``): the policy the running kubelet uses, and
  the exclusive CPUs each container holds;
- the kubelet config file (``KubeletConfiguration``; kubeadm writes ``/var/lib/kubelet/config.yaml``):
  ``cpuManagerPolicy``, ``cpuManagerPolicyOptions``, ``topologyManagerPolicy``, ``featureGates``.
Nothing here judges the host: these are facts for the person sizing VMs, and a plain line when
they cannot be read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pcitopo.errors import ConfigError, DomainError
from pcitopo.host.files import read_bounded
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import NumaNode

KUBELET_DIR = "/var/lib/kubelet"
STATE_FILE = "cpu_manager_state"
CONFIG_FILE = "config.yaml"
MAX_BYTES = 1024 * 1024
SHOWN_ENTRIES = 4
DISTRIBUTE = "distribute-cpus-across-numa"


@dataclass(frozen=True)
class Exclusive:
    """A container's exclusive CPUs (from the checkpoint) and their host NUMA nodes."""

    pod: str
    container: str
    cpus: int
    nodes: tuple[int, ...]


@dataclass
class KubeletFacts:
    state_path: str
    config_path: str
    state_policy: str | None = None
    config_policy: str | None = None
    options: dict[str, str] | None = None  # cpuManagerPolicyOptions, when the config was read
    topology_policy: str | None = None
    gates: dict[str, bool] = field(default_factory=dict)  # the CPUManagerPolicy*Options gates set
    reserved_cpus: str | None = None  # reservedSystemCPUs, a cpuset list
    reserved_cpu: str | None = None  # kubeReserved.cpu + systemReserved.cpu, as written ("1", "500m")
    exclusive: list[Exclusive] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)  # "<path> (why)"

    @property
    def policy(self) -> str | None:
        return self.state_policy or self.config_policy

    def lines(self) -> list[str]:
        """What the doctor prints, one line each."""
        if self.state_policy is None and self.config_policy is None and self.options is None:
            return [f"kubelet: cannot read the CPU manager's settings: {'; '.join(self.unread)}; policy and options "
                    "unknown (the doctor DaemonSet: add the doctor-kubelet component of your distribution, docs/OPERATOR.md; "
                    "by hand: --kubelet-dir, and --kubelet-config if the kubelet's --config is elsewhere)"]
        out = [f"kubelet: CPU manager policy {self._policy_text()}, options {self._options_text()}, "
               f"topology manager policy {self.topology_policy or 'none (the default)' if self.options is not None else 'unknown'}"
               + (f" (not read: {'; '.join(self.unread)})" if self.unread else "")]
        for e in self.exclusive[:SHOWN_ENTRIES]:
            out.append(f"kubelet: pod {e.pod} container {e.container}: {e.cpus} exclusive CPUs on host NUMA "
                       f"node{'s' if len(e.nodes) != 1 else ''} {','.join(map(str, e.nodes)) or '?'}")
        if len(self.exclusive) > SHOWN_ENTRIES:
            out.append(f"kubelet: ... and {len(self.exclusive) - SHOWN_ENTRIES} more container(s) with exclusive CPUs")
        return out

    def _policy_text(self) -> str:
        s, c = self.state_policy, self.config_policy
        if s and c and s != c:
            return f"{s} (cpu_manager_state; the config file says {c}: the kubelet refuses to start until the state file is removed)"
        if s:
            return f"{s} (cpu_manager_state)"
        return f"{c} (config file)"

    def _options_text(self) -> str:
        if self.options is None:
            return "unknown (config file not read)"
        if not self.options:
            return f"none ({DISTRIBUTE} not set: a pod's CPUs fill whole NUMA nodes first)"
        text = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return text + (f", gates {', '.join(f'{k}={v}' for k, v in sorted(self.gates.items()))}" if self.gates else "")

    def as_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "state_policy": self.state_policy, "config_policy": self.config_policy,
                "options": self.options, "topology_manager_policy": self.topology_policy, "feature_gates": self.gates,
                "reserved_system_cpus": self.reserved_cpus, "reserved_cpu": self.reserved_cpu,
                "exclusive": [{"pod": e.pod, "container": e.container, "cpus": e.cpus, "nodes": list(e.nodes)}
                              for e in self.exclusive],
                "unread": self.unread}

    def nfd_features(self) -> dict[str, str]:
        """NFD label values (``[A-Za-z0-9._-]``): only what was read."""
        out = {}
        if self.policy:
            out["kubelet-cpu-manager-policy"] = self.policy
        if self.options is not None:
            out["kubelet-distribute-cpus-across-numa"] = str(self.options.get(DISTRIBUTE, "false")).lower()
            out["kubelet-topology-manager-policy"] = self.topology_policy or "none"
        return out


def _read(path: str) -> tuple[bytes | None, str | None]:
    """(the bytes, None), or (None, why not): an absent file is a fact here, not an error."""
    try:
        return read_bounded(path, MAX_BYTES, "kubelet file"), None
    except ConfigError as e:
        return None, "absent" if not os.path.lexists(path) else e.reason


def _node_of(numa: Mapping[int, NumaNode]) -> dict[int, int]:
    out = {}
    for nid, n in numa.items():
        try:
            out.update((c, nid) for c in parse_cpuset(n.cpulist or ""))
        except DomainError:
            continue
    return out


def _state(facts: KubeletFacts, data: bytes, numa: Mapping[int, NumaNode]) -> None:
    try:
        doc = json.loads(data)
        facts.state_policy = str(doc["policyName"])
    except (ValueError, UnicodeDecodeError, KeyError, TypeError):
        facts.unread.append(f"{facts.state_path} (not the CPU manager's checkpoint JSON)")
        return
    node_of = _node_of(numa)
    for pod, containers in sorted((doc.get("entries") or {}).items()):
        for name, cpuset in sorted((containers or {}).items()):
            try:
                cpus = parse_cpuset(str(cpuset))
            except DomainError:
                continue
            nodes = tuple(sorted({node_of[c] for c in cpus if c in node_of}))
            facts.exclusive.append(Exclusive(pod, name, len(cpus), nodes))


def _config(facts: KubeletFacts, data: bytes) -> None:
    from pcitopo.host.yamltext import yaml_documents  # PyYAML: only the doctor on a node needs it here

    try:
        docs = yaml_documents(data, str(facts.config_path))
    except ConfigError:
        docs = []
    doc = docs[0] if len(docs) == 1 else None
    if not isinstance(doc, dict):
        facts.unread.append(f"{facts.config_path} (not a KubeletConfiguration)")
        return
    facts.config_policy = str(doc.get("cpuManagerPolicy") or "none")
    options = doc.get("cpuManagerPolicyOptions") or {}
    facts.options = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in options.items()} \
        if isinstance(options, dict) else {}
    facts.topology_policy = doc.get("topologyManagerPolicy") or None
    gates = doc.get("featureGates") or {}
    if isinstance(gates, dict):
        facts.gates = {k: bool(v) for k, v in gates.items() if str(k).startswith("CPUManagerPolicy")}
    facts.reserved_cpus = str(doc["reservedSystemCPUs"]) if doc.get("reservedSystemCPUs") else None
    reserved = [str(((doc.get(k) or {}) if isinstance(doc.get(k), dict) else {}).get("cpu") or "")
                for k in ("kubeReserved", "systemReserved")]
    facts.reserved_cpu = "+".join(r for r in reserved if r) or None


def read_config(path: str) -> KubeletFacts:
    """Only the kubelet config file ``path`` (``pcitopo domain --kubelet-config``); what could
    not be read is in ``unread``."""
    facts = KubeletFacts("", path)
    data, why = _read(path)
    if data is None:
        facts.unread.append(f"{path} ({why})")
    else:
        _config(facts, data)
    return facts


def read_kubelet(kubelet_dir: str, config: str | None, numa: Mapping[int, NumaNode]) -> KubeletFacts:
    """The facts ``kubelet_dir``'s checkpoint and the config file (default ``<dir>/config.yaml``)
    give; what could not be read is in ``unread``, never an exception."""
    facts = KubeletFacts(os.path.join(kubelet_dir, STATE_FILE), config or os.path.join(kubelet_dir, CONFIG_FILE))
    for path, parse in ((facts.state_path, lambda d: _state(facts, d, numa)), (facts.config_path, lambda d: _config(facts, d))):
        data, why = _read(path)
        if data is None:
            facts.unread.append(f"{path} ({why})")
        else:
            parse(data)
    return facts


__all__ = ["KUBELET_DIR", "Exclusive", "KubeletFacts", "read_config", "read_kubelet"]
