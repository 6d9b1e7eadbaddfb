"""What a rewritten domain shows the guest, and what it only lays out: the facts ``pcitopo golden
check`` compares in ``domain.xml``.

A hostdev's *placement* is its path from ``pcie.0`` down: each controller by its model, slot
and function on its parent, an expander bus with its ``busNr`` and NUMA node, then the device's
own slot and function. Controller indexes are libvirt's names for buses, which the guest never
sees, so the path holds none: renumbering them, adding spare ports or renaming aliases leaves
every placement as it was (layout only); moving a device to another port, bus or cell changes
its placement (guest-visible).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from lxml import etree

from pcitopo.libvirt.document import parse_domain
from pcitopo.libvirt.domain import DomainView, PciController

# Controllers whose empty instances are spare ports: a slot for hotplug, nothing the guest uses.
PORT_MODELS = ("pcie-root-port", "pcie-switch-downstream-port", "pci-bridge")


@dataclass(frozen=True)
class DomainFacts:
    """One domain's placements (host BDF -> path), controllers (path -> element), spare ports
    per model, and everything else as comparable lines."""

    placements: dict[str, str]
    controllers: dict[str, PciController]
    hostdevs: dict[str, etree._Element]
    spare: Counter
    rest: tuple[str, ...]


def _where(ctrls: dict[int, PciController], bus: int, seen: frozenset = frozenset()) -> str:
    """The path of controller index ``bus`` from pcie.0, without indexes."""
    c = ctrls.get(bus)
    if c is None:
        return f"<no controller {bus}>"
    if c.address is None or bus in seen:  # pcie.0, or a controller libvirt gives an address on define
        return c.model if c.model in ("pcie-root", "pci-root") else f"{c.model} (address left to libvirt)"
    bits = [c.model]
    if c.bus_nr is not None:
        bits.append(f"busNr=0x{c.bus_nr:02x}")
    if c.node is not None:
        bits.append(f"node={c.node}")
    a = c.address
    return f"{_where(ctrls, a.bus, seen | {bus})} > {a.slot:02x}.{a.function} {' '.join(bits)}"


def _canonical(el: etree._Element) -> str:
    """An element as one comparable line: its attributes sorted, children in order, whitespace
    between elements ignored."""
    copy = etree.fromstring(etree.tostring(el))
    for e in copy.iter():
        if isinstance(e.tag, str):
            e.tail = None
            if e.text is not None and not e.text.strip():
                e.text = None
            attrs = sorted(e.attrib.items())
            e.attrib.clear()
            for k, v in attrs:
                e.set(k, v)
    return etree.tostring(copy, encoding="unicode")


def domain_facts(xml: bytes) -> DomainFacts:
    view = DomainView(parse_domain(xml))
    by_index = {c.index: c for c in view.pci_controllers()}
    used = Counter(a.bus for a in ([h.address for h in view.pci_hostdevs()] + [c.address for c in by_index.values()]
                                   + _other_addresses(view)) if a is not None)
    controllers: dict[str, PciController] = {}
    for i, c in sorted(by_index.items()):  # controllers without an address share a path: the nth of them
        path = _where(by_index, i)
        n = sum(1 for k in controllers if k == path or k.startswith(f"{path} #"))
        controllers[f"{path} #{n + 1}" if n else path] = c
    spare = Counter(c.model for i, c in by_index.items() if c.model in PORT_MODELS and not used[i])
    placements, hostdevs = {}, {}
    for h in view.pci_hostdevs():
        a = h.address
        path = f"{_where(by_index, a.bus)} > {a.slot:02x}.{a.function}" if a is not None else "(no guest address: libvirt picks one)"
        placements[str(h.source)] = path
        hostdevs[str(h.source)] = h.el
    rest = []
    for el in view.devices:
        if not isinstance(el.tag, str) or (el.tag == "hostdev" and el.get("type") == "pci") or \
                (el.tag == "controller" and el.get("type") == "pci"):
            continue
        rest.append(_canonical(el))
    for el in view.root:
        if isinstance(el.tag, str) and el.tag != "devices":
            rest.append(_canonical(el))
    return DomainFacts(placements, controllers, hostdevs, spare, tuple(rest))


def _other_addresses(view: DomainView) -> list:
    """The PCI addresses of the domain's other devices (disks, NICs, ...): a port holding one is not spare."""
    from pcitopo.libvirt.domain import read_guest_address

    out = []
    for el in view.devices:
        if isinstance(el.tag, str) and not (el.tag in ("hostdev", "controller") and el.get("type") == "pci"):
            out.append(read_guest_address(el))
    return out


@dataclass
class DomainDiff:
    guest: list[str]
    layout: list[str]


def _examples(items: list[str], n: int = 2) -> str:
    return ", ".join(items[:n]) + (f", and {len(items) - n} more" if len(items) > n else "")


def compare_domains(golden: bytes, fresh: bytes, labels: dict[str, str]) -> DomainDiff:
    """Sort the differences between the golden ``domain.xml`` and the fresh one: a device's
    placement (guest address or cell) is guest-visible; spare ports, controller indexes, aliases
    and every other attribute or element are layout only."""
    g, f = domain_facts(golden), domain_facts(fresh)
    out = DomainDiff([], [])

    def name(bdf: str) -> str:
        return f"{labels[bdf]} ({bdf})" if bdf in labels else bdf

    for bdf in sorted(set(g.placements) | set(f.placements)):
        was, now = g.placements.get(bdf), f.placements.get(bdf)
        if was != now:
            out.guest.append(f"device {name(bdf)}: placed at {_moved(was, now)}")
    for model in sorted(set(g.spare) | set(f.spare)):
        if g.spare[model] != f.spare[model]:
            out.layout.append(f"spare ports: {g.spare[model]} -> {f.spare[model]} empty {model}")
    both = sorted(set(g.controllers) & set(f.controllers))
    moved = [p for p in both if g.controllers[p].index != f.controllers[p].index]
    if moved:
        out.layout.append(f"controller indexes: {len(moved)} renumbered")
    aliases = [f"{g.controllers[p].alias} -> {f.controllers[p].alias}" for p in both if g.controllers[p].alias != f.controllers[p].alias]
    aliases += [f"{_alias(g.hostdevs[b])} -> {_alias(f.hostdevs[b])}" for b in sorted(set(g.hostdevs) & set(f.hostdevs))
                if _alias(g.hostdevs[b]) != _alias(f.hostdevs[b])]
    if aliases:
        out.layout.append(f"aliases: {len(aliases)} renamed ({_examples(aliases)})")
    out.layout += _attribute_changes("controller", [(g.controllers[p].el, f.controllers[p].el) for p in both], ("address", "alias"))
    out.layout += _attribute_changes("hostdev", [(g.hostdevs[b], f.hostdevs[b]) for b in sorted(set(g.hostdevs) & set(f.hostdevs))],
                                     ("address", "alias"))
    gone, added = sorted(set(g.rest) - set(f.rest)), sorted(set(f.rest) - set(g.rest))
    if gone or added:
        out.layout.append(f"other elements: {len(gone)} removed, {len(added)} added or changed "
                          f"(e.g. {_short((added or gone)[0])})")
    return out


def _moved(was: str | None, now: str | None) -> str:
    """``A -> B`` for two placements, the part of the path they share said once."""
    if was is None or now is None:
        return f"{was or 'not in the domain'} -> {now or 'not in the domain'}"
    a, b = was.split(" > "), now.split(" > ")
    n = 0
    while n < min(len(a), len(b)) - 1 and a[n] == b[n]:
        n += 1
    head = " > ".join(a[:n]) + " > " if n else ""
    return f"{head}{{{' > '.join(a[n:])} -> {' > '.join(b[n:])}}}"


def _alias(el: etree._Element) -> str | None:
    a = el.find("alias")
    return a.get("name") if a is not None else None


def _short(line: str, n: int = 90) -> str:
    return line if len(line) <= n else line[: n - 3] + "..."


def _children(el: etree._Element, drop: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(c.tag, _canonical(c)) for c in el if isinstance(c.tag, str) and c.tag not in drop]


def _attribute_changes(kind: str, pairs: list[tuple[etree._Element, etree._Element]], drop: tuple[str, ...]) -> list[str]:
    """Changes inside matched elements beyond their address and alias, counted by what changed:
    attributes the guest does not see (hostdev ``mode``, a port's ``chassis`` or ``port``)."""
    changes: Counter = Counter()
    for was, now in pairs:
        for key in sorted((set(was.attrib) | set(now.attrib)) - {"index"}):  # indexes: counted apart
            if was.get(key) != now.get(key):
                changes[f"{kind} attribute {key}: {was.get(key)!r} -> {now.get(key)!r}"] += 1
        was_kids, now_kids = _children(was, drop), _children(now, drop)
        if was_kids != now_kids:
            tags = sorted({t for t, _ in set(was_kids) ^ set(now_kids)})
            changes[f"{kind} {', '.join(f'<{t}>' for t in tags)} changed"] += 1
    return [f"{what} ({n} {kind}{'s' if n > 1 else ''})" for what, n in sorted(changes.items())]
