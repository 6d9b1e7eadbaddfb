"""Every 64-bit BAR assigned after the rewrite, under SeaBIOS 1.16.3 and OVMF 2025.02 (what KubeVirt
1.8-1.9's virt-launcher boots), on every case; and no setting the rewrite adds ever leaves fewer
BARs assigned than the same domain without it (each case boots both ways).

Devices are stood in for by ivshmem functions with the same 64-bit prefetchable BARs at the guest
address the rewrite gave them (``mmio_boot.large_bar_standins``): 128 GiB + 32 MiB per H100,
256 GiB + 32 MiB per B200, 32 MiB per ConnectX-7 function. The guest gets the domain's RAM (8-16 GiB:
SeaBIOS 1.16.3 only pads its windows when RAM reaches above 4 GiB, as in every GPU VM), at most
5 GiB; TCG maps it lazily, so the boots stay light. The CPU is ``custom`` ``qemu64`` (the rewrite writes ``emulate``
widths and, for OVMF, ``pdpe1gb``).

Cases (``mmio_boot.CASES``): one GPU per root port behind a two-level switch with a dual-function
NIC, at 8 x (128 GiB + 32 MiB) and 8 x (256 GiB + 32 MiB); the same without NICs; one GPU
directly under each root port; two GPUs behind one switch (fixtures/hgx-b200), which SeaBIOS
1.16.3 cannot place whatever the domain says: the rewrite refuses it (``mmio-firmware``,
recommending EFI) and the boot of what ``on-error: passthrough`` would start shows why.

Tiers: the OCI H100 shape and two GPUs per switch under SeaBIOS (both ways), and the latter under
EFI with the settings, run in the regular e2e tier (5 boots, 1-3 minutes each under TCG); every
other case x firmware (20 boots; OVMF without settings is the slowest, up to its 15-minute
timeout) is ``e2e_slow``: ``make test-slow``. The table
of every boot of the session, with the stack's versions, prints at the end (also without ``-s``).
"""

from __future__ import annotations

import pytest

from testkit.e2e.bootable import BootError
from testkit.e2e.guestboot import boot
from testkit.e2e.mmio_boot import (
    CASES,
    KEEP_CPU,
    OVMF,
    BootRow,
    boot_domain,
    count_bars,
    large_bar_standins,
    mmio_settings,
    serial_text,
    stack_versions,
    strip_mmio_settings,
)
from testkit.e2e.terminal import show_past_capture

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROWS: list[BootRow] = []
EFI_ROWS: list[str] = []
# the regular tier: KubeVirt's default firmware on the OCI H100 shape and on the refused case (4
# boots), plus EFI on the refused case (test_efi_assigns_what_seabios_cannot, 1 boot); every other
# case x firmware is e2e_slow
REGULAR = {("oci-h100", "seabios"), ("two-per-switch", "seabios")}
BOOT_TIMEOUT = {"seabios": 600.0, "ovmf": 900.0}
# The guest gets the domain's RAM up to this (above 4 GiB either way, so SeaBIOS pads as it would;
# where the windows go does not depend on it below 2^41); 5 GiB as in the measurement
MAX_GUEST_MIB = 5120


def _params():
    for case in CASES:
        for fw in ("seabios", "ovmf"):
            marks = () if (case, fw) in REGULAR else (pytest.mark.e2e_slow,)
            yield pytest.param(case, fw, id=f"{case}-{fw}", marks=marks)


def _boot(libvirtd, xml: bytes, sizes: dict[str, tuple[int, ...]], efi: bool, memory_mib: int,
          silent_after: float | None = 240.0):
    """``silent_after``: a boot that must reach /init gets one more try if it never does
    (guestboot.GuestSilent, QEMU CPU seconds: seen once in CI); the control boot may legitimately not."""
    standin, _ = large_bar_standins(xml, sizes)
    r = boot(standin, libvirtd=libvirtd, timeout=BOOT_TIMEOUT["ovmf" if efi else "seabios"],
             keep_cpu=KEEP_CPU, loader=OVMF if efi else None, memory_mib=min(memory_mib, MAX_GUEST_MIB),
             silent_after=silent_after)
    want = [s for v in sizes.values() for s in v]
    return count_bars(serial_text(r.serial_log), want), r


def _boot_bare(libvirtd, xml: bytes, sizes, efi: bool, memory_mib: int):
    """The control boot without any setting. Without them the guest may not reach its end
    marker within the timeout at all (seen: OVMF with eight 128 GiB devices; SeaBIOS 1.16.3 with
    two B200s per switch, whose 64-bit start wraps past 2^64 when the windows outgrow 2^40): that
    counts as no BAR assigned, and the row says so."""
    try:
        return _boot(libvirtd, xml, sizes, efi, memory_mib, silent_after=None)
    except BootError as e:
        if "no end marker" not in str(e):
            raise
        want = [s for v in sizes.values() for s in v]
        return count_bars("", want), NoBoot(BOOT_TIMEOUT["ovmf" if efi else "seabios"])


class NoBoot:
    """Stands for a control boot that did not reach the guest's end marker."""

    def __init__(self, timeout: float) -> None:
        self.timings = {"total": timeout}
        self.firmware = f"no end marker within {timeout:.0f} s"


@pytest.fixture(scope="module")
def stack(libvirtd) -> str:
    """The stack's line; the tier proves SeaBIOS 1.16.3's placement, so it needs that SeaBIOS."""
    line, seabios = stack_versions(libvirtd)
    if seabios != "1.16.3":
        pytest.fail(f"the MMIO tier needs SeaBIOS 1.16.3 (KubeVirt's); this stack has {seabios}: {line}")
    return line


@pytest.mark.parametrize("case,fw", list(_params()))
def test_every_bar_assigned_and_no_setting_lowers_the_count(libvirtd, stack, case, fw):
    d = boot_domain(case, efi=fw == "ovmf")
    b = d.report.mmio
    assert b is not None and b.firmware == fw
    refused = [w for w in d.report.warnings if w.kind == "mmio-firmware"]
    with_settings, r_with = _boot(libvirtd, d.xml, d.sizes, fw == "ovmf", d.memory_mib)
    bare = strip_mmio_settings(d.xml)
    assert mmio_settings(bare) == "none"
    without, r_without = _boot_bare(libvirtd, bare, d.sizes, fw == "ovmf", d.memory_mib)
    row = BootRow(case, fw, mmio_settings(d.xml), with_settings, without, r_with, r_without,
                  refused[0].reason if refused else "")
    ROWS.append(row)
    print("\n" + row.line())
    # no setting may lower the count, on any case and firmware
    assert with_settings.assigned >= without.assigned, row.line()
    if fw == "seabios":  # the firmware model predicted what the guest kernel found
        assert b.seabios.placement.assigned == with_settings.assigned, (row.line(), b.seabios.placement.lost)
    if case == "two-per-switch" and fw == "seabios":
        # refused with a line recommending EFI, because the boot cannot place them
        assert len(refused) == 1 and "EFI" in refused[0].reason and "\n" not in refused[0].reason
        assert with_settings.assigned < with_settings.expected, row.line()
        return
    assert not refused, refused
    assert with_settings.assigned == with_settings.expected, (row.line(), with_settings.dmesg[:20])


def test_efi_assigns_what_seabios_cannot(libvirtd, stack):
    """What the refusal recommends, booted: two GPUs per switch (fixtures/hgx-b200, with NICs)
    under OVMF 2025.02 with the rewrite's settings have every BAR assigned. (The control boot
    without settings is in the slow tier's two-per-switch-ovmf case.)"""
    d = boot_domain("two-per-switch", efi=True)
    assert not d.report.warnings and d.report.mmio.firmware == "ovmf"
    c, r = _boot(libvirtd, d.xml, d.sizes, True, d.memory_mib)
    line = f"two-per-switch, EFI only: {c.assigned}/{c.expected} ({mmio_settings(d.xml)}; {r.firmware})"
    EFI_ROWS.append(line)
    assert c.assigned == c.expected, (line, c.dmesg[:20])


def test_libvirt_hands_the_settings_to_qemu(libvirtd, tmp_path):
    """No boot: ``virsh domxml-to-native`` of rewritten domains with real vfio hostdevs shows
    each setting in QEMU's arguments: phys-bits on -cpu and pref64-reserve on our root ports (the
    OCI H100 shape), x-nv-gpudirect-clique on the GPUs (a PCIe host with two switches of two
    L40S, which needs no MMIO setting; the stand-in boots cannot carry the clique)."""
    import re

    from testkit.e2e.mmio_boot import native_settings_domain, switch_host

    def argv(host) -> tuple[str, object]:
        xml, report, name = native_settings_domain(host)
        f = tmp_path / f"{name}.xml"
        f.write_bytes(xml)
        libvirtd.virsh("define", str(f))
        try:
            return libvirtd.virsh("domxml-to-native", "qemu-argv", "--domain", name).stdout, report
        finally:
            libvirtd.virsh("undefine", name, check=False)

    out, report = argv(switch_host("h100"))
    assert report.mmio.bits is not None and f"phys-bits={report.mmio.bits}" in out
    reserves = dict(re.findall(r'"id":"(ua-pcitopo-rp-[^"]+)"[^}]*"pref64-reserve":(\d+)', out))
    assert reserves == {a: str(v) for a, v in report.mmio.seabios.reserves.items()} and len(reserves) == 8
    import test_mmio

    from pcitopo.synth import host_from_topo

    out, report = argv(host_from_topo(test_mmio.PCIE_HOST))
    cliques = dict(re.findall(r'"id":"(ua-gpu-[^"]+)"[^}]*"x-nv-gpudirect-clique":(\d+)', out))
    assert cliques == {a: str(n) for a, n in report.cliques.by_alias.items()} and len(cliques) == 4


def test_zz_mmio_table(request, libvirtd):
    """The table of this session's boots, with the stack it ran on."""
    if ROWS or EFI_ROWS:
        show_past_capture(request.config, [stack_versions(libvirtd)[0], *BootRow.header(),
                                           *(r.line() for r in ROWS), *EFI_ROWS])
