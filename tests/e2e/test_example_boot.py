"""The deploy/ examples booted as KubeVirt v1.9.0 sends them.

Each example's domain is built as KubeVirt v1.9.0's converter builds it (placeholders, vCPU
hotplug, real aliases, the secboot loader, per-cell hugepages: testkit.kubevirt_vmi), goes
through the boot's defines with libvirt's placement between them (testkit.kubevirt_define,
simulated libvirt), and the XML of the last define, what libvirt boots, is booted on the
Debian 13 stack and judged as the golden boots are: every pair's class and every device's NUMA
node as the rewrite promised for that define's input. The boot harness gives the guest one vCPU
per cell and stand-ins for the devices (guestboot.make_bootable), so KubeVirt's 256-vCPU maximum
and its firmware choice do not reach QEMU here.

vm-gpu.yaml is vmi-gpu.yaml's twin (the same devices in a VirtualMachine): it boots in the slow tier.
"""

from __future__ import annotations

import pytest

from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.kubevirt.launcher.defines import boot_defines, vmi_interfaces
from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.model.tree import Role
from testkit.e2e.golden_check import check_booted
from testkit.e2e.guestboot import boot
from testkit.e2e.paths import REPO_ROOT
from testkit.kubevirt_vmi import deploy_examples, domain_for_vmi

from .test_golden_boot import BOOT_TIMEOUT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1200)]

EXAMPLES = {name: (host, vmi, gpus) for name, host, vmi, gpus in deploy_examples(REPO_ROOT)}
SLOW = {"vm-gpu.yaml"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=(pytest.mark.e2e_slow,) if n in SLOW else ())
                                  for n in sorted(EXAMPLES)])
def test_example_boots_as_kubevirt_v190_sends_it(name, libvirtd, tmp_path):
    host, vmi, gpus = EXAMPLES[name]
    first = domain_for_vmi(host, vmi, gpus, release=Release.V1_9)
    defines = boot_defines(first, lambda x: rewrite_domain(x, host).xml, Release.V1_9, interfaces=vmi_interfaces(vmi))
    res = rewrite_domain(defines.hook_inputs[-1], host)
    assert res.xml == defines.hook_outputs[-1]
    # stand-ins by the host's role of each source address, never by alias (DRA's ua-dra-hostdevice-
    # aliases say nothing of a NIC)
    kinds = {str(d.host): {Role.GPU: "gpu", Role.NIC: "nic"}.get(host.role(host.function(d.host)), "other")
             for d in res.report.placed}
    booted = boot(res.xml, libvirtd=libvirtd, timeout=BOOT_TIMEOUT, silent_after=0.4 * BOOT_TIMEOUT, kinds=kinds)
    print(f"\n[e2e] {name}: KubeVirt v1.9.0's define {len(defines.hook_outputs)} booted, {len(booted.mapping)} stand-ins")
    check = check_booted(name, host, res, booted, tmp_path / "sysfs")
    check.assert_ok()
    assert check.devices_checked == len(res.report.placed) > 0
