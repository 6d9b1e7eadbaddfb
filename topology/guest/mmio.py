"""The guest's 64-bit MMIO space: what the assigned devices need, and what makes the firmware
give it.

A GPU's large BARs are 64-bit prefetchable (H100: 128 GiB + 32 MiB, B200: 256 GiB + 32 MiB). In
the guest every bridge above a device opens a window holding its subtree's BARs; we size each
window as the next power of two of its children's sum (what SeaBIOS and OVMF's PCI bus driver
do at worst: each window aligned to its largest member), per root port and in total.

Whether the firmware can place them depends on the guest's physical-address width and on the
firmware (measured under QEMU 7.2/TCG with a Linux 6.1 guest; see docs/DEPLOY.md "MMIO"):
- Linux ignores a PCI window above the CPU's address width ("not CPU addressable"); QEMU's
  default width for non-host CPU models is 40 bits (1 TiB).
- SeaBIOS places the 64-bit windows above guest RAM: it needs RAM top + the windows below
  2^bits.
- OVMF (edk2 ``OvmfPkg/Library/PlatformInitLib``, ``PlatformDynamicMmioWindow``) sizes its 64-bit
  aperture from the address width, as the top eighth of the address space, but only when the CPU
  offers 1 GiB pages (``pdpe1gb``), else it keeps its 32 GiB default.
- SeaBIOS 1.16.3 (what KubeVirt's virt-launcher ships) misplaces large BARs when the guest has more
  than 4 GiB of RAM unless each root port reserves its window (QEMU ``pcie-root-port``
  ``pref64-reserve``); with two large-BAR GPUs below one switch even that is not enough (fixed
  upstream in SeaBIOS 1.17.0): a typed warning recommends EFI.

What this module emits into the domain (idempotent, every call, since KubeVirt's domain struct
keeps neither ``<maxphysaddr>`` nor ``<qemu:override>``): ``<cpu><maxphysaddr>`` (``passthrough``
for host-passthrough/maximum CPUs, ``emulate`` with ``bits`` otherwise), ``<feature
name='pdpe1gb' policy='require'/>`` for OVMF where the CPU mode does not pass the host's flags
through, and for SeaBIOS ``pref64-reserve`` on exactly our root ports (by alias, via
``<qemu:override>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from lxml import etree

from ..errors import FirmwareWarning, MmioError, PcitopoError
from ..libvirt.domain import OUR_ALIAS_PREFIX, PciController, ROOT_PORT, UPSTREAM
from ..libvirt.machine import (
    FEATURE_OFF_POLICIES,
    cpu_feature_policies,
    cpu_has_model,
    cpu_mode_of,
    ensure_cpu,
    firmware_of,
    guest_ram,
    require_cpu_feature,
    set_maxphysaddr,
)
from ..libvirt.overrides import Property, set_properties
from ..model.bars import device_bars
from ..model.cpuinfo import HostWidth, local_width
from ..model.tree import Bdf, Topology

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
QEMU_DEFAULT_BITS = 40  # QEMU's phys-bits for CPU models other than host/max
OVMF_DEFAULT_APERTURE = 32 * GiB  # OVMF's PcdPciMmio64Size when it cannot size the window itself
OVMF_MIN_DYNAMIC_BITS = 41  # OVMF sizes the window from the width only above 40 bits
# SeaBIOS 1.16.3 aligns slot windows to 32 GiB only (guest RAM above 4 GiB): larger BARs below one
# switch cannot be placed together.
SEABIOS_1163_ALIGN = 32 * GiB
PREF64_RESERVE = "pref64-reserve"
PASSTHROUGH_CPU_MODES = frozenset({"host-passthrough", "maximum"})
FEATURE_1G_PAGES = "pdpe1gb"


def pow2ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def bits_for(end: int) -> int:
    """Smallest width whose address space holds ``[0, end)``."""
    return max(1, (end - 1).bit_length())


def host_phys_bits(path: str | None = None) -> int | None:
    """This machine's physical-address width (``/proc/cpuinfo``, or ``$PCITOPO_CPUINFO``, or
    ``path``; None when it cannot be read). The width of the host a sysfs source describes is
    ``Topology.host_width()`` (topology/model/cpuinfo.py): a capture carries its own."""
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
    large_bars_below_one_switch: int = 0  # most BARs > 32 GiB below one switch of this port


@dataclass
class MmioBudget:
    firmware: str
    cpu_mode: str
    ram: int
    ports: list[PortBudget] = field(default_factory=list)
    other: int = 0  # 64-bit prefetchable space of devices not below one of our root ports
    host_bits: int | None = None
    host_bits_from: str = "not given"  # where host_bits came from (HostWidth.origin)
    seabios_bits: int | None = None  # None: QEMU's default width is enough
    ovmf_bits: int | None = None
    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[PcitopoError] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(p.window for p in self.ports) + pow2ceil(self.other)

    @property
    def largest_window(self) -> int:
        return max([p.window for p in self.ports] + [pow2ceil(self.other)], default=0)

    @property
    def bits(self) -> int | None:
        """The width asked for under this domain's firmware."""
        return self.ovmf_bits if self.firmware == "ovmf" else self.seabios_bits

    def ovmf_window(self, bits: int | None) -> int:
        return 1 << (bits - 3) if bits and bits >= OVMF_MIN_DYNAMIC_BITS else OVMF_DEFAULT_APERTURE

    def summary(self) -> dict:
        return {"firmware": self.firmware, "total_bytes": self.total, "ports": len(self.ports),
                "bits": self.bits, "host_bits": self.host_bits, "applied": list(self.applied)}


def seabios_bits(ram: int, windows: list[int]) -> int | None:
    """SeaBIOS puts the 64-bit windows above RAM (biggest first, each aligned to its size)."""
    if not windows:
        return None
    top = 4 * GiB + ram
    align = pow2ceil(max(windows))  # at most the largest window's size
    end = -(-top // align) * align + sum(windows)
    bits = bits_for(end)
    return bits if bits > QEMU_DEFAULT_BITS else None


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


def snapshot(controllers: list[PciController]) -> dict[int, Ctl]:
    out = {}
    for c in controllers:
        a = c.address
        out[c.index] = Ctl(c.index, c.model, c.alias, a.bus if a is not None else None, c.ours)
    return out


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
                 ) -> tuple[list[PortBudget], int, list[str]]:
    """Per root port of ours: the power-of-two window of its subtree (nested bridges each
    rounding their own sum up). ``hostdevs`` = (host BDF, guest bus index or None)."""
    notes: list[str] = []
    members: dict[int, list[int]] = {}  # controller index → BAR sizes, then child windows
    aligns_of: dict[int, list[int]] = {}  # ... and their alignments
    large_below: dict[tuple[int, int], int] = {}  # (root port, upstream port) → devices with a BAR > 32 GiB
    depth: dict[int, int] = {}
    parent_of: dict[int, int] = {}
    devices: dict[int, list[Bdf]] = {}
    largest: dict[int, int] = {}
    other = 0
    for bdf, bus in hostdevs:
        bars = host.function(bdf).bars
        if bars is None:
            notes.append(f"{bdf}: no BARs in sysfs (resource file absent); not counted in the MMIO budget")
            continue
        sizes = [b.size for b in device_bars(bars) if b.is_mem64_pref]
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
        if any(s > SEABIOS_1163_ALIGN for s in sizes):
            for c in chain:
                if c.model == UPSTREAM:
                    key = (top, c.index)
                    large_below[key] = large_below.get(key, 0) + 1
    windows: dict[int, int] = {}
    aligns: dict[int, int] = {}
    for i in sorted(depth, key=lambda i: -depth[i]):
        sizes = members.get(i, [])
        windows[i], aligns[i] = window_of(sizes, aligns_of.get(i, []))
        if i in parent_of:
            members.setdefault(parent_of[i], []).append(windows[i])
            aligns_of.setdefault(parent_of[i], []).append(aligns[i])
    ports = [
        PortBudget(ctrls[i].alias or "", i, windows[i], largest.get(i, 0), tuple(devices.get(i, ())),
                   max([n for (rp, _), n in large_below.items() if rp == i], default=0))
        for i in sorted(windows) if depth[i] == 0 and windows[i]
    ]
    return ports, other, notes


def budget(root: etree._Element, host: Topology, hostdevs: list[tuple[Bdf, int | None]],
           controllers: list[PciController], host_bits: int | HostWidth | None) -> MmioBudget:
    ctrls = snapshot(controllers)
    width = as_width(host_bits)
    b = MmioBudget(firmware_of(root), cpu_mode_of(root), guest_ram(root), host_bits=width.bits,
                   host_bits_from=width.origin)
    b.ports, b.other, b.notes = port_budgets(host, ctrls, hostdevs)
    windows = [p.window for p in b.ports] + ([pow2ceil(b.other)] if b.other else [])
    b.seabios_bits = seabios_bits(b.ram, windows)
    b.ovmf_bits = ovmf_bits(b.total)
    return b


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
    if b.host_bits is None:
        b.notes.append(f"host CPU address width unknown ({b.host_bits_from}): "
                       f"asking for {need} bits unchecked")
        return
    if need > b.host_bits:
        raise MmioError(
            f"the assigned devices need {fmt_size(b.total)} of 64-bit MMIO space: {need}-bit guest addresses "
            f"under {b.firmware}, but the host CPU has {b.host_bits} ({b.host_bits_from})"
        )


def seabios_1163_warning(b: MmioBudget) -> None:
    if b.firmware != "seabios" or b.ram <= 4 * GiB:
        return
    bad = [p for p in b.ports if p.large_bars_below_one_switch >= 2]
    if bad:
        b.warnings.append(FirmwareWarning(
            f"SeaBIOS 1.16.3 (KubeVirt's) cannot place two BARs above 32 GiB below one switch when the guest has "
            f"more than 4 GiB of RAM ({len(bad)} root port(s), e.g. {bad[0].alias}): some GPUs will show "
            f"BAR1 0M; boot with EFI (spec.domain.firmware.bootloader.efi), fixed in SeaBIOS 1.17.0"
        ))


def apply(root: etree._Element, b: MmioBudget) -> None:
    """Write what the budget needs; replace what an earlier call wrote. Idempotent."""
    bits = b.bits
    # SeaBIOS: reserve each root port's window whenever the width must grow or a BAR is above
    # 32 GiB (SeaBIOS 1.16.3 misaligns those whatever the width, unless the port reserves them)
    large = any(p.largest_bar > SEABIOS_1163_ALIGN for p in b.ports)
    reserve = {p.alias: [Property(PREF64_RESERVE, "unsigned", str(p.window))]
               for p in b.ports if b.firmware == "seabios" and p.alias and (bits is not None or large)}
    set_properties(root, lambda alias, name: name == PREF64_RESERVE and alias.startswith(OUR_ALIAS_PREFIX), reserve)
    if reserve:
        b.applied.append(f"pref64-reserve on {len(reserve)} root port(s)")
    if bits is None:
        return
    cpu = ensure_cpu(root)
    passthrough = b.cpu_mode in PASSTHROUGH_CPU_MODES
    set_maxphysaddr(cpu, None if passthrough else bits)
    b.applied.append("<maxphysaddr mode='passthrough'/>" if passthrough else f"<maxphysaddr mode='emulate' bits='{bits}'/>")
    if b.firmware == "ovmf" and not passthrough:
        _require_feature(cpu, FEATURE_1G_PAGES, b)


def _require_feature(cpu: etree._Element, name: str, b: MmioBudget) -> None:
    policies = cpu_feature_policies(cpu, name)
    if any(p in FEATURE_OFF_POLICIES for p in policies):
        b.notes.append(f"<cpu> disables {name}: OVMF keeps its {fmt_size(OVMF_DEFAULT_APERTURE)} 64-bit window")
        return
    if policies:
        return
    if not cpu_has_model(cpu) and b.cpu_mode not in ("host-model",):
        b.notes.append(f"<cpu mode='{b.cpu_mode}'> has no model: cannot require {name} (OVMF needs it)")
        return
    require_cpu_feature(cpu, name)
    b.applied.append(f"<feature policy='require' name='{name}'/>")


def fmt_size(n: int) -> str:
    """Bytes in the largest binary unit that fits: exact as an integer, else two decimals."""
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.2f} {unit}"
    return f"{n} B"


__all__ = ["FirmwareWarning", "MmioBudget", "MmioError", "PortBudget", "apply", "budget", "check_host",
           "firmware_of", "host_phys_bits", "seabios_1163_warning"]


# -- the one call the rewrite makes ---------------------------------------------------------------

def apply_mmio_settings(root: etree._Element, host: Topology, hostdevs: list, controllers: list[PciController],
                        *, mmio: bool, p2p_clique: bool, host_bits: int | HostWidth | None):
    """Budget + settings (``mmio``) and P2P cliques (``p2p_clique``) on an already placed domain.
    ``hostdevs``: the domain's ``PciHostdev`` views. Returns (MmioBudget | None, CliquePlan | None);
    raises MmioError when even the host's address width is too small."""
    from .cliques import apply_cliques, plan_cliques

    b = None
    if mmio:
        placed = []
        for hd in hostdevs:
            a = hd.address
            placed.append((hd.source, a.bus if a is not None else None))
        b = budget(root, host, placed, controllers, host_bits)
        check_host(b)
        seabios_1163_warning(b)
        apply(root, b)
    cliques = None
    if p2p_clique:
        cliques = plan_cliques(host, [(hd.source, hd.alias) for hd in hostdevs])
        apply_cliques(root, cliques)
    return b, cliques


def budget_lines(b: MmioBudget | None, cliques=None) -> list[str]:
    """The MMIO budget and P2P cliques as text (``xmlfix --explain``)."""
    if b is None:
        out = ["64-bit MMIO: not managed (mmio: off)"]
    else:
        host = f"{b.host_bits} bits" if b.host_bits else "unknown"
        host += f", {b.host_bits_from}"
        out = [f"64-bit MMIO budget ({b.firmware}, CPU {b.cpu_mode}, guest RAM {fmt_size(b.ram)}, host width {host}):"]
        for p in b.ports:
            out.append(f"  {p.alias}: window {fmt_size(p.window)} (largest BAR {fmt_size(p.largest_bar)}, "
                       f"{len(p.devices)} function(s))")
        if b.other:
            out.append(f"  elsewhere (not below pcitopo's root ports): {fmt_size(b.other)}")
        for fw, bits in (("seabios", b.seabios_bits), ("ovmf", b.ovmf_bits)):
            if fw == "ovmf":
                window = f"window {fmt_size(b.ovmf_window(bits))}"
            else:
                window = f"windows above RAM below {fmt_size(1 << (bits or QEMU_DEFAULT_BITS))}"
            need = f"{bits} bits" if bits else f"QEMU's default ({QEMU_DEFAULT_BITS} bits) is enough"
            mark = "  <- this domain" if fw == b.firmware else ""
            out.append(f"  {fw}: total {fmt_size(b.total)}, needs {need}, {window}{mark}")
        out.append("  applied: " + ("; ".join(b.applied) if b.applied else "nothing needed"))
        out += [f"  warning: {w.kind}: {w.reason}" for w in b.warnings]
    if cliques is not None:
        if cliques.members:
            for n, members in sorted(cliques.members.items()):
                out.append(f"P2P clique {n}: {', '.join(str(m) for m in members)}")
        else:
            out.append("P2P cliques: none (no two PCIe GPUs below one host switch)")
    return out
