"""Doctor results for people and for fleets: the human report, node-exporter textfile metrics
and Node Feature Discovery local features.

- Prometheus text format (what node-exporter's textfile collector reads from ``*.prom``): one
  ``# HELP``/``# TYPE`` pair per metric family, samples ``name{label="value",...} number``,
  label values escaped (backslash, double quote, newline).
- NFD local features (``features.d/`` files): ``name=value`` lines; ``#`` starts a comment.
  Names carry the ``pcitopo.kubevirt.io/`` prefix; values are valid Kubernetes label values
  (at most 63 characters of ``[A-Za-z0-9._-]``, alphanumeric at both ends).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pcitopo.checks.doctor import CHECKS, STATUSES, DoctorReport, Target
from pcitopo.model.labels import mark_host_labels
from pcitopo.model.tree import Role, Topology
from pcitopo.paths.classify import Nccl, Nvml, classify
from pcitopo.paths.pairing import host_pair

STATUS_CODE = {"ok": 0, "warn": 1, "fail": 2, "unknown": 3}
NFD_PREFIX = "pcitopo.kubevirt.io/"


@dataclass(frozen=True, slots=True)
class PixFacts:
    """GPU-NIC pairs at PIX, in NCCL's and in nvidia-smi's view, among the checked devices."""

    gpus: int
    nics: int
    pairs_nccl: int
    pairs_nvml: int
    gpus_with_pix_nic: int  # NCCL's view: the one that decides GPUDirect RDMA
    gpus_with_gdr_nic: int  # a NIC at PXB or closer (NCCL), where GPUDirect RDMA is used
    # GPUs that a DRA claim aligning GPU and NIC by pcieRoot alone may pair with a NIC worse than
    # their best (src/pcitopo/paths/pairing.py); GPUs with no NIC at PXB or closer never count
    gpus_pcieroot_not_enough: int = 0


def pix_facts(topo: Topology, targets: Sequence[Target]) -> PixFacts:
    gpus = [t.function for t in targets if t.role == Role.GPU and not t.function.is_vf]
    nics = [t.function for t in targets if t.role == Role.NIC and not t.function.is_vf]
    nccl = nvml = with_pix = with_gdr = 0
    for g in gpus:
        classes = [classify(topo, g, n) for n in nics]
        nccl += sum(c.nccl == Nccl.PIX for c in classes)
        nvml += sum(c.nvml == Nvml.PIX for c in classes)
        with_pix += any(c.nccl == Nccl.PIX for c in classes)
        with_gdr += any(c.nccl in (Nccl.PIX, Nccl.PXB) for c in classes)
    not_enough = sum(host_pair(topo, g).pcie_root_loses_gdr for g in gpus)
    return PixFacts(len(gpus), len(nics), nccl, nvml, with_pix, with_gdr, not_enough)


# -- people -------------------------------------------------------------------------------------

def doctor_text(report: DoctorReport, verbose: bool = False, beside_vm_labels: bool = False) -> str:
    """One line per finding that is not ok (every finding with ``verbose``), then the verdict.
    ``beside_vm_labels`` (``xmlfix --explain``, whose legend numbers the VM's own devices): each
    label marked as the host's (``host NIC3``, ``downstream-port above host NIC0``)."""
    lines = []
    for f in report.findings:
        if f.status == "ok" and not verbose:
            continue
        who = " ".join(x for x in (f.label, f.bdf) if x) or "host"
        fix = f"  fix: {f.fix}" if f.fix and f.status != "ok" else ""
        line = f"{who}: {f.message}{fix}"
        lines.append(f"{f.status.upper():<7} {f.check:<11} {mark_host_labels(line) if beside_vm_labels else line}")
    if report.kubelet is not None:
        lines += report.kubelet.lines()
    lines.append(verdict(report))
    return "\n".join(lines) + "\n"


def verdict(report: DoctorReport) -> str:
    s = report.summary()
    counts = f"{s['fail']} fail, {s['warn']} warn, {s['unknown']} unknown, {s['ok']} ok"
    if s["fail"]:
        return f"verdict: NOT READY for GPUDirect RDMA in VMs ({counts})"
    if s["unknown"]:
        return f"verdict: no check failed, but {s['unknown']} could not be read ({counts})"
    return f"verdict: ready for GPUDirect RDMA in VMs ({counts})"


# -- Prometheus (node-exporter textfile collector) ------------------------------------------------

def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(**kv: str) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in kv.items()) + "}"


def prometheus_text(report: DoctorReport, pix: PixFacts) -> str:
    out: list[str] = []

    def family(name: str, help_text: str, samples: list[tuple[str, int]]) -> None:
        out.append(f"# HELP {name} {help_text}")
        out.append(f"# TYPE {name} gauge")
        out.extend(f"{name}{labels} {value}" for labels, value in samples)

    family("pcitopo_check_status", "pcitopo doctor result per check and device: 0 ok, 1 warn, 2 fail, 3 unknown.",
           [(_labels(check=f.check, bdf=f.bdf or "", label=f.label or ""), STATUS_CODE[f.status]) for f in report.findings])
    summary = report.summary()
    family("pcitopo_checks", "pcitopo doctor checks by status.", [(_labels(status=s), summary[s]) for s in STATUSES])
    family("pcitopo_gdr_ready", "1 when no check failed or was unknown and every GPU has a NIC at PXB or closer.",
           [("", int(gdr_ready(report, pix)))])
    family("pcitopo_gpus", "GPUs checked.", [("", pix.gpus)])
    family("pcitopo_gpu_nic_pix_pairs", "GPU-NIC pairs at PIX (one switch), as NCCL and as nvidia-smi classify them.",
           [(_labels(view="nccl"), pix.pairs_nccl), (_labels(view="nvml"), pix.pairs_nvml)])
    family("pcitopo_gpus_with_pix_nic", "GPUs with at least one NIC at PIX (NCCL's view).", [("", pix.gpus_with_pix_nic)])
    family("pcitopo_gpus_pcieroot_not_enough",
           "GPUs with a NIC at PXB or closer that a DRA claim matching on resource.kubernetes.io/pcieRoot alone may pair "
           "with a worse NIC (their root complex also carries NICs of a worse class; pcitopo pairs names them).",
           [("", pix.gpus_pcieroot_not_enough)])
    return "\n".join(out) + "\n"


def gdr_ready(report: DoctorReport, pix: PixFacts) -> bool:
    s = report.summary()
    return s["fail"] == 0 and s["unknown"] == 0 and pix.gpus > 0 and pix.gpus_with_gdr_nic == pix.gpus


# -- Node Feature Discovery ------------------------------------------------------------------------

def _worst(report: DoctorReport, check: str) -> str:
    statuses = {f.status for f in report.findings if f.check == check}
    for s in ("fail", "unknown", "warn", "ok"):
        if s in statuses:
            return s
    return "none"


def nfd_text(report: DoctorReport, pix: PixFacts) -> str:
    s = report.summary()
    features = {
        "gdr-ready": str(gdr_ready(report, pix)).lower(),
        "gpus": str(pix.gpus),
        "gpus-with-pix-nic": str(pix.gpus_with_pix_nic),
        "all-gpus-have-pix-nic": str(pix.gpus > 0 and pix.gpus_with_pix_nic == pix.gpus).lower(),
        "doctor-fail": str(s["fail"]),
        "doctor-unknown": str(s["unknown"]),
    }
    for check in CHECKS:
        features[f"check-{check}"] = _worst(report, check)
    if report.kubelet is not None:
        features.update(report.kubelet.nfd_features())
    lines = ["# pcitopo doctor: host readiness for GPUDirect RDMA in VMs (Node Feature Discovery local features)"]
    lines += [f"{NFD_PREFIX}{k}={v}" for k, v in features.items()]
    return "\n".join(lines) + "\n"
