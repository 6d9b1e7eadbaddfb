"""ConnectX-7 functions that manage NVLink switch chips (HGX/DGX B200), never compute NICs.

On B200 boards the NVLink switch chips are not PCI devices; the host reaches them through
ConnectX-7 functions (``15b3:1021``) whose VPD carries ``SW_MNG``. Such a function looks like any
other ConnectX-7 NIC by its ids and class, so two signals tell it apart:

1. **VPD** (authoritative): the function's ``vpd`` file (PCI Vital Product Data, readable by
   root only) holds ``SW_MNG`` (``lspci -vv`` shows ``SMDL=SW_MNG`` in a vendor-specific field)
   in its identifier string or in any keyword of its read-only or read-write section.
2. **No RDMA use** (where the VPD cannot be read, e.g. unprivileged): on a host with B200 GPUs,
   the function is bound to a host driver other than ``vfio-pci`` and has registered neither an
   RDMA device (no ``infiniband/`` child in its sysfs directory) nor a network interface (no
   ``net/`` child). A compute NIC is either handed to VMs (``vfio-pci``) or used by the host for
   RDMA (``infiniband/``) or networking (``net/``); a function the host driver owns without any
   of these serves nothing a workload could use. This signal is weaker: where Fabric Manager's
   NVLink subnet manager runs on the host it talks to the switches through these functions'
   InfiniBand devices, so they do have ``infiniband/`` and only the VPD tells them apart. Run
   the operator tools (``pcitopo topo``, ``pcitopo partitions``, ``pcitopo capture``) as root on
   B200 hosts; the rewrite in the sidecar never needs this distinction.

VPDs are read only for ``15b3:1021`` functions: reading VPD goes to the hardware and is slow
on some devices.
"""

from __future__ import annotations

from dataclasses import dataclass

from pcitopo.model.keep import PerModel
from pcitopo.model.tree import PciFunction, Role, Topology

CANDIDATE_IDS = frozenset({"15b3:1021"})
SW_MNG = b"SW_MNG"
# GPUs of boards whose NVLink switch chips are managed through ConnectX-7 functions.
SWITCH_OFF_PCI_GPUS = frozenset({"10de:2901"})  # B200


@dataclass(frozen=True, slots=True)
class VpdField:
    section: str  # "ID", "RO" or "RW"
    keyword: str  # "" for the identifier string
    value: bytes


def parse_vpd(data: bytes) -> list[VpdField] | None:
    """The fields of a PCI VPD image (PCI Local Bus spec, VPD resource format): a large
    resource 0x82 (identifier string), 0x90 (read-only keywords) and 0x91 (read-write keywords),
    ending at small resource 0x78. Returns None when the image is malformed."""
    out: list[VpdField] = []
    i, n = 0, len(data)
    while i < n:
        tag = data[i]
        if tag == 0x78 or tag in (0x00, 0xFF):  # end tag; unprogrammed bytes
            return out
        if not tag & 0x80:  # other small resources: skip
            i += 1 + (tag & 0x07)
            continue
        if i + 3 > n:
            return None
        size = data[i + 1] | data[i + 2] << 8
        body = data[i + 3:i + 3 + size]
        if len(body) != size:
            return None
        if tag == 0x82:
            out.append(VpdField("ID", "", body))
        elif tag in (0x90, 0x91):
            section = "RO" if tag == 0x90 else "RW"
            j = 0
            while j + 3 <= len(body):
                key, ln = body[j:j + 2], body[j + 2]
                out.append(VpdField(section, key.decode("latin-1"), body[j + 3:j + 3 + ln]))
                j += 3 + ln
        i += 3 + size
    return out


def vpd_says_switch_management(data: bytes) -> bool:
    fields = parse_vpd(data)
    if fields is None:  # malformed: fall back to the raw bytes
        return SW_MNG in data
    return any(SW_MNG in f.value for f in fields)


# Whether a host's GPUs are ones whose NVLink switches sit off PCI: one answer per host model.
_OFFPCI_SWITCHES: PerModel[bool] = PerModel(
    lambda topo: any(f.ids in SWITCH_OFF_PCI_GPUS and topo.role(f) == Role.GPU for f in topo.functions()))


def _host_has_offpci_switches(topo: Topology) -> bool:
    return _OFFPCI_SWITCHES(topo)


def management_reason(topo: Topology, f: PciFunction) -> str | None:
    """Why ``f`` is an NVLink-switch management function, or None if it is not one."""
    if f.ids not in CANDIDATE_IDS or f.physfn is not None:
        return None
    vpd = topo.extra("vpd", f.bdf)
    if isinstance(vpd, bytes) and vpd:
        return "VPD carries SW_MNG" if vpd_says_switch_management(vpd) else None
    dirs = topo.extra("class_dirs", f.bdf)
    if dirs is None or f.driver in (None, "vfio-pci") or dirs:
        return None
    if not _host_has_offpci_switches(topo):
        return None
    return f"bound to {f.driver} with no RDMA (infiniband/) or network (net/) device, on a B200 host"


def is_compute_nic(topo: Topology, f: PciFunction) -> bool:
    return topo.role(f) == Role.NIC and management_reason(topo, f) is None
