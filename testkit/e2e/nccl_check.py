"""In a booted golden guest, NCCL's bandwidth model equals the host's.

What a booted guest must show (``check_nccl``):

1. every root port the rewrite created carries the host link it stands for: the guest kernel's
   ``max_link_speed``/``max_link_width`` of the port above each placed device equal the host's
   link there (the host root port's, or its switch's uplink), where QEMU has a value for it;
2. the fw_cfg blob is present and, decoded, byte-identical to ``xmlfix --nccl-topo``;
3. ``pcitopo guest install-nccl-topo`` installs it, and the installed file parses under NCCL's
   rules (``ncclxml.parse``, which follows NCCL's xml.cc);
4. NCCL's bandwidth, computed NCCL's way from the guest's sysfs plus the installed file, equals
   the host's for every GPU–NIC, GPU–GPU and GPU–CPU path (``pcitopo verify`` checks the same
   and must pass); without the file the check prints how far off the guest is.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pcitopo.model.tree import Bdf, Role, Topology
from pcitopo.nccl.pcitree import DirSysfs, NcclTree
from pcitopo.nccl.price import port_link
from pcitopo.nccl.topoxml import FWCFG_NAME, gt_s, parse, strtol

from .guestboot import GuestResult
from .paths import REPO_ROOT

BIN = Path(sys.executable).parent


def _run(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / str(args[0])), *map(str, args[1:])], capture_output=True, timeout=300, cwd=REPO_ROOT)


@dataclass
class NcclCheck:
    problems: list[str] = field(default_factory=list)
    ports_checked: int = 0
    pairs: int = 0
    equal_with_file: int = 0
    equal_without_file: int = 0
    worst_without: str = ""

    def line(self, case: str) -> str:
        return (f"[e2e nccl] {case}: {self.ports_checked} root ports at the host's link; {self.pairs} paths compared, "
                f"NCCL bandwidth as on the host: {self.equal_with_file}/{self.pairs} with the file, "
                f"{self.equal_without_file}/{self.pairs} without it{self.worst_without}")


def _guest_path(booted: GuestResult, bdf: str) -> list[str]:
    real = booted.printout.functions[bdf].realpath
    return real.split("/sys/devices/", 1)[1].split("/")


def check_root_ports(host: Topology, prediction: dict, booted: GuestResult, out: NcclCheck) -> None:
    seen: set[str] = set()
    for d in prediction["devices"]:
        if d["guest_bdf"] is None:
            continue
        path = _guest_path(booted, d["guest_bdf"])
        port = path[1] if len(path) > 2 else None
        if port is None or port in seen:
            continue
        seen.add(port)
        anc = host.ancestry(host.function(Bdf.parse(d["host_bdf"])))
        if not anc or host.role(anc[0]) != Role.ROOT_PORT:
            continue  # a device on a host root bus: its guest root port stands for nothing
        want = port_link(anc[0], anc[1] if len(anc) > 1 else None)
        attrs = booted.printout.functions[port].attrs
        got = (gt_s(attrs.get("max_link_speed", "")), strtol(attrs.get("max_link_width", "")))
        exp = (gt_s(want[0] or ""), strtol(want[1] or ""))
        out.ports_checked += 1
        if got != exp:
            out.problems.append(f"root port {port} above {d['label']}: guest {got[0]} GT/s x{got[1]}, host {exp[0]} GT/s x{exp[1]}")


def check_nccl(host_dir: Path, domain: Path, host: Topology, booted: GuestResult, work: Path) -> NcclCheck:
    out = NcclCheck()
    work.mkdir(parents=True, exist_ok=True)
    pred = _run("xmlfix", "--json", "--sysfs", host_dir, domain)
    topo_file = _run("xmlfix", "--nccl-topo", "--sysfs", host_dir, domain)
    assert pred.returncode == 0 and topo_file.returncode == 0, (pred.stderr, topo_file.stderr)
    prediction = json.loads(pred.stdout)
    (work / "predicted.json").write_bytes(pred.stdout)

    check_root_ports(host, prediction, booted, out)

    blob = booted.printout.fwcfg.get(FWCFG_NAME)
    if blob is None:
        out.problems.append(f"no fw_cfg blob {FWCFG_NAME} in the guest (fw_cfg {booted.printout.info.get('fw_cfg')})")
        return out
    if base64.b64decode(blob) != topo_file.stdout:
        out.problems.append("the fw_cfg blob, decoded, differs from xmlfix --nccl-topo")
    raw = work / "raw"
    raw.write_bytes(blob)
    dest = work / "run" / "nvidia-topologyd" / "virtualTopology.xml"
    inst = _run("pcitopo", "guest", "install-nccl-topo", "--from", raw, "--dest", dest)
    if inst.returncode != 0:
        out.problems.append(f"install-nccl-topo: exit {inst.returncode}: {inst.stderr.decode().strip()}")
        return out
    system = parse(dest.read_bytes())

    tree = booted.sysfs_tree(work / "guest-sysfs")
    guest_bdf = {d["host_bdf"]: d["guest_bdf"] for d in prediction["devices"]}
    kinds = {d["host_bdf"]: d["kind"] for d in prediction["devices"]}
    with_file, without = NcclTree(DirSysfs(str(tree)), system), NcclTree(DirSysfs(str(tree)))
    worst = (float("inf"), "")

    def busid(host_bdf: str) -> str:
        g = guest_bdf[host_bdf]
        return g[:-1] + "0" if kinds[host_bdf] == "nic" else g

    rows = [(d["host_bdf"], None, d["nccl_cpu_gbps"]) for d in prediction["devices"] if d.get("nccl_cpu_gbps") is not None]
    rows += [(p["a"], p["b"], p["nccl_gbps"]) for p in prediction["pairs"] if p.get("nccl_gbps") is not None]
    for a, b, host_bw in rows:
        out.pairs += 1
        for tree_, attr in ((with_file, "equal_with_file"), (without, "equal_without_file")):
            bw = tree_.to_cpu(busid(a)) if b is None else tree_.between(busid(a), busid(b))
            if round(bw, 4) == round(host_bw, 4):
                setattr(out, attr, getattr(out, attr) + 1)
            elif tree_ is with_file:
                out.problems.append(f"{a}-{b or 'CPU'}: NCCL {bw:g} GB/s in the guest, {host_bw:g} on the host")
            elif bw / host_bw < worst[0]:
                worst = (bw / host_bw, f"{a}-{b or 'CPU'} {bw:g} GB/s vs {host_bw:g}")
    if worst[1]:
        out.worst_without = f" (worst without: {worst[1]}, {1 / worst[0]:.0f}x too slow)"

    v = _run("pcitopo", "verify", "--expect", work / "predicted.json", "--sysfs", tree, "--nccl-topo", dest)
    if v.returncode != 0:
        out.problems.append(f"pcitopo verify with the file: exit {v.returncode}: {v.stderr.decode().strip()[-800:]}")
    return out
