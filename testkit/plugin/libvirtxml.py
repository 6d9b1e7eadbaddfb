"""A test model of what libvirt-go-xml-module v1.12002.0 (``libvirt.org/go/libvirtxml``, the copy
KubeVirt v1.9.0 vendors) does to a domain in ``Domain.Unmarshal`` and ``Domain.Marshal``, for the
elements a KubeVirt GPU domain and pcitopo's output hold. Facts from its ``domain.go`` (struct
tags and custom (Un)MarshalXML), checked here against the real module built with Go (see
tests/sidecar/test_plugin_chain.py, ``PCITOPO_LIBVIRTXML``):

- ``DomainHostdev.UnmarshalXML``: a ``<hostdev>`` without ``mode`` is an error, "Missing 'mode'
  attribute on domain hostdev" (KubeVirt writes none: kubevirt/kubevirt#18861);
- ``DomainAddressPCI.MarshalXML``: domain/bus/slot/function written as ``0x%04x``/``0x%02x``/
  ``0x%02x``/``0x%x``, ``multifunction`` kept; read in any base;
- the hostdev's ``<source><address>`` is a bare ``DomainAddressPCI``: its ``type`` is dropped;
- ``DomainAddress.UnmarshalXML`` switches on ``type``: a device ``<address>`` without one is dropped;
- ``DomainControllerPCITarget.UnmarshalXML``: ``chassisNr``, ``chassis``, ``busNr``, ``index`` and
  ``<node>`` are read in base 10 only (``0x..`` is an error), ``port`` in any base, and all are
  written in decimal; ``hotplug`` is kept;
- ``DomainQEMUOverride`` is tagged with the QEMU namespace URI: it is written with a default
  namespace (``<override xmlns="…/qemu/1.0">``), and the root's ``xmlns:qemu`` is not written;
- an ethernet ``<interface>``'s ``<source>`` with nothing in it is not written;
- ``Marshal`` is ``xml.MarshalIndent(d, "", "  ")``: two-space indentation, no XML declaration,
  an empty element as ``<x></x>``, attributes in double quotes, Go's escapes.
What the model does not do: Go writes child elements in struct field order; the model keeps the
input's order (compare structures, or compare two model outputs, never a model output with Go's).
"""

from __future__ import annotations

import re

from lxml import etree

from pcitopo.libvirt.domain import QEMU_NS

_PCI_FORMAT = (("domain", "0x{:04x}"), ("bus", "0x{:02x}"), ("slot", "0x{:02x}"), ("function", "0x{:x}"))
_DECIMAL_TARGET = ("chassisNr", "chassis", "busNr", "index")


class LibvirtxmlError(ValueError):
    """What ``Domain.Unmarshal`` returns as an error."""


def _uint(text: str, base: int, what: str) -> int:
    try:
        return int(text, base)
    except ValueError:
        raise LibvirtxmlError(f'strconv.ParseUint: parsing "{text}": invalid syntax ({what})') from None


def _pci_address(a: etree._Element, keep_type: bool) -> None:
    values = {k: _uint(a.get(k), 0, f"address {k}") for k, _ in _PCI_FORMAT if a.get(k) is not None}
    multifunction = a.get("multifunction")
    kind = a.get("type")
    a.attrib.clear()
    if keep_type and kind:
        a.set("type", kind)
    for k, fmt in _PCI_FORMAT:
        if k in values:
            a.set(k, fmt.format(values[k]))
    if multifunction:
        a.set("multifunction", multifunction)


def _controller_target(t: etree._Element) -> None:
    for k in _DECIMAL_TARGET:
        if t.get(k) is not None:
            t.set(k, str(_uint(t.get(k), 10, f"controller target {k}")))
    if t.get("port") is not None:
        t.set("port", str(_uint(t.get("port"), 0, "controller target port")))
    for node in t.findall("node"):
        node.text = str(_uint((node.text or "").strip(), 10, "controller target node"))


def unmarshal(xml: bytes) -> etree._Element:
    """The domain as libvirtxml holds it after ``Domain.Unmarshal`` (an error where it fails)."""
    root = etree.fromstring(xml, etree.XMLParser(resolve_entities=False))
    _strip_blank(root)
    for hd in root.iter("hostdev"):
        if hd.get("mode") is None:
            raise LibvirtxmlError("Missing 'mode' attribute on domain hostdev")
    for a in list(root.iter("address")):
        parent = a.getparent()
        if parent.tag == "source" and parent.getparent().tag == "hostdev":
            _pci_address(a, keep_type=False)
        elif a.get("type") == "pci":
            _pci_address(a, keep_type=True)
        elif a.get("type") is None:
            parent.remove(a)
    for c in root.iter("controller"):
        for t in c.findall("target"):
            _controller_target(t)
    for iface in root.iter("interface"):
        for src in iface.findall("source"):
            if iface.get("type") == "ethernet" and not src.attrib and len(src) == 0:
                iface.remove(src)
    return root


def _raw(el: etree._Element) -> str:
    """An element as written in the input: Go's innerxml has only the declarations written there."""
    import copy

    mine = copy.deepcopy(el)
    etree.cleanup_namespaces(mine)
    return etree.tostring(mine, encoding="unicode")


def _strip_blank(el: etree._Element) -> None:
    """Whitespace between elements is not data, except inside ``<metadata>``, which
    ``DomainMetadata`` keeps as raw inner XML."""
    if el.tag == "metadata":
        return
    if el.text is not None and not el.text.strip() and len(el):
        el.text = None
    for c in el:
        if c.tail is not None and not c.tail.strip():
            c.tail = None
        if isinstance(c.tag, str):
            _strip_blank(c)


def marshal(root: etree._Element) -> bytes:
    """``Domain.Marshal``: Go's ``MarshalIndent`` with two spaces."""
    out: list[str] = []
    _write(root, 0, out)
    return "".join(out).encode()


def round_trip(xml: bytes) -> bytes:
    return marshal(unmarshal(xml))


_ESCAPES = {'"': "&#34;", "'": "&#39;", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\t": "&#x9;", "\n": "&#xA;", "\r": "&#xD;"}
_ESCAPE_RE = re.compile("[\"'&<>\t\n\r]")


def _escape(text: str) -> str:
    return _ESCAPE_RE.sub(lambda m: _ESCAPES[m.group()], text)


def _write(el: etree._Element, depth: int, out: list[str], in_qemu: bool = False) -> None:
    """One element and its children; an element of the QEMU namespace declares it as the
    default namespace unless its parent already did (the root's prefixes are never written)."""
    if not isinstance(el.tag, str):
        return
    qn = etree.QName(el)
    qemu = qn.namespace == QEMU_NS
    attrs = "".join(f' {k}="{_escape(v)}"' for k, v in el.attrib.items())
    if qemu and not in_qemu:
        attrs = f' xmlns="{QEMU_NS}"' + attrs
    out.append(f"{chr(10) + '  ' * depth if out else ''}<{qn.localname}{attrs}>")
    if el.tag == "metadata":  # raw inner XML, as read
        inner = (el.text or "") + "".join(_raw(c) for c in el)
        out.append(inner + "</metadata>")
        return
    text = (el.text or "").strip()
    if text:
        out.append(_escape(text))
    children = [c for c in el if isinstance(c.tag, str)]
    for c in children:
        _write(c, depth + 1, out, qemu)
    if children:
        out.append("\n" + "  " * depth)
    out.append(f"</{qn.localname}>")
