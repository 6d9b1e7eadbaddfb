"""KubeVirt's re-parse between hook calls, per release: what the next ``OnDefineDomain`` call (and
the next define) gets of a hook's output (``pcitopo domain --call N``).

virt-launcher reads a hook's output back into its Go struct ``api.DomainSpec``
(``pkg/virt-launcher/virtwrap/api/schema.go``) and marshals that struct again for the next
``OnDefineDomain`` call; only the last call's raw string is defined. What survives is what the
struct has a field for, and the struct differs per release: the table in releases.py
(:class:`Release`'s fields; docs/SOURCES.md, "KubeVirt's re-parse, per release").

Every release drops controller ``<model name>``, target ``chassis``/``port``, address
``multifunction``, ``<cpu><maxphysaddr>``, ``<qemu:override>``, hostdev ``<rom>``, and the
root's ``xmlns:qemu`` (Go's ``encoding/xml`` does not match the prefixed names
``xmlns:qemu``/``qemu:commandline`` of the struct tags when it reads; main re-extracts the
command line and its namespace after the re-parse). Every release keeps ``<cpu><feature>``, NUMA
cells, ``<os>`` loader and nvram, hostdev ``mode``, and aliases (``ua-`` ones included).
Field by field where releases differ:

- ``Address.Type`` and ``Address.Bus`` have no ``omitempty`` up to v1.7: an address read without
  ``type`` (libvirt writes hostdev source addresses that way) comes back as ``type=""``.
- A ``<target>`` whose attributes are all dropped comes back as an empty ``<target>`` from v1.8
  on (the pointer is set), and vanishes in v1.7 (no field at all).
- ``HostDevice.Driver`` exists from v1.9 with only ``iommufd``: libvirt's ``<driver name='vfio'/>``
  comes back empty. v1.8 has no field (dropped, as v1.7); the v1.8–1.9 group is modelled on
  v1.9.0's struct, and the hook reads no hostdev ``<driver>``.
- ``OS.Firmware`` (``<os firmware='efi'>``, written by v1.9's firmware auto-selection) exists
  from v1.9; v1.7 and v1.8 never write it and drop it.
"""

from __future__ import annotations

from lxml import etree

from pcitopo.libvirt.domain import QEMU_NS, parse_int

from pcitopo.kubevirt.launcher.release_groups import Release


def _keep_only(el: etree._Element, attributes: tuple[str, ...], children: tuple[str, ...]) -> None:
    """What a Go struct keeps of an element: the attributes and child tags it has fields for."""
    for a in list(el.attrib):
        if a not in attributes:
            del el.attrib[a]
    for child in list(el):
        if child.tag not in children:
            el.remove(child)


def _reparse_controller(c: etree._Element, release: Release) -> None:
    for m in c.findall("model"):
        c.remove(m)
    for t in c.findall("target"):
        if not release.controller_target:
            c.remove(t)
            continue
        _keep_only(t, ("busNr", "hotplug") if release.target_hotplug else ("busNr",), ("node",))


def _reparse_address(a: etree._Element, release: Release, decimal_bus: bool) -> None:
    a.attrib.pop("multifunction", None)
    if release.empty_address_type:
        for attr in ("type", "bus"):
            if a.get(attr) is None:
                a.set(attr, "")
    if decimal_bus and a.getparent().tag != "source" and a.get("bus"):
        a.set("bus", str(parse_int(a.get("bus"), "bus")))


def _reparse_hostdev(hd: etree._Element, release: Release) -> None:
    for rom in hd.findall("rom"):
        hd.remove(rom)
    for drv in hd.findall("driver"):
        if not release.hostdev_driver:
            hd.remove(drv)
            continue
        _keep_only(drv, ("iommufd",), ())


def _without_qemu_namespace(root: etree._Element, keep: bool) -> etree._Element:
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


def reparse(xml: bytes, release: Release, decimal_bus: bool = False) -> etree._Element:
    """``xml`` after ``release``'s ``xml.Unmarshal`` into ``api.DomainSpec`` and back."""
    root = etree.fromstring(xml)
    for c in root.iter("controller"):
        _reparse_controller(c, release)
    for a in root.iter("address"):
        _reparse_address(a, release, decimal_bus)
    for hd in root.iter("hostdev"):
        _reparse_hostdev(hd, release)
    for el in root.findall("cpu/maxphysaddr") + root.findall(f"{{{QEMU_NS}}}override"):
        el.getparent().remove(el)
    commandline = root.findall(f"{{{QEMU_NS}}}commandline")
    if not release.commandline_restored:
        for el in commandline:
            root.remove(el)
        commandline = []
    os_el = root.find("os")
    if os_el is not None and not release.os_firmware:
        os_el.attrib.pop("firmware", None)
    _fold_sysinfo(root)
    return _without_qemu_namespace(root, keep=bool(commandline))


def _fold_sysinfo(root: etree._Element) -> None:
    """Every release's api.DomainSpec has one ``SysInfo`` (type, system/bios/baseBoard/chassis
    entries); Go's decoder folds every ``<sysinfo>`` into it, the last one's type winning, and
    drops entries directly below ``<sysinfo>`` (where fw_cfg entries sit)."""
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
