"""What the entry points read from, or give back of, a domain the rewrite may have refused or left
alone (``on-error: passthrough``, ``mode: off``, a warning about the VMI): lenient where the
rewrite is strict, so a malformed domain still comes back as sent."""

from __future__ import annotations

from lxml import etree

from pcitopo.errors import DomainError
from pcitopo.libvirt.document import parse_domain, serialize
from pcitopo.libvirt.domain import DomainView
from pcitopo.model.tree import Bdf


def readable_hostdev_sources(data: bytes) -> list[Bdf]:
    """The source BDFs of a domain's PCI hostdevs, skipping what cannot be read (a malformed
    domain has none, a hostdev without a valid source is left out): for checks that run on a
    domain the rewrite refused (``on-error: passthrough``)."""
    try:
        hostdevs = DomainView(parse_domain(data)).pci_hostdevs()
    except DomainError:
        return []
    out = []
    for h in hostdevs:
        try:
            out.append(h.source)
        except DomainError:
            continue
    return out


def with_hostdev_modes(data: bytes) -> tuple[bytes, int]:
    """The domain with ``mode='subsystem'`` on every PCI hostdev that lacks it, and how many got
    one: what the hook hands back even when it leaves the placement alone (``mode: off``,
    ``on-error: passthrough``), so KubeVirt's Plugins pipeline can read the domain. A domain that
    cannot be parsed, or has nothing to add, comes back byte for byte."""
    try:
        tree = parse_domain(data)
        view = DomainView(tree)
    except DomainError:
        return data, 0
    given = sum(h.give_mode() for h in view.pci_hostdevs())
    return (serialize(tree, data), given) if given else (data, 0)


def readable_domain_name(data: bytes) -> str | None:
    """The domain's ``<name>``, or None when the domain cannot be read or has none."""
    try:
        return (parse_domain(data).getroot().findtext("name") or "").strip() or None
    except DomainError:
        return None


def readable_root(data: bytes) -> etree._Element | None:
    """The domain's root element read without resolving entities or fetching anything, whatever
    its root tag; None when it is not XML (what pcitopo's answer holds is judged even where the
    rewrite's strict parse would refuse it)."""
    try:
        return etree.fromstring(data, etree.XMLParser(resolve_entities=False, no_network=True))
    except (etree.XMLSyntaxError, ValueError):
        return None
