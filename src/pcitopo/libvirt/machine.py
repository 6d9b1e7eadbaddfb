"""The machine a domain describes: its ``<os>`` firmware, ``<memory>`` size and ``<cpu>``
(address width, features), and a sketch domain built from scratch.

The MMIO budget (:mod:`pcitopo.guest.mmio`) decides what these must say; the spellings it reads
and writes, and libvirt's memory-unit table, live here, as do the ``<os>``, ``<cpu>``, ``<vcpu>``,
``<cputune>`` and ``<memoryBacking>`` settings of virt-launcher's converter, whose values the
model of it computes (src/pcitopo/kubevirt/launcher/). The PCI side of a domain (controllers,
hostdevs, addresses) is :mod:`pcitopo.libvirt.domain`'s.
"""

from __future__ import annotations

from lxml import etree

from pcitopo.libvirt.document import append_child
from pcitopo.libvirt.domain import parse_int
from pcitopo.model.tree import Bdf

# -- <os>, <memory>, <cpu>: what the MMIO budget reads and writes (src/pcitopo/guest/mmio.py computes) --

CPU = "cpu"
MAXPHYSADDR = "maxphysaddr"
CPU_FEATURE = "feature"
# libvirt's order of <cpu> children: <maxphysaddr> goes after these, before <feature> and <numa>
CPU_CHILDREN_BEFORE_MAXPHYSADDR = ("model", "vendor", "topology", "cache")
FEATURE_OFF_POLICIES = ("disable", "forbid")
_KiB, _MiB, _GiB, _TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
# libvirt's memory units (formatdomain.html "Memory Allocation": unit, default KiB)
MEMORY_UNITS = {"b": 1, "bytes": 1, "k": _KiB, "kib": _KiB, "kb": 1000, "m": _MiB, "mib": _MiB, "mb": 10**6,
                "g": _GiB, "gib": _GiB, "gb": 10**9, "t": _TiB, "tib": _TiB, "tb": 10**12}


def firmware_of(root: etree._Element) -> str:
    """``ovmf`` when ``<os>`` boots UEFI (firmware='efi', or a pflash/OVMF/edk2 loader), else
    ``seabios`` (KubeVirt boots OVMF only with spec.domain.firmware.bootloader.efi)."""
    os_el = root.find("os")
    if os_el is None:
        return "seabios"
    if (os_el.get("firmware") or "").lower() == "efi":
        return "ovmf"
    loader = os_el.find("loader")
    if loader is not None:
        text = (loader.text or "").lower()
        if loader.get("type") == "pflash" or any(k in text for k in ("ovmf", "edk2", "efi", "aavmf")):
            return "ovmf"
    return "seabios"


def cpu_mode_of(root: etree._Element) -> str:
    """``<cpu mode>`` (libvirt's default ``custom``), ``none`` without ``<cpu>``."""
    cpu = root.find(CPU)
    if cpu is None:
        return "none"
    return cpu.get("mode") or "custom"


def memory_bytes(root: etree._Element, tag: str = "memory") -> int:
    """``<memory>`` (or ``tag``) in bytes; 0 when absent."""
    el = root.find(tag)
    if el is None or not (el.text or "").strip():
        return 0
    return parse_int(el.text, f"<{tag}>") * MEMORY_UNITS.get((el.get("unit") or "KiB").lower(), _KiB)


def guest_ram(root: etree._Element) -> int:
    """Guest RAM in bytes (``<maxMemory>`` if larger: hotplugged DIMMs sit above RAM too)."""
    return max(memory_bytes(root, "memory"), memory_bytes(root, "maxMemory"))


def ensure_cpu(root: etree._Element) -> etree._Element:
    """The domain's ``<cpu>``, appended (in the document's indentation) when absent."""
    cpu = root.find(CPU)
    if cpu is None:
        cpu = etree.Element(CPU)
        append_child(root, cpu)
    return cpu


def set_maxphysaddr(cpu: etree._Element, bits: int | None) -> None:
    """``<maxphysaddr mode='passthrough'/>`` (bits None) or ``mode='emulate' bits='N'``,
    replacing one already there, else in libvirt's order."""
    old = cpu.find(MAXPHYSADDR)
    el = etree.Element(MAXPHYSADDR)
    el.set("mode", "passthrough" if bits is None else "emulate")
    if bits is not None:
        el.set("bits", str(bits))
    if old is not None:
        el.tail = old.tail
        cpu.replace(old, el)
        return
    after = None
    for tag in CPU_CHILDREN_BEFORE_MAXPHYSADDR:
        found = cpu.find(tag)
        if found is not None:
            after = found
    if after is None and len(cpu):
        cpu[0].addprevious(el)
        el.tail = cpu.text
        return
    append_child(cpu, el, after=after)


def cpu_feature_policies(cpu: etree._Element, name: str) -> list[str | None]:
    """The policies of ``<feature name=NAME>`` under ``<cpu>`` (empty: not named)."""
    return [f.get("policy") for f in cpu.findall(CPU_FEATURE) if f.get("name") == name]


def cpu_has_model(cpu: etree._Element) -> bool:
    return cpu.find("model") is not None


def require_cpu_feature(cpu: etree._Element, name: str) -> None:
    """Append ``<feature policy='require' name=NAME/>`` after the last feature (else after
    ``<maxphysaddr>``)."""
    el = etree.Element(CPU_FEATURE)
    el.set("policy", "require")
    el.set("name", name)
    feats = cpu.findall(CPU_FEATURE)
    append_child(cpu, el, after=feats[-1] if feats else cpu.find(MAXPHYSADDR))


def has_maxphysaddr(root: etree._Element) -> bool:
    return root.find(f"{CPU}/{MAXPHYSADDR}") is not None


# -- what virt-launcher's converter sets (src/pcitopo/kubevirt/launcher/ decides the values) ---

def set_machine_type(root: etree._Element, machine: str) -> None:
    """``<os><type machine=>``."""
    root.find("os/type").set("machine", machine)


def add_pflash_loader(root: etree._Element, code: str, template: str, nvram: str) -> None:
    """A read-only pflash ``<loader>`` (secure boot off) of ``code`` and its ``<nvram>`` from
    ``template`` after ``<os><type>``, unless ``<os>`` has a loader already."""
    os_el = root.find("os")
    if os_el.find("loader") is not None:
        return
    loader = etree.Element("loader", readonly="yes", secure="no", type="pflash")
    loader.text = code
    nvram_el = etree.Element("nvram", template=template)
    nvram_el.text = nvram
    os_el.find("type").addnext(loader)
    loader.addnext(nvram_el)


def set_loader_secure(root: etree._Element, secure: bool) -> None:
    """``<os><loader secure=>``."""
    root.find("os/loader").set("secure", "yes" if secure else "no")


def set_cpu_mode(root: etree._Element, mode: str, model: str | None = None) -> None:
    """``<cpu mode=>``; with ``model``, a ``<model>`` of that name first in ``<cpu>``."""
    cpu = root.find(CPU)
    cpu.set("mode", mode)
    if model is not None:
        el = etree.Element("model")
        el.text = model
        cpu.insert(0, el)


def set_cpu_topology(root: etree._Element, sockets: int, cores: int, threads: int) -> None:
    """``<cpu><topology sockets= cores= threads=>``."""
    root.find(f"{CPU}/topology").attrib.update({"sockets": str(sockets), "cores": str(cores), "threads": str(threads)})


def set_vcpus(root: etree._Element, states: list[tuple[bool, bool]]) -> None:
    """``<vcpu>`` is ``len(states)``, and ``<vcpus>`` after it has one ``<vcpu id= enabled=
    hotpluggable=>`` per ``(enabled, hotpluggable)`` in ``states``."""
    vcpu = root.find("vcpu")
    vcpu.text = str(len(states))
    vcpus = etree.Element("vcpus")
    for i, (enabled, hotpluggable) in enumerate(states):
        etree.SubElement(vcpus, "vcpu", id=str(i), enabled="yes" if enabled else "no",
                         hotpluggable="yes" if hotpluggable else "no")
    vcpu.addnext(vcpus)


def add_emulator_pin(root: etree._Element, cpuset: str) -> None:
    """``<cputune><emulatorpin cpuset=>``."""
    etree.SubElement(root.find("cputune"), "emulatorpin", cpuset=cpuset)


def set_memory(root: etree._Element, amount: int) -> None:
    """``<memory>``'s amount, in the unit it has."""
    root.find("memory").text = str(amount)


def numa_cells(root: etree._Element) -> list[etree._Element]:
    """The guest cells, ``<cpu><numa><cell>``, in order."""
    return root.findall(f"{CPU}/numa/cell")


def set_hugepages(root: etree._Element, size: int, unit: str, nodesets: list[str | None]) -> None:
    """``<memoryBacking><hugepages>`` holding one ``<page size= unit=>`` per entry of
    ``nodesets`` (with ``nodeset=`` unless None), the pages it had dropped."""
    hp = root.find("memoryBacking/hugepages")
    for page in list(hp):
        hp.remove(page)
    for nodeset in nodesets:
        attrs = {"size": str(size), "unit": unit}
        if nodeset is not None:
            attrs["nodeset"] = nodeset
        etree.SubElement(hp, "page", attrs)


def add_memory_backing(root: etree._Element, source: str, allocation: str) -> None:
    """``<source type=>`` and ``<allocation mode=>`` at the end of ``<memoryBacking>``."""
    mb = root.find("memoryBacking")
    etree.SubElement(mb, "source", type=source)
    etree.SubElement(mb, "allocation", mode=allocation)


# -- a sketch domain: every named device passed through (pcitopo topo --dot) -----------------

def sketch_domain(devices: list[Bdf], host_nodes: list[int]) -> bytes:
    """A minimal q35 domain that passes ``devices`` through, with ACPI and one guest cell per
    host NUMA node in ``host_nodes`` (cell i backed by node host_nodes[i] through
    ``<numatune><memnode>``, as KubeVirt's guestMappingPassthrough writes it). It is never
    started: it lets ``pcitopo topo --dot`` predict the guest of a VM given all those devices."""
    root = etree.Element("domain", type="kvm")
    etree.SubElement(root, "name").text = "pcitopo-sketch"
    etree.SubElement(root, "memory", unit="GiB").text = str(max(1, len(host_nodes)))
    etree.SubElement(root, "vcpu").text = str(max(1, len(host_nodes)))
    os_el = etree.SubElement(root, "os")
    etree.SubElement(os_el, "type", arch="x86_64", machine="q35").text = "hvm"
    etree.SubElement(etree.SubElement(root, "features"), "acpi")
    if host_nodes:
        numa = etree.SubElement(etree.SubElement(root, CPU), "numa")
        tune = etree.SubElement(root, "numatune")
        for cell, node in enumerate(host_nodes):
            etree.SubElement(numa, "cell", id=str(cell), cpus=str(cell), memory="1", unit="GiB")
            etree.SubElement(tune, "memnode", cellid=str(cell), mode="strict", nodeset=str(node))
    devs = etree.SubElement(root, "devices")
    for b in devices:
        hd = etree.SubElement(devs, "hostdev", mode="subsystem", type="pci", managed="no")
        etree.SubElement(
            etree.SubElement(hd, "source"), "address",
            domain=f"0x{b.domain:04x}", bus=f"0x{b.bus:02x}", slot=f"0x{b.slot:02x}", function=f"0x{b.function:x}",
        )
    return etree.tostring(root, pretty_print=True)
