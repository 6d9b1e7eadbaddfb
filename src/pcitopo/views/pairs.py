"""``pcitopo pairs``: each GPU's best NIC on the host and whether pcieRoot alignment gets it,
as a table for people and as JSON for tools (the facts: :mod:`pcitopo.paths.pairing`)."""

from __future__ import annotations

from pcitopo.paths.pairing import HostPair, HostPairs, pcie_root


def pairs_json(hp: HostPairs) -> dict:
    def one(p: HostPair) -> dict:
        b = p.best
        return {
            "gpu": str(b.gpu.bdf),
            "label": hp.labels.get(b.gpu.bdf),
            "pcie_root": pcie_root(b.gpu),
            "nic": str(b.nic.bdf) if b.nic else None,
            "nic_label": hp.labels.get(b.nic.bdf) if b.nic else None,
            "nccl": b.cls.nccl.value if b.cls else None,
            "nvml": b.cls.nvml.value if b.cls else None,
            "gdr": b.gdr,
            "same_pcie_root_nics": [{"nic": str(n.bdf), "nccl": c.nccl.value, "nvml": c.nvml.value} for n, c in p.same_root],
            "pcie_root_enough": p.pcie_root_enough,
        }

    missed = hp.not_served_by_pcie_root
    return {
        "host": hp.host,
        "gpus": [one(p) for p in hp.pairs],
        "pcie_root_enough": not missed,
        "pcie_root_not_enough_for": [hp.labels.get(p.best.gpu.bdf) or str(p.best.gpu.bdf) for p in missed],
    }


def pairs_text(hp: HostPairs) -> str:
    head = f"{'GPU':<6}{'BDF':<14}{'pcieRoot':<12}{'best NIC':<10}{'BDF':<14}{'NCCL':<6}{'nvidia-smi':<12}by pcieRoot"
    lines = [head]
    for p in hp.pairs:
        b = p.best
        nic = (hp.labels.get(b.nic.bdf, "?"), str(b.nic.bdf)) if b.nic else ("-", "-")
        cls = (b.cls.nccl.value, b.cls.nvml.value) if b.cls else ("-", "-")
        lines.append(f"{hp.labels.get(b.gpu.bdf, '?'):<6}{str(b.gpu.bdf):<14}{pcie_root(b.gpu):<12}{nic[0]:<10}{nic[1]:<14}"
                     f"{cls[0]:<6}{cls[1]:<12}{_by_root(hp, p)}")
    lines.append("")
    lines.extend(_verdict(hp))
    return "\n".join(lines) + "\n"


def _by_root(hp: HostPairs, p: HostPair) -> str:
    """The last column: whether a claim matching on pcieRoot gets this GPU a NIC of its best class."""
    b = p.best
    if not p.same_root:
        return "no: no NIC on its pcieRoot" + ("" if b.gdr else " (none at PXB or closer either)")
    if p.pcie_root_enough:
        return "yes" if b.gdr else "yes (no NIC at PXB or closer)"
    others = ", ".join(f"{hp.labels.get(n.bdf, n.bdf)} {c.nccl.value}" for n, c in p.same_root if c.nccl != b.cls.nccl)  # type: ignore[union-attr]
    return f"no: also {others}"


def _verdict(hp: HostPairs) -> list[str]:
    def names(ps: list[HostPair]) -> str:
        return ", ".join(hp.labels.get(p.best.gpu.bdf) or str(p.best.gpu.bdf) for p in ps)

    if not hp.pairs:
        return ["no GPUs on this host"]
    missed = hp.not_served_by_pcie_root
    if not missed:
        return ["pcieRoot alignment gives every GPU a NIC of its best class on this host "
                "(a DRA claim with matchAttribute: resource.kubernetes.io/pcieRoot is enough)"]
    lonely = [p for p in missed if not p.same_root]
    worse = [p for p in missed if p.same_root]
    out = []
    if worse:
        out.append(f"pcieRoot alignment is not enough on this host for {len(worse)} GPU(s): {names(worse)} "
                   "(their root complex also carries NICs of a worse class: pick NICs by PCI address, "
                   "or check every allocation with pcitopo.kubevirt.io/pairing)")
    if lonely:
        gdr = any(p.best.gdr for p in lonely)
        why = ("pick NICs by PCI address" if gdr else
               "none has a NIC at PXB or closer, so no pairing gives it GPUDirect RDMA")
        out.append(f"a claim matching GPU and NIC on resource.kubernetes.io/pcieRoot can never be satisfied "
                   f"for {len(lonely)} GPU(s): {names(lonely)} (no NIC shares their root complex: {why})")
    return out
