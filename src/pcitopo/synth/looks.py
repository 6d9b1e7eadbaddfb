"""What a synthetic function looks like in sysfs apart from its place in the tree: :class:`Look`,
the presets ``.topo`` lines name (``preset=h100``) with their PCI ids and link, and the real BAR
sizes per device id the ``resource`` files are made from."""

from __future__ import annotations

from dataclasses import dataclass, replace

from pcitopo.host.sysfs import OPTIONAL_ATTRS, RESOURCE_ATTRS

# The kernel's pci_speed_string(); "Unknown" is what a function without link registers shows.
SPEEDS = {
    "2.5": "2.5 GT/s PCIe",
    "5": "5.0 GT/s PCIe",
    "8": "8.0 GT/s PCIe",
    "16": "16.0 GT/s PCIe",
    "32": "32.0 GT/s PCIe",
    "64": "64.0 GT/s PCIe",
    "unknown": "Unknown",
}
WIDTHS = (0, 1, 2, 4, 8, 12, 16, 32)
LINK_FILES = ("max_link_speed", "max_link_width", "current_link_speed", "current_link_width")
# Names `omit=` accepts besides the optional attribute files; "link" is shorthand for the four
# link files (conventional PCI functions have none).
OMITTABLE = frozenset(OPTIONAL_ATTRS) | frozenset(RESOURCE_ATTRS) | {"driver", "iommu_group"}


@dataclass(frozen=True, slots=True)
class Look:
    """Everything a function shows in sysfs apart from its place in the tree."""

    vendor: int
    device: int
    class_code: int
    sub_vendor: int = 0
    sub_device: int = 0
    max_speed: str = "Unknown"
    max_width: int = 0
    cur_speed: str | None = None  # None: same as max (a link trained at full speed)
    cur_width: int | None = None
    driver: str | None = None
    omit: frozenset[str] = frozenset()
    vf_device: int | None = None  # the SR-IOV VF device id, if the function can have VFs
    # pcitopo doctor: planted faults, driver_override, IOMMU group type
    faults: frozenset[str] = frozenset()
    override: str | None = None
    iommu_type: str | None = None
    bars: tuple[tuple[int, int, int], ...] = ()  # (BAR index, size, kernel flags): see BARS

    @property
    def is_bridge(self) -> bool:
        return self.class_code >> 8 == 0x0604


def _look(ids: str, sub: str, cls: int, speed: str, width: int, driver: str | None,
          omit: tuple[str, ...] = (), vf: int | None = None) -> Look:
    v, d = (int(x, 16) for x in ids.split(":"))
    sv, sd = (int(x, 16) for x in sub.split(":"))
    return Look(v, d, cls, sv, sd, SPEEDS[speed], width, None, None, driver, frozenset(omit), vf)


_MLX_VF = 0x101E  # ConnectX-5 and later, BlueField: "ConnectX Family mlx5Gen Virtual Function"

# Ids from the PCI ID Repository (pci.ids) where it has them; the rest is marked "guess" and
# listed in fixtures/README.md (sources: docs/SOURCES.md, "the fixture hosts"). GPUs default to vfio-pci
# (a GPU passthrough node binds all of them); NICs to mlx5_core (the host's own driver) and fixtures say driver=vfio-pci where a NIC is
# handed to VMs whole.
PRESETS: dict[str, Look] = {
    # GPUs and NVSwitches
    "h100": _look("10de:2330", "10de:16c1", 0x030200, "32", 16, "vfio-pci"),
    "h200": _look("10de:2335", "10de:18be", 0x030200, "32", 16, "vfio-pci"),
    "b200": _look("10de:2901", "10de:1999", 0x030200, "32", 16, "vfio-pci"),  # sub: guess
    "b300": _look("10de:3182", "10de:20ea", 0x030200, "64", 16, "vfio-pci"),  # sub: guess
    "a100-pcie": _look("10de:20f1", "10de:145f", 0x030200, "16", 16, "vfio-pci"),
    "a100-sxm4": _look("10de:20b0", "10de:134f", 0x030200, "16", 16, "vfio-pci"),  # NVIDIA/nccl#1505's dump
    "l40s": _look("10de:26b9", "10de:1851", 0x030200, "16", 16, "vfio-pci"),
    "nvswitch-h100": _look("10de:22a3", "10de:1796", 0x068000, "16", 2, "vfio-pci"),  # sub, link: guess
    "nvswitch-a100": _look("10de:1af1", "10de:1612", 0x068000, "16", 2, "vfio-pci"),  # sub, link: guess
    # NVIDIA/Mellanox networking
    "cx7-ib": _look("15b3:1021", "15b3:0023", 0x020700, "32", 16, "mlx5_core", vf=_MLX_VF),
    "cx7-eth": _look("15b3:1021", "15b3:0023", 0x020000, "32", 16, "mlx5_core", vf=_MLX_VF),
    "cx7-switch": _look("15b3:1979", "15b3:0023", 0x060400, "32", 16, "pcieport"),  # sub: guess
    # ConnectX-8 SuperNIC: NIC 15b3:1023; its integrated switch presents 15b3:197c and 15b3:1979
    # ports (rdma-core's rdma_topo lists both as "USP/DSP of a CX switch"; which level carries
    # which id is a guess); the Data Direct DMA function 15b3:2100 (class: guess)
    "cx8-ib": _look("15b3:1023", "15b3:0026", 0x020700, "64", 16, "mlx5_core", vf=_MLX_VF),  # sub: guess
    "cx8-switch": _look("15b3:197c", "15b3:0026", 0x060400, "64", 16, "pcieport"),  # sub: guess
    "cx8-switch-l2": _look("15b3:1979", "15b3:0026", 0x060400, "64", 16, "pcieport"),  # sub: guess
    "cx8-dd": _look("15b3:2100", "15b3:0026", 0x080100, "64", 16, "mlx5_core"),  # sub, class: guess
    "cx6-ib": _look("15b3:101b", "15b3:0007", 0x020700, "16", 16, "mlx5_core", vf=_MLX_VF),  # NVIDIA/nccl#1505
    "cx6-dx": _look("15b3:101d", "15b3:0016", 0x020000, "16", 16, "mlx5_core", vf=_MLX_VF),  # sub: guess
    "bf3": _look("15b3:a2dc", "15b3:0051", 0x020000, "32", 16, "mlx5_core", vf=_MLX_VF),  # sub: guess
    # Broadcom PEX switches. NCCL flattens c030 with subsystem 1000:0xxx over 1000:1xxx and
    # c010 with 1000:a0xx; an OEM subsystem vendor (Supermicro 15d9 here) is never flattened.
    "pex-gen5-top": _look("1000:c030", "1000:0144", 0x060400, "32", 16, "pcieport"),  # 0144: guess
    "pex-gen5-virt": _look("1000:c030", "1000:100b", 0x060400, "32", 16, "pcieport"),
    "pex-gen5-oem": _look("1000:c030", "15d9:1d25", 0x060400, "32", 16, "pcieport"),
    "pex-gen4": _look("1000:c010", "1000:a064", 0x060400, "16", 16, "pcieport"),  # a064: guess
    # CPU root complexes
    "intel-rp": _look("8086:352a", "0000:0000", 0x060400, "32", 16, "pcieport"),
    "intel-vtd": _look("8086:09a2", "8086:0000", 0x088000, "unknown", 0, None),  # RCiEP: no link
    "amd-rp": _look("1022:1483", "0000:0000", 0x060400, "16", 16, "pcieport"),
    "amd-rc": _look("1022:1480", "1022:1480", 0x060000, "unknown", 0, None, omit=LINK_FILES),
    "amd-iommu": _look("1022:1481", "1022:1481", 0x080600, "unknown", 0, None, omit=LINK_FILES),
    # Storage and the BMC. The ASPEED display sits behind the BMC's PCIe-to-PCI bridge and is
    # conventional PCI: the kernel shows no link files for it.
    "nvme": _look("144d:a80a", "144d:a812", 0x010802, "16", 4, "nvme"),
    "aspeed-bridge": _look("1a03:1150", "0000:0000", 0x060400, "5", 1, None),
    "bmc-vga": _look("1a03:2000", "1a03:2000", 0x030000, "unknown", 0, "ast", omit=LINK_FILES),
}


# --- BARs --------------------------------------------------------
# Real sizes per device id (facts and guesses listed in fixtures/README.md). Flags as the kernel
# prints them: 32-bit memory, 64-bit prefetchable memory, 64-bit non-prefetchable, I/O.
_M32, _P64, _N64, _IO = 0x40200, 0x14220C, 0x140204, 0x40101
MiB, _GiB = 1 << 20, 1 << 30
BARS: dict[str, tuple[tuple[int, int, int], ...]] = {
    "h100": ((0, 16 * MiB, _M32), (1, 128 * _GiB, _P64), (3, 32 * MiB, _P64)),
    "h200": ((0, 16 * MiB, _M32), (1, 128 * _GiB, _P64), (3, 32 * MiB, _P64)),
    "b200": ((0, 64 * MiB, _M32), (1, 256 * _GiB, _P64), (3, 32 * MiB, _P64)),
    "b300": ((0, 64 * MiB, _M32), (1, 256 * _GiB, _P64), (3, 32 * MiB, _P64)),  # guess: B200's
    "a100-pcie": ((0, 16 * MiB, _M32), (1, 64 * _GiB, _P64), (3, 32 * MiB, _P64)),  # guess
    "a100-sxm4": ((0, 16 * MiB, _M32), (1, 64 * _GiB, _P64), (3, 32 * MiB, _P64)),  # the 40 GB board's
    "l40s": ((0, 16 * MiB, _M32), (1, 64 * _GiB, _P64), (3, 32 * MiB, _P64)),  # guess
    "nvswitch-h100": ((0, 32 * MiB, _M32),),  # guess
    "nvswitch-a100": ((0, 32 * MiB, _M32),),  # guess
    "cx7-ib": ((0, 32 * MiB, _P64),),
    "cx7-eth": ((0, 32 * MiB, _P64),),
    "cx8-ib": ((0, 32 * MiB, _P64),),  # guess: ConnectX-7's
    "cx6-dx": ((0, 32 * MiB, _P64),),  # guess
    "cx6-ib": ((0, 32 * MiB, _P64),),  # guess
    "bf3": ((0, 32 * MiB, _P64),),  # guess
    "nvme": ((0, 16 * 1024, _N64),),
    "bmc-vga": ((0, 64 * MiB, _M32), (1, 256 * 1024, _M32), (2, 128, _IO)),  # guess
}
VF_BAR = (0, 1 * MiB, _P64)  # an mlx5 VF's BAR0 (guess); its PF shows VF BAR0 x numvfs on line 7
PRESETS = {k: replace(v, bars=BARS.get(k, ())) for k, v in PRESETS.items()}
# --- end BARs ------------------------------------------------------------------------------------
