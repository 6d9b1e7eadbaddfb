"""The one classifier, case by case (NCCL's parent walk and flattening; NVML's levels)."""

from __future__ import annotations

import pytest

from pcitopo.paths.classify import NvlinkOracle, classify
from pcitopo.synth import host_from_topo

NUMA2 = """
numa 0 cpus=0-3
numa 1 cpus=4-7
"""


def cls(host, a, b):
    c = classify(host, a, b)
    return c.nccl.value, c.nvml.value


def test_same_switch_is_pix():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-oem
      ds 17:00.0
        ep 18:00.0 preset=h100
      ds 17:01.0
        ep 19:00.0 preset=cx7-ib
""")
    assert cls(h, "18:00.0", "19:00.0") == ("PIX", "PIX")


def test_nested_switches_are_pxb_and_stay_pxb():
    # DGX-style: ConnectX integrated switch with the GPU behind a second bridge pair.
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=cx7-switch
      ds 17:00.0 preset=cx7-switch
        ep 18:00.0 preset=cx7-ib
      ds 17:01.0 preset=cx7-switch
        us 19:00.0 preset=pex-gen5-oem
          ds 1a:00.0
            ep 1b:00.0 preset=h100
""")
    assert cls(h, "18:00.0", "1b:00.0") == ("PXB", "PXB")


BCM_TWO_LEVEL = NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-top
      ds 17:00.0 preset=pex-gen5-top
        us 18:00.0 preset=pex-gen5-virt
          ds 19:00.0
            ep 1a:00.0 preset=b200
          ds 19:01.0
            ep 1b:00.0 preset=cx7-ib
      ds 17:01.0 preset=pex-gen5-top
        us 1c:00.0 preset=pex-gen5-virt
          ds 1d:00.0
            ep 1e:00.0 preset=b200
          ds 1d:01.0
            ep 1f:00.0 preset=cx7-ib
"""


def test_broadcom_two_level_flattened_for_nccl_not_for_nvml():
    h = host_from_topo(BCM_TWO_LEVEL)
    assert cls(h, "1a:00.0", "1b:00.0") == ("PIX", "PIX")  # own NIC
    assert cls(h, "1a:00.0", "1f:00.0") == ("PIX", "PXB")  # neighbour pair's NIC
    assert cls(h, "1a:00.0", "1e:00.0") == ("PIX", "PXB")


def test_oem_subsystem_broadcom_is_not_flattened():
    h = host_from_topo(BCM_TWO_LEVEL.replace("pex-gen5-virt", "pex-gen5-oem"))
    assert cls(h, "1a:00.0", "1f:00.0") == ("PXB", "PXB")


def test_gen4_two_level_flattened():
    h = host_from_topo(BCM_TWO_LEVEL.replace("pex-gen5-top", "pex-gen4").replace("pex-gen5-virt", "pex-gen4"))
    assert cls(h, "1a:00.0", "1f:00.0") == ("PIX", "PXB")


def test_two_root_ports_of_one_host_bridge_are_phb():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    ep 16:00.0 preset=a100-pcie
  rp 15:02.0 preset=intel-rp
    ep 17:00.0 preset=cx7-ib
""")
    assert cls(h, "16:00.0", "17:00.0") == ("PHB", "PHB")


def test_two_host_bridges_of_one_numa_node_are_node_for_nvml_phb_for_nccl():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    ep 16:00.0 preset=a100-pcie
rc 0000:26 numa=0
  rp 26:01.0 preset=intel-rp
    ep 27:00.0 preset=cx7-ib
""")
    assert cls(h, "16:00.0", "27:00.0") == ("PHB", "NODE")


def test_two_numa_nodes_are_sys():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    ep 16:00.0 preset=a100-pcie
rc 0000:97 numa=1
  rp 97:01.0 preset=intel-rp
    ep 98:00.0 preset=cx7-ib
""")
    assert cls(h, "16:00.0", "98:00.0") == ("SYS", "SYS")


def test_numa_node_unknown_collapses_to_one_cpu():
    # Firmware that reports -1 everywhere: NCCL puts every device on CPU -1 (PHB), NVML sees
    # one node (NODE), never SYS.
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=-1
  rp 15:01.0 preset=intel-rp
    ep 16:00.0 preset=a100-pcie
rc 0000:97 numa=-1
  rp 97:01.0 preset=intel-rp
    ep 98:00.0 preset=cx7-ib
""")
    assert h.function("16:00.0").numa_node == -1
    assert cls(h, "16:00.0", "98:00.0") == ("PHB", "NODE")


def test_vf_and_its_pf_are_one_nccl_nic():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-oem
      ds 17:00.0
        ep 18:00.0 preset=h100
      ds 17:01.0
        ep 19:00.0 preset=cx7-ib vfs=4
""")
    vfs = [b for b in h.bdfs() if h.function(b).physfn is not None]
    assert len(vfs) == 4
    assert all(str(h.function(v).physfn) == "0000:19:00.0" for v in vfs)
    assert cls(h, vfs[0], "19:00.0") == ("PIX", "PIX")
    assert cls(h, vfs[0], "18:00.0") == cls(h, "19:00.0", "18:00.0") == ("PIX", "PIX")


def test_functions_of_one_device_are_pix():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    ep 16:00.0 preset=cx6-dx functions=2
  rp 15:02.0 preset=intel-rp
    ep 17:00.0 preset=a100-pcie
""")
    assert cls(h, "16:00.0", "16:00.1") == ("PIX", "PIX")
    assert cls(h, "16:00.1", "17:00.0") == ("PHB", "PHB")


def test_device_directly_on_a_root_bus():
    h = host_from_topo(NUMA2 + """
rc 0000:15 numa=0
  ep 15:00.4 preset=nvme
  rp 15:01.0 preset=intel-rp
    us 16:00.0 preset=pex-gen5-oem
      ds 17:00.0
        ep 18:00.0 preset=h100
""")
    assert h.function("15:00.4").parent_bdf is None
    assert cls(h, "15:00.4", "18:00.0") == ("PHB", "PHB")


def test_nvlink_inferred_only_with_nvswitches_present():
    base = NUMA2 + """
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp
    ep 16:00.0 preset=h100
  rp 15:02.0 preset=intel-rp
    ep 17:00.0 preset=h100
"""
    h = host_from_topo(base)
    assert NvlinkOracle(h).count(h.function("16:00.0"), h.function("17:00.0")) is None
    h2 = host_from_topo(base + """  rp 15:03.0 preset=intel-rp
    ep 18:00.0 preset=nvswitch-h100
""")
    assert NvlinkOracle(h2).count(h2.function("16:00.0"), h2.function("17:00.0")) == 18


@pytest.mark.parametrize("fixture", ["hgx-h100", "hgx-b200", "dgx-h100"])
def test_fixture_gpu_to_own_nic(fixture):
    """Each GPU has exactly one NIC at its closest class: PIX (HGX) or PXB (DGX, where the GPU sits
    below its ConnectX-7's integrated switch); docs/SOURCES.md, "Reference hosts"."""
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Role

    h = open_host(f"fixtures/{fixture}")
    gpus = [f for f in h.functions() if h.role(f) == Role.GPU]
    nics = [f for f in h.functions() if h.role(f) == Role.NIC and not f.is_vf]
    want = "PXB" if fixture == "dgx-h100" else "PIX"
    assert len(gpus) == 8
    for g in gpus:
        close = [n for n in nics if classify(h, g, n).nvml.value == want]
        assert len(close) == 1, (g.bdf, [str(n.bdf) for n in close])
        assert classify(h, g, close[0]).nccl.value == want
        if fixture == "hgx-b200":
            # NCCL flattens the two-level complex: the neighbour pair's NIC is PIX too.
            assert sum(classify(h, g, n).nccl.value == "PIX" for n in nics) == 2


def test_three_broadcom_tiers_flatten_only_one_level():
    """NCCL's flattening merges a level-0 switch's direct sub-switches once, then marks it done:
    the third tier stays separate, so two devices below different third-tier switches are PXB."""
    h = host_from_topo(NUMA2 + """
rc 0000:00 numa=0
  rp 00:01.0 preset=intel-rp
    us 01:00.0 preset=pex-gen4
      ds 02:00.0 preset=pex-gen4
        us 03:00.0 preset=pex-gen4
          ds 04:00.0 preset=pex-gen4
            us 05:00.0 preset=pex-gen4
              ds 06:00.0 preset=pex-gen4
                ep 07:00.0 preset=h100
          ds 04:01.0 preset=pex-gen4
            us 08:00.0 preset=pex-gen4
              ds 09:00.0 preset=pex-gen4
                ep 0a:00.0 preset=cx7-ib
""")
    assert cls(h, "07:00.0", "0a:00.0") == ("PXB", "PXB")
    from pcitopo.paths.classify import nccl_path
    assert [str(b) for b in nccl_path(h, h.function("07:00.0")).switches] == ["0000:05:00.0", "0000:01:00.0"]
