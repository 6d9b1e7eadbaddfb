"""Human names for PCI functions: udev's hardware database on a live host (through pyudev),
a small built-in table of the parts this product cares about everywhere else."""

from __future__ import annotations

from functools import lru_cache

from pcitopo.model.nvswitch_mgmt import management_reason
from pcitopo.model.tree import PciFunction, Topology

# The parts the fixtures and QEMU's emulated ports use, and the NVIDIA (Mellanox) NICs and DPUs a
# GPU node carries, named after the PCI ID Repository (pci.ids, https://pci-ids.ucw.cz; a test
# checks the 15b3 entries against Debian's copy) and, for the ConnectX-8 parts pci.ids lacks or
# names by family, rdma-core's rdma_topo device table; enough for readable output without pci.ids.
# The functions that manage NVLink switch chips (B200 boards; any host whose VPD says SW_MNG) carry
# the ConnectX-7 id: their name comes from their role (:func:`device_name`), not from this table.
KNOWN_PARTS: dict[str, str] = {
    "10de:2330": "NVIDIA H100 SXM5 80GB",
    "10de:2335": "NVIDIA H200 SXM 141GB",
    "10de:2324": "NVIDIA H800",
    "10de:2901": "NVIDIA B200",
    "10de:3182": "NVIDIA B300",
    "10de:22a3": "NVIDIA H100 NVSwitch",
    "10de:20b0": "NVIDIA A100 SXM4 40GB",
    "10de:20b2": "NVIDIA A100 SXM4 80GB",
    "10de:20f1": "NVIDIA A100 PCIe 40GB",
    "10de:26b9": "NVIDIA L40S",
    "15b3:1017": "Mellanox ConnectX-5",
    "15b3:1018": "Mellanox ConnectX-5 Virtual Function",
    "15b3:1019": "Mellanox ConnectX-5 Ex",
    "15b3:101a": "Mellanox ConnectX-5 Ex Virtual Function",
    "15b3:101b": "Mellanox ConnectX-6",
    "15b3:101c": "Mellanox ConnectX-6 Virtual Function",
    "15b3:101d": "Mellanox ConnectX-6 Dx",
    "15b3:101e": "Mellanox ConnectX Family mlx5Gen Virtual Function",
    "15b3:101f": "Mellanox ConnectX-6 Lx",
    "15b3:1021": "Mellanox ConnectX-7",
    "15b3:1023": "Mellanox ConnectX-8",
    "15b3:1979": "Mellanox ConnectX-7/ConnectX-8 PCIe switch port",
    "15b3:197c": "Mellanox ConnectX-8 PCIe switch port",
    "15b3:2100": "Mellanox ConnectX-8 Data Direct",
    "15b3:a2d6": "Mellanox BlueField-2",
    "15b3:a2dc": "Mellanox BlueField-3",
    "1000:c030": "Broadcom PEX890xx Gen5 switch",
    "1000:c010": "Broadcom PEX880xx Gen4 switch",
    "104c:8232": "QEMU/TI XIO3130 upstream port",
    "104c:8233": "QEMU/TI XIO3130 downstream port",
    "1b36:000c": "QEMU PCIe root port",
    "1a03:2000": "ASPEED graphics (BMC)",
    "144d:a80a": "Samsung NVMe SSD",
}


@lru_cache(maxsize=1)
def _udev_context():
    try:
        import pyudev  # imported lazily: the sidecar never needs it

        return pyudev.Context()
    except Exception:  # libudev missing in a minimal container: names are a nicety
        return None


def udev_name(sys_path: str) -> str | None:
    """'Vendor Model' from udev's hwdb for a live device, if udev can tell."""
    ctx = _udev_context()
    if ctx is None:
        return None
    try:
        import pyudev

        dev = pyudev.Devices.from_sys_path(ctx, sys_path)
        vendor = dev.properties.get("ID_VENDOR_FROM_DATABASE")
        model = dev.properties.get("ID_MODEL_FROM_DATABASE")
    except Exception:
        return None
    if vendor and model:
        return f"{vendor} {model}"
    return model or vendor


def part_name(f: PciFunction, live_root: str | None = None) -> str | None:
    """The part's name: udev's on a live host, else the one in :data:`KNOWN_PARTS`, else None."""
    if live_root is not None:
        name = udev_name(f"{live_root.rstrip('/')}/devices/{'/'.join(f.path)}")
        if name:
            return name
    return KNOWN_PARTS.get(f.ids)


SWITCH_MANAGEMENT = "NVLink switch management, not a compute NIC"


def device_name(topo: Topology, f: PciFunction, live_root: str | None = None) -> str:
    """What the legend calls a function: its part name (else its ids), and for a ConnectX-7
    function that manages NVLink switch chips, that role, since its ids alone say ConnectX-7
    (src/pcitopo/model/nvswitch_mgmt.py; ``--tree`` adds why)."""
    name = part_name(f, live_root) or f.ids
    return f"{name} ({SWITCH_MANAGEMENT})" if management_reason(topo, f) else name
