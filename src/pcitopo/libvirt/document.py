"""The domain document as a document: a hardened parse, a serialisation that keeps the original's
form, and element edits that keep its indentation (KubeVirt indents with tabs, libvirt with
spaces; an edited domain reads as if written by the same hand).

What the elements mean (controllers, hostdevs, addresses) is :mod:`pcitopo.libvirt.domain`'s.
"""

from __future__ import annotations

from collections.abc import Iterable

from lxml import etree

from pcitopo.errors import DomainError

MAX_DOMAIN_BYTES = 8 * 1024 * 1024  # a KubeVirt domain is a few KB; 8 MiB is generous


def parse_domain(data: bytes) -> etree._ElementTree:
    if not isinstance(data, (bytes, bytearray)):
        raise DomainError("domain XML must be bytes")
    if len(data) > MAX_DOMAIN_BYTES:
        raise DomainError(f"domain XML is {len(data)} bytes, more than the {MAX_DOMAIN_BYTES} we accept")
    if not data.strip():
        raise DomainError("domain XML is empty")
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False, huge_tree=False
    )
    try:
        tree = etree.fromstring(bytes(data), parser).getroottree()
    except etree.XMLSyntaxError as e:
        raise DomainError(f"malformed domain XML: {e.msg if hasattr(e, 'msg') else e}") from None
    if tree.docinfo.doctype or tree.docinfo.internalDTD is not None:
        # libvirt never writes a DOCTYPE; one here can only carry entity tricks (XXE, billion laughs).
        raise DomainError("domain XML has a DOCTYPE; refusing (entities are not allowed)")
    for _ in tree.iter(etree.Entity):
        raise DomainError("domain XML uses entity references; refusing")
    root = tree.getroot()
    if root.tag != "domain":
        raise DomainError(f"root element is <{root.tag}>, not <domain>")
    return tree


def declare_on_root(tree: etree._ElementTree, prefix: str, uri: str) -> None:
    """Move the declaration of ``prefix`` (bound to ``uri``) to the root element when elements
    below use it and the root does not declare it; lxml then drops the declarations below."""
    root = tree.getroot()
    if prefix in root.nsmap or next(root.iter(f"{{{uri}}}*"), None) is None:
        return
    new = etree.Element(root.tag, attrib=dict(root.attrib), nsmap={**root.nsmap, prefix: uri})
    new.text = root.text
    for child in list(root):
        new.append(child)
    tree._setroot(new)


def serialize(tree: etree._ElementTree, original: bytes) -> bytes:
    declaration = original.lstrip().startswith(b"<?xml")
    out = etree.tostring(tree, encoding="utf-8", xml_declaration=declaration)
    return out if out.endswith(b"\n") else out + b"\n"


def append_child(parent: etree._Element, child: etree._Element, after: etree._Element | None = None) -> None:
    """Insert keeping the document's indentation style (KubeVirt indents with tabs)."""
    _insert(parent, child, after, *_indent_of(parent))


def append_children(parent: etree._Element, children: Iterable[etree._Element], after: etree._Element | None = None) -> None:
    """:func:`append_child` of each of ``children`` in turn, each after the one before (the
    first after ``after``); the parent's indentation, which these inserts keep, read once."""
    indent, closing = _indent_of(parent)
    for child in children:
        _insert(parent, child, after, indent, closing)
        after = child


def _insert(parent: etree._Element, child: etree._Element, after: etree._Element | None, indent: str, closing: str) -> None:
    if after is None:
        after = parent[-1] if len(parent) else None
    if after is None:
        parent.text = "\n" + indent
        child.tail = closing
        parent.append(child)
        return
    child.tail = after.tail if after.tail is not None else closing
    after.tail = "\n" + indent
    after.addnext(child)


def remove_element(el: etree._Element) -> None:
    """Remove an element, keeping the indentation of what follows it."""
    parent = el.getparent()
    if parent is None:
        return
    prev = el.getprevious()
    if el.getnext() is None:
        # The last child's tail is the parent's closing indentation: hand it on.
        if prev is not None:
            prev.tail = el.tail
        else:
            parent.text = el.tail
    parent.remove(el)


def _indent_of(parent: etree._Element) -> tuple[str, str]:
    if parent.text and parent.text.strip() == "" and "\n" in parent.text:
        inner = parent.text.rsplit("\n", 1)[-1]
        outer = (parent[-1].tail or "\n").rsplit("\n", 1)[-1] if len(parent) else inner[: -1]
        return inner, "\n" + outer
    depth = len(list(parent.iterancestors())) + 1
    unit = indent_unit(parent.getroottree())
    return unit * depth, "\n" + unit * (depth - 1)


def indent_subtree(el: etree._Element, level: int, unit: str) -> None:
    """Pretty-print an element we built, to sit at ``level`` in a document indented by ``unit``."""
    if len(el):
        el.text = "\n" + unit * (level + 1)
        for i, child in enumerate(el):
            indent_subtree(child, level + 1, unit)
            child.tail = "\n" + unit * (level + 1 if i < len(el) - 1 else level)


def indent_unit(tree: etree._ElementTree) -> str:
    text = tree.getroot().text or ""
    if "\n" in text:
        tail = text.rsplit("\n", 1)[-1]
        if tail:
            return tail
    return "\t"
