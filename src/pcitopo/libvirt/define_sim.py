"""libvirt's additions at define, as :func:`libvirt_define` simulates them (checked against libvirt
9.0's ``virsh define`` + ``dumpxml --inactive``): what virt-launcher reads back between its
defines (:mod:`pcitopo.kubevirt.launcher.defines`, ``pcitopo domain --call N``). The test kit runs the real libvirt where
it is installed (testkit/kubevirt_define.py ``RealLibvirt``)."""

from __future__ import annotations

from lxml import etree

from pcitopo.libvirt.domain import QEMU_MODEL_NAME, ROOT_PORT, parse_int
from pcitopo.libvirt.marshal import sub as _sub, to_kubevirt_bytes

# Unaddressed devices libvirt gives a root port of their own on pcie-root.
_PCIE_TAGS = ("interface", "memballoon", "rng", "vsock")


def _needs_root_port(el: etree._Element) -> bool:
    if el.tag in _PCIE_TAGS:
        return el.get("model") != "none" and (el.find("model") is None or el.find("model").get("type") != "none")
    if el.tag == "hostdev":
        return el.get("type") == "mdev"
    if el.tag == "disk":
        t = el.find("target")
        return t is not None and t.get("bus") == "virtio"
    if el.tag == "controller":
        return el.get("type") in ("scsi", "virtio-serial")
    if el.tag == "input":
        return el.get("bus") == "virtio"
    return False


class _RootBus:
    """libvirt's bookkeeping at define: controller indexes in use, pcie-root slots taken, and the
    slot whose functions new root ports fill (root ports packed as functions of one slot)."""

    def __init__(self, devices: etree._Element, pci: list[etree._Element]):
        self.pci = pci
        self.used_indexes = {parse_int(c.get("index"), "index") for c in pci}
        self.taken_slots = {0, 0x1F}
        for a in devices.iter("address"):
            if a.get("type") == "pci" and a.getparent().tag != "source" and parse_int(a.get("bus", "0"), "bus") == 0:
                self.taken_slots.add(parse_int(a.get("slot", "0"), "slot"))
        self.open_slot: list[int] = []  # [slot, next function] of the slot being filled
        self.bridge: list[int] = []  # the pcie-to-pci-bridge for conventional PCI devices, once made

    def free_root_fn(self) -> tuple[int, int]:
        if not self.open_slot or self.open_slot[1] == 8:
            s = next(s for s in range(2, 0x1F) if s not in self.taken_slots)
            self.taken_slots.add(s)
            self.open_slot[:] = [s, 0]
        s, f = self.open_slot
        self.open_slot[1] += 1
        return s, f

    def add_controller(self, index: int, model: str) -> etree._Element:
        el = etree.Element("controller", type="pci", index=str(index), model=model)
        self.pci[-1].addnext(el)
        self.pci.append(el)
        self.used_indexes.add(index)
        return el

    def add_port(self, index: int) -> etree._Element:
        s, f = self.free_root_fn()
        rp = self.add_controller(index, ROOT_PORT)
        _sub(rp, "target", chassis=str(index), port=f"0x{(s << 3) | f:x}")
        _sub(rp, "address", type="pci", domain="0x0000", bus="0x00", slot=f"0x{s:02x}", function=f"0x{f:x}",
             **({"multifunction": "on"} if f == 0 else {}))
        return rp

    def lowest_free(self) -> int:
        i = 1
        while i in self.used_indexes:
            i += 1
        return i

    def place(self, el: etree._Element) -> None:
        """An unaddressed device: a root port of its own, or slot 1.. of the one PCI bridge."""
        if _needs_root_port(el):
            index = self.lowest_free()
            self.add_port(index)
            _sub(el, "address", type="pci", domain="0x0000", bus=f"0x{index:02x}", slot="0x00", function="0x0")
        elif el.tag == "watchdog" and el.get("model") == "i6300esb":
            if not self.bridge:
                port = self.lowest_free()
                self.add_port(port)
                index = self.lowest_free()
                br = self.add_controller(index, "pcie-to-pci-bridge")
                _sub(br, "address", type="pci", domain="0x0000", bus=f"0x{port:02x}", slot="0x00", function="0x0")
                self.bridge.append(index)
            _sub(el, "address", type="pci", domain="0x0000", bus=f"0x{self.bridge[0]:02x}", slot="0x01", function="0x0")

    def fill_gaps(self) -> None:
        for i in range(1, max(self.used_indexes)):
            if i not in self.used_indexes:
                self.add_port(i)


def libvirt_define(xml: bytes) -> bytes:
    """libvirt's additions at define (checked against libvirt 9.0's define and dumpxml):
    pcie-root; the primary video at 00:01.0; one pcie-root-port on pcie-root per unaddressed
    PCIe device, at the lowest free index (root ports packed as functions of one slot from slot
    2); a pcie-to-pci-bridge in a root port of its own for a conventional PCI watchdog; root
    ports in every index gap below the highest; model names, chassis/port and ``pci.N`` aliases
    on controllers that lack them; hostdevs with ``mode``, ``<driver name='vfio'>`` and source
    addresses without ``type``."""
    root = etree.fromstring(xml, etree.XMLParser(resolve_entities=False))
    devices = root.find("devices")
    pci = [c for c in devices.findall("controller") if c.get("type") == "pci"]
    if not any(c.get("model") == "pcie-root" for c in pci):
        el = etree.Element("controller", type="pci", index="0", model="pcie-root")
        devices.insert(0, el)
        pci.insert(0, el)
    bus = _RootBus(devices, pci)
    video = devices.find("video")
    if video is not None and video.find("address") is None and 1 not in bus.taken_slots:
        _sub(video, "address", type="pci", domain="0x0000", bus="0x00", slot="0x01", function="0x0")
    bus.taken_slots.add(1)
    for el in list(devices):
        if isinstance(el.tag, str) and el.find("address") is None:
            bus.place(el)
    bus.fill_gaps()
    _name_controllers(pci)
    _format_hostdevs(devices)
    return to_kubevirt_bytes(root)


def _name_controllers(pci: list[etree._Element]) -> None:
    """Model names, chassis/port and ``pci.N`` aliases on controllers that lack them."""
    for c in pci:
        model = c.get("model")
        if model in QEMU_MODEL_NAME and c.find("model") is None:
            c.insert(0, etree.Element("model", name=QEMU_MODEL_NAME[model]))
        if model in (ROOT_PORT, "pcie-switch-downstream-port"):
            t = c.find("target")
            if t is None:
                t = etree.Element("target")
                c.find("model").addnext(t)
            if t.get("chassis") is None:
                t.set("chassis", c.get("index"))
            if t.get("port") is None:
                t.set("port", "0x0")
        if c.find("alias") is None:
            al = etree.Element("alias", name="pcie.0" if model == "pcie-root" else f"pci.{c.get('index')}")
            addr = c.find("address")
            (addr.addprevious(al) if addr is not None else c.append(al))


def _format_hostdevs(devices: etree._Element) -> None:
    """Hostdevs with ``mode``, ``<driver name='vfio'>`` and source addresses without ``type``."""
    for hd in devices.findall("hostdev"):
        if hd.get("type") != "pci":
            continue
        hd.set("mode", "subsystem")
        src = hd.find("source/address")
        if src is not None:
            src.attrib.pop("type", None)
        if hd.find("driver") is None:
            hd.insert(0, etree.Element("driver", name="vfio"))

