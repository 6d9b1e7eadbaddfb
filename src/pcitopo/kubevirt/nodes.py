"""Which nodes of a cluster are GPU nodes, and whether pcitopo's DaemonSets land on them: the one
rule ``pcitopo preflight`` counts with and the DaemonSets' node affinity is written from.

A GPU node is one with a GPU, as the labellers and device plugins that run on GPU clusters say it
(docs/SOURCES.md, "A shared cluster on any distribution"):

- a label one of them sets (:data:`GPU_NODE_TERMS`, one node selector term each);
- or an allocatable GPU resource: ``nvidia.com/gpu`` and ``nvidia.com/mig-*`` (NVIDIA's device
  plugin), the GPU Operator's sandbox device plugin's names (NVIDIA/kubevirt-gpu-device-plugin
  ``pkg/device_plugin/device_plugin.go``: a passthrough GPU is named after its pci.ids entry,
  upper-cased, with only ``[A-Z0-9_]`` left, or its four-hex device id; a vGPU after its mdev
  type name with blanks as ``_``, ``NVIDIA_…`` or ``GRID_…``), or a KubeVirt CR
  ``permittedHostDevices.pciHostDevices`` resource whose vendor makes display-class devices
  (:data:`GPU_VENDORS`).

Not a GPU: every other ``nvidia.com/*`` resource. NVIDIA's Network Operator advertises SR-IOV
NICs and RDMA devices under ``nvidia.com/`` too (``nvidia.com/cx6_sriov_vf``), on CPU-only nodes,
with names the admin picks; a CR entry with another vendor (``15b3``, Mellanox) is never a GPU
whatever its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Node labels that mark a GPU node, whoever set them (one node selector term each: a node
# matches when any term does). The DaemonSets' nodeSelectorTerms are these (tests/test_targets.py).
GPU_NODE_TERMS: tuple[tuple[str, str], ...] = (
    ("feature.node.kubernetes.io/pci-0302_10de.present", "true"),  # NFD default deviceLabelFields [class, vendor]
    ("feature.node.kubernetes.io/pci-10de.present", "true"),  # GPU Operator's NFD: deviceLabelFields [vendor]
    ("nvidia.com/gpu.present", "true"),  # GPU Feature Discovery
    ("nvidia.com/gpu.workload.config", "vm-passthrough"),  # GPU Operator in KubeVirt (sandbox) mode
)

# PCI vendors whose passed-through functions are GPUs (class 03): NVIDIA, AMD/ATI. Intel (8086)
# is not here: it makes NICs as well, so its GPUs count by label only.
GPU_VENDORS = frozenset({"10de", "1002"})

# NVIDIA/kubevirt-gpu-device-plugin's resource names (see the module docstring)
_SANDBOX_GPU = re.compile(r"nvidia\.com/(?:[A-Z0-9_]*[A-Z][A-Z0-9_]*|[0-9a-f]{4}|(?:NVIDIA|GRID)_[\w.-]+)")
_DEVICE_PLUGIN_GPU = re.compile(r"nvidia\.com/(?:gpu|mig-[\w.-]+)")

# What an admin does for a GPU node no term selects: install a labeller, or set the label the
# GPU Operator takes as its input. Never a label a labeller manages (it would be overwritten,
# and would claim what nothing checked).
UNLABELLED_ADVICE = ("no GPU label: run Node Feature Discovery (it sets feature.node.kubernetes.io/pci-0302_10de.present) "
                     "or the GPU Operator (its NFD sets feature.node.kubernetes.io/pci-10de.present); in KubeVirt mode the "
                     "GPU Operator reads nvidia.com/gpu.workload.config=vm-passthrough, the one label you set yourself")


@dataclass(frozen=True)
class GpuNode:
    name: str
    why: tuple[str, ...]  # what makes it a GPU node
    daemonset: bool  # the target's DaemonSet selects it


def is_gpu_node(labels: Mapping[str, Any] | None) -> bool:
    """Whether the DaemonSets' node affinity (:data:`GPU_NODE_TERMS`) selects a node with these labels."""
    labels = labels or {}
    return any(labels.get(key) == value for key, value in GPU_NODE_TERMS)


def gpu_resources(permitted: Mapping[str, str]) -> GpuResources:
    """The rule for resource names, given the KubeVirt CR's ``pciHostDevices`` (resource name ->
    ``vendor:device``)."""
    return GpuResources({r for r, vd in permitted.items() if vd.split(":")[0].lower() in GPU_VENDORS},
                        {r for r, vd in permitted.items() if vd.split(":")[0].lower() not in GPU_VENDORS})


@dataclass(frozen=True)
class GpuResources:
    gpus: set[str]  # the CR's resources of a GPU vendor
    not_gpus: set[str]  # the CR's resources of any other vendor (NICs, NVMe, ...)

    def __contains__(self, resource: object) -> bool:
        name = str(resource)
        if name in self.not_gpus:
            return False
        return name in self.gpus or bool(_DEVICE_PLUGIN_GPU.fullmatch(name) or _SANDBOX_GPU.fullmatch(name))


def gpu_node(node: Mapping[str, Any], resources: GpuResources) -> GpuNode | None:
    """The node, if it is a GPU node (a GPU resource it can allocate, or a GPU label), with why."""
    meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    status = node.get("status") if isinstance(node.get("status"), Mapping) else {}
    allocatable = status.get("allocatable") if isinstance(status.get("allocatable"), Mapping) else {}
    why = [f"allocatable {k}: {v}" for k, v in allocatable.items() if k in resources and _positive(v)]
    why += [f"label {k}={v}" for k, v in GPU_NODE_TERMS if labels.get(k) == v]
    return GpuNode(str(meta.get("name", "?")), tuple(why), is_gpu_node(labels)) if why else None


def _positive(value: Any) -> bool:
    text = str(value).strip()
    digits = "".join(ch for ch in text if ch.isdigit() or ch == ".")
    try:
        return float(digits or 0) > 0
    except ValueError:
        return False


__all__ = ["GPU_NODE_TERMS", "GPU_VENDORS", "UNLABELLED_ADVICE", "GpuNode", "GpuResources", "gpu_node",
           "gpu_resources", "is_gpu_node"]
