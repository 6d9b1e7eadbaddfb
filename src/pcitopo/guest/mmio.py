"""The guest's 64-bit MMIO space: what the assigned devices need, and what makes the firmware
give it.

A GPU's large BARs are 64-bit prefetchable (H100: 128 GiB + 32 MiB, B200: 256 GiB + 32 MiB). In
the guest every bridge above a device opens a window holding its subtree's BARs; we size each
window as the sum of its members rounded up to the largest alignment, per root port and in total.

Whether the firmware places them, per firmware as KubeVirt 1.8-1.9's virt-launcher ships it
(docs/SOURCES.md, "Guest MMIO window"):
- Linux ignores a PCI window above the CPU's address width ("not CPU addressable"), and a BAR
  not on a multiple of its size; QEMU's default width for non-host CPU models is 40 bits.
- SeaBIOS 1.16.3: :mod:`.seabios` models its placement step for step. The rule written from it:
  with RAM above 4 GiB it aligns every root and downstream port to 2^bits/2048 and packs the
  top-level windows from the top of the space, so each of our root ports holding a larger BAR
  gets a power-of-two ``pref64-reserve`` (power-of-two windows packed biggest first each start on
  a multiple of their size), and the width is the smallest from 41 bits (trusted on any CPU
  vendor) at which the model places every BAR. Two such BARs below one switch cannot both be
  placed at any width or reserve (the second downstream port starts 2^bits/2048 past a multiple
  of the first's size): a typed warning recommends EFI (fixed upstream in SeaBIOS 1.17.0).
  No setting is written that the model says places fewer BARs than none.
- OVMF 2025.02 (edk2 ``OvmfPkg/Library/PlatformInitLib``, ``PlatformDynamicMmioWindow``) sizes
  its 64-bit aperture from the address width, as the top eighth of the address space, but only
  when the CPU offers 1 GiB pages (``pdpe1gb``), else it keeps its 32 GiB default.

What this module emits into the domain (idempotent, every call, since KubeVirt's domain struct
keeps neither ``<maxphysaddr>`` nor ``<qemu:override>``): ``<cpu><maxphysaddr>`` (``passthrough``
for host-passthrough/maximum CPUs, ``emulate`` with ``bits`` otherwise), ``<feature
name='pdpe1gb' policy='require'/>`` for OVMF where the CPU mode does not pass the host's flags
through, and for SeaBIOS ``pref64-reserve`` on our root ports (by alias, via ``<qemu:override>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from lxml import etree

from pcitopo.errors import FirmwareWarning, MmioError, PcitopoError
from pcitopo.guest import seabios
from pcitopo.guest.view import GuestLayout, LayoutController
from pcitopo.libvirt import machine
from pcitopo.libvirt.domain import DOWNSTREAM, OUR_ALIAS_PREFIX, ROOT_PORT, UPSTREAM
from pcitopo.libvirt.overrides import Property, set_properties
from pcitopo.model.bars import GiB, bits_for, device_bars, fmt_size, pow2ceil
from pcitopo.model.cpuinfo import HostWidth, local_width
from pcitopo.model.keep import recent
from pcitopo.model.tree import Bdf, Topology

QEMU_DEFAULT_BITS = 40  # QEMU's phys-bits for CPU models other than host/max
OVMF_DEFAULT_APERTURE = 32 * GiB  # OVMF's PcdPciMmio64Size when it cannot size the window itself
OVMF_MIN_DYNAMIC_BITS = 41  # OVMF sizes the window from the width only above 40 bits
# virt-launcher's x86_64 firmware at KubeVirt v1.8.0-v1.9.0 (default CentOS Stream 9 build: hack/rpm-deps.sh
# EDK2_VERSION 20241117-8.el9, seabios.VERSION 1.16.3-4.el9); docs/DEPLOY.md, "KubeVirt releases", is held to these
EDK2_VERSION = "20241117"
FIRMWARE_OF = "as KubeVirt 1.8-1.9's virt-launcher ships it"
SEABIOS_MIN_BITS = 41  # the narrowest width SeaBIOS trusts whatever the CPU vendor
CPU_VENDORS = ("AuthenticAMD", "GenuineIntel")  # a host-model CPU's signature is the host's
# bridges SeaBIOS gives a hot-plug slot (root/downstream ports; SHPC bridges) and those it does not
SLOT_BRIDGES = frozenset({ROOT_PORT, DOWNSTREAM, "pci-bridge", "pcie-to-pci-bridge"})
BRIDGES = SLOT_BRIDGES | {UPSTREAM, "dmi-to-pci-bridge"}
PREF64_RESERVE = "pref64-reserve"
PASSTHROUGH_CPU_MODES = frozenset({"host-passthrough", "maximum"})
FEATURE_1G_PAGES = "pdpe1gb"


def host_phys_bits(path: str | None = None) -> int | None:
    """This machine's physical-address width (``/proc/cpuinfo``, or ``$PCITOPO_CPUINFO``, or
    ``path``; None when it cannot be read). The width of the host a sysfs source describes is
    ``Topology.host_width()`` (src/pcitopo/model/cpuinfo.py): a capture carries its own."""
    return local_width(path).bits


# -- facts from the domain ----------------------------------------------------------------------

# -- the budget ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class PortBudget:
    """One of our root ports: the 64-bit prefetchable window its subtree needs."""

    alias: str
    index: int
    window: int
    largest_bar: int
    devices: tuple[Bdf, ...]


@dataclass
class MmioBudget:
    firmware: str
    cpu_mode: str
    ram: int
    ports: list[PortBudget] = field(default_factory=list)
    other: int = 0  # 64-bit prefetchable space of devices not below one of our root ports
    host_bits: int | None = None
    host_bits_from: str = "not given"  # where host_bits came from (HostWidth.origin)
    seabios: SeabiosPlan | None = None
    ovmf_bits: int | None = None
    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[PcitopoError] = field(default_factory=list)
    # devices whose BARs sysfs does not give (no ``resource`` file): left out of the sums above
    unsized: tuple[Bdf, ...] = ()

    @property
    def unknown(self) -> list[str]:
        """What the budget cannot know (``xmlfix --check`` says unknown): BARs it cannot size, a
        host width not recorded where the guest asks for a width of its own."""
        n, shown = len(self.unsized), ", ".join(str(b) for b in self.unsized[:3])
        out = [f"MMIO: the BARs of {n} device(s) cannot be sized (no resource file in sysfs: {shown}"
               f"{f', and {n - 3} more' if n > 3 else ''})"] if n else []
        if self.bits is not None and self.host_bits is None:
            out.append(f"MMIO: the host CPU address width is unknown ({self.host_bits_from}); the guest asks for "
                       f"{self.bits} bits (`pcitopo capture --phys-bits N` records it)")
        return out

    @property
    def total(self) -> int:
        return sum(p.window for p in self.ports) + pow2ceil(self.other)

    @property
    def largest_window(self) -> int:
        return max([p.window for p in self.ports] + [pow2ceil(self.other)], default=0)

    @property
    def seabios_bits(self) -> int | None:
        """The width asked for under SeaBIOS (None: QEMU's default, or the CPU's own)."""
        return self.seabios.bits if self.seabios is not None else None

    @property
    def bits(self) -> int | None:
        """The width asked for under this domain's firmware."""
        return self.ovmf_bits if self.firmware == "ovmf" else self.seabios_bits

    def ovmf_window(self, bits: int | None) -> int:
        return 1 << (bits - 3) if bits and bits >= OVMF_MIN_DYNAMIC_BITS else OVMF_DEFAULT_APERTURE

    def summary(self) -> dict:
        return {"firmware": self.firmware, "total_bytes": self.total, "ports": len(self.ports),
                "bits": self.bits, "host_bits": self.host_bits, "applied": list(self.applied)}


def ovmf_bits(total: int) -> int | None:
    """OVMF's dynamic aperture is the top eighth of the address space."""
    if total <= OVMF_DEFAULT_APERTURE:
        return None
    return max(OVMF_MIN_DYNAMIC_BITS, bits_for(total) + 3)


def window_of(sizes: list[int], aligns: list[int]) -> tuple[int, int]:
    """A bridge window as SeaBIOS (``pciinit.c``) and edk2's PCI bus driver size it: members placed
    biggest alignment first, the sum rounded up to the largest alignment. Sizes are multiples of
    their (power-of-two) alignments, so the packing leaves no holes. Returns (size, alignment)."""
    align = max(aligns, default=0)
    if not align:
        return 0, 0
    return -(-sum(sizes) // align) * align, align


class Ctl(NamedTuple):
    """What the budget needs of a PCI controller, read once per call."""

    index: int
    model: str
    alias: str | None
    parent: int | None  # the controller index its address names
    ours: bool


def snapshot(controllers: Iterable[LayoutController]) -> dict[int, Ctl]:
    """The budget's view of the placed domain's controllers (its layout, read once per call)."""
    return {c.index: Ctl(c.index, c.model, c.alias, c.address.bus if c.address is not None else None,
                         (c.alias or "").startswith(OUR_ALIAS_PREFIX)) for c in controllers}


def _chain(ctrls: dict[int, Ctl], bus: int | None) -> list[Ctl]:
    """Controllers from the one at index ``bus`` up to pcie-root (excluded), nearest first."""
    out: list[Ctl] = []
    seen: set[int] = set()
    while bus is not None and bus in ctrls and bus not in seen and bus != 0:
        seen.add(bus)
        c = ctrls[bus]
        out.append(c)
        bus = c.parent
    return out


def port_budgets(host: Topology, ctrls: dict[int, Ctl], hostdevs: list[tuple[Bdf, int | None]]
                 ) -> tuple[list[PortBudget], int, list[str], dict[int, list[seabios.Bar]]]:
    """Per root port of ours: the window of its subtree (nested bridges each rounding their own
    sum up). ``hostdevs`` = (host BDF, guest bus index or None). Also every 64-bit prefetchable
    BAR by the guest bus it sits on (for the firmware model)."""
    notes: list[str] = []
    members: dict[int, list[int]] = {}  # controller index → BAR sizes, then child windows
    aligns_of: dict[int, list[int]] = {}  # ... and their alignments
    depth: dict[int, int] = {}
    parent_of: dict[int, int] = {}
    devices: dict[int, list[Bdf]] = {}
    largest: dict[int, int] = {}
    on_bus: dict[int, list[seabios.Bar]] = {}
    other = 0
    for bdf, bus in hostdevs:
        bars = host.function(bdf).bars
        if bars is None:  # MmioBudget.unsized: one line for all of them, and --check unknown
            continue
        mine = [b for b in device_bars(bars) if b.is_mem64_pref]
        sizes = [b.size for b in mine]
        on_bus.setdefault(bus or 0, []).extend(seabios.Bar(f"{bdf} BAR{b.index}", b.size) for b in mine)
        chain = _chain(ctrls, bus)
        rp = next((i for i, c in enumerate(chain) if c.model == ROOT_PORT), None)
        if rp is None or not chain[rp].ours:
            other += sum(sizes)
            continue
        chain = chain[: rp + 1]
        members.setdefault(chain[0].index, []).extend(sizes)
        aligns_of.setdefault(chain[0].index, []).extend(sizes)  # a BAR is aligned to its size
        for k, c in enumerate(chain):
            depth[c.index] = len(chain) - 1 - k
            if k + 1 < len(chain):
                parent_of[c.index] = chain[k + 1].index
        top = chain[-1].index
        devices.setdefault(top, []).append(bdf)
        largest[top] = max([largest.get(top, 0)] + sizes)
    windows: dict[int, int] = {}
    for i in sorted(depth, key=lambda i: -depth[i]):
        windows[i], align = window_of(members.get(i, []), aligns_of.get(i, []))
        if i in parent_of:
            members.setdefault(parent_of[i], []).append(windows[i])
            aligns_of.setdefault(parent_of[i], []).append(align)
    ports = [PortBudget(ctrls[i].alias or "", i, windows[i], largest.get(i, 0), tuple(devices.get(i, ())))
             for i in sorted(windows) if depth[i] == 0 and windows[i]]
    return ports, other, notes, on_bus


# -- SeaBIOS: the rule, from the firmware model ---------------------------------------------------

@dataclass
class SeabiosPlan:
    """What SeaBIOS needs written: a width (None: leave QEMU's default or the CPU's own) and
    ``pref64-reserve`` per root port alias; the model's placement with them and without any."""

    bits: int | None
    reserves: dict[str, int]
    placement: seabios.Placement
    baseline: seabios.Placement
    width: int  # the width the placement assumed

    @property
    def complete(self) -> bool:
        return self.placement.assigned == len(self.placement.bars)


def guest_tree(ctrls: dict[int, Ctl], on_bus: dict[int, list[seabios.Bar]], reserves: dict[str, int],
               extra_ports: int) -> list[seabios.Bar | seabios.Bridge]:
    """The guest's bridges and 64-bit BARs as the firmware sees them; root ports libvirt and
    KubeVirt add after us (``extra_ports``) as empty slots."""
    nodes = {i: seabios.Bridge(c.alias or f"pci.{i}", c.model in SLOT_BRIDGES, reserve=reserves.get(c.alias or "", 0))
             for i, c in ctrls.items() if c.model in BRIDGES}
    tops: list[seabios.Bar | seabios.Bridge] = []

    def holder(bus: int | None) -> list:
        seen = set()
        while bus is not None and bus not in nodes and bus in ctrls and bus not in seen:
            seen.add(bus)  # expander buses and pcie-root: everything there is top level
            bus = ctrls[bus].parent
        return nodes[bus].members if bus in nodes else tops

    for i, n in nodes.items():
        holder(ctrls[i].parent).append(n)
    for bus, bars in on_bus.items():
        holder(bus).extend(bars)
    return tops + [seabios.Bridge(f"(added root port {k})", True) for k in range(extra_ports)]


def seabios_plan(tree, ours: list[PortBudget], ram: int, cpu_mode: str, host_bits: int | None) -> SeabiosPlan:
    """The rule: the narrowest width from 41 bits (the host's own for passthrough CPUs) at which
    SeaBIOS 1.16.3 places every BAR, with a power-of-two ``pref64-reserve`` on each of our root
    ports holding a BAR larger than the padded slot alignment. Nothing when no setting is
    needed, or when the best the settings reach is no better than none. A width beyond the host's
    is returned only when it alone places everything (``check_host`` then refuses it).
    ``tree(reserves)`` builds the guest tree."""
    passthrough = cpu_mode in PASSTHROUGH_CPU_MODES
    default = (host_bits or seabios.MAX_TOP_BITS) if passthrough else QEMU_DEFAULT_BITS
    bare = [seabios.place(tree({}), ram, seabios.Width(default, v)) for v in CPU_VENDORS]
    worst, best_bare = min(bare, key=lambda p: p.assigned), max(bare, key=lambda p: p.assigned)
    none = SeabiosPlan(None, {}, worst, worst, default)
    if worst.assigned == len(worst.bars):
        return none
    widths = [w for w in range(SEABIOS_MIN_BITS, seabios.MAX_TOP_BITS + 1) if not passthrough or w > default]
    best = None
    for bits in ([default] if passthrough else []) + widths:
        reserves = _reserves(tree, ours, bits)
        plan = SeabiosPlan(bits, reserves, seabios.place(tree(reserves), ram, seabios.Width(bits)), worst, bits)
        if plan.complete:
            return plan
        reachable = host_bits is None or bits <= host_bits
        if reachable and (best is None or plan.placement.assigned > best.placement.assigned):
            best = plan
    if best is None or best.placement.assigned <= best_bare.assigned:
        return none
    return best


def _reserves(tree, ours: list[PortBudget], bits: int) -> dict[str, int]:
    top = 1 << min(bits, seabios.MAX_TOP_BITS)
    slot_align = top >> seabios.PAD_SHIFT
    sized = {n.label: seabios.window_entry(n, True, top).size for n in tree({}) if isinstance(n, seabios.Bridge)}
    return {p.alias: pow2ceil(sized[p.alias]) for p in ours
            if p.alias in sized and p.largest_bar > slot_align}


def budget(root: etree._Element, host: Topology, hostdevs: list[tuple[Bdf, int | None]],
           controllers: Iterable[LayoutController], host_bits: int | HostWidth | None, added_ports: int = 0) -> MmioBudget:
    """``added_ports``: root ports libvirt and KubeVirt add after the hook (empty slots to
    SeaBIOS, each padded like ours)."""
    ctrls = snapshot(controllers)
    width = as_width(host_bits)
    b = MmioBudget(machine.firmware_of(root), machine.cpu_mode_of(root), machine.guest_ram(root), host_bits=width.bits,
                   host_bits_from=width.origin)
    # the sizing follows from these alone (SeaBIOS's model tries every width): one per allocation
    key = (tuple(ctrls.values()), tuple(hostdevs), added_ports, b.ram, b.cpu_mode, width.bits)
    ports, b.other, notes, b.seabios = SIZINGS(host).get(key, lambda: _sizing(host, ctrls, hostdevs, added_ports,
                                                                              b.ram, b.cpu_mode, width.bits))
    b.ports, b.notes = list(ports), list(notes)
    b.unsized = tuple(bdf for bdf, _ in hostdevs if host.function(bdf).bars is None)
    b.ovmf_bits = ovmf_bits(b.total)
    return b


# The sizing per host model, for the last few allocations.
SIZINGS = recent()


def _sizing(host: Topology, ctrls: dict[int, Ctl], hostdevs: list[tuple[Bdf, int | None]], added_ports: int,
            ram: int, cpu_mode: str, bits: int | None) -> tuple[tuple[PortBudget, ...], int, tuple[str, ...], SeabiosPlan | None]:
    ports, other, notes, on_bus = port_budgets(host, ctrls, hostdevs)
    seabios = None
    if ports or other:
        seabios = seabios_plan(lambda reserves: guest_tree(ctrls, on_bus, reserves, added_ports), ports, ram, cpu_mode, bits)
    return tuple(ports), other, tuple(notes), seabios


# -- what goes into the domain ------------------------------------------------------------------

def as_width(host_bits: int | HostWidth | None) -> HostWidth:
    """A caller's width: a HostWidth as is (``Topology.host_width()``), a bare number or None as
    given by the caller (tests, the e2e tier, library users)."""
    if isinstance(host_bits, HostWidth):
        return host_bits
    return HostWidth(host_bits, "given by the caller" if host_bits is not None else "not given")


def check_host(b: MmioBudget) -> None:
    """MmioError when the guest needs more address bits than the host CPU has."""
    need = b.bits
    if need is None:
        return
    if b.host_bits is None:  # said once, by MmioBudget.unknown (xmlfix --check: unknown)
        return
    if need > b.host_bits:
        raise MmioError(
            f"the assigned devices need {fmt_size(b.total)} of 64-bit MMIO space: {need}-bit guest addresses "
            f"under {b.firmware}, but the host CPU has {b.host_bits} ({b.host_bits_from})"
        )


def seabios_warning(b: MmioBudget) -> None:
    """A typed warning recommending EFI when SeaBIOS cannot seabios.place every BAR whatever we write:
    two BARs above the padded slot alignment below one switch."""
    plan = b.seabios
    if b.firmware != "seabios" or plan is None or plan.complete:
        return
    p = plan.placement
    misaligned = [label for label, why in p.lost.items() if "multiple of its size" in why]
    if not misaligned:
        return  # the width: check_host says so
    b.warnings.append(FirmwareWarning(
        f"SeaBIOS {seabios.VERSION} (KubeVirt's default firmware) leaves {len(p.lost)} of {len(p.bars)} 64-bit BARs "
        f"unusable whatever the domain says: it aligns each switch port to {fmt_size(p.slot_align)} "
        f"(2^{plan.width}/2048), so the second BAR above that below one switch lands misaligned "
        f"({misaligned[0]}, {p.lost[misaligned[0]]}); boot with EFI (spec.domain.firmware.bootloader.efi), "
        f"fixed in SeaBIOS 1.17.0"))


def apply(root: etree._Element, b: MmioBudget) -> None:
    """Write what the budget needs; replace what an earlier call wrote. Idempotent."""
    plan = b.seabios if b.firmware == "seabios" else None
    reserve = {alias: [Property(PREF64_RESERVE, "unsigned", str(size))]
               for alias, size in (plan.reserves if plan is not None else {}).items()}
    set_properties(root, lambda alias, name: name == PREF64_RESERVE and alias.startswith(OUR_ALIAS_PREFIX), reserve)
    if reserve:
        sizes = sorted({fmt_size(v) for v in plan.reserves.values()}, reverse=True)
        b.applied.append(f"pref64-reserve {'/'.join(sizes)} on {len(reserve)} root port(s)")
    bits = b.bits
    if bits is None:
        return
    cpu = machine.ensure_cpu(root)
    passthrough = b.cpu_mode in PASSTHROUGH_CPU_MODES
    machine.set_maxphysaddr(cpu, None if passthrough else bits)
    b.applied.append("<maxphysaddr mode='passthrough'/>" if passthrough else f"<maxphysaddr mode='emulate' bits='{bits}'/>")
    if b.firmware == "ovmf" and not passthrough:
        _require_feature(cpu, FEATURE_1G_PAGES, b)


def _require_feature(cpu: etree._Element, name: str, b: MmioBudget) -> None:
    policies = machine.cpu_feature_policies(cpu, name)
    if any(p in machine.FEATURE_OFF_POLICIES for p in policies):
        b.notes.append(f"<cpu> disables {name}: OVMF keeps its {fmt_size(OVMF_DEFAULT_APERTURE)} 64-bit window")
        return
    if policies:
        return
    if not machine.cpu_has_model(cpu) and b.cpu_mode not in ("host-model",):
        b.notes.append(f"<cpu mode='{b.cpu_mode}'> has no model: cannot require {name} (OVMF needs it)")
        return
    machine.require_cpu_feature(cpu, name)
    b.applied.append(f"<feature policy='require' name='{name}'/>")


__all__ = ["FirmwareWarning", "MmioBudget", "MmioError", "PortBudget", "apply", "budget", "check_host",
           "host_phys_bits", "seabios_warning"]


# -- the one call the rewrite makes ---------------------------------------------------------------

def apply_mmio_settings(root: etree._Element, host: Topology, layout: GuestLayout, hostdevs: Sequence[tuple[Bdf, str | None]],
                        *, mmio: bool, p2p_clique: bool, host_bits: int | HostWidth | None, added_ports: int = 0):
    """Budget + settings (``mmio``) and P2P cliques (``p2p_clique``) on an already placed domain
    (``layout``: its PCI layout, read once per call). ``hostdevs``: each PCI hostdev's host
    source and alias, in the domain's order. Returns (MmioBudget | None, CliquePlan | None);
    raises MmioError when even the host's address width is too small."""
    from pcitopo.guest.cliques import apply_cliques, plan_cliques

    b = None
    if mmio:
        placed = [(source, a.bus if a is not None else None) for a, source in layout.hostdevs]
        b = budget(root, host, placed, layout.controllers, host_bits, added_ports)
        check_host(b)
        seabios_warning(b)
        apply(root, b)
    cliques = None
    if p2p_clique:
        cliques = plan_cliques(host, list(hostdevs))
        apply_cliques(root, cliques)
    return b, cliques
