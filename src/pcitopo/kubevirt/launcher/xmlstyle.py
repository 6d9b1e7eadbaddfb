"""KubeVirt's serialisation of its domain struct, as the hook reads it: tab indents, explicit end
tags, no XML declaration (Go's ``encoding/xml`` ``MarshalIndent`` of ``api.DomainSpec`` in
``pkg/hooks/manager.go``; the struct is ``pkg/virt-launcher/virtwrap/api/schema.go``'s)."""

from __future__ import annotations

from lxml import etree


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


def sub(parent: etree._Element, tag: str, text: str | None = None, **attrs: str) -> etree._Element:
    """A child element; ``error_policy`` writes ``error_policy`` (a trailing ``_`` is dropped, a
    double underscore is a namespace colon)."""
    el = etree.SubElement(parent, tag)
    for k, v in attrs.items():
        el.set(k.rstrip("_").replace("__", ":"), v)
    if text is not None:
        el.text = text
    return el
