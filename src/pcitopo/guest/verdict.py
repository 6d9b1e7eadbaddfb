"""What the guest will see, judged pair by pair: the verdict line, what ``--check`` fails on, and
the prediction ``xmlfix --json`` prints (and ``pcitopo verify`` checks inside the guest).

A pair "matters" in a view only where that view uses the PCIe path: two GPUs joined by NVLink
read ``NV#`` in ``nvidia-smi topo -m`` on both sides, and NCCL routes them over NVLink, so a
PCIe class difference between them is listed nowhere (it is counted once, as a footnote).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pcitopo.guest.rewrite import Why
from pcitopo.host.sources import LEFT_OUT
from pcitopo.model.keep import recent
from pcitopo.model.labels import label_devices
from pcitopo.model.tree import MELLANOX, Bdf, Role, Topology
from pcitopo.nccl.price import nccl_tree, path_bandwidth
from pcitopo.paths.classify import NvlinkOracle
from pcitopo.paths.pairing import GDR_CLASSES, GdrVerdict, gdr_verdict

if TYPE_CHECKING:
    from pcitopo.guest.rewrite import PairReport, RewriteResult

# Short forms of the rewrite's reasons (``PairReport.why``), for the verdict line; the full
# reason is printed in the explanation.
SHORT_REASONS = {
    Why.BROADCOM_COLLAPSE: "by design (Broadcom flattening)",
    Why.NO_ACPI: "(no ACPI: the guest sees no NUMA)",
    Why.NO_CELLS: "(no guest NUMA cells)",
    Why.MISSING_CELLS: "(a device's host node has no guest cell)",
    Why.UNEXPRESSIBLE: "(host firmware NUMA mismatch: no guest can show it)",
    Why.NOT_PLACED: "(not placed in the guest)",
}
KUBEVIRT_NUMA_ADVICE = (
    "the VM has no guest NUMA cells tied to host nodes. In KubeVirt set "
    "spec.domain.cpu.dedicatedCpuPlacement: true, spec.domain.cpu.numa.guestMappingPassthrough: {} "
    "and spec.domain.memory.hugepages.pageSize (e.g. 1Gi): virt-launcher then writes one guest "
    "cell per host node the VM's CPUs come from (<numatune><memnode>), and pcitopo puts each "
    "expander bus on its host node's cell"
)


def short_reason(why: Why | None) -> str:
    return SHORT_REASONS.get(why, f"({why})") if why is not None else ""


@dataclass(frozen=True)
class PairView:
    """One pair as a reader of the matrices sees it."""

    p: PairReport
    labels: tuple[str, str]
    nvlink: int | None

    def differs(self, view: str) -> bool:
        """Whether this view shows the pair differently in the guest (and it matters)."""
        if self.nvlink:
            return False
        if self.p.guest is None:
            return True
        return getattr(self.p.host, view) != getattr(self.p.guest, view)

    def transition(self, view: str) -> str:
        h = getattr(self.p.host, view).value
        return f"{h}→{getattr(self.p.guest, view).value if self.p.guest else '?'}"

    @property
    def by_design(self) -> bool:
        return self.p.why is Why.BROADCOM_COLLAPSE

    @property
    def name(self) -> str:
        return f"{self.labels[0]}-{self.labels[1]}"


def guest_nvlink(result: RewriteResult, host: Topology, fabric=None):
    """What gives the guest's NV# (an object with ``count(fa, fb)``), or None for no NVLink.

    Without a fabric file (src/pcitopo/paths/fabric.py): the SXM board table's inference. With one: the
    NVLink check's verdict (``report.nvlink``, src/pcitopo/serve/core.py ``nvlink_check``) decides, so
    the guest has NV# only inside its own partition when that is active; None when the check
    did not run (``pcitopo.kubevirt.io/nvlink: off``)."""
    if fabric is None:
        return NvlinkOracle(host)
    verdict = result.report.nvlink
    return verdict.guest_nvlink(fabric) if verdict is not None else None


def placed_labels(result: RewriteResult, host: Topology) -> dict[Bdf, str]:
    """GPU0.., NIC0.. over the VM's own devices, as nvidia-smi in the guest numbers them."""
    return {lab.function.bdf: lab.label for lab in label_devices(host, [d.host for d in result.report.placed])}


def pair_views(result: RewriteResult, host: Topology, fabric=None) -> list[PairView]:

    label_of = placed_labels(result, host)
    oracle = guest_nvlink(result, host, fabric)

    def links(p: PairReport) -> int | None:
        return oracle.count(host.function(p.a), host.function(p.b)) if oracle is not None else None

    return [PairView(p, (label_of[p.a], label_of[p.b]), links(p)) for p in result.report.pairs]


def guest_ib_hcas(result: RewriteResult, host: Topology) -> list[tuple[str, str]]:
    """The RDMA device names the guest will give the VM's GPUDirect RDMA NICs, in guest PCI
    order, as ``(name, host label)``. Inside the guest the mlx5 driver names every ConnectX or
    BlueField function it binds ``mlx5_0``, ``mlx5_1``, ... in probe order, which is PCI order;
    a NIC counts when NCCL puts it at PXB or closer to a placed GPU (GPUDirect RDMA's reach)."""
    report = result.report
    labels = placed_labels(result, host)
    mlx = sorted((d for d in report.placed if d.guest is not None and d.role == Role.NIC.value
                  and host.function(d.host).vendor == MELLANOX), key=lambda d: d.guest)
    gpus = {d.host for d in report.placed if d.role == Role.GPU.value}
    near = {end for p in report.pairs if p.guest is not None and p.guest.nccl in GDR_CLASSES
            and (p.a in gpus) != (p.b in gpus) for end in (p.a, p.b) if end not in gpus}
    return [(f"mlx5_{i}", labels[d.host]) for i, d in enumerate(mlx) if d.host in near]


def pair_counts(result: RewriteResult, host: Topology, fabric=None) -> dict[str, int]:
    """The one count of pairs the guest shows as the host does, per view: what ``--explain``'s
    verdict and ``--check`` print, the hook's log line carries (``pairs_nccl_equal``,
    ``pairs_nvml_equal``) and the ``--dot`` pictures' titles say. A pair counts when the tool
    prints the same for it in the guest as on the host (:meth:`PairView.differs`): two GPUs
    joined by NVLink print ``NV#`` on both sides, whatever the PCIe path beneath."""
    def count() -> dict[str, int]:
        views = pair_views(result, host, fabric)
        return {
            "pairs": len(views),
            "pairs_nccl_equal": sum(not v.differs("nccl") for v in views),
            "pairs_nvml_equal": sum(not v.differs("nvml") for v in views),
        }

    layout = result.guest.layout if result.guest is not None else None
    if fabric is not None or layout is None:
        return count()
    # without a fabric file the counts follow from the guest's layout and the placed devices
    # (their classes on both sides, the board table's NV#): one per allocation
    return dict(PAIR_COUNTS(host).get((layout, tuple(d.host for d in result.report.placed)), count))


# The counts without a fabric file, per host model, for the last few allocations.
PAIR_COUNTS = recent()


def _view_summary(views: list[PairView], view: str, title: str) -> str:
    n = len(views)
    diff = Counter((v.transition(view), short_reason(v.p.why)) for v in views if v.differs(view))
    same = n - sum(diff.values())
    text = f"{title}: {same}/{n} pairs as on the host"
    if diff:
        text += ", " + ", ".join(f"{c} {t} {why}" for (t, why), c in sorted(diff.items(), key=lambda kv: -kv[1]))
    return text


def verdict(result: RewriteResult, host: Topology, fabric=None) -> str:
    """One line: how many pairs each view shows as on the host, and why the others differ."""
    if not result.report.placed:
        return "no PCI hostdevs: nothing to mirror, the guest sees no host device"
    views = pair_views(result, host, fabric)
    parts = [_view_summary(views, "nccl", "NCCL"), _view_summary(views, "nvml", "nvidia-smi")]
    gdr = gdr_in_guest(result, host).summary
    if gdr:
        parts.append(gdr)
    if not result.report.numa_map and result.report.placed:
        parts.append("NUMA: no guest cells")
    if result.report.missing_cells is not None:
        parts.append(result.report.missing_cells.short)
    pairing = pairing_summary(result)
    if pairing:
        parts.append(pairing)
    return "; ".join(parts)


def pairing_summary(result: RewriteResult) -> str | None:
    """The pairing check's part of the verdict (the hook option ``pcitopo.kubevirt.io/pairing``), only
    when a GPU got a worse NIC than the host has for it: the guest is faithful, the allocation
    is not."""
    found = result.report.pairing
    findings = getattr(found[1], "findings", ()) if found else ()
    if not findings:
        return None
    who = ", ".join(f.gpu_name for f in findings)
    return f"pairing: {len(findings)} GPU(s) given a worse NIC than the host offers ({who})"


def gdr_in_guest(result: RewriteResult, host: Topology) -> GdrVerdict:
    """GPUDirect RDMA of the VM's GPUs in the predicted guest (src/pcitopo/paths/pairing.py
    :func:`gdr_verdict`), from the guest classes the rewrite judged."""
    guest = {frozenset((p.a, p.b)): p.guest.nccl for p in result.report.pairs if p.guest is not None}
    return gdr_verdict(host, [d.host for d in result.report.placed], lambda a, b: guest.get(frozenset((a, b))))


# The one list of the reasons ``--check`` fails for, by code (``xmlfix --check --json``'s
# "reasons": [{"code", "text"}]). A new reason is a row here and a :class:`Reason` where it is
# found; a reader keys on the code, never on the sentence (human text may change in any release).
REASON_CODES = {
    "pair-class": "pairs whose NCCL or nvidia-smi class differs in the guest from the host's, for one cause",
    "numa-cells-missing": "devices on host NUMA nodes that back no guest cell",
    "no-guest-numa": "devices on several host NUMA nodes, and no guest NUMA cells tied to them",
    "gdr-lost": "a GPU without a NIC at PIX or PXB in the guest where the node has one for it",
    "firmware": "BARs the guest firmware will not assign (mmio-firmware, ...)",
    "nvlink": "with a fabric file: GPUs that will not get NVLink",
    "kubevirt-release": "the VMI would not start, or not with every setting, on the KubeVirt release judged",
    "policy": "the deploy target's Sidecar policy would refuse the VMI at create (namespace label, tag, image not admitted)",
    "device-name": "a device request whose resource name neither permittedHostDevices nor any node has",
    "not-rewritten": "the hook would not rewrite this domain",
}
# Differences ``--check`` accepts, by code: what a guest shows differently by design.
ACCEPTED_CODES = {
    "broadcom-flattening": "nvidia-smi PXB on the host, PIX in the guest, where NCCL already says PIX on the host "
                           "(a two-level Broadcom switch mirrored as the one switch NCCL flattens it to)",
}


@dataclass(frozen=True)
class Reason:
    """One reason of the check: a code of :data:`REASON_CODES` and its sentence."""

    code: str
    text: str

    def __post_init__(self) -> None:
        if self.code not in REASON_CODES:  # a code nobody listed is a bug here, not a user's input
            raise ValueError(f"reason code {self.code!r} is not in REASON_CODES")

    def as_json(self) -> dict:
        return {"code": self.code, "text": self.text}


def check_reasons(result: RewriteResult, host: Topology, fabric=None, gdr: bool = True) -> list[Reason]:
    """Everything that keeps the guest from seeing what the host has, one :class:`Reason` each;
    empty when it will. The only accepted difference is the documented Broadcom flattening
    (nvidia-smi PXB → PIX where NCCL already says PIX on the host). A firmware warning (a GPU
    whose BARs the guest firmware will not assign) and, with a fabric file, GPUs that will not
    get NVLink (the NVLink check's verdict) are problems too (:func:`beyond_pairs`), and so is,
    unless ``gdr`` is False (``pcitopo.kubevirt.io/pairing: off``), a GPU without GPUDirect RDMA
    in the guest where the node has a NIC at PXB or closer for it."""
    views = pair_views(result, host, fabric)
    groups: dict[str, list[PairView]] = {}
    for v in views:
        if (v.differs("nccl") or v.differs("nvml")) and not (v.by_design and not v.differs("nccl")):
            groups.setdefault(str(getattr(v.p.why, "value", v.p.why)), []).append(v)
    out = []
    for why, vs in groups.items():
        e = vs[0]
        view = "nccl" if e.differs("nccl") else "nvml"
        out.append(Reason("pair-class", f"{len(vs)} pair(s) differ, e.g. {e.name} ({e.p.a}-{e.p.b}) {view.upper()} "
                                        f"{e.transition(view)}: {why}"))
    if result.report.missing_cells is not None:
        out.append(Reason("numa-cells-missing", result.report.missing_cells.line))
    if not result.report.numa_map and len({d.host_node for d in result.report.placed if d.host_node >= 0}) > 1:
        out.append(Reason("no-guest-numa", KUBEVIRT_NUMA_ADVICE))
    if gdr:
        out += [Reason("gdr-lost", line) for line in gdr_in_guest(result, host).lines]
    out += [Reason("firmware", line) for line in firmware_warnings(result)]
    nv = result.report.nvlink
    if fabric is not None and nv is not None and not nv.nvlink_ok:
        out.append(Reason("nvlink", f"NVLink: {nv.message}"))
    return out


def check_pairs_json(result: RewriteResult, host: Topology, fabric=None) -> tuple[list[dict], list[dict]]:
    """Each pair's host and guest class in both views (``--check --json``'s "pairs"), and the
    differences the check accepts ("accepted"), by :data:`ACCEPTED_CODES` code."""
    pairs, flattened = [], []
    for v in pair_views(result, host, fabric):
        g = v.p.guest
        pairs.append({"a": str(v.p.a), "b": str(v.p.b), "labels": list(v.labels), "nvlink": v.nvlink,
                      "host": {"nccl": v.p.host.nccl.value, "nvml": v.p.host.nvml.value},
                      "guest": {"nccl": g.nccl.value, "nvml": g.nvml.value} if g is not None else None,
                      "differs": [view for view in ("nccl", "nvml") if v.differs(view)]})
        if v.by_design and v.differs("nvml") and not v.differs("nccl"):
            flattened.append(pairs[-1]["a"] + "-" + pairs[-1]["b"])
    accepted = [{"code": "broadcom-flattening", "text": ACCEPTED_CODES["broadcom-flattening"], "pairs": flattened}] if flattened else []
    return pairs, accepted


def gdr_pairs_json(result: RewriteResult, host: Topology) -> list[dict]:
    """GPUDirect RDMA per GPU of the VM (``--check --json``'s "gdr"): its best NIC on the node and
    among the VM's, with NCCL's host class, the best class the guest shows it to a NIC of the VM,
    and whether the guest gives it GPUDirect RDMA (PIX or PXB)."""
    def nic(p) -> str | None:
        return str(p.nic.bdf) if p.nic is not None else None

    def cls(p) -> str | None:
        return p.cls.nccl.value if p.cls is not None else None

    return [{"gpu": str(g.host.gpu.bdf), "host_nic": nic(g.host), "host_nccl": cls(g.host), "vm_nic": nic(g.got),
             "guest_nccl": g.guest.value if g.guest is not None else None, "gdr": g.gdr, "lost": g.lost}
            for g in gdr_in_guest(result, host).gpus]


def check_unknowns(result: RewriteResult, host: Topology) -> list[str]:
    """What the check cannot know, one line each: the MMIO budget's gaps (BARs that cannot be
    sized, a host CPU width not recorded: ``MmioBudget.unknown``), and placed devices whose IOMMU
    group, driver or (on a host of several NUMA nodes) NUMA node sysfs does not give."""
    out = list(result.report.mmio.unknown) if result.report.mmio is not None else []
    fs = [host.function(d.host) for d in result.report.placed]
    several_nodes = len(host.numa_nodes()) > 1
    for what, lacking, why in (("IOMMU group", [f for f in fs if f.iommu_group is None], LEFT_OUT["iommu_group"]),
                               ("driver", [f for f in fs if f.driver is None], LEFT_OUT["driver"]),
                               ("NUMA node", [f for f in fs if several_nodes and host.numa_of(f) < 0], "")):
        if lacking:  # in pcitopo capture's words
            shown = ", ".join(str(f.bdf) for f in lacking[:3]) + (f", and {len(lacking) - 3} more" if len(lacking) > 3 else "")
            out.append(f"sysfs gives no {what} for {len(lacking)} device(s) ({shown})" + (f": {why}" if why else ""))
    return out


@dataclass(frozen=True)
class CheckVerdict:
    """What ``xmlfix --check`` decides and says, for each command that shows it (``--check``, the
    ``--dot`` title, ``--summary``): ``failed`` when there are problems, else ``unknown`` when
    something it needs is missing, else ``ok``. ``parts``: the verdict line (:func:`verdict`),
    then each other problem's kind (firmware, NVLink)."""

    problems: tuple[str, ...]
    unknowns: tuple[str, ...]
    parts: tuple[str, ...]
    reasons: tuple[Reason, ...] = ()  # the problems with their codes (REASON_CODES)

    @property
    def state(self) -> str:
        return "failed" if self.problems else "unknown" if self.unknowns else "ok"


def check_verdict(result: RewriteResult, host: Topology, fabric=None, gdr: bool = True) -> CheckVerdict:
    """The one judgement behind every command that shows ``--check``'s outcome (:class:`CheckVerdict`);
    ``gdr`` False: GPUDirect RDMA is counted, not judged (``pcitopo.kubevirt.io/pairing: off``)."""
    reasons = check_reasons(result, host, fabric, gdr)
    kinds = [line.split(":", 1)[0] for line in beyond_pairs(result, fabric)]
    return CheckVerdict(tuple(r.text for r in reasons), tuple(check_unknowns(result, host)), (verdict(result, host, fabric), *kinds),
                        tuple(reasons))


def firmware_warnings(result: RewriteResult) -> list[str]:
    """The rewrite's typed warnings (``pcitopo.guest.mmio.FirmwareWarning``: BARs the guest firmware
    will leave unassigned whatever the domain sets), one ``kind: reason`` line each."""
    return [f"{w.kind}: {w.reason}" for w in result.report.warnings]


def beyond_pairs(result: RewriteResult, fabric=None) -> list[str]:
    """The problems the verdict line does not show: firmware warnings, and with a fabric file
    GPUs that will not get NVLink (the NVLink check's verdict)."""
    out = firmware_warnings(result)
    nv = result.report.nvlink
    if fabric is not None and nv is not None and not nv.nvlink_ok:
        out.append(f"NVLink: {nv.message}")
    return out


def prediction(result: RewriteResult, host: Topology, fabric=None) -> dict:
    """The predicted guest, keyed by host BDF: what ``pcitopo verify --expect`` checks. Its notes
    are the report's, then the firmware warnings. ``nccl_gbps`` (GPU–GPU, GPU–NIC pairs) and
    ``nccl_cpu_gbps`` (GPUs) are NCCL's PCIe bandwidth on the host, null for other devices."""

    report = result.report
    labels = placed_labels(result, host)
    views = {(v.p.a, v.p.b): v.nvlink for v in pair_views(result, host, fabric)}
    tree = nccl_tree(host)  # the host's NCCL bandwidths: what the guest should price alike

    def gbps(a: Bdf, b: Bdf | None) -> float | None:
        return path_bandwidth(tree, host, host.function(a), None if b is None else host.function(b))

    devices = [
        {
            "host_bdf": str(d.host),
            "guest_bdf": str(d.guest) if d.guest else None,
            "kind": d.role,
            "label": labels[d.host],
            "numa": -1 if d.guest_cell is None else d.guest_cell,
            "nccl_cpu_gbps": gbps(d.host, None),
        }
        for d in sorted(report.placed, key=lambda d: d.host)
    ]
    pairs = [
        {
            "a": str(p.a),
            "b": str(p.b),
            "nccl": p.guest.nccl.value if p.guest else None,
            "nvml": p.guest.nvml.value if p.guest else None,
            "nvlink": views[p.a, p.b],
            "nccl_gbps": gbps(p.a, p.b),
        }
        for p in report.pairs
    ]
    doc = {"devices": devices, "pairs": pairs, "notes": list(report.notes) + firmware_warnings(result)}
    if fabric is None:  # the board table's NV# (with a fabric, the NVLink check's verdict is in the notes)
        oracle = NvlinkOracle(host)
        doc["nvlink_source"], doc["nvlink_reason"] = oracle.source, oracle.reason
    if report.pairing is not None:
        policy, found = report.pairing
        doc["pairing"] = found.as_json(policy)
    return doc
