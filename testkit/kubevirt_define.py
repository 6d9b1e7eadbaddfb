"""Around the defines of one boot (the product's model, :mod:`pcitopo.kubevirt.launcher.defines`),
what only tests and the benchmark use: :func:`free_hotplug_ports` (what the VM is left with:
empty pcie-root-ports on pcie-root that are not ``hotplug='off'``) and :class:`RealLibvirt`
(the real ``virsh define`` where libvirt is installed)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

from lxml import etree

from pcitopo.libvirt.domain import ROOT_PORT, parse_int


def free_hotplug_ports(xml: bytes) -> int:
    """Empty pcie-root-ports on pcie-root that accept hotplug: what a disk or NIC hotplug takes."""
    root = etree.fromstring(xml)
    devices = root.find("devices")
    used = {parse_int(a.get("bus"), "bus") for a in devices.iter("address")
            if a.get("type") == "pci" and a.getparent().tag != "source"}
    free = 0
    for c in devices.findall("controller"):
        if c.get("type") != "pci" or c.get("model") != ROOT_PORT:
            continue
        a, t = c.find("address"), c.find("target")
        on_root = a is None or parse_int(a.get("bus"), "bus") == 0
        off = t is not None and t.get("hotplug") == "off"
        if on_root and not off and parse_int(c.get("index"), "index") not in used:
            free += 1
    return free


def real_libvirt_available() -> bool:
    return shutil.which("virsh") is not None and shutil.which("libvirtd") is not None


class RealLibvirt:
    """``virsh define`` + ``dumpxml --inactive`` (+ ``undefine``) on a private daemon
    (``testkit/e2e/libvirtd.py`` ``PrivateLibvirtd``). libvirt 9.0 refuses more than 255 vCPUs
    without an IOMMU in extended interrupt mode; libvirt 10 and later add that IOMMU at define
    (``qemuDomainDefAddDefaultDevices``), so for 9.0 it is added here, as they would."""

    def __init__(self, daemon):
        self.daemon = daemon
        self.dir = Path(tempfile.mkdtemp(prefix="pcitopo-define-"))

    def __call__(self, xml: bytes) -> bytes:
        root = etree.fromstring(xml)
        name = f"d-{uuid.uuid4().hex[:12]}"
        root.find("name").text = name
        if int(root.findtext("vcpu") or 1) > 255:
            if root.find("devices/iommu") is None:
                iommu = etree.SubElement(root.find("devices"), "iommu", model="intel")
                etree.SubElement(iommu, "driver", intremap="on", eim="on")
            feats = root.find("features")
            if feats is None:
                feats = etree.SubElement(root, "features")
            if feats.find("ioapic") is None:
                etree.SubElement(feats, "ioapic", driver="qemu")
        path = self.dir / f"{name}.xml"
        path.write_bytes(etree.tostring(root))
        self.daemon.virsh("define", str(path))
        try:
            out = self.daemon.virsh("dumpxml", "--inactive", name).stdout.encode()
        finally:
            self.daemon.virsh("undefine", "--nvram", name, check=False)
        back = etree.fromstring(out)
        back.find("name").text = etree.fromstring(xml).findtext("name")
        return etree.tostring(back)

