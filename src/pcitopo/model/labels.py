"""Device labels as nvidia-smi numbers them (GPU0.., NIC0..), and which devices a host's views
and checks list by default: one rule each, used by the matrices, the prediction, the pictures
and the doctor."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pcitopo.model.keep import PerModel
from pcitopo.model.nvswitch_mgmt import management_reason
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology

LABEL_PREFIX = {Role.GPU: "GPU", Role.NIC: "NIC", Role.NVME: "NVME", Role.NVSWITCH: "NVSW"}


@dataclass(frozen=True, slots=True)
class Labeled:
    label: str
    function: PciFunction
    role: Role


def label_devices(topo: Topology, bdfs: Iterable[Bdf]) -> list[Labeled]:
    """GPU0.., NIC0.. in BDF order, as nvidia-smi numbers them; other roles DEV0.."""
    fs = sorted((topo.function(b) for b in bdfs), key=lambda f: f.bdf)
    counters: dict[str, int] = {}
    out = []
    for group in ("GPU", "NIC", "NVME", "NVSW", "DEV"):
        for f in fs:
            role = topo.role(f)
            if LABEL_PREFIX.get(role, "DEV") != group:
                continue
            n = counters.get(group, 0)
            counters[group] = n + 1
            out.append(Labeled(f"{group}{n}", f, role))
    return out


def default_devices(topo: Topology, include_vfs: bool = False) -> list[Bdf]:
    """GPUs and compute NICs of the host (physical functions only unless asked); ConnectX
    functions that manage NVLink switch chips are not NICs a workload uses (nvswitch_mgmt)."""
    out = []
    for f in topo.functions():
        role = topo.role(f)
        if role in (Role.GPU, Role.NIC) and (include_vfs or not f.is_vf):
            if role == Role.NIC and management_reason(topo, f) is not None:
                continue
            out.append(f.bdf)
    return out


def host_labels(topo: Topology) -> Mapping[Bdf, str]:
    """GPU0.., NIC0.. over all the host's GPUs and NICs (as ``pcitopo topo`` and ``partitions``
    number them), so a device's label does not depend on which others were named. Read once per
    host model (the hook's pairing check asks on every call)."""
    return _HOST_LABELS(topo)


_HOST_LABELS: PerModel[Mapping[Bdf, str]] = PerModel(lambda topo: MappingProxyType(
    {lab.function.bdf: lab.label for lab in label_devices(topo, default_devices(topo))}))


def host_label(label: str) -> str:
    """A host-numbered label (:func:`host_labels`) where VM-numbered ones may be shown too
    (``xmlfix``, the hook: the matrices and the legend number the VM's own devices, as the
    guest's nvidia-smi does): ``host NIC0``, so one name never means two devices."""
    return f"host {label}"


_LABEL = re.compile(r"\b((?:GPU|NIC|NVME|NVSW|DEV)\d+)\b")


def mark_host_labels(text: str) -> str:
    """Every numbered label in ``text`` (host-numbered: the doctor's findings) as
    :func:`host_label` writes it: ``downstream-port above host NIC0``."""
    return _LABEL.sub(lambda m: host_label(m.group(1)), text)


def rdma_name(topo: Topology, f: PciFunction) -> str | None:
    """The RDMA device name of a function (``mlx5_0``) where the host has one: what
    ``nvidia-smi topo -m`` names a NIC by. None where the loader cannot tell (a guest layout)
    or the function registered none (bound to vfio-pci)."""
    names = topo.extra("rdma_names", f.bdf)
    return ",".join(names) if names else None
