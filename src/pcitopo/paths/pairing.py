"""GPU-NIC pairs: each GPU's best NIC on the host, whether aligning by DRA's ``pcieRoot`` alone
gets a GPU a NIC of that class, and whether a VM was given one.

The classifier (:mod:`.classify`) is the only judge of a pair. Classes are compared in NCCL's
view, the one that decides GPUDirect RDMA (used at PXB or closer); nvidia-smi's class only
breaks ties when naming a GPU's best NIC (on a two-level Broadcom complex NCCL says PIX to both
NICs of the complex, nvidia-smi PIX to one of them). A GPU whose best NIC is PHB or worse has
nothing to pair: no allocation gives it GPUDirect RDMA, so it is never named.

``pcieRoot`` is Kubernetes' standard device attribute ``resource.kubernetes.io/pcieRoot``
(k8s.io/dynamic-resource-allocation, package ``deviceattribute``): the first component of the
device's realpath below ``/sys/devices``, ``pci<domain>:<bus>`` of its root bus. A claim with
``matchAttribute: resource.kubernetes.io/pcieRoot`` gives a GPU *some* NIC of its root complex,
which is enough only when some NIC is there and every one is of the GPU's best class: decided
per host (on Intel HGX boards each switch has a root complex of its own; on AMD boards one root
complex carries several root ports and their switches; on a PCIe server with the NIC on another
root complex than every GPU, such a claim never allocates).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from pcitopo.model.keep import PerModel, Recent, recent
from pcitopo.model.labels import default_devices, host_label, host_labels
from pcitopo.model.tree import Bdf, PciFunction, Role, Topology
from pcitopo.paths.classify import Nccl, PairClass, classify, closeness

GDR_CLASSES = (Nccl.PIX, Nccl.PXB)  # NCCL_NET_GDR_LEVEL's default: GPUDirect RDMA at PXB or closer


def pcie_root(f: PciFunction) -> str:
    """What Kubernetes publishes as ``resource.kubernetes.io/pcieRoot`` for ``f``:
    ``pci<domain>:<bus>``, the root-complex directory its realpath starts with."""
    return f.root_complex


def class_text(cls: PairClass) -> str:
    """``PXB``, or ``PHB (nvidia-smi NODE)`` where the two views differ."""
    return cls.nccl.value if cls.nccl.value == cls.nvml.value else f"{cls.nccl.value} (nvidia-smi {cls.nvml.value})"


@dataclass(frozen=True, slots=True)
class GpuPair:
    """A GPU and its best NIC among some NICs (``nic`` None when there were none)."""

    gpu: PciFunction
    nic: PciFunction | None
    cls: PairClass | None

    @property
    def gdr(self) -> bool:
        """A NIC at PXB or closer in NCCL's view: GPUDirect RDMA possible."""
        return self.cls is not None and self.cls.nccl in GDR_CLASSES

    def worse_than(self, other: GpuPair) -> bool:
        """This pair's NIC is further than ``other``'s in NCCL's view (no NIC is the furthest)."""
        if other.cls is None:
            return False
        return self.cls is None or closeness(self.cls)[0] > closeness(other.cls)[0]


def best_nic(topo: Topology, gpu: PciFunction, nics: Iterable[PciFunction]) -> GpuPair:
    """The closest NIC to ``gpu`` (:func:`.classify.closeness`, then the lower BDF)."""
    best: tuple[tuple[int, int, Bdf], PciFunction, PairClass] | None = None
    for n in nics:
        cls = classify(topo, gpu, n)
        key = (*closeness(cls), n.bdf)
        if best is None or key < best[0]:
            best = (key, n, cls)
    return GpuPair(gpu, None, None) if best is None else GpuPair(gpu, best[1], best[2])


@dataclass(frozen=True, slots=True)
class HostPair:
    """A GPU's best NIC on the host, and the host's NICs on its pcieRoot with their classes."""

    best: GpuPair
    same_root: tuple[tuple[PciFunction, PairClass], ...]

    @property
    def pcie_root_enough(self) -> bool:
        """A claim matching this GPU and a NIC on pcieRoot can be satisfied (some NIC shares its
        root) and gets it a NIC of its best class (NCCL): every NIC on its root is of that class.
        False for a GPU no NIC shares a root with, whatever its best class: such a claim never
        allocates."""
        want = self.best.cls.nccl if self.best.cls else None
        return bool(self.same_root) and all(c.nccl == want for _, c in self.same_root)

    @property
    def pcie_root_loses_gdr(self) -> bool:
        """This GPU has a NIC at PXB or closer on the host, but pcieRoot alignment alone may give
        it none or a worse one (what the fleet counts: a GPU with nothing to pair loses nothing)."""
        return self.best.gdr and not self.pcie_root_enough


def host_nics(topo: Topology) -> list[PciFunction]:
    """The host's compute NICs (physical functions, as ``pcitopo topo`` lists them)."""
    return [f for f in (topo.function(b) for b in default_devices(topo)) if topo.role(f) == Role.NIC]


def host_pair(topo: Topology, gpu: PciFunction) -> HostPair:
    """``gpu``'s best NIC on the host and its pcieRoot's NICs; remembered for the life of the
    topology (the hook asks once per GPU per call)."""

    def compute() -> HostPair:
        nics = host_nics(topo)
        root = pcie_root(gpu)
        same = tuple((n, classify(topo, gpu, n)) for n in nics if pcie_root(n) == root)
        return HostPair(best_nic(topo, gpu, nics), same)

    pairs = _HOST_PAIRS(topo)
    got = pairs.get(gpu.bdf)
    if got is None:
        got = pairs[gpu.bdf] = compute()
    return got


# Each GPU's host pair, per host model; the pairing verdict per set of a VM's devices, for the
# last few allocations.
_HOST_PAIRS: PerModel[dict[Bdf, HostPair]] = PerModel(lambda topo: {})
VM_PAIRS: PerModel[Recent[tuple[Bdf, ...], PairingVerdict]] = recent()


@dataclass(frozen=True)
class HostPairs:
    """Every GPU of a host with its best NIC (``pcitopo pairs``)."""

    host: str
    pairs: tuple[HostPair, ...]
    labels: dict[Bdf, str]

    @property
    def not_served_by_pcie_root(self) -> list[HostPair]:
        return [p for p in self.pairs if not p.pcie_root_enough]


def host_pairs(topo: Topology) -> HostPairs:
    gpus = [topo.function(b) for b in default_devices(topo) if topo.role(b) == Role.GPU]
    return HostPairs(topo.label, tuple(host_pair(topo, g) for g in gpus), dict(host_labels(topo)))


# -- a VM's allocation -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PairingFinding:
    """A GPU of the VM whose best NIC in the VM is further than its best NIC on the host."""

    got: GpuPair
    host: GpuPair
    labels: dict[Bdf, str]

    def _name(self, f: PciFunction) -> str:
        """``host GPU0 (0000:1a:00.0)``, as the host numbers it (:func:`host_label`: never to be
        read as the VM's own GPU0); a VF or other unnumbered function by BDF."""
        return f"{host_label(self.labels[f.bdf])} ({f.bdf})" if f.bdf in self.labels else str(f.bdf)

    @property
    def gpu_name(self) -> str:
        """The GPU alone: ``host GPU0``, or its BDF."""
        g = self.got.gpu.bdf
        return host_label(self.labels[g]) if g in self.labels else str(g)

    @property
    def line(self) -> str:
        # Findings are made only where the host has a NIC at PXB or closer and the VM has NICs,
        # so both pairs have a NIC and a class.
        got, best = self.got, self.host
        return (f"{self._name(got.gpu)} got {self._name(got.nic)} at {class_text(got.cls)}; "  # type: ignore[arg-type]
                f"{self._name(best.nic)} would be {class_text(best.cls)}")  # type: ignore[arg-type]


@dataclass(frozen=True)
class PairingVerdict:
    """The pairing check on a VM's devices: ``ok`` (every GPU has a NIC of its host-best class,
    or has nothing to pair), ``worse`` (``findings`` says which), ``no-nics`` (a VM without
    NICs is never warned), ``no-gpus``."""

    status: str
    findings: tuple[PairingFinding, ...] = ()
    gpus_checked: int = 0

    @property
    def lines(self) -> list[str]:
        return [f.line for f in self.findings]

    @property
    def message(self) -> str:
        """One line for a refusal: the first finding, and how many more."""
        more = f" (and {len(self.findings) - 1} more GPU(s))" if len(self.findings) > 1 else ""
        return f"{self.findings[0].line}{more}" if self.findings else self.status

    def as_json(self, policy: str) -> dict:
        return {"policy": policy, "status": self.status, "gpus_checked": self.gpus_checked, "findings": self.lines}


def check_vm_pairs(topo: Topology, bdfs: Sequence[Bdf]) -> PairingVerdict:
    """Compare, for each GPU among a VM's devices (``bdfs``, on the host), its best NIC among
    the VM's NICs with its best NIC on the host. Remembered per set of devices on ``topo``."""
    key = tuple(dict.fromkeys(bdfs))
    return VM_PAIRS(topo).get(key, lambda: _check_vm_pairs(topo, key))


def _check_vm_pairs(topo: Topology, bdfs: tuple[Bdf, ...]) -> PairingVerdict:
    fs = [topo.function(b) for b in bdfs]
    gpus = [f for f in fs if topo.role(f) == Role.GPU and not f.is_vf]
    nics = [f for f in fs if topo.role(f) == Role.NIC]
    if not gpus:
        return PairingVerdict("no-gpus")
    if not nics:
        return PairingVerdict("no-nics", gpus_checked=len(gpus))
    labels = host_labels(topo)
    findings = []
    for g in gpus:
        host = host_pair(topo, g).best
        got = best_nic(topo, g, nics)
        if host.gdr and got.worse_than(host):
            findings.append(PairingFinding(got, host, labels))
    return PairingVerdict("worse" if findings else "ok", tuple(findings), len(gpus))


# -- GPUDirect RDMA in the guest (xmlfix --check) ---------------------------------------------

GDR_TEXT = "a NIC at PIX or PXB"  # NCCL_NET_GDR_LEVEL's default reach, in the verdict's words


@dataclass(frozen=True, slots=True)
class GpuGdr:
    """One GPU of a VM: its best NIC on the host, its best NIC among the VM's (host classes),
    and the best NCCL class the guest shows it to any of the VM's NICs."""

    host: GpuPair
    got: GpuPair
    guest: Nccl | None

    @property
    def gdr(self) -> bool:
        """The guest gives it GPUDirect RDMA: some NIC of the VM at PXB or closer."""
        return self.guest in GDR_CLASSES

    @property
    def lost(self) -> bool:
        """The node has a NIC at PXB or closer for it, the guest none: what --check fails on."""
        return self.host.gdr and not self.gdr


@dataclass(frozen=True)
class GdrVerdict:
    """GPUDirect RDMA of a VM's GPUs in its guest: one rule for the verdict line and for
    ``--check``. ``nics`` 0: the VM has no NIC and is not judged."""

    gpus: tuple[GpuGdr, ...]
    nics: int
    labels: dict[Bdf, str]

    def _name(self, f: PciFunction | None) -> str:
        if f is None:
            return "none"
        return f"{host_label(self.labels[f.bdf])} ({f.bdf})" if f.bdf in self.labels else str(f.bdf)

    @property
    def judged(self) -> bool:
        return bool(self.gpus) and self.nics > 0

    @property
    def lost(self) -> list[GpuGdr]:
        return [g for g in self.gpus if g.lost] if self.judged else []

    @property
    def summary(self) -> str | None:
        """The verdict's part: ``GPUDirect RDMA: 4/8 GPUs have a NIC at PIX or PXB in the guest``,
        naming the GPUs the node itself offers nothing better; None for a VM without GPUs."""
        if not self.gpus:
            return None
        if not self.nics:
            return "GPUDirect RDMA: not judged (no NIC in the VM)"
        text = f"GPUDirect RDMA: {sum(g.gdr for g in self.gpus)}/{len(self.gpus)} GPUs have {GDR_TEXT} in the guest"
        bare = [g for g in self.gpus if not g.gdr and not g.host.gdr]
        if bare:
            who = ", ".join(self._name(g.host.gpu).split(" (")[0] for g in bare)
            text += f" ({len(bare)} without: the node has none for {who})"
        return text

    @property
    def lines(self) -> list[str]:
        """What ``--check`` fails on, one line per GPU that lost GPUDirect RDMA."""
        out = []
        for g in self.lost:
            near = f"{self._name(g.got.nic)}, {g.guest.value if g.guest else 'not placed'} in the guest" if g.got.nic else "none"
            out.append(f"GPUDirect RDMA: {self._name(g.host.gpu)} has no NIC at PIX or PXB in the guest (its nearest: "
                       f"{near}); the node has {self._name(g.host.nic)} at {class_text(g.host.cls)} for it")  # type: ignore[arg-type]
        return out


def gdr_verdict(topo: Topology, bdfs: Sequence[Bdf], guest_class: Callable[[Bdf, Bdf], Nccl | None]) -> GdrVerdict:
    """Judge each GPU of a VM (``bdfs``, on the host): does the guest give it a NIC at PXB or
    closer (``guest_class``: the NCCL class the guest shows between two host BDFs, None when
    not placed), and does the node have one for it (:func:`host_pair`)? GPUs as the pairing
    check counts them (physical functions), NICs any compute function of the VM."""
    fs = [topo.function(b) for b in dict.fromkeys(bdfs)]
    gpus = [f for f in fs if topo.role(f) == Role.GPU and not f.is_vf]
    nics = [f for f in fs if topo.role(f) == Role.NIC]
    out = []
    for g in gpus:
        seen = [c for c in (guest_class(g.bdf, n.bdf) for n in nics) if c is not None]
        guest = min(seen, key=list(Nccl).index) if seen else None
        out.append(GpuGdr(host_pair(topo, g).best, best_nic(topo, g, nics), guest))
    return GdrVerdict(tuple(out), len(nics), dict(host_labels(topo)))
