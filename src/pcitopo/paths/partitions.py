"""What the fabric means for a host and for one VM: NVLink counts, the boot check, and the
partition table an operator builds GPU pools from.

- :class:`FabricNvlink`: NVLink counts from the fabric (``NV<n>`` between two GPUs of one active
  partition, n = the smaller ``numNvLinksAvailable`` of the two; nothing across partitions).
- :func:`check_gpu_set`: the boot check, one verdict with a one-line message: a VM's NVIDIA GPUs
  get NVLink only when they are exactly one active partition, and full NVLink only when no GPU
  in it has failed links.
- :func:`partition_rows`: per partition, each GPU's best compute NIC (a distinct one per GPU
  where possible) and whether every GPU is PIX to its own NIC.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from pcitopo.model.nvswitch_mgmt import is_compute_nic
from pcitopo.model.tree import NVIDIA, Bdf, PciFunction, Role, Topology
from pcitopo.paths.classify import classify, closeness
from pcitopo.paths.fabric import Fabric, Partition, modules_text

Status = Literal["ok", "no-gpus", "no-fabric", "unknown", "not-a-partition", "inactive", "failed-links"]


class FabricNvlink:
    """NVLink counts from the fabric; same interface as :class:`pcitopo.paths.classify.NvlinkOracle`.
    ``partitions`` limits the answer to these (the guest of one VM sees only its own)."""

    def __init__(self, fabric: Fabric, partitions: Iterable[Partition] | None = None):
        self.fabric = fabric
        parts = fabric.partitions if partitions is None else tuple(partitions)
        self._links: dict[frozenset[Bdf], int] = {}
        for p in parts:
            if not p.active:
                continue
            for a in p.gpus:
                for b in p.gpus:
                    if a is not b and a.bdf is not None and b.bdf is not None:
                        n = min(a.links, b.links)
                        if n > 0:
                            self._links[frozenset((a.bdf, b.bdf))] = n
        self.source = f"fabric file {fabric.path} (active partitions only; {fabric.bdf_origin})"

    def count(self, fa: PciFunction, fb: PciFunction) -> int | None:
        return self._links.get(frozenset((fa.bdf, fb.bdf)))


@dataclass(frozen=True)
class NvlinkVerdict:
    status: Status
    message: str
    partition: Partition | None = None

    @property
    def nvlink_ok(self) -> bool:
        """Nothing to complain about (the set is an active partition with all links, or the
        domain has no NVIDIA GPU)."""
        return self.status in ("ok", "no-gpus")

    def guest_nvlink(self, fabric: Fabric | None) -> FabricNvlink | None:
        """The NVLink the guest will have: only inside its own partition, when that is active."""
        if fabric is None or self.partition is None or not self.partition.active:
            return None
        return FabricNvlink(fabric, [self.partition])


def nvidia_gpus(host: Topology, bdfs: Iterable[Bdf]) -> list[Bdf]:
    out = []
    for b in bdfs:
        f = host.find(b)
        if f is not None and f.vendor == NVIDIA and host.role(f) == Role.GPU and not f.is_vf:
            out.append(f.bdf)
    return sorted(set(out))


def _bdfs_text(bdfs: Iterable[Bdf | None]) -> str:
    return ",".join(str(b) if b is not None else "?" for b in bdfs)


def _part_text(p: Partition) -> str:
    state = "active" if p.active else "inactive"
    return f"partition {p.id} modules {p.modules_text()} ({_bdfs_text(g.bdf for g in sorted(p.gpus, key=lambda g: g.module))}, {state})"


def nearest_partitions(fabric: Fabric, modules: frozenset[int], limit: int = 3) -> list[Partition]:
    """Partitions closest to a module set: fewest differing GPUs, then most shared; single-GPU
    partitions only for a single GPU; degraded partitions last."""
    cands = [p for p in fabric.partitions if len(p.gpus) > 1 or len(modules) <= 1]
    cands.sort(key=lambda p: (
        any(g.degraded for g in p.gpus) and len(p.gpus) > 1,
        len(p.modules ^ modules), -len(p.modules & modules), p.id,
    ))
    return [p for p in cands if p.modules & modules][:limit]


def check_gpu_set(fabric: Fabric | None, gpus: list[Bdf]) -> NvlinkVerdict:
    """The boot check for a VM's NVIDIA GPUs (``gpus``, host BDFs)."""
    if not gpus:
        return NvlinkVerdict("no-gpus", "no NVIDIA GPU in the domain: no NVLink to check")
    listed = _bdfs_text(gpus)
    if fabric is None:
        return NvlinkVerdict(
            "no-fabric",
            f"no fabric file: cannot tell whether GPUs {listed} will have NVLink "
            "(start pcitopo with --fabric FILE, the output of `fmpm -l` where Fabric Manager runs)",
        )
    modules = {b: fabric.module_of(b) for b in gpus}
    missing = [b for b, m in modules.items() if m is None]
    if missing and not fabric.mapped:
        unmapped = sorted({g.module for p in fabric.partitions for g in p.gpus if g.bdf is None})
        return NvlinkVerdict(
            "unknown",
            f"fabric file {fabric.path} gives placeholder BDFs for modules {modules_text(unmapped)} and no module map "
            f"names them, so the partition of GPUs {listed} is unknown (give --module-map FILE, "
            '{"gpus": [{"module", "bdf"}]}, e.g. from `nvidia-smi --query-gpu=module_id,pci.bus_id` before vfio-pci)',
        )
    if missing:
        return NvlinkVerdict("not-a-partition", f"GPU {_bdfs_text(missing)} is in no partition of fabric file {fabric.path}: "
                             "no NVLink in the guest")
    want = frozenset(m for m in modules.values() if m is not None)
    exact = next((p for p in fabric.partitions if p.modules == want), None)
    if exact is None:
        near = "; ".join(_part_text(p) for p in nearest_partitions(fabric, want)) or "none"
        return NvlinkVerdict(
            "not-a-partition",
            f"GPUs {listed} are modules {modules_text(want)}, which is no fabric partition, so the guest gets no NVLink; "
            f"nearest valid GPU sets: {near}",
        )
    return _check_partition(fabric, exact, listed)


def _check_partition(fabric: Fabric, p: Partition, listed: str) -> NvlinkVerdict:
    if not p.active:
        busy = [q for q in fabric.partitions if q.active and q.modules & p.modules]
        extra = (f" (first deactivate {', '.join(f'partition {q.id} {q.modules_text()}' for q in busy)}, which holds some of them)"
                 if busy else "")
        return NvlinkVerdict(
            "inactive",
            f"GPUs {listed} are partition {p.id} modules {p.modules_text()}, which is not active: activate it "
            f"(`fmpm -a {p.id}`){extra} before the VM starts, or the guest gets no NVLink",
            p,
        )
    bad = [g for g in p.gpus if g.degraded] if len(p.gpus) > 1 else []
    if bad:
        worst = ", ".join(f"module {g.module} ({g.bdf}) has {g.links} of {g.max_links}" for g in sorted(bad, key=lambda g: g.module))
        good = [q for q in fabric.partitions if len(q.gpus) == len(p.gpus) and not any(g.degraded for g in q.gpus)]
        alt = "; ".join(_part_text(q) for q in good[:3]) or "none of this size"
        return NvlinkVerdict(
            "failed-links",
            f"GPUs {listed} are active partition {p.id} modules {p.modules_text()}, but {worst} NVLinks available: "
            f"the guest's NVLink is degraded; partitions of this size with all links: {alt}",
            p,
        )
    links = min((g.links for g in p.gpus), default=0)
    what = f"NV{links}" if len(p.gpus) > 1 and links else "a single GPU, no NVLink peers"
    return NvlinkVerdict("ok", f"GPUs {listed} are active partition {p.id} modules {p.modules_text()}: {what}", p)


# -- pcitopo partitions ------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuRow:
    module: int
    bdf: Bdf | None
    label: str | None
    nic: Bdf | None
    nic_label: str | None
    nic_class: str | None
    links: int = 0  # NVLinks available now / the most the GPU can have (the fabric's numbers)
    max_links: int = 0


@dataclass(frozen=True)
class PartitionRow:
    partition: Partition
    gpus: tuple[GpuRow, ...]
    # None: some GPU's BDF is unknown (placeholder BDFs, no module map), so nobody can say.
    all_pix: bool | None

    @property
    def degraded(self) -> list[GpuRow]:
        """GPUs with fewer NVLinks than they can have: the partition's NVLink is degraded."""
        return [g for g in self.gpus if g.links < g.max_links]

    def degraded_text(self) -> str:
        return "; ".join(f"module {g.module} has {g.links} of {g.max_links} NVLinks" for g in self.degraded)


def compute_nics(host: Topology) -> list[PciFunction]:
    """Compute NICs: NIC physical functions, one per device (ports merge, as in NCCL), never an
    NVLink-switch management function."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for f in host.functions():
        if f.is_vf or not is_compute_nic(host, f) or f.bdf.device_key in seen:
            continue
        seen.add(f.bdf.device_key)
        out.append(f)
    return out


def _match_pix(gpus: list[Bdf], pix: dict[Bdf, list[Bdf]]) -> dict[Bdf, Bdf]:
    """A maximum matching of GPUs to distinct NICs over PIX pairs (augmenting paths)."""
    owner: dict[Bdf, Bdf] = {}

    def assign(g: Bdf, seen: set[Bdf]) -> bool:
        for n in pix.get(g, []):
            if n in seen:
                continue
            seen.add(n)
            if n not in owner or assign(owner[n], seen):
                owner[n] = g
                return True
        return False

    for g in gpus:
        assign(g, set())
    return {g: n for n, g in owner.items()}


def partition_rows(host: Topology, fabric: Fabric, labels: dict[Bdf, str]) -> list[PartitionRow]:
    nics = compute_nics(host)
    rows = []
    for p in fabric.partitions:
        bdfs = [g.bdf for g in p.gpus if g.bdf is not None and host.find(g.bdf) is not None]
        ranked: dict[Bdf, list[tuple[int, Bdf]]] = {}
        for g in bdfs:
            # classify.closeness: NCCL's class decides, nvidia-smi's breaks ties (rank 0: PIX)
            ranked[g] = sorted((*closeness(classify(host, g, n.bdf)), n.bdf) for n in nics)
        pix = {g: [n for r, _, n in ranked[g] if r == 0] for g in bdfs}
        matched = _match_pix(bdfs, pix)
        out = []
        for g in sorted(p.gpus, key=lambda g: g.module):
            if g.bdf is None or g.bdf not in ranked:
                out.append(GpuRow(g.module, g.bdf, None, None, None, None, g.links, g.max_links))
                continue
            nic = matched.get(g.bdf) or (ranked[g.bdf][0][2] if ranked[g.bdf] else None)
            cls = classify(host, g.bdf, nic).nccl.value if nic is not None else None
            out.append(GpuRow(g.module, g.bdf, labels.get(g.bdf), nic, labels.get(nic) if nic else None, cls,
                              g.links, g.max_links))
        unknown = any(r.bdf is None or r.bdf not in ranked for r in out)
        all_pix = None if unknown else bool(out) and all(r.bdf in matched for r in out)
        rows.append(PartitionRow(p, tuple(out), all_pix))
    return rows


def partitions_json(fabric: Fabric, rows: list[PartitionRow]) -> dict:
    return {
        "fabric": fabric.path,
        "bdf_source": fabric.source,
        "partitions": [
            {
                "id": r.partition.id,
                "active": r.partition.active,
                "gpus": [
                    {"bdf": str(g.bdf) if g.bdf else None, "module": g.module, "label": g.label,
                     "nic": str(g.nic) if g.nic else None, "nic_class": g.nic_class,
                     "nvlinks": {"available": g.links, "max": g.max_links}}
                    for g in r.gpus
                ],
                "all_pix": r.all_pix,
                "degraded": bool(r.degraded),
            }
            for r in rows
        ],
    }


MAPPING_UNKNOWN = ("NICs unknown: the fabric's GPU BDFs are placeholders; give --module-map FILE (module ID -> BDF) "
                   "to see each GPU's NIC and whether every GPU is PIX to its own NIC")


def partitions_text(fabric: Fabric, rows: list[PartitionRow]) -> str:
    lines = [f"Fabric {fabric.path}: {len(rows)} partitions, {fabric.bdf_origin}", ""]
    if any(r.all_pix is None for r in rows):
        lines.insert(1, MAPPING_UNKNOWN)
    for r in rows:
        p = r.partition
        pix = "unknown" if r.all_pix is None else "yes" if r.all_pix else "no"
        degraded = f"  degraded: {r.degraded_text()}" if r.degraded else ""
        lines.append(
            f"Partition {p.id:<3} {'active  ' if p.active else 'inactive'}  modules {p.modules_text():<19} "
            f"every GPU PIX to its own NIC: {pix}{degraded}"
        )
        for g in r.gpus:
            gpu = f"{g.label or '?'} {g.bdf or 'unmapped'}"
            nic = (f"{g.nic_label or '?'} {g.nic} {g.nic_class}" if g.nic else
                   "NIC unknown (GPU BDF unknown)" if g.bdf is None else "no compute NIC")
            lines.append(f"    module {g.module}  {gpu:<18}  {nic:<22}  NVLinks {g.links}/{g.max_links}")
    lines += ["", "NIC classes are NCCL's (GPUDirect RDMA needs PXB or closer); each GPU gets a NIC of its own where one is PIX."]
    return "\n".join(lines) + "\n"
