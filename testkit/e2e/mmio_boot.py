"""The MMIO tier: boot rewritten domains with large-BAR stand-ins and count the
BARs the guest kernel assigned.

A GPU's BARs are stood in for by QEMU ``ivshmem-plain`` devices: its BAR2 is a 64-bit
prefetchable BAR of exactly the size of its ``memory-backend-ram`` (``share=on,reserve=off``: the
memory is mapped, never reserved or touched). Per GPU hostdev, at the guest address the rewrite
gave it: function 0 with the GPU's large BAR (128 GiB for H100, 256 GiB for B200) and function 1
with its second 64-bit prefetchable BAR (32 MiB). libvirt has no element for ivshmem with a
given backend, so the stand-ins go through ``<qemu:commandline>`` as JSON ``-object``/``-device``
arguments; ``bus`` is the QEMU id of the port the hostdev sat on, which is that controller's
alias (libvirt uses user aliases as device ids).

The guest's ``/init`` prints every function's ``resource`` file (``@@RES`` lines) and the
kernel's BAR messages (``@@DMESG``); :func:`count_bars` reads them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree

from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.libvirt.domain import QEMU_NS, Q, parse_int
from pcitopo.model.bars import Bar
from pcitopo.model.tree import Topology
from pcitopo.synth import host_from_topo
from testkit import REPO
from testkit.kubevirt_sim import DomainSpec, gpus_and_nics, kubevirt_domain, with_efi

IVSHMEM = ("0x1af4", "0x1110")  # ivshmem's vendor:device in the guest
OVMF = "/usr/share/ovmf/OVMF.fd"  # the stack's `ovmf` package (2025.02 in the Debian 13 root)
KEEP_CPU = ("maxphysaddr", "feature")
MiB, GiB = 1 << 20, 1 << 30


def large_bar_standins(domain_xml: bytes, bar_sizes: dict[str, tuple[int, ...]]) -> tuple[bytes, int]:
    """Replace each hostdev whose alias is in ``bar_sizes`` by ivshmem functions with those
    BAR sizes (one function each, at the hostdev's slot). Returns (XML, functions added)."""
    root = etree.fromstring(domain_xml)
    devices = root.find("devices")
    alias_of = {parse_int(c.get("index"), "index"): c.find("alias").get("name")
                for c in devices.findall("controller") if c.get("type") == "pci" and c.find("alias") is not None}
    args: list[str] = []
    removed: set[str] = set()
    for hd in devices.findall("hostdev"):
        alias = hd.find("alias").get("name") if hd.find("alias") is not None else None
        if alias not in bar_sizes:
            continue
        a = hd.find("address")
        bus = alias_of[parse_int(a.get("bus"), "bus")]
        slot = parse_int(a.get("slot"), "slot")
        base = parse_int(a.get("function", "0"), "function")  # NIC ports share a slot
        for k, size in enumerate(bar_sizes[alias]):
            fn = base + k
            mem = f"{alias}-m{fn}"
            args += ["-object", json.dumps({"qom-type": "memory-backend-ram", "id": mem, "size": size,
                                            "share": True, "reserve": False}, separators=(",", ":"))]
            dev = {"driver": "ivshmem-plain", "id": f"{alias}-f{fn}", "memdev": mem, "bus": bus,
                   "addr": f"0x{slot:x}.0x{fn:x}"}
            if fn == 0 and (len(bar_sizes[alias]) > 1 or a.get("multifunction") == "on"):
                dev["multifunction"] = True
            args += ["-device", json.dumps(dev, separators=(",", ":"))]
        devices.remove(hd)
        removed.add(alias)
    # libvirt would put devices without an address on the ports the hostdevs left empty (it
    # does not see the stand-ins): drop them, the guest needs none of them.
    # (After KubeVirt's define cycle, libvirt's read-back gave them addresses: the balloon goes
    # anyway, since the guest gets the one below.)
    for el in list(devices):
        if el.tag == "memballoon" or el.find("address") is None and (
            el.tag in ("interface", "channel", "rng")
            or (el.tag == "controller" and el.get("type") in ("scsi", "virtio-serial"))
        ):
            devices.remove(el)
    etree.SubElement(devices, "memballoon", model="none")
    for ov in root.findall(f"{Q}override"):  # hostdev properties (cliques) go with the hostdev
        for dev in ov.findall(f"{Q}device"):
            if dev.get("alias") in removed:
                ov.remove(dev)
        if len(ov) == 0:
            root.remove(ov)
    cl = root.find(f"{Q}commandline")
    if cl is None:
        cl = etree.SubElement(root, f"{Q}commandline", nsmap={"qemu": QEMU_NS})
    for arg in args:
        etree.SubElement(cl, f"{Q}arg", value=arg)
    return etree.tostring(root), len(args) // 4


def strip_mmio_settings(domain_xml: bytes) -> bytes:
    """The same domain without what the mmio option wrote (for the "loses BARs" control)."""
    root = etree.fromstring(domain_xml)
    for el in root.findall("cpu/maxphysaddr") + root.findall("cpu/feature[@name='pdpe1gb']"):
        el.getparent().remove(el)
    for p in root.iter(f"{Q}property"):
        if p.get("name") == "pref64-reserve":
            p.getparent().remove(p)
    return etree.tostring(root)


@dataclass
class BarCount:
    expected: int  # stand-in BARs (the ivshmem memdev BAR2 of every stand-in function)
    assigned: int
    sizes: dict[int, tuple[int, int]] = field(default_factory=dict)  # size -> (assigned, expected)
    physbits: str = ""
    dmesg: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        per = ", ".join(f"{_fmt(s)}: {a}/{e}" for s, (a, e) in sorted(self.sizes.items(), reverse=True))
        return f"{self.assigned}/{self.expected} BARs assigned ({per}; guest CPU {self.physbits})"


def _fmt(n: int) -> str:
    return f"{n // GiB} GiB" if n >= GiB else f"{n // MiB} MiB"


def count_bars(serial_text: str, want_sizes: list[int]) -> BarCount:
    """Count the stand-ins' BAR2 assigned in the guest. ``want_sizes`` are the memdev sizes of
    every stand-in function: a BAR the kernel gave up on may read as all zeros, so the expected
    set comes from the domain, not from the guest."""
    res: dict[str, dict[int, Bar]] = {}
    ids: dict[str, tuple[str, str]] = {}
    physbits, dmesg = "", []
    for raw in serial_text.replace("\r", "").split("\n"):
        i = raw.find("@@")
        if i < 0:
            continue
        tag, _, rest = raw[i:].partition(" ")
        if tag == "@@RES":
            bdf, n, s, e, f = rest.split()
            res.setdefault(bdf, {})[int(n)] = Bar(int(n), int(s, 16), int(e, 16), int(f, 16))
        elif tag == "@@ATTR":
            bdf, name, *value = rest.split(" ", 2)
            if name in ("vendor", "device"):
                v = ids.get(bdf, ("", ""))
                ids[bdf] = (value[0], v[1]) if name == "vendor" else (v[0], value[0])
        elif tag == "@@INFO" and rest.startswith("physbits "):
            physbits = rest.split(" ", 1)[1]
        elif tag == "@@DMESG":
            dmesg.append(rest)
    got: dict[int, int] = {}
    for bdf, (v, d) in ids.items():
        if (v, d) != IVSHMEM:
            continue
        b = res.get(bdf, {}).get(2)
        if b is not None and b.size and b.start:
            got[b.size] = got.get(b.size, 0) + 1
    sizes = {}
    for s in sorted(set(want_sizes)):
        sizes[s] = (min(got.get(s, 0), want_sizes.count(s)), want_sizes.count(s))
    return BarCount(len(want_sizes), sum(a for a, _ in sizes.values()), sizes, physbits, dmesg)


def serial_text(path: Path) -> str:
    return path.read_text(errors="replace")


# -- the cases of the boot table ---------------------------------------------------------------

HOST_BITS = 46  # the hosts' CPUs (Sapphire/Emerald Rapids)
GPU_PRESETS = {"h100": "128 GiB + 32 MiB", "b200": "256 GiB + 32 MiB"}


def switch_host(gpu: str, nics: bool = True, direct: bool = False) -> Topology:
    """Eight root complexes, one root port each, and below it either the GPU itself (``direct``)
    or, as on an OCI H100 node, a two-level switch holding the GPU and (``nics``) a
    dual-function ConnectX-7 (src/pcitopo/synth/looks.py presets: real BAR sizes)."""
    lines = ["numa 0 cpus=0-15", "numa 1 cpus=16-31"]
    for i in range(8):
        b = 0x10 + i * 0x10
        lines += [f"rc 0000:{b:02x} numa={i // 4}", f"  rp {b:02x}:01.0 preset=intel-rp"]
        if direct:
            lines.append(f"    ep {b + 1:02x}:00.0 preset={gpu}")
            continue
        lines += [f"    us {b + 1:02x}:00.0 preset=pex-gen5-top", f"      ds {b + 2:02x}:00.0",
                  f"        us {b + 3:02x}:00.0 preset=pex-gen5-virt", f"          ds {b + 4:02x}:00.0",
                  f"            ep {b + 5:02x}:00.0 preset={gpu}"]
        if nics:
            lines += [f"          ds {b + 4:02x}:01.0",
                      f"            ep {b + 6:02x}:00.0 preset=cx7-ib functions=2 driver=vfio-pci"]
    return host_from_topo("\n".join(lines) + "\n", f"switch-{gpu}")


CASES = {
    "oci-h100": lambda: switch_host("h100"),
    "oci-b200": lambda: switch_host("b200"),
    "oci-h100-gpus-only": lambda: switch_host("h100", nics=False),
    "oci-b200-gpus-only": lambda: switch_host("b200", nics=False),
    "gpu-on-root-port": lambda: switch_host("h100", direct=True),
    "two-per-switch": lambda: open_host(REPO / "fixtures" / "hgx-b200"),  # B200s, GPUs + NICs
}


@dataclass
class BootDomain:
    xml: bytes  # rewritten
    sizes: dict[str, tuple[int, ...]]  # hostdev alias -> its 64-bit prefetchable BAR sizes
    report: object  # the rewrite's report
    memory_mib: int  # the domain's RAM, which the boot gives the guest


def kubevirt_input(case: str, efi: bool) -> tuple[Topology, bytes]:
    """``case``'s host and a KubeVirt-shaped domain of its every GPU and NIC (CPU custom qemu64)."""
    host = CASES[case]()
    root = etree.fromstring(kubevirt_domain(host, DomainSpec(f"mmio-{case}", tuple(gpus_and_nics(host)))))
    cpu = root.find("cpu")
    cpu.set("mode", "custom")
    model = etree.Element("model", fallback="allow")
    model.text = "qemu64"
    cpu.insert(0, model)
    xml = etree.tostring(root)
    return host, with_efi(xml) if efi else xml


def boot_domain(case: str, efi: bool) -> BootDomain:
    """:func:`kubevirt_input`, rewritten."""
    host, xml = kubevirt_input(case, efi)
    r = rewrite_domain(xml, host, host_phys_bits=HOST_BITS)
    sizes = {}
    out = etree.fromstring(r.xml)
    for hd in out.iter("hostdev"):
        src = hd.find("source/address")
        bdf = "{:04x}:{:02x}:{:02x}.{:x}".format(*(int(src.get(k), 16) for k in ("domain", "bus", "slot", "function")))
        bars = host.function(bdf).bars or ()
        sizes[hd.find("alias").get("name")] = tuple(sorted((b.size for b in bars if b.is_mem64_pref and b.index < 6), reverse=True))
    mem = out.find("memory")
    return BootDomain(r.xml, sizes, r.report, parse_int(mem.text, "memory") * _UNIT[mem.get("unit", "KiB")] // MiB)


_UNIT = {"b": 1, "bytes": 1, "KiB": 1 << 10, "k": 1 << 10, "MiB": MiB, "M": MiB, "GiB": GiB, "G": GiB}


def mmio_settings(xml: bytes) -> str:
    """What the mmio option wrote, in a few words (the table's settings column)."""
    root = etree.fromstring(xml)
    out = []
    m = root.find("cpu/maxphysaddr")
    if m is not None:
        out.append(f"{m.get('bits')} bits" if m.get("bits") else "width passthrough")
    if root.find("cpu/feature[@name='pdpe1gb']") is not None:
        out.append("pdpe1gb")
    res = [int(p.get("value")) for p in root.iter(f"{Q}property") if p.get("name") == "pref64-reserve"]
    if res:
        out.append(f"pref64-reserve {'/'.join(_fmt(v) for v in sorted(set(res), reverse=True))} x{len(res)}")
    return ", ".join(out) or "none"


@dataclass
class BootRow:
    """One case under one firmware, booted with the rewrite's settings and without any."""

    case: str
    firmware: str
    settings: str
    with_settings: BarCount
    without: BarCount
    boot_with: object  # guestboot.GuestResult
    boot_without: object
    refused: str = ""

    @staticmethod
    def header() -> list[str]:
        return [f"{'case':<20} {'firmware':<8} {'with':>7} {'without':>7}  {'s (QEMU CPU s)':<26} "
                "guest firmware / settings", "-" * 110]

    def line(self) -> str:
        w, wo = self.with_settings, self.without
        times = "/".join(f"{r.timings['total']:.0f} ({r.timings.get('qemu_cpu') or 0:.0f})"
                         for r in (self.boot_with, self.boot_without))
        return (f"{self.case:<20} {self.firmware:<8} {w.assigned:>3}/{w.expected:<3} {wo.assigned:>3}/{wo.expected:<3}  "
                f"{times:<26} {self.boot_with.firmware} / {self.settings}"
                + ("  [refused: recommends EFI]" if self.refused else ""))


def stack_versions(libvirtd) -> tuple[str, str]:
    """(the line naming QEMU, libvirt, SeaBIOS and OVMF the boots ran on, SeaBIOS's version)."""
    versions = getattr(libvirtd, "versions", None)
    if versions is not None:
        v = versions()
        return f"[e2e mmio] stack: {v.line()}", v.seabios
    import subprocess

    def run(*argv: str) -> str:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60).stdout.strip()

    qemu = run("qemu-system-x86_64", "--version").splitlines()[0].split("version")[-1].split()[0]
    pkgs = {p: run("dpkg-query", "-W", "-f", "${Version}", p) for p in ("libvirt-daemon", "seabios", "ovmf")}
    seabios = pkgs["seabios"].split("-")[0]
    return (f"[e2e mmio] stack: QEMU {qemu}, libvirt {pkgs['libvirt-daemon']}, SeaBIOS {pkgs['seabios']}, "
            f"OVMF {pkgs['ovmf']}"), seabios


def native_settings_domain(host: Topology) -> tuple[bytes, object, str]:
    """A rewritten domain of every GPU and NIC of ``host`` as real vfio hostdevs, which libvirt
    can translate without starting it: (XML, the rewrite's report, the domain's name)."""
    name = f"settings-{host.name}" if getattr(host, "name", None) else "settings"
    root = etree.fromstring(kubevirt_domain(host, DomainSpec(name, tuple(gpus_and_nics(host)))))
    root.set("type", "qemu")
    root.find("os/type").set("machine", "q35")
    for el in [*root.findall("cputune"), *root.findall("numatune"), *root.findall("memoryBacking"),
               *root.findall("os/smbios")]:
        el.getparent().remove(el)
    for tag in ("graphics", "interface", "channel"):
        for el in root.find("devices").findall(tag):
            root.find("devices").remove(el)
    cpu = root.find("cpu")
    cpu.set("mode", "custom")
    model = etree.Element("model")
    model.text = "qemu64"
    cpu.insert(0, model)
    for hd in root.iter("hostdev"):
        hd.insert(0, etree.Element("driver", name="vfio"))  # libvirt fills this in at start
    r = rewrite_domain(etree.tostring(root), host, host_phys_bits=HOST_BITS)
    return r.xml, r.report, root.findtext("name")
