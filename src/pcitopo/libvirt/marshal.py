"""The domain as a Go struct marshals it, the form KubeVirt hands the hook: tab indents, explicit
end tags, no XML declaration (Go's ``encoding/xml`` ``MarshalIndent`` of ``api.DomainSpec`` in
``pkg/hooks/manager.go``; the struct is ``pkg/virt-launcher/virtwrap/api/schema.go``'s), and the
element builder the launcher's model writes its domains with."""

from __future__ import annotations

from typing import TypeAlias

from lxml import etree

# An element of a domain, for the annotations of modules that hold one but spell nothing.
Element: TypeAlias = etree._Element


def parse_plain(xml: bytes) -> Element:
    """A domain KubeVirt's struct or libvirt wrote (or the launcher's model built), as its root
    element (lxml's default parser: these are the model's own bytes, not the hook's input)."""
    return etree.fromstring(xml)


def to_kubevirt_bytes(root: etree._Element) -> bytes:
    """``root`` in KubeVirt's style: tab indents, explicit end tags, no declaration."""
    for el in root.iter():
        if isinstance(el.tag, str) and len(el) == 0 and el.text is None:
            el.text = ""
    for el in root.iter():
        if isinstance(el.tag, str) and len(el):
            el.text = None
            for c in el:
                c.tail = None
    etree.indent(root, space="\t")
    for el in root.iter():
        if isinstance(el.tag, str) and len(el) == 0 and el.text is None:
            el.text = ""
    return etree.tostring(root, encoding="utf-8") + b"\n"


def root_element(tag: str, nsmap: dict[str | None, str] | None = None, **attrs: str) -> Element:
    """The root of a domain the model builds, declaring ``nsmap`` (``qemu``: :data:`QEMU_NS`)."""
    return etree.Element(tag, attrs, nsmap=nsmap)


def sub_ns(parent: Element, ns: str, tag: str, text: str | None = None, declare: bool = False) -> Element:
    """A child in namespace ``ns`` (KubeVirt's ``<metadata>``), declaring it as the default
    namespace when ``declare``."""
    el = etree.SubElement(parent, f"{{{ns}}}{tag}", nsmap={None: ns} if declare else None)
    if text is not None:
        el.text = text
    return el


def sub(parent: etree._Element, tag: str, text: str | None = None, **attrs: str) -> etree._Element:
    """A child element; ``error_policy`` writes ``error_policy`` (a trailing ``_`` is dropped, a
    double underscore is a namespace colon)."""
    el = etree.SubElement(parent, tag)
    for k, v in attrs.items():
        el.set(k.rstrip("_").replace("__", ":"), v)
    if text is not None:
        el.text = text
    return el
