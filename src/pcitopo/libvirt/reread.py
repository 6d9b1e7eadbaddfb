"""What a Go struct of the domain keeps when it reads domain XML and marshals it again: each
element cut to the attributes and children the struct has fields for, Go's ``encoding/xml``
folding of repeated elements, and the root's namespace declarations. Which fields a struct has
is its owner's (KubeVirt's ``api.DomainSpec`` per release: src/pcitopo/kubevirt/launcher/reparse.py
decides, this spells).
"""

from __future__ import annotations

from lxml import etree

from pcitopo.libvirt.domain import QEMU_NS, Q, parse_int


def keep_only(el: etree._Element, attributes: tuple[str, ...], children: tuple[str, ...]) -> None:
    """What a Go struct keeps of an element: the attributes and child tags it has fields for."""
    for a in list(el.attrib):
        if a not in attributes:
            del el.attrib[a]
    for child in list(el):
        if child.tag not in children:
            el.remove(child)


def reread_controllers(root: etree._Element, target_attributes: tuple[str, ...] | None) -> None:
    """Every ``<controller>`` without ``<model>``, its ``<target>`` cut to ``target_attributes``
    and ``<node>`` (None: no target field, the target dropped)."""
    for c in root.iter("controller"):
        for m in c.findall("model"):
            c.remove(m)
        for t in c.findall("target"):
            if target_attributes is None:
                c.remove(t)
                continue
            keep_only(t, target_attributes, ("node",))


def reread_addresses(root: etree._Element, empty_type: bool, decimal_bus: bool) -> None:
    """Every ``<address>`` without ``multifunction``; with ``empty_type`` a missing ``type`` or
    ``bus`` comes back empty (no ``omitempty``), with ``decimal_bus`` a device's bus in decimal."""
    for a in root.iter("address"):
        a.attrib.pop("multifunction", None)
        if empty_type:
            for attr in ("type", "bus"):
                if a.get(attr) is None:
                    a.set(attr, "")
        if decimal_bus and a.getparent().tag != "source" and a.get("bus"):
            a.set("bus", str(parse_int(a.get("bus"), "bus")))


def reread_hostdevs(root: etree._Element, driver_attributes: tuple[str, ...] | None) -> None:
    """Every ``<hostdev>`` without ``<rom>``, its ``<driver>`` cut to ``driver_attributes``
    (None: no driver field, the driver dropped)."""
    for hd in root.iter("hostdev"):
        for rom in hd.findall("rom"):
            hd.remove(rom)
        for drv in hd.findall("driver"):
            if driver_attributes is None:
                hd.remove(drv)
                continue
            keep_only(drv, driver_attributes, ())


def drop_maxphysaddr_and_overrides(root: etree._Element) -> None:
    """``<cpu><maxphysaddr>`` and ``<qemu:override>``, which no struct field reads."""
    for el in root.findall("cpu/maxphysaddr") + root.findall(f"{Q}override"):
        el.getparent().remove(el)


def reread_commandlines(root: etree._Element, kept: bool) -> bool:
    """``<qemu:commandline>`` dropped unless ``kept``; whether one remains."""
    commandline = root.findall(f"{Q}commandline")
    if not kept:
        for el in commandline:
            root.remove(el)
        return False
    return bool(commandline)


def drop_os_firmware(root: etree._Element) -> None:
    """``<os firmware=>``, for a struct without the field."""
    os_el = root.find("os")
    if os_el is not None:
        os_el.attrib.pop("firmware", None)


def fold_sysinfo(root: etree._Element) -> None:
    """One ``SysInfo`` field (type, system/bios/baseBoard/chassis entries): Go's decoder folds
    every ``<sysinfo>`` into it, the last one's type winning, and drops entries directly below
    ``<sysinfo>`` (where fw_cfg entries sit)."""
    found = root.findall("sysinfo")
    if not found:
        return
    merged = etree.Element("sysinfo", type=found[-1].get("type") or "")
    for part in ("system", "bios", "baseBoard", "chassis"):
        entries = [e for si in found for e in si.findall(f"{part}/entry")]
        if entries:
            sub = etree.SubElement(merged, part)
            for e in entries:
                sub.append(etree.fromstring(etree.tostring(e, with_tail=False)))
    found[0].addprevious(merged)
    merged.tail = found[0].tail
    for si in found:
        si.getparent().remove(si)


def with_qemu_namespace(root: etree._Element, keep: bool) -> etree._Element:
    """The root as Go marshals it: ``xmlns:qemu`` only when the struct's ``XmlNS`` is set."""
    nsmap = {k: v for k, v in root.nsmap.items() if v != QEMU_NS}
    if keep:
        nsmap["qemu"] = QEMU_NS
    if nsmap == root.nsmap:
        return root
    new = etree.Element(root.tag, attrib=dict(root.attrib), nsmap=nsmap)
    new.text = root.text
    for child in list(root):
        new.append(child)
    return etree.fromstring(etree.tostring(new))
