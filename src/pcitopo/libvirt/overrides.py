"""``<qemu:override>``: QEMU device properties set through libvirt, by device alias.

libvirt (8.2 and later) lets a domain set a QEMU ``-device`` property of any device that has an
alias (``docs/drvqemu.rst``, "Overriding properties of QEMU devices")::

    <qemu:override>
      <qemu:device alias='ua-gpu-gpu0'>
        <qemu:frontend>
          <qemu:property name='x-nv-gpudirect-clique' type='unsigned' value='0'/>
        </qemu:frontend>
      </qemu:device>
    </qemu:override>

(The older ``-set device.<id>.<prop>=…`` through ``<qemu:commandline>`` no longer works: libvirt
passes ``-device`` as JSON.) The spellings of these elements live here and nowhere else, as
``src/pcitopo/libvirt/domain.py`` holds the rest. KubeVirt's domain struct does not keep this element
between hook calls, so whoever needs a property re-emits it on every call: :func:`set_properties`
first removes every property its owner wrote (so a call replaces what an earlier call wrote) and
then adds what is wanted, keeping every other property and device untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from lxml import etree

from pcitopo.libvirt.document import append_child, indent_subtree, indent_unit, remove_element
from pcitopo.libvirt.domain import QEMU_NS, Q

OVERRIDE = f"{Q}override"
DEVICE = f"{Q}device"
FRONTEND = f"{Q}frontend"
PROPERTY = f"{Q}property"


@dataclass(frozen=True)
class Property:
    name: str
    type: str  # unsigned | signed | string | bool
    value: str


def has_override(root: etree._Element) -> bool:
    """Whether any element named ``override`` is in the domain, whatever its namespace (a
    reading that lost the prefix counts)."""
    return bool(root.xpath("//*[local-name()='override']"))


def properties(root: etree._Element) -> dict[str, dict[str, Property]]:
    """alias → {property name → Property} for every override in the domain."""
    out: dict[str, dict[str, Property]] = {}
    for dev in root.iterfind(f"{OVERRIDE}/{DEVICE}"):
        for p in dev.iterfind(f"{FRONTEND}/{PROPERTY}"):
            out.setdefault(dev.get("alias") or "", {})[p.get("name") or ""] = Property(
                p.get("name") or "", p.get("type") or "", p.get("value") or ""
            )
    return out


def set_properties(
    root: etree._Element,
    owned: Callable[[str, str], bool],
    wanted: Mapping[str, Sequence[Property]],
) -> None:
    """Remove every property for which ``owned(alias, name)`` holds (and the device/override
    elements left empty by that), then set ``wanted`` (alias → properties)."""
    for ov in list(root.iterfind(OVERRIDE)):
        for dev in list(ov.iterfind(DEVICE)):
            for fe in list(dev.iterfind(FRONTEND)):
                for p in list(fe.iterfind(PROPERTY)):
                    if owned(dev.get("alias") or "", p.get("name") or ""):
                        remove_element(p)
                if len(fe) == 0:
                    remove_element(fe)
            if len(dev) == 0:
                remove_element(dev)
        if len(ov) == 0:
            remove_element(ov)
    wanted = {a: ps for a, ps in wanted.items() if ps}
    if not wanted:
        return
    ov = root.find(OVERRIDE)
    unit = indent_unit(root.getroottree())
    if ov is None:
        ov = etree.Element(OVERRIDE, nsmap={"qemu": QEMU_NS})
        append_child(root, ov)
    # Below <qemu:override> plain appends: indent_subtree gives every element there its
    # indentation at the end.
    devices: dict[str, etree._Element] = {}
    for d in ov.iterfind(DEVICE):
        devices.setdefault(d.get("alias"), d)  # the first device of an alias, as a search would find
    for alias in sorted(wanted):
        dev = devices.get(alias)
        if dev is None:
            dev = devices[alias] = etree.SubElement(ov, DEVICE, alias=alias)
        fe = dev.find(FRONTEND)
        if fe is None:
            fe = etree.SubElement(dev, FRONTEND)
        for prop in wanted[alias]:
            old = next((p for p in fe.iterfind(PROPERTY) if p.get("name") == prop.name), None)
            if old is not None:
                fe.remove(old)
            etree.SubElement(fe, PROPERTY, name=prop.name, type=prop.type, value=prop.value)
    indent_subtree(ov, 1, unit)
