"""Turn a rewritten (KubeVirt-shaped) domain into one that boots here, boot
it with a private libvirtd under TCG, and read the guest's PCI tree back.

``make_bootable`` keeps everything the planner decides (PCI controllers with
their indexes, addresses, ``busNr``, ``<node>``, chassis/port, aliases,
``<cpu><numa>`` cell ids, ``<numatune>`` cell ids, ``<qemu:override>`` of
controllers, ``<features><acpi/>`` or its absence) and changes only what
cannot work on this machine. Each change is appended to ``notes`` if given.
"""

from __future__ import annotations

import copy
import itertools
import shutil
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from lxml import etree

from pcitopo.libvirt.domain import QEMU_NS

from .guesttree import (
    GuestAddr,
    GuestPrintout,
    StandIn,
    _int,
    guest_sysfs_tree,
    map_guest_bdfs,
    parse_printout,
)
from .initramfs import END_MARKER, build_initramfs
from .libvirtd import LibvirtError, PrivateLibvirtd
from .paths import cache_dir, find_kernel

Q = "{%s}" % QEMU_NS

KERNEL_CMDLINE = "console=ttyS0 quiet loglevel=1 panic=-1"

# hostdev alias prefixes (KubeVirt) -> stand-in kind
ALIAS_KINDS = (
    ("ua-gpu-", "gpu"),
    ("ua-dra-gpu-", "gpu"),
    ("ua-sriov-", "nic"),
    ("ua-hostdevice-", "other"),
    ("ua-dra-hostdevice-", "other"),
)

# Children of <devices> that need pod paths, daemons or host devices we do not have.
_DROP_DEVICES = (
    "disk", "channel", "graphics", "filesystem", "tpm", "redirdev", "smartcard",
    "shmem", "vsock", "lease", "serial", "console", "parallel", "emulator", "crypto",
)
_DROP_DOMAIN = (
    "memoryBacking", "cputune", "memtune", "blkiotune", "resource", "seclabel",
    "perf", "launchSecurity", "uuid", "genid", "iothreadids", "on_poweroff",
    "on_reboot", "on_crash", "on_lockfailure", "currentMemory", "maxMemory",
)
_DROP_FEATURES = ("kvm", "hyperv", "pvspinlock", "hap", "msrs", "tsc", "xen")


class BootError(RuntimeError):
    pass


class QemuAborted(BootError):
    """QEMU itself failed an internal assertion and aborted (not the guest, not the domain)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# The stack's QEMU, with its TCG on one thread for all vCPUs: QEMU 10.0's multi-threaded TCG
# races one vCPU's MMIO access against another's change of the memory map while the firmware
# programs BARs. Seen here, in CI and on a fresh clone: "iotlb_to_section: Assertion
# `section_index < d->map.sections_nb' failed" (QEMU aborts), and guests that never reach /init
# with an empty serial log; a multi-cell golden domain (4 vCPUs) hit both on its first boot.
# One TCG thread cannot race with itself. This is how the tier emulates, not what it proves:
# KubeVirt's VMs run under KVM. libvirt has no setting for TCG's threading and passes
# ``-accel tcg``; the wrapper adds ``thread=single`` and execs the QEMU of the root it runs in.
TCG_WRAPPER_NAME = "qemu-system-x86_64-tcg-single"
TCG_WRAPPER = """#!/bin/sh
# pcitopo e2e (tests/e2e/guestboot.py, tcg_single_emulator): the stack's QEMU with its TCG on
# one thread; PCITOPO_QEMU names another binary (the wrapper's own test).
n=$#
prev=
while [ "$n" -gt 0 ]; do
    a=$1
    shift
    n=$((n - 1))
    if [ "$prev" = "-accel" ]; then
        case $a in
            tcg) a=tcg,thread=single ;;
            tcg,*thread=*) ;;
            tcg,*) a="$a,thread=single" ;;
        esac
    fi
    set -- "$@" "$a"
    prev=$a
done
exec "${PCITOPO_QEMU:-/usr/bin/qemu-system-x86_64}" "$@"
"""


def tcg_single_emulator() -> Path:
    """The wrapper (``TCG_WRAPPER``) in the e2e cache, which the private libvirtd sees at the
    same path; written when missing or different."""
    path = cache_dir() / TCG_WRAPPER_NAME
    if not path.exists() or path.read_text() != TCG_WRAPPER:
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_text(TCG_WRAPPER)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return path


class GuestSilent(BootError):
    """The guest wrote nothing to its serial console while QEMU spun for ``silent_after`` CPU
    seconds (or ``SILENT_WALL_FACTOR`` times that of wall time): it never reached /init."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# QEMU 10.0's multi-threaded TCG can abort on a race between one vCPU's MMIO access and another's
# change of the memory map while the firmware programs BARs ("iotlb_to_section: Assertion
# `section_index < d->map.sections_nb' failed"); seen once in a full e2e run on a heavily loaded
# machine, not reproduced by the same boot again. A fresh QEMU gets one more try. The same boot
# (OCI H100 shape, SeaBIOS 1.16.3, 2 vCPUs) also once never reached /init in CI: an empty serial
# log after 600 s, where it takes 20 s of QEMU CPU here and passed 25 times in a row, under load
# too; that also gets one more try (``silent_after``), with the firmware's debug log printed.
QEMU_ABORT_RETRIES = 1
# A boot of the e2e tiers reaches /init within 20-25 QEMU CPU seconds on a quiet machine and
# 60-80 under a load of 10-17; with ``silent_after=S`` an empty serial log after S QEMU CPU
# seconds, or SILENT_WALL_FACTOR x S of wall time (a QEMU that spins no more), is a hang
SILENT_WALL_FACTOR = 1.75


def _qemu_abort(log_text: str) -> str | None:
    """The assertion line of a QEMU that aborted, from its log."""
    for line in log_text.splitlines():
        if line.startswith("qemu-system-") and "Assertion" in line and line.rstrip().endswith("failed."):
            return line.strip()
    return None


def _parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)


def _kind_of(hd: etree._Element, alias: str, source: str | None,
             kinds: Mapping[str, str] | None) -> str:
    if kinds:
        if alias in kinds:
            return kinds[alias]
        if source and source in kinds:
            return kinds[source]
    if hd.tag == "interface":
        return "nic"
    if hd.get("type") == "mdev":
        return "gpu"
    for prefix, kind in ALIAS_KINDS:
        if alias.startswith(prefix):
            return kind
    return "other"


def _source_bdf(hd: etree._Element) -> str | None:
    a = hd.find("source/address")
    if a is None or a.get("uuid") is not None:
        return None
    try:
        return "%04x:%02x:%02x.%x" % (
            _int(a.get("domain"), 0), _int(a.get("bus")), _int(a.get("slot")),
            _int(a.get("function"), 0),
        )
    except (TypeError, ValueError):
        return None


def _standin(kind: str, alias: str, addr: etree._Element | None, primary: bool) -> etree._Element:
    """An emulated PCIe endpoint for ``kind`` carrying ``alias`` at ``addr``."""
    if kind == "gpu":
        el = etree.Element("video")
        # Only qxl/virtio may be secondary video devices in libvirt; bochs
        # ("bochs-display", class 0x0380) is used when it is the first video.
        etree.SubElement(el, "model", type="bochs" if primary else "virtio", heads="1")
    elif kind == "nic":
        el = etree.Element("interface", type="user")
        etree.SubElement(el, "model", type="e1000e")
        etree.SubElement(el, "rom", enabled="no")  # no iPXE: faster firmware
    else:
        el = etree.Element("rng", model="virtio")
        b = etree.SubElement(el, "backend", model="random")
        b.text = "/dev/urandom"
    etree.SubElement(el, "alias", name=alias)
    if addr is not None:
        el.append(copy.deepcopy(addr))
    return el


def _host_nodes() -> set[int]:
    from .paths import host_numa_nodes

    return host_numa_nodes()


def _fmt_nodeset(nodes: set[int]) -> str:
    return ",".join(str(n) for n in sorted(nodes))


def _parse_nodeset(s: str) -> set[int]:
    out: set[int] = set()
    for part in s.split(","):
        part = part.strip()
        if not part or part.startswith("^"):
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def make_bootable(
    domain_xml: bytes,
    kernel: str | os.PathLike,
    initrd: str | os.PathLike,
    serial_log_path: str | os.PathLike,
    *,
    kinds: Mapping[str, str] | None = None,
    memory_mib: int = 512,
    vcpus_per_cell: int = 1,
    name: str | None = None,
    cmdline: str = KERNEL_CMDLINE,
    notes: list[str] | None = None,
    unplaced: list[StandIn] | None = None,
    keep_cpu: Sequence[str] = (),
    loader: str | None = None,
    emulator: str | None = None,
) -> tuple[bytes, dict[GuestAddr, StandIn]]:
    """Return ``(bootable_xml, mapping)``.

    ``mapping`` maps each stand-in's guest address (controller index, slot,
    function) to the hostdev it replaces. Hostdevs without a guest address get
    a stand-in without one (libvirt places it); they are not in the mapping
    but appended to ``unplaced`` if given (``boot`` adds them to its mapping
    from the defined domain, by alias).
    ``kinds`` maps a hostdev alias or source BDF to "gpu" / "nic" / "other";
    otherwise the alias prefix decides (ua-gpu- gpu, ua-sriov- nic, ...).
    ``keep_cpu``: ``<cpu>`` children kept besides numa/topology (the MMIO tier keeps
    ``maxphysaddr`` and ``feature``); ``loader``: a firmware image for ``<loader type='rom'>``
    (OVMF), else QEMU's default SeaBIOS; ``emulator``: the QEMU binary (default: libvirt's own
    choice; ``boot`` gives :func:`tcg_single_emulator`).
    """
    log = notes if notes is not None else []
    root = etree.fromstring(domain_xml, _parser())
    if root.tag != "domain":
        raise BootError(f"not a domain: <{root.tag}>")
    root.set("type", "qemu")
    if name is not None:
        nm = root.find("name")
        if nm is None:
            nm = etree.SubElement(root, "name")
        nm.text = name

    for tag in _DROP_DOMAIN:
        for el in root.findall(tag):
            log.append(f"removed <{tag}>")
            root.remove(el)

    # --- os: direct kernel boot -----------------------------------------
    os_el = root.find("os")
    if os_el is None:
        os_el = etree.SubElement(root, "os")
    type_el = os_el.find("type")
    if type_el is None:
        type_el = etree.Element("type")
        type_el.text = "hvm"
    machine = type_el.get("machine") or "q35"
    if "q35" in machine and machine != "q35":
        log.append(f"machine {machine} -> q35")
        machine = "q35"
    type_el.set("machine", machine)
    type_el.set("arch", "x86_64")
    for k in list(os_el.attrib):
        del os_el.attrib[k]
    for child in list(os_el):
        os_el.remove(child)
    os_el.append(type_el)
    if loader is not None:
        etree.SubElement(os_el, "loader", type="rom", readonly="yes").text = loader
        log.append(f"firmware {loader}")
    for tag, text in (("kernel", str(kernel)), ("initrd", str(initrd)), ("cmdline", cmdline)):
        etree.SubElement(os_el, tag).text = text

    # --- features / clock -------------------------------------------------
    feats = root.find("features")
    if feats is not None:
        for child in list(feats):
            if child.tag in _DROP_FEATURES or (child.tag == "ioapic" and child.get("driver") == "kvm"):
                log.append(f"removed <features><{child.tag}>")
                feats.remove(child)
    clock = root.find("clock")
    if clock is not None:
        for t in clock.findall("timer"):
            if t.get("name") in ("kvmclock", "hypervclock", "tsc"):
                clock.remove(t)

    # --- CPU / NUMA / memory ----------------------------------------------
    cpu = root.find("cpu")
    cells = cpu.findall("numa/cell") if cpu is not None else []
    ncpus = max(1, len(cells)) * vcpus_per_cell
    vcpu = root.find("vcpu")
    if vcpu is None:
        vcpu = etree.Element("vcpu")
        root.insert(root.index(root.find("os")), vcpu)
    for k in list(vcpu.attrib):
        del vcpu.attrib[k]
    vcpu.set("placement", "static")
    vcpu.text = str(ncpus)
    for el in root.findall("vcpus"):
        root.remove(el)
    if cpu is not None:
        log.append(f"cpu mode={cpu.get('mode')} -> custom qemu64 (TCG)")
        for k in list(cpu.attrib):
            del cpu.attrib[k]
        cpu.set("mode", "custom")
        cpu.set("match", "exact")
        cpu.set("check", "none")
        for child in list(cpu):
            if child.tag not in ("numa", "topology", *keep_cpu):
                cpu.remove(child)
        model = etree.Element("model", fallback="allow")
        model.text = "qemu64"
        cpu.insert(0, model)
        topo = cpu.find("topology")
        if topo is not None:
            topo.set("sockets", str(max(1, len(cells))))
            if topo.get("dies") is not None:
                topo.set("dies", "1")
            topo.set("cores", str(vcpus_per_cell))
            topo.set("threads", "1")
    if cells:
        per_cell = max(64, memory_mib // len(cells))
        memory_mib = per_cell * len(cells)
        for i, cell in enumerate(cells):
            first = i * vcpus_per_cell
            cell.set("cpus", str(first) if vcpus_per_cell == 1 else f"{first}-{first + vcpus_per_cell - 1}")
            cell.set("memory", str(per_cell))
            cell.set("unit", "MiB")
            for a in ("memAccess", "discard"):
                if a in cell.attrib:
                    del cell.attrib[a]
        log.append(f"{len(cells)} NUMA cells: {vcpus_per_cell} vCPU and {per_cell} MiB each")
    mem = root.find("memory")
    if mem is None:
        mem = etree.Element("memory")
        root.insert(root.index(vcpu), mem)
    mem.attrib.clear()
    mem.set("unit", "MiB")
    mem.text = str(memory_mib)

    numatune = root.find("numatune")
    if numatune is not None:
        have = _host_nodes()
        for el in numatune:
            ns = el.get("nodeset")
            if ns is not None and not _parse_nodeset(ns) <= have:
                log.append(f"numatune <{el.tag}> nodeset {ns} -> {_fmt_nodeset(have)} (host nodes here)")
                el.set("nodeset", _fmt_nodeset(have))

    # --- devices ------------------------------------------------------------
    devices = root.find("devices")
    if devices is None:
        devices = etree.SubElement(root, "devices")
    for tag in _DROP_DEVICES:
        for el in devices.findall(tag):
            log.append(f"removed <{tag}>")
            devices.remove(el)
    if emulator is not None:
        em = etree.Element("emulator")
        em.text = emulator
        devices.insert(0, em)

    mapping: dict[GuestAddr, StandIn] = {}
    replaced_aliases: set[str] = set()
    has_video = any(True for _ in devices.iterfind("video"))
    first_gpu = not has_video
    counter = itertools.count()
    for hd in list(devices):
        is_hostdev = hd.tag == "hostdev" and hd.get("type") in ("pci", "mdev")
        is_hostdev_if = hd.tag == "interface" and hd.get("type") == "hostdev"
        if hd.tag == "hostdev" and not is_hostdev:
            log.append(f"removed <hostdev type={hd.get('type')}>")
            devices.remove(hd)
            continue
        if not (is_hostdev or is_hostdev_if):
            continue
        alias_el = hd.find("alias")
        alias = alias_el.get("name") if alias_el is not None else None
        if not alias or not alias.startswith("ua-"):
            alias = f"ua-standin-{next(counter)}"
        source = _source_bdf(hd)
        kind = _kind_of(hd, alias, source, kinds)
        addr_el = hd.find("address")
        if addr_el is not None and addr_el.get("type") != "pci":
            addr_el = None
        primary = kind == "gpu" and first_gpu
        if primary:
            first_gpu = False
        st = _standin(kind, alias, addr_el, primary)
        hd.addprevious(st)
        devices.remove(hd)
        replaced_aliases.add(alias)
        model = st.find("model").get("type") if st.find("model") is not None else "virtio"
        info = StandIn(alias=alias, source=source, kind=kind, element=st.tag, model=model)
        if addr_el is not None:
            ga = GuestAddr(_int(addr_el.get("bus")), _int(addr_el.get("slot")),
                           _int(addr_el.get("function"), 0))
            if ga in mapping:
                raise BootError(f"two hostdevs at guest address {ga}")
            mapping[ga] = info
        elif unplaced is not None:
            unplaced.append(info)
        log.append(f"hostdev {alias} ({source}) -> {st.tag} {model}")

    # KubeVirt-only interfaces -> user-mode networking, same model and address
    for itf in devices.findall("interface"):
        if itf.get("type") == "user":
            continue
        if itf.get("type") == "hostdev":
            continue  # already replaced above
        log.append(f"interface type={itf.get('type')} -> user")
        itf.set("type", "user")
        for child in list(itf):
            if child.tag not in ("mac", "model", "alias", "address", "rom", "link"):
                itf.remove(child)
        rom = itf.find("rom")
        if rom is not None and rom.get("file"):
            del rom.attrib["file"]

    # inputs on USB need a USB controller
    usb = devices.findall("controller[@type='usb']")
    if not usb:
        etree.SubElement(devices, "controller", type="usb", model="none")
        log.append("added <controller type=usb model=none> (libvirt would add one on a new root port)")
    elif all(c.get("model") == "none" for c in usb):
        for inp in devices.findall("input[@bus='usb']"):
            devices.remove(inp)
    if devices.find("memballoon") is None:
        etree.SubElement(devices, "memballoon", model="none")

    # serial console to a file
    serial = etree.SubElement(devices, "serial", type="file")
    etree.SubElement(serial, "source", path=str(serial_log_path))
    etree.SubElement(serial, "target", port="0")
    console = etree.SubElement(devices, "console", type="file")
    etree.SubElement(console, "source", path=str(serial_log_path))
    etree.SubElement(console, "target", type="serial", port="0")

    # the guest ends itself; make sure the domain ends with it
    for tag in ("on_poweroff", "on_reboot", "on_crash"):
        el = etree.Element(tag)
        el.text = "destroy"
        devices.addprevious(el)

    # --- qemu namespace -------------------------------------------------------
    for ov in root.findall(f"{Q}override"):
        for dev in ov.findall(f"{Q}device"):
            if dev.get("alias") in replaced_aliases:
                log.append(f"removed <qemu:override> of replaced hostdev {dev.get('alias')}")
                ov.remove(dev)
        if len(ov) == 0:
            root.remove(ov)
    for cl in root.findall(f"{Q}commandline"):
        if any((a.get("value") or "").find("/") >= 0 for a in cl.iter(f"{Q}arg")):
            log.append("removed <qemu:commandline> with host paths")
            root.remove(cl)
    # SeaBIOS writes its debug log to I/O port 0x402: beside the serial log, so that a boot that
    # never reaches the guest kernel still says where the firmware stopped
    cl = root.find(f"{Q}commandline")
    if cl is None:
        cl = etree.SubElement(root, f"{Q}commandline", nsmap={"qemu": QEMU_NS})
    for value in ("-chardev", f"file,id=pcitopo-fwlog,path={firmware_log_path(serial_log_path)}",
                  "-device", "isa-debugcon,iobase=0x402,chardev=pcitopo-fwlog"):
        etree.SubElement(cl, f"{Q}arg", value=value)

    etree.indent(root, space="  ")
    etree.cleanup_namespaces(root, top_nsmap={"qemu": QEMU_NS} if root.find(f"{Q}*") is not None else None)
    return etree.tostring(root, encoding="utf-8"), mapping


# ---------------------------------------------------------------------------
# booting


@dataclass
class GuestResult:
    name: str
    printout: GuestPrintout
    mapping: dict[GuestAddr, StandIn]  # guest address -> hostdev
    bdf_map: dict[str, StandIn]  # guest BDF -> hostdev
    defined_xml: bytes  # `virsh dumpxml` after define (all addresses filled in)
    bootable_xml: bytes
    serial_log: Path
    work_dir: Path
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    qemu_argv: tuple[str, ...] = ()  # what QEMU ran with, read from /proc while it ran

    @property
    def firmware(self) -> str:
        """The firmware that booted the guest, as its SMBIOS tables name it (vendor and version
        from ``/sys/class/dmi/id``): ``SeaBIOS 1.16.3-debian-1.16.3-2``,
        ``Debian distribution of EDK II 2025.02-8+deb13u1``; empty if the guest had none."""
        info = self.printout.info
        return " ".join(v for v in (info.get("bios_vendor", ""), info.get("bios_version", "")) if v)

    def unmapped(self) -> list[StandIn]:
        """Stand-ins (with a guest address) that did not show up where the
        domain put them: their hierarchy vanished or moved."""
        found = {id(s) for s in self.bdf_map.values()}
        return [s for s in self.mapping.values() if id(s) not in found]

    def sysfs_tree(self, out_dir: str | os.PathLike | None = None) -> Path:
        return guest_sysfs_tree(self.printout, out_dir or self.work_dir / "sysfs")


_seq = itertools.count()


def boot(domain_xml: bytes, **kwargs) -> GuestResult:
    """:func:`boot_once`, once more (``QEMU_ABORT_RETRIES``) if QEMU itself aborted on an internal
    assertion, or (with ``silent_after``) if the guest stayed silent (:class:`GuestSilent`);
    the retry is printed with its reason and noted in ``GuestResult.notes``. Any other failure,
    and a second one, is raised as it is."""
    aborts: list[str] = []
    while True:
        try:
            r = boot_once(domain_xml, **kwargs)
        except (QemuAborted, GuestSilent) as e:
            if len(aborts) >= QEMU_ABORT_RETRIES:
                raise
            what = "QEMU aborted" if isinstance(e, QemuAborted) else "guest silent"
            aborts.append(f"{what}: {e.reason}")
            print(f"\n[e2e] {what} ({e.reason}); booting the same domain once more", flush=True)
            continue
        r.notes += [f"an earlier try: {a}" for a in aborts]
        return r


def boot_once(
    domain_xml: bytes,
    *,
    kinds: Mapping[str, str] | None = None,
    libvirtd: PrivateLibvirtd | None = None,
    timeout: float = 120.0,
    work_dir: str | os.PathLike | None = None,
    memory_mib: int = 512,
    keep_cpu: Sequence[str] = (),
    loader: str | None = None,
    silent_after: float | None = None,
    cmdline: str = KERNEL_CMDLINE,
) -> GuestResult:
    """Make ``domain_xml`` (a rewritten domain) bootable, define and start it
    on a private libvirtd (``libvirtd`` if given, else a fresh one stopped
    afterwards), wait for the guest's end marker, destroy/undefine it and
    return the parsed printout. Raises ``BootError`` (with the tail of the
    serial and QEMU logs) on any failure or after ``timeout`` seconds;
    ``silent_after``: raise :class:`GuestSilent` early when the serial log stays empty past
    that many QEMU CPU seconds (or ``SILENT_WALL_FACTOR`` times that of wall time), for a boot
    known to reach /init; a control boot that may legitimately never get there leaves it None."""
    t0 = time.monotonic()
    name = f"pcitopo-e2e-{os.getpid()}-{next(_seq)}"
    if work_dir is None:
        _prune_runs(cache_dir() / "runs")
    wd = Path(work_dir) if work_dir else cache_dir() / "runs" / name
    wd.mkdir(parents=True, exist_ok=True)
    serial = (wd / "serial.log").resolve()
    if serial.exists():
        serial.unlink()
    kernel = find_kernel()
    initrd = build_initramfs(cache_dir())
    notes: list[str] = []
    unplaced: list[StandIn] = []
    bootable, mapping = make_bootable(
        domain_xml, kernel, initrd, serial, kinds=kinds, name=name,
        memory_mib=memory_mib, notes=notes, unplaced=unplaced, keep_cpu=keep_cpu, loader=loader, cmdline=cmdline,
        emulator=str(tcg_single_emulator()),
    )
    (wd / "bootable.xml").write_bytes(bootable)
    timings: dict[str, float] = {"prepare": time.monotonic() - t0}

    own = libvirtd is None
    lv = libvirtd or PrivateLibvirtd()
    defined = False
    try:
        t = time.monotonic()
        if own:
            lv.start()
            timings["libvirtd_start"] = time.monotonic() - t
        deadline = t0 + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        t = time.monotonic()
        r = lv.virsh("define", str(wd / "bootable.xml"), check=False, timeout=left())
        if r.returncode != 0:
            raise BootError(f"virsh define failed: {r.stderr.strip()}")
        defined = True
        timings["define"] = time.monotonic() - t
        defined_xml = lv.virsh("dumpxml", name, timeout=left()).stdout.encode()
        (wd / "defined.xml").write_bytes(defined_xml)
        mapping.update(_placed_by_libvirt(defined_xml, unplaced))

        t = time.monotonic()
        r = lv.virsh("start", name, check=False, timeout=left())
        if r.returncode != 0:
            raise BootError(f"virsh start failed: {r.stderr.strip()}\n{_tail(lv.qemu_log(name))}")
        qemu_argv = _qemu_argv(lv, name)
        text = ""
        while True:
            text = serial.read_text(errors="replace") if serial.exists() else ""
            if END_MARKER in text:
                break
            st = lv.virsh("domstate", name, check=False, timeout=left()).stdout.strip()
            if st.startswith("shut off") or st.startswith("crashed"):
                text = serial.read_text(errors="replace") if serial.exists() else ""
                if END_MARKER in text:
                    break
                message = (f"guest stopped ({st}) before the end marker\n"
                           f"--- serial ---\n{_tail(serial)}\n--- qemu log ---\n{_tail(lv.qemu_log(name))}")
                abort = _qemu_abort(_tail(lv.qemu_log(name), 200))
                if abort:
                    raise QemuAborted(message, abort)
                raise BootError(message)
            now = time.monotonic()
            silent = silent_after is not None and not text and _silent(lv, name, now - t, silent_after)
            if now > deadline or silent:
                cpu = _qemu_cpu_seconds(lv, name)
                what = f"no end marker after {timeout:.0f}s" if not silent else f"serial log empty after {now - t:.0f}s"
                message = (f"{what} (QEMU used {'?' if cpu is None else f'{cpu:.0f}'} CPU seconds)"
                           f"\n--- serial ---\n{_tail(serial)}"
                           f"\n--- firmware debug log ---\n{_tail(firmware_log_path(serial), 25)}"
                           f"\n--- qemu log ---\n{_tail(lv.qemu_log(name), 15)}")
                if silent:
                    last = _tail(firmware_log_path(serial), 1).strip() or "no firmware output"
                    raise GuestSilent(message, f"{what}, the firmware's last line: {last}")
                raise BootError(message)
            time.sleep(0.2)
        timings["run"] = time.monotonic() - t
        cpu = _qemu_cpu_seconds(lv, name)
        if cpu is not None:
            timings["qemu_cpu"] = cpu
    finally:
        t = time.monotonic()
        if defined:
            # the guest powers off right after the marker; a destroy of a
            # running QEMU costs ~1.5 s more than letting it end
            end = time.monotonic() + 3
            while time.monotonic() < end:
                st = lv.virsh("domstate", name, check=False, timeout=10).stdout
                if not st.strip() or st.startswith("shut off"):
                    break
                time.sleep(0.1)
            lv.virsh("destroy", name, check=False, timeout=30)
            lv.virsh("undefine", name, check=False, timeout=30)
        timings["teardown"] = time.monotonic() - t
        if own:
            lv.stop()
            lv.cleanup(keep_logs=False)
    printout = parse_printout(text)
    timings["total"] = time.monotonic() - t0
    return GuestResult(
        name=name, printout=printout, mapping=mapping,
        bdf_map=map_guest_bdfs(printout, defined_xml, mapping),
        defined_xml=defined_xml, bootable_xml=bootable, serial_log=serial,
        work_dir=wd, timings=timings, notes=notes, qemu_argv=qemu_argv,
    )


def _silent(lv: PrivateLibvirtd, name: str, running: float, cpu_limit: float) -> bool:
    if running > SILENT_WALL_FACTOR * cpu_limit:
        return True
    cpu = _qemu_cpu_seconds(lv, name)
    return cpu is not None and cpu > cpu_limit


def _qemu_argv(lv: PrivateLibvirtd, name: str) -> tuple[str, ...]:
    """The command line of the domain's running QEMU (after the wrapper's exec), or ()."""
    try:
        pid = int(lv.qemu_pidfile(name).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except (OSError, ValueError):
        return ()


def _qemu_cpu_seconds(lv: PrivateLibvirtd, name: str) -> float | None:
    """CPU time (user + system, all threads) the domain's QEMU has used so far: unlike wall
    time, it hardly depends on what else runs on the machine, so boots on different stacks or
    under different load compare by it."""
    try:
        pid = int(lv.qemu_pidfile(name).read_text().strip())
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    # fields after the command name start at stat's 3rd; utime and stime are the 14th and 15th
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _placed_by_libvirt(defined_xml: bytes, unplaced: list[StandIn]) -> dict[GuestAddr, StandIn]:
    """Guest addresses libvirt gave the stand-ins that had none."""
    if not unplaced:
        return {}
    root = etree.fromstring(defined_xml, _parser())
    out: dict[GuestAddr, StandIn] = {}
    for st in unplaced:
        for el in root.iterfind(f"devices/{st.element}"):
            a = el.find("alias")
            addr = el.find("address")
            if a is not None and a.get("name") == st.alias and addr is not None:
                out[GuestAddr(_int(addr.get("bus")), _int(addr.get("slot")),
                              _int(addr.get("function"), 0))] = st
    return out


def _prune_runs(runs: Path, keep: int = 30) -> None:
    """Keep the work dirs (serial log, XML) of the last ``keep`` boots."""
    if not runs.is_dir():
        return
    dirs = sorted((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for d in dirs[: max(0, len(dirs) - keep)]:
        shutil.rmtree(d, ignore_errors=True)


def firmware_log_path(serial_log_path: str | os.PathLike) -> Path:
    """Where the firmware's debug port output of a boot goes: beside its serial log."""
    return Path(serial_log_path).with_name("firmware.log")


def _tail(p: Path, n: int = 40) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({p} not readable)"


__all__ = [
    "BootError", "GuestResult", "GuestSilent", "LibvirtError", "PrivateLibvirtd", "QemuAborted", "boot", "boot_once",
    "make_bootable",
]
