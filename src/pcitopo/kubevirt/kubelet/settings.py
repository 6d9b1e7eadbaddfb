"""Which kubelet settings a prediction places the pod's CPUs with, from what the command line
says of them (:class:`KubeletRequest`; the options are src/pcitopo/cli/prediction.py's).

In order: the flags (``--topology-policy``, ``--cpu-policy``, ``--reserved-cpus``), else the
node's kubelet configuration (``--kubelet-config``: the ``KubeletConfiguration`` file, or the
JSON report of ``pcitopo doctor --kubelet-dir ... --json``, which carries the doctor's reading),
else docs/DEPLOY.md's recommendation: ``cpuManagerPolicy: static`` with
``distribute-cpus-across-numa``, ``topologyManagerPolicy: best-effort``, one core reserved.
Whatever was not read is said in one line (:attr:`Resolved.assumed`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from pcitopo.errors import ConfigError, DomainError
from pcitopo.kubevirt.kubelet.static import DISTRIBUTE, FULL_PCPUS, KubeletSettings
from pcitopo.kubevirt.kubelet.topologymanager import POLICIES
from pcitopo.libvirt.domain import parse_cpuset

CPU_POLICY_CHOICES = ("distribute", "packed", "devices")


@dataclass(frozen=True)
class KubeletRequest:
    """What the command line says of the node's kubelet (``--cpu-policy``, ``--topology-policy``,
    ``--reserved-cpus``, ``--kubelet-config``; src/pcitopo/cli/prediction.py): None, not given."""

    cpu_policy: str | None = None
    topology_policy: str | None = None
    reserved_cpus: str | None = None
    kubelet_config: str | None = None


@dataclass(frozen=True)
class Resolved:
    settings: KubeletSettings
    spread_over_devices: bool  # --cpu-policy devices: not kubelet's, a what-if kept for old command lines
    assumed: str | None  # one line: what was not read


def _quantity_cpus(text: str) -> int:
    """kubelet's numReservedCPUs: ceil(kubeReserved.cpu + systemReserved.cpu)."""
    total = 0.0
    for part in text.split("+"):
        part = part.strip()
        try:
            total += float(part[:-1]) / 1000 if part.endswith("m") else float(part)
        except ValueError:
            raise ConfigError(f"--kubelet-config: kubeReserved/systemReserved cpu {part!r} is not a CPU quantity") from None
    return math.ceil(total)


def _cpuset(text: str, where: str) -> frozenset[int]:
    try:
        cpus = frozenset(parse_cpuset(text))
    except DomainError:
        cpus = frozenset()
    if not cpus:
        raise ConfigError(f"{where} {text!r}: not a CPU list such as 0,112 or 0-1")
    return cpus


def _from_reading(reading: Mapping[str, Any], path: str) -> KubeletSettings:
    """The settings of the doctor's kubelet reading (``KubeletFacts.as_json``)."""
    policy = reading.get("policy") or reading.get("config_policy")
    if policy and policy != "static":
        raise ConfigError(f"--kubelet-config {path}: cpuManagerPolicy {policy}: the pod gets no dedicated CPUs "
                          "(KubeVirt's dedicatedCpuPlacement needs static)")
    options = reading.get("options") or {}
    reserved = reading.get("reserved_system_cpus")
    quantity = reading.get("reserved_cpu")
    return KubeletSettings(topology_policy=reading.get("topology_manager_policy") or "none",
                           distribute=str(options.get(DISTRIBUTE, "false")).lower() == "true",
                           full_pcpus_only=str(options.get(FULL_PCPUS, "false")).lower() == "true",
                           reserved_cpus=_cpuset(str(reserved), f"--kubelet-config {path}: reservedSystemCPUs") if reserved else None,
                           reserved_count=_quantity_cpus(str(quantity)) if quantity else None)


def _read_file(path: str) -> KubeletSettings:
    from pcitopo.checks.kubeletcpu import MAX_BYTES, read_config
    from pcitopo.host.files import read_bounded

    data = read_bounded(path, MAX_BYTES, "--kubelet-config")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        doc = None
    if isinstance(doc, dict) and "kubelet" in doc:
        if not isinstance(doc["kubelet"], dict):
            raise ConfigError(f"--kubelet-config {path}: the doctor's report has no kubelet reading")
        return _from_reading(doc["kubelet"], path)
    facts = read_config(path)
    if facts.unread:
        raise ConfigError(f"--kubelet-config {path}: {'; '.join(facts.unread)}")
    return _from_reading(facts.as_json(), path)


def resolve(args: KubeletRequest) -> Resolved:
    """The settings for ``args`` (flags, then ``--kubelet-config``, then docs/DEPLOY.md's)."""
    cpu_policy = args.cpu_policy
    if cpu_policy is not None and cpu_policy not in CPU_POLICY_CHOICES:
        raise ConfigError(f"--cpu-policy {cpu_policy}: unknown (one of {', '.join(CPU_POLICY_CHOICES)})")
    topology = args.topology_policy
    if topology is not None and topology not in POLICIES:
        raise ConfigError(f"--topology-policy {topology}: unknown (one of {', '.join(POLICIES)})")
    path = args.kubelet_config
    settings = _read_file(path) if path else KubeletSettings()
    if cpu_policy in ("distribute", "packed"):
        settings = replace(settings, distribute=cpu_policy == "distribute")
    if topology:
        settings = replace(settings, topology_policy=topology)
    reserved = args.reserved_cpus
    if reserved:
        settings = replace(settings, reserved_cpus=_cpuset(reserved, "--reserved-cpus"))
    missing = [what for what, given in (
        (f"cpuManagerPolicyOptions {DISTRIBUTE}", cpu_policy or path), ("topologyManagerPolicy best-effort", topology or path),
        ("one core reserved", reserved or settings.reserved_cpus or settings.reserved_count))
        if not given]
    assumed = (f"kubelet assumed: {', '.join(missing)} (docs/DEPLOY.md's; give --kubelet-config, --cpu-policy, "
               "--topology-policy, --reserved-cpus)") if missing else None
    return Resolved(settings, cpu_policy == "devices", assumed)


__all__ = ["CPU_POLICY_CHOICES", "KubeletRequest", "Resolved", "resolve"]
