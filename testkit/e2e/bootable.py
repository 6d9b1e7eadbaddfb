"""Turn a rewritten (KubeVirt-shaped) domain into one that boots here (:func:`make_bootable`;
:mod:`.guestboot` boots it).

``make_bootable`` keeps everything the planner decides (PCI controllers with
their indexes, addresses, ``busNr``, ``<node>``, chassis/port, aliases,
``<cpu><numa>`` cell ids, ``<numatune>`` cell ids, ``<qemu:override>`` of
controllers, ``<features><acpi/>`` or its absence) and changes only what
cannot work on this machine. Each change is appended to ``notes`` if given.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from lxml import etree

from pcitopo.libvirt.domain import QEMU_NS, Q

from .guesttree import GuestAddr, StandIn, _int
from .standins import kind_of, source_bdf, standin

KERNEL_CMDLINE = "console=ttyS0 quiet loglevel=1 panic=-1"

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


def _parser() -> etree.XMLParser:
    return etree.XMLParser(resolve_entities=False, no_network=True, remove_blank_text=False)


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
    choice; ``boot`` gives :func:`.guestboot.tcg_single_emulator`).
    """
    log = notes if notes is not None else []
    root = _qemu_domain(domain_xml, name, log)
    _direct_kernel_boot(root, kernel, initrd, cmdline, loader, log)
    _drop_kvm_features(root, log)
    cells, vcpu = _tcg_cpus(root, vcpus_per_cell, keep_cpu, log)
    _cell_memory(root, cells, vcpu, memory_mib, vcpus_per_cell, log)
    _numatune_on_host_nodes(root, log)
    devices = _devices_here(root, emulator, log)
    mapping, replaced_aliases = _replace_hostdevs(devices, kinds, unplaced, log)
    _user_networking(devices, log)
    _usb_serial_and_end(devices, serial_log_path, log)
    _qemu_namespace(root, replaced_aliases, serial_log_path, log)

    etree.indent(root, space="  ")
    etree.cleanup_namespaces(root, top_nsmap={"qemu": QEMU_NS} if root.find(f"{Q}*") is not None else None)
    return etree.tostring(root, encoding="utf-8"), mapping


def _qemu_domain(domain_xml: bytes, name: str | None, log: list[str]) -> etree._Element:
    """The domain, for QEMU (not KVM), renamed if ``name``, without the elements this machine cannot give."""
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
    return root


def _direct_kernel_boot(root: etree._Element, kernel: str | os.PathLike, initrd: str | os.PathLike, cmdline: str,
                        loader: str | None, log: list[str]) -> None:
    """<os>: a direct kernel boot of ``kernel`` and ``initrd`` on q35 (``loader``: a firmware ROM)."""
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


def _drop_kvm_features(root: etree._Element, log: list[str]) -> None:
    """<features> and <clock> timers only KVM or Hyper-V provide, which TCG has not."""
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


def _tcg_cpus(root: etree._Element, vcpus_per_cell: int, keep_cpu: Sequence[str],
              log: list[str]) -> tuple[list[etree._Element], etree._Element]:
    """CPU / NUMA: the guest cells and the <vcpu> element."""
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
    return cells, vcpu


def _cell_memory(root: etree._Element, cells: list[etree._Element], vcpu: etree._Element, memory_mib: int,
                 vcpus_per_cell: int, log: list[str]) -> None:
    """Memory, split over the NUMA cells."""
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


def _numatune_on_host_nodes(root: etree._Element, log: list[str]) -> None:
    """<numatune> nodesets this machine lacks become the nodes it has."""
    numatune = root.find("numatune")
    if numatune is not None:
        have = _host_nodes()
        for el in numatune:
            ns = el.get("nodeset")
            if ns is not None and not _parse_nodeset(ns) <= have:
                log.append(f"numatune <{el.tag}> nodeset {ns} -> {_fmt_nodeset(have)} (host nodes here)")
                el.set("nodeset", _fmt_nodeset(have))


def _devices_here(root: etree._Element, emulator: str | None, log: list[str]) -> etree._Element:
    """devices: what needs pod paths, daemons or host devices goes; the emulator is set."""
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
    return devices


def _replace_hostdevs(devices: etree._Element, kinds: Mapping[str, str] | None, unplaced: list[StandIn] | None,
                      log: list[str]) -> tuple[dict[GuestAddr, StandIn], set[str]]:
    """Every hostdev becomes a stand-in at its guest address: (address -> stand-in, aliases replaced)."""
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
        source = source_bdf(hd)
        kind = kind_of(hd, alias, source, kinds)
        addr_el = hd.find("address")
        if addr_el is not None and addr_el.get("type") != "pci":
            addr_el = None
        primary = kind == "gpu" and first_gpu
        if primary:
            first_gpu = False
        st = standin(kind, alias, addr_el, primary)
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
    return mapping, replaced_aliases


def _user_networking(devices: etree._Element, log: list[str]) -> None:
    """KubeVirt-only interfaces -> user-mode networking, same model and address."""
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


def _usb_serial_and_end(devices: etree._Element, serial_log_path: str | os.PathLike, log: list[str]) -> None:
    """A USB controller for USB inputs, no balloon, the serial console to a file, and a domain
    that ends with its guest."""
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


def _qemu_namespace(root: etree._Element, replaced_aliases: set[str], serial_log_path: str | os.PathLike,
                    log: list[str]) -> None:
    """<qemu:override> of replaced hostdevs and <qemu:commandline> with host paths go; the
    firmware's debug port is logged."""
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


def firmware_log_path(serial_log_path: str | os.PathLike) -> Path:
    """Where the firmware's debug port output of a boot goes: beside its serial log."""
    return Path(serial_log_path).with_name("firmware.log")
