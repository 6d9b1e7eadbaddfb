"""The Plugin path's final XML boots as the hook's does.

What libvirt gets on KubeVirt v1.9.0 with the Plugins gate and pcitopo at both doors is the last
define of testkit.plugin.pipeline.boot: the legacy hook's reply through KubeVirt's struct re-parse,
then the plugin's reply through libvirt-go-xml-module (the model), three defines with libvirt's
read-back between them. That XML is booted on the Debian 13 stack and judged exactly as the
golden boots (test_golden_boot.py: every pair's class and every device's NUMA node as promised,
NCCL's bandwidth model in the guest) and the MMIO tier (test_mmio_boot.py: every BAR assigned
under SeaBIOS 1.16.3, as the legacy path's boot of the same domain)."""

from __future__ import annotations

import pytest

from pcitopo.guest.rewrite import rewrite_domain
from testkit.e2e.golden_check import check_booted
from testkit.e2e.mmio_boot import HOST_BITS, boot_domain, kubevirt_input
from testkit.e2e.nccl_check import check_nccl
from testkit.plugin.pipeline import boot as kubevirt_boot

from .test_golden_boot import FIXTURES, NCCL_CASES, _boot, golden
from .test_mmio_boot import _boot as mmio_boot

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

ROWS: list[str] = []


def plugin_path(host, domain: bytes, **kw) -> bytes:
    """The XML virt-launcher v1.9.0 defines last, pcitopo at both doors."""
    def rewrite(xml: bytes) -> bytes:
        return rewrite_domain(xml, host, **kw).xml

    b = kubevirt_boot(domain, legacy=rewrite, plugins=[rewrite])
    assert b.error is None and len(b.defines) == 3, b.error
    return b.defines[-1]


# hgx-b200 in the regular tier; the two H100 boards (the same path, 2 more boots) in the slow one
@pytest.mark.parametrize("case", [pytest.param(c, marks=() if c == "hgx-b200" else (pytest.mark.e2e_slow,))
                                  for c in NCCL_CASES])
def test_plugin_path_boots_with_the_legacy_paths_classes_and_nccl(case, libvirtd, tmp_path):
    host, res = golden(case)
    xml = plugin_path(host, (FIXTURES / case / "domain.xml").read_bytes())
    assert b'<override xmlns="http://libvirt.org/schemas/domain/qemu/1.0">' in xml  # libvirtxml's form
    booted = _boot(libvirtd, f"{case} (plugin path)", xml)
    check = check_booted(case, host, res, booted, tmp_path / "sysfs")
    check.assert_ok()
    assert check.devices_checked == len(res.report.placed) and check.pairs_checked == len(res.report.pairs)
    nccl = check_nccl(FIXTURES / case, FIXTURES / case / "domain.xml", host, booted, tmp_path / "nccl")
    ROWS.append(f"{case} plugin path: {nccl.line(case)}")
    print("\n" + ROWS[-1])
    assert not nccl.problems, "\n".join(nccl.problems)
    assert nccl.ports_checked and nccl.pairs and nccl.equal_with_file == nccl.pairs


def test_plugin_path_assigns_every_bar_as_the_legacy_path(libvirtd):
    """The OCI H100 shape under SeaBIOS 1.16.3 (the MMIO tier's regular case): the plugin path's
    XML (maxphysaddr and pref64-reserve through libvirtxml) assigns what the hook's does."""
    legacy = boot_domain("oci-h100", efi=False)
    host, domain = kubevirt_input("oci-h100", efi=False)
    xml = plugin_path(host, domain, host_phys_bits=HOST_BITS)
    got, r = mmio_boot(libvirtd, xml, legacy.sizes, False, legacy.memory_mib)
    predicted = legacy.report.mmio.seabios.placement.assigned
    ROWS.append(f"oci-h100 seabios plugin path: {got.assigned}/{got.expected} BARs (legacy path predicted and booted: {predicted})")
    print("\n" + ROWS[-1])
    assert got.assigned == got.expected == predicted, (ROWS[-1], got.dmesg[:20])
