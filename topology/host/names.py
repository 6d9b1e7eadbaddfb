"""Human names for PCI functions: udev's hardware database on a live host (through pyudev),
a small built-in table of the parts this product cares about everywhere else."""

from __future__ import annotations

from functools import lru_cache

from ..model.tree import PciFunction

# The parts the fixtures and QEMU's emulated ports use, named after the PCI ID Repository
# (pci.ids, https://pci-ids.ucw.cz) and, for the ConnectX-8 parts, rdma-core's rdma_topo device
# table; enough for readable fixture output without pci.ids.
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
    "15b3:1021": "Mellanox ConnectX-7",
    "15b3:101d": "Mellanox ConnectX-6 Dx",
    "15b3:101e": "Mellanox ConnectX Family Virtual Function",
    "15b3:1023": "Mellanox ConnectX-8",
    "15b3:1979": "Mellanox ConnectX-7/ConnectX-8 PCIe switch port",
    "15b3:197c": "Mellanox ConnectX-8 PCIe switch port",
    "15b3:2100": "Mellanox ConnectX-8 Data Direct",
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
    if live_root is not None:
        name = udev_name(f"{live_root.rstrip('/')}/devices/{'/'.join(f.path)}")
        if name:
            return name
    return KNOWN_PARTS.get(f.ids)
