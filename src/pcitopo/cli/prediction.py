"""The options a domain prediction takes (``pcitopo domain``; ``xmlfix --vmi`` without a domain
argument) and the typed request they make (:class:`~pcitopo.kubevirt.launcher.request.PredictionRequest`):
the commands parse, :mod:`pcitopo.kubevirt.launcher.request` predicts from the request alone."""

from __future__ import annotations

import argparse

from pcitopo.kubevirt.kubelet.settings import KubeletRequest
from pcitopo.kubevirt.kubelet.topologymanager import POLICIES
from pcitopo.kubevirt.launcher.request import PredictionRequest


def add_prediction_args(p: argparse.ArgumentParser, shared: bool = True) -> None:
    """The options a prediction takes (``pcitopo domain``; ``xmlfix --vmi`` without a domain,
    whose own ``--kubevirt`` and ``--cluster`` serve it too: ``shared`` False)."""
    if shared:
        p.add_argument("--kubevirt", metavar="VERSION", help="the KubeVirt release whose virt-launcher builds the domain: "
                       "v1.6.0 to v1.9.0 or main (default: the dump's observedKubeVirtVersion, else v1.9.0); a release "
                       "pcitopo did not read is unknown (exit 4)")
        p.add_argument("--assume-release", metavar="RELEASE", help="build the domain of this release pcitopo read for "
                       "the one --kubevirt or the dump names (v1.9.0 for a v1.9.1, say)")
        p.add_argument("--cluster", metavar="FILE", action="append",
                       help="the cluster dump `pcitopo preflight` reads (`kubectl get kubevirt,plugins.plugin.kubevirt.io,"
                       "namespaces,nodes,vmis,vms -A -o yaml`), with resourceclaims,resourceslices,"
                       "virtualmachineclusterinstancetypes,virtualmachineclusterpreferences added for DRA and instance "
                       "types (- for stdin): the release, the machine type, permittedHostDevices, DRA allocations, "
                       "instance types; nothing in it is required")
    p.add_argument("--devices", metavar="BDF,...", help="the functions kubelet hands the pod, in the order of the "
                   "VMI's gpus, SR-IOV interfaces, hostDevices (a running launcher's PCI_RESOURCE_* values); "
                   "default: picked as `pcitopo pairs` pairs them")
    p.add_argument("--cpu-policy", metavar="POLICY", help="how kubelet's static CPU manager places the pod's CPUs: "
                   "distribute (cpuManagerPolicyOptions distribute-cpus-across-numa, docs/DEPLOY.md's), packed (no "
                   "options); default: the --kubelet-config's, else distribute; devices (spread over every NUMA node "
                   "of the devices) is not kubelet's, a what-if")
    _add_kubelet_args(p)


def _add_kubelet_args(p: argparse.ArgumentParser) -> None:
    """The kubelet options of a prediction (``--cpu-policy`` is :func:`add_prediction_args`'s, shared with xmlfix)."""
    p.add_argument("--topology-policy", metavar="POLICY", help="the node's kubelet topologyManagerPolicy: "
                   f"{', '.join(POLICIES)} (default: the --kubelet-config's, else best-effort, docs/DEPLOY.md's)")
    p.add_argument("--reserved-cpus", metavar="LIST", help="the node's kubelet reservedSystemCPUs (a cpuset list such as "
                   "0,112); default: the --kubelet-config's reservation, else one core taken as kubelet takes it")
    p.add_argument("--kubelet-config", metavar="FILE", help="the node's KubeletConfiguration (/var/lib/kubelet/config.yaml) "
                   "or `pcitopo doctor --kubelet-dir DIR --json`'s report: the CPU manager's policy, options, "
                   "topology manager policy and reservation the pod's CPUs are placed with")


def prediction_request(args: argparse.Namespace) -> PredictionRequest:
    """What the parsed options ask of a prediction (xmlfix's ``--cluster`` and ``--kubevirt``
    serve it too, one dump path or several)."""
    cluster = args.cluster or ()
    return PredictionRequest(
        kubevirt=args.kubevirt, assume_release=args.assume_release,
        cluster=tuple(cluster) if isinstance(cluster, (list, tuple)) else (cluster,), devices=args.devices,
        kubelet=KubeletRequest(cpu_policy=args.cpu_policy, topology_policy=args.topology_policy,
                               reserved_cpus=args.reserved_cpus, kubelet_config=args.kubelet_config))
