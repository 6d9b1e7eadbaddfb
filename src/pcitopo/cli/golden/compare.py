"""``pcitopo golden check``: each difference between a golden directory and what this pcitopo
makes of the same node and VMs, sorted by whether the guest would see it.

- guest-visible (exit 1, one line each): a device's placement in the domain (guest address or
  NUMA cell), its guest BDF or cell in the prediction, a pair's NCCL or nvidia-smi class or NV#,
  NCCL bandwidths, the verdict and its reason codes, GPUDirect RDMA per GPU, NCCL's topology file;
- layout only (exit 0, listed): spare ports, controller indexes, aliases, attributes and
  elements the guest does not see (:mod:`.placement`);
- text only (exit 0, counted): human wording (verdict.txt, notes, reason sentences), the
  version stamp, JSON keys outside the guest-visible contract.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from lxml import etree

from pcitopo.cli.golden.placement import compare_domains

# The prediction's guest-visible fields (xmlfix --json), per device and per pair.
DEVICE_FIELDS = ("guest_bdf", "numa", "kind", "nccl_cpu_gbps")
PAIR_FIELDS = ("nccl", "nvml", "nvlink", "nccl_gbps")


@dataclass
class Differences:
    guest: list[str] = field(default_factory=list)
    layout: list[str] = field(default_factory=list)
    text: int = 0

    def add(self, vm: str, other: Differences) -> None:
        self.guest += [f"{vm}: {line}" for line in other.guest]
        self.layout += [f"{vm}: {line}" for line in other.layout]
        self.text += other.text


def _load(data: bytes, what: str) -> dict:
    from pcitopo.errors import ConfigError

    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ConfigError(f"{what}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{what}: not a JSON object")
    return doc


def _labels(prediction: dict) -> dict[str, str]:
    return {d.get("host_bdf"): d.get("label") for d in prediction.get("devices") or () if isinstance(d, dict)}


def compare_prediction(golden: dict, fresh: dict) -> Differences:
    """Device by device (host BDF) and pair by pair: the fields the guest shows."""
    out = Differences()
    labels = _labels(fresh) | _labels(golden)
    gd = {d.get("host_bdf"): d for d in golden.get("devices") or ()}
    fd = {d.get("host_bdf"): d for d in fresh.get("devices") or ()}
    for bdf in sorted(set(gd) | set(fd), key=str):
        name = f"{labels.get(bdf) or '?'} ({bdf})"
        if bdf not in gd or bdf not in fd:
            out.guest.append(f"device {name}: {'added' if bdf in fd else 'gone'}")
            continue
        for key in DEVICE_FIELDS:
            if gd[bdf].get(key) != fd[bdf].get(key):
                out.guest.append(f"device {name}: {key} {gd[bdf].get(key)} -> {fd[bdf].get(key)}")
        out.text += sum(gd[bdf].get(k) != fd[bdf].get(k) for k in set(gd[bdf]) | set(fd[bdf]) if k not in DEVICE_FIELDS)
    gp = {(p.get("a"), p.get("b")): p for p in golden.get("pairs") or ()}
    fp = {(p.get("a"), p.get("b")): p for p in fresh.get("pairs") or ()}
    for a, b in sorted(set(gp) | set(fp), key=str):
        name = f"{labels.get(a) or a}-{labels.get(b) or b} ({a}-{b})"
        if (a, b) not in gp or (a, b) not in fp:
            out.guest.append(f"pair {name}: {'added' if (a, b) in fp else 'gone'}")
            continue
        for key in PAIR_FIELDS:
            was, now = gp[a, b].get(key), fp[a, b].get(key)
            if was != now:
                what = {"nccl": "NCCL class", "nvml": "nvidia-smi class", "nvlink": "NV#", "nccl_gbps": "NCCL GB/s"}[key]
                out.guest.append(f"pair {name}: {what} {was} -> {now}")
    rest = set(golden) | set(fresh)
    out.text += sum(golden.get(k) != fresh.get(k) for k in rest - {"devices", "pairs"})
    return out


def compare_verdict(golden: dict, fresh: dict) -> Differences:
    """The verdict, its reason codes and GPUDirect RDMA per GPU; the sentences are text."""
    out = Differences()
    if golden.get("verdict") != fresh.get("verdict"):
        out.guest.append(f"verdict: {golden.get('verdict')} -> {fresh.get('verdict')}")
    codes = [sorted(r.get("code", "") for r in doc.get("reasons") or ()) for doc in (golden, fresh)]
    if codes[0] != codes[1]:
        out.guest.append(f"verdict reasons: {', '.join(codes[0]) or 'none'} -> {', '.join(codes[1]) or 'none'}")
    gg = {g.get("gpu"): g for g in golden.get("gdr") or ()}
    fg = {g.get("gpu"): g for g in fresh.get("gdr") or ()}
    for gpu in sorted(set(gg) | set(fg), key=str):
        was, now = gg.get(gpu) or {}, fg.get(gpu) or {}
        if (was.get("gdr"), was.get("guest_nccl")) != (now.get("gdr"), now.get("guest_nccl")):
            out.guest.append(f"GPUDirect RDMA of {gpu}: {_gdr(was)} -> {_gdr(now)}")
    # the pairs' classes are the prediction's (compared there); reason sentences, summary: wording
    out.text += sum(golden.get(k) != fresh.get(k) for k in (set(golden) | set(fresh)) - {"verdict", "gdr", "pairs"})
    return out


def _gdr(g: dict) -> str:
    return "none" if not g else f"{'yes' if g.get('gdr') else 'no'} ({g.get('guest_nccl')} to the VM's nearest NIC)"


def _nccl_nodes(data: bytes) -> dict[str, dict[str, str]]:
    """NCCL's topology file as {element path: attributes}: what NCCL reads in the guest."""
    out: dict[str, dict[str, str]] = {}
    if not data.strip():
        return out
    root = etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))
    for el in root.iter():
        if isinstance(el.tag, str):
            key = "/".join(f"{e.tag}[{e.get('busid') or e.get('numaid') or e.get('dev') or e.get('name') or e.get('target') or ''}]"
                           for e in reversed([el, *el.iterancestors()]))
            out[key] = dict(el.attrib)
    return out


def compare_nccl_file(golden: bytes, fresh: bytes) -> Differences:
    out = Differences()
    g, f = _nccl_nodes(golden), _nccl_nodes(fresh)
    for key in sorted(set(g) | set(f)):
        if g.get(key) != f.get(key):
            if key not in g or key not in f:
                out.guest.append(f"NCCL topology file: {key} {'added' if key in f else 'gone'}")
                continue
            changed = sorted(k for k in set(g[key]) | set(f[key]) if g[key].get(k) != f[key].get(k))
            out.guest.append(f"NCCL topology file: {key}: " + ", ".join(f"{k} {g[key].get(k)} -> {f[key].get(k)}" for k in changed))
    return out


def compare_vm(golden: dict[str, bytes], fresh: dict[str, bytes]) -> Differences:
    """One VM's files, golden against fresh (file name -> bytes; a file absent from one side is empty)."""
    out = Differences()
    missing = [name for name in ("domain.xml", "prediction.json", "verdict.json") if not golden.get(name)]
    out.guest += [f"{name}: missing from the goldens" for name in missing]
    gp, fp = (_load(golden.get("prediction.json") or b"{}", "prediction.json"),
              _load(fresh.get("prediction.json") or b"{}", "prediction.json"))
    labels = _labels(fp) | _labels(gp)
    if "domain.xml" not in missing and golden.get("domain.xml") != fresh.get("domain.xml"):
        d = compare_domains(golden.get("domain.xml", b""), fresh.get("domain.xml", b""), labels)
        out.guest += d.guest
        out.layout += d.layout
    for part in (compare_prediction(gp, fp),
                 compare_verdict(_load(golden.get("verdict.json") or b"{}", "verdict.json"),
                                 _load(fresh.get("verdict.json") or b"{}", "verdict.json")),
                 compare_nccl_file(golden.get("nccl-topo.xml", b""), fresh.get("nccl-topo.xml", b""))):
        out.guest += part.guest
        out.layout += part.layout
        out.text += part.text
    was, now = (golden.get("verdict.txt", b"").decode(errors="replace").splitlines(),
                fresh.get("verdict.txt", b"").decode(errors="replace").splitlines())
    out.text += sum(a != b for a, b in zip(was, now)) + abs(len(was) - len(now))
    return out
