"""Device labels as nvidia-smi numbers them (GPU0.., NIC0..): one rule, used by the matrices,
the prediction and the pictures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from .model import Bdf, PciFunction, Role, Topology

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
