"""The ``<devices>`` of a domain as plain elements, for the model of what virt-launcher builds
(src/pcitopo/kubevirt/launcher/): finding devices, their ``<address>`` and ``<target>``, and the
devices KubeVirt adds between its defines (placeholder interfaces, bare root ports, copies of
the root disk). The rewrite's typed views of the same elements are :mod:`pcitopo.libvirt.domain`'s;
these keep what they are handed as it is (KubeVirt's struct, not the hook, wrote it).
"""

from __future__ import annotations

from lxml import etree

DEVICES = "devices"


def devices_of(root: etree._Element) -> etree._Element:
    """The domain's ``<devices>``."""
    return root.find(DEVICES)


def device_list(root: etree._Element) -> list[etree._Element]:
    """Every device of ``<devices>`` in document order (comments left out)."""
    return [el for el in devices_of(root) if isinstance(el.tag, str)]


def device_elements(root: etree._Element, tag: str) -> list[etree._Element]:
    """The ``<devices>`` children named ``tag`` (``interface``, ``hostdev``, ``controller``, ...)."""
    return root.findall(f"{DEVICES}/{tag}")


def pci_controllers(root: etree._Element) -> list[etree._Element]:
    """The ``<controller type='pci'>`` elements, in document order."""
    return [c for c in device_elements(root, "controller") if c.get("type") == "pci"]


def address_of(el: etree._Element) -> etree._Element | None:
    """A device's own ``<address>`` (not its source's)."""
    return el.find("address")


def target_of(el: etree._Element) -> etree._Element | None:
    """A device's ``<target>``."""
    return el.find("target")


def target_attr(el: etree._Element, name: str) -> str | None:
    """An attribute of a device's ``<target>`` (a disk's ``bus``, a port's ``busNr``); None
    without a target."""
    t = target_of(el)
    return None if t is None else t.get(name)


def has_pci_hostdev(root: etree._Element) -> bool:
    """Whether the domain holds a ``<hostdev type='pci'>``."""
    return bool(root.xpath("devices/hostdev[@type='pci']"))


def has_controller_model_names(root: etree._Element) -> bool:
    """Whether any controller carries a ``<model name>`` (QEMU's device, as we write it)."""
    return bool(root.xpath("devices/controller/model[@name]"))


def append_pci_controller(root: etree._Element, index: int, model: str) -> None:
    """A bare ``<controller type='pci' index= model=>`` at the end of ``<devices>``."""
    devices_of(root).append(etree.Element("controller", type="pci", index=str(index), model=model))


def append_ethernet_interface(root: etree._Element, dev: str, model: str, alias: str) -> None:
    """An ``<interface type='ethernet'>`` on tap ``dev`` (``managed='no'``) of ``model`` with
    ``alias``, at the end of ``<devices>``."""
    iface = etree.SubElement(devices_of(root), "interface", type="ethernet")
    etree.SubElement(iface, "target", dev=dev, managed="no")
    etree.SubElement(iface, "model", type=model)
    etree.SubElement(iface, "alias", name=alias)


def take_devices(root: etree._Element, other: etree._Element, keep: str) -> None:
    """``root``'s ``<devices>`` become ``other``'s, whose ``keep`` devices (``interface``) are
    swapped for ``root``'s own, appended at the end."""
    devices = devices_of(other)
    for el in devices.findall(keep):
        devices.remove(el)
    for el in device_elements(root, keep):
        devices.append(el)
    root.replace(devices_of(root), devices)


def copy_disk_after(anchor: etree._Element, template: etree._Element, file: str, dev: str, alias: str) -> etree._Element:
    """A copy of the disk ``template`` with its source ``file``, target ``dev`` and ``alias``,
    placed after ``anchor``; the copy."""
    el = etree.fromstring(etree.tostring(template))
    el.tail = None
    el.find("source").set("file", file)
    el.find("target").set("dev", dev)
    el.find("alias").set("name", alias)
    anchor.addnext(el)
    return el
