"""``<sysinfo type='fwcfg'>``: blobs QEMU hands the guest through its firmware configuration
device, and the spellings of that element (as ``topology/overrides.py`` holds ``<qemu:override>``).

libvirt (6.5 and later) turns each ``<entry name='opt/...'>VALUE</entry>`` into
``-fw_cfg name=opt/...,string=VALUE``; a Linux guest reads it at
``/sys/firmware/qemu_fw_cfg/by_name/opt/.../raw`` (module ``qemu_fw_cfg``). The value is inline
because the hook runs in another container than libvirt: a ``file=`` path would have to exist
in the compute container. libvirt (9.0 and 11.3, measured) XML-escapes an inline value on its
way to QEMU's command line, so ``<`` arrives in the guest as ``&lt;``: markup is carried
base64-encoded, and the guest decodes it.

KubeVirt's domain struct keeps a single ``<sysinfo>`` (its own ``smbios`` one): a second one is
folded into it on the re-parse between hook calls and its entries are dropped. So the element
is written *before* any other ``<sysinfo>`` (KubeVirt's then wins the fold and stays intact)
and re-emitted on every call; :func:`set_entries` replaces what an earlier call wrote.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping

from lxml import etree

from pcitopo.libvirt.document import append_child, indent_subtree, indent_unit, remove_element

SYSINFO = "sysinfo"
FWCFG = "fwcfg"
ENTRY = "entry"


def encode(data: bytes) -> str:
    """The inline value for ``data``: base64, which libvirt's escaping leaves alone."""
    return base64.b64encode(data).decode("ascii")


def entries(root: etree._Element) -> dict[str, str]:
    """name → inline value of every fw_cfg entry in the domain."""
    return {e.get("name") or "": e.text or "" for e in root.iterfind(f"{SYSINFO}[@type='{FWCFG}']/{ENTRY}")}


def set_entries(root: etree._Element, owned: Callable[[str], bool], wanted: Mapping[str, str]) -> None:
    """Remove every fw_cfg entry ``owned(name)`` holds for (and a ``<sysinfo type='fwcfg'>`` left
    empty by that), then add ``wanted`` (name → inline value) before any other ``<sysinfo>``."""
    for si in list(root.iterfind(f"{SYSINFO}[@type='{FWCFG}']")):
        for e in list(si.iterfind(ENTRY)):
            if owned(e.get("name") or ""):
                remove_element(e)
        if len(si) == 0:
            remove_element(si)
    if not wanted:
        return
    unit = indent_unit(root.getroottree())
    mine = root.find(f"{SYSINFO}[@type='{FWCFG}']")
    if mine is not None:  # the domain's own fw_cfg blobs: ours join them (one element per type)
        for name in sorted(wanted):
            e = etree.Element(ENTRY, name=name)
            e.text = wanted[name]
            append_child(mine, e)
        return
    si = etree.Element(SYSINFO, type=FWCFG)
    for name in sorted(wanted):
        e = etree.SubElement(si, ENTRY, name=name)
        e.text = wanted[name]
    # before KubeVirt's own <sysinfo> (see above), else after <os>, else last
    first = root.find(SYSINFO)
    anchor = first.getprevious() if first is not None else root.find("os")
    if first is not None and anchor is None:
        root.insert(0, si)
        si.tail = root.text
    else:
        append_child(root, si, after=anchor)
    indent_subtree(si, 1, unit)
