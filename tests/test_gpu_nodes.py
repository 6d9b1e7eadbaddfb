"""src/pcitopo/kubevirt/nodes.py: a GPU node is one with a GPU (a GPU resource or a GPU label), and the advice
for one the DaemonSets miss never asks to hand-set a label a labeller manages.

Resource names as the device plugins write them: NVIDIA/kubevirt-gpu-device-plugin
``pkg/device_plugin/device_plugin.go`` (``getDeviceName``: pci.ids name upper-cased, ``/`` ``.``
and blanks as ``_``, nothing but ``[A-Za-z0-9_]``; vGPU: the mdev type name, blanks as ``_``), and
NVIDIA's Network Operator's SR-IOV resources (``nvidia.com/cx6_sriov_vf``), which are NICs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from pcitopo.kubevirt.cluster import read_dump
from pcitopo.kubevirt.cluster_verdict import preflight
from pcitopo.kubevirt.nodes import UNLABELLED_ADVICE, gpu_node, gpu_resources
from pcitopo.kubevirt.targets import target
from testkit import REPO

STRANGER = REPO / "fixtures" / "clusters" / "v1.9.0-stranger.yaml"
PERMITTED = {"nvidia.com/GH100_H100_SXM5_80GB": "10de:2330", "nvidia.com/cx7_vf": "15b3:101e",
             "amd.com/MI300X": "1002:74a1", "nvidia.com/CX7_PF": "15b3:1021"}


def node(name: str, labels: dict | None = None, **allocatable: str) -> dict:
    return {"kind": "Node", "metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": {"cpu": "64", **{k.replace("nvidia__", "nvidia.com/"): v for k, v in allocatable.items()}}}}


@pytest.mark.parametrize("resource", [
    "nvidia.com/GH100_H100_SXM5_80GB",  # sandbox device plugin: pci.ids "GH100 [H100 SXM5 80GB]"
    "nvidia.com/GA100_A100_PCIE_40GB", "nvidia.com/TU104GL_TESLA_T4",
    "nvidia.com/2330",  # the same plugin, a device id pci.ids lacks
    "nvidia.com/NVIDIA_A10-4Q", "nvidia.com/GRID_T4-16Q",  # vGPU: mdev type names
    "nvidia.com/gpu", "nvidia.com/mig-1g.10gb",  # NVIDIA's device plugin (container mode)
    "amd.com/MI300X",  # the CR permits it with AMD's vendor id
])
def test_gpu_resources_are_gpus(resource):
    assert resource in gpu_resources(PERMITTED)


@pytest.mark.parametrize("resource", [
    "nvidia.com/cx6_sriov_vf", "nvidia.com/rdma_shared_device_a", "nvidia.com/hostdev",  # Network Operator
    "nvidia.com/cx7_vf",  # the CR permits it with Mellanox's vendor id
    "nvidia.com/CX7_PF",  # upper case like the sandbox plugin, but the CR says Mellanox
    "cpu", "memory", "hugepages-1Gi", "devices.kubevirt.io/kvm", "intel.com/sriov_netdevice",
])
def test_nic_and_other_resources_are_not(resource):
    assert resource not in gpu_resources(PERMITTED)


def test_a_cpu_worker_with_sr_iov_vfs_is_no_gpu_node_and_a_gpu_node_is():
    rules = gpu_resources(PERMITTED)
    assert gpu_node(node("cpu-01", nvidia__cx6_sriov_vf="16", nvidia__rdma_shared_device_a="63"), rules) is None
    assert gpu_node(node("cpu-02", {"nvidia.com/gpu.present": "false"}, nvidia__cx7_vf="8"), rules) is None
    gpu = gpu_node(node("gpu-01", nvidia__GH100_H100_SXM5_80GB="8", nvidia__cx7_vf="8"), rules)
    assert gpu is not None and gpu.why == ("allocatable nvidia.com/GH100_H100_SXM5_80GB: 8",) and not gpu.daemonset
    zero = gpu_node(node("gpu-02", nvidia__GH100_H100_SXM5_80GB="0"), rules)
    assert zero is None  # advertised, none allocatable: nothing says a GPU is there
    labelled = gpu_node(node("gpu-03", {"feature.node.kubernetes.io/pci-10de.present": "true"}), rules)
    assert labelled is not None and labelled.daemonset


def test_preflight_counts_only_gpu_nodes_on_a_dump_with_cpu_workers_holding_sr_iov_vfs(tmp_path):
    """The dump of the trial: the fixture's nodes plus two CPU workers with the Network Operator's
    resources. Preflight names 4 GPU nodes (not 6), and its advice for the unlabelled one names
    labellers, never `label it nvidia.com/gpu.present=true`."""
    doc = yaml.safe_load(STRANGER.read_text())
    doc["items"] += [node("cpu-01", nvidia__cx6_sriov_vf="16"),
                     node("cpu-02", {"feature.node.kubernetes.io/pci-0200_15b3.present": "true"},
                          nvidia__rdma_shared_device_a="63")]
    dump = tmp_path / "cluster.yaml"
    dump.write_text(yaml.safe_dump(doc))
    names = [n.name for n in preflight(read_dump([str(dump)]), target("kubevirt-v1.9.0")).nodes]
    assert "cpu-01" not in names and "cpu-02" not in names and len(names) == 4
    r = subprocess.run([sys.executable, "-m", "pcitopo.cli.main", "preflight", "--target", "kubevirt-v1.9.0",
                        str(dump)], capture_output=True, text=True, timeout=120)
    assert "gpu nodes: 4; the DaemonSet runs on 3, misses 1" in r.stdout, r.stdout + r.stderr
    (miss,) = [ln for ln in r.stdout.splitlines() if "MISSES" in ln]
    assert UNLABELLED_ADVICE in miss and "label it nvidia.com/gpu.present" not in r.stdout


def test_the_advice_sets_no_label_a_labeller_manages():
    """Only the GPU Operator's input label is ever suggested to set; the labels NFD and GFD own are named
    as what those labellers set."""
    set_by_hand = [part for part in UNLABELLED_ADVICE.split(";") if "you set" in part]
    assert set_by_hand and all("nvidia.com/gpu.workload.config=vm-passthrough" in p for p in set_by_hand)
    assert "nvidia.com/gpu.present" not in UNLABELLED_ADVICE
