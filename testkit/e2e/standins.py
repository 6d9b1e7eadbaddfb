"""The emulated endpoints that stand in for a domain's hostdevs in a boot here (``<video>``
for a GPU, an e1000e ``<interface>`` for a NIC, a virtio ``<rng>`` for anything else), and
how a hostdev's kind is told."""

from __future__ import annotations

import copy
from collections.abc import Mapping

from lxml import etree

from .guesttree import _int

# hostdev alias prefixes (KubeVirt) -> stand-in kind
ALIAS_KINDS = (
    ("ua-gpu-", "gpu"),
    ("ua-dra-gpu-", "gpu"),
    ("ua-sriov-", "nic"),
    ("ua-hostdevice-", "other"),
    ("ua-dra-hostdevice-", "other"),
)


def kind_of(hd: etree._Element, alias: str, source: str | None,
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


def source_bdf(hd: etree._Element) -> str | None:
    a = hd.find("source/address")
    if a is None or a.get("uuid") is not None:
        return None
    try:
        return "{:04x}:{:02x}:{:02x}.{:x}".format(
            _int(a.get("domain"), 0), _int(a.get("bus")), _int(a.get("slot")),
            _int(a.get("function"), 0),
        )
    except (TypeError, ValueError):
        return None


def standin(kind: str, alias: str, addr: etree._Element | None, primary: bool) -> etree._Element:
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
