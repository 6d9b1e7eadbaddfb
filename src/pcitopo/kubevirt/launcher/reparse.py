"""KubeVirt's re-parse between hook calls, per release: what the next ``OnDefineDomain`` call (and
the next define) gets of a hook's output (``pcitopo domain --call N``).

virt-launcher reads a hook's output back into its Go struct ``api.DomainSpec``
(``pkg/virt-launcher/virtwrap/api/schema.go``) and marshals that struct again for the next
``OnDefineDomain`` call; only the last call's raw string is defined. What survives is what the
struct has a field for, and the struct differs per release: the table in releases.py
(:class:`Release`'s fields; docs/SOURCES.md, "KubeVirt's re-parse, per release").

Every release drops controller ``<model name>``, target ``chassis``/``port``, address
``multifunction``, ``<cpu><maxphysaddr>``, ``<qemu:override>``, hostdev ``<rom>``, and the
root's ``xmlns:qemu`` (Go's ``encoding/xml`` does not match the prefixed names
``xmlns:qemu``/``qemu:commandline`` of the struct tags when it reads; main re-extracts the
command line and its namespace after the re-parse). Every release keeps ``<cpu><feature>``, NUMA
cells, ``<os>`` loader and nvram, hostdev ``mode``, and aliases (``ua-`` ones included).
Field by field where releases differ:

- ``Address.Type`` and ``Address.Bus`` have no ``omitempty`` up to v1.7: an address read without
  ``type`` (libvirt writes hostdev source addresses that way) comes back as ``type=""``.
- A ``<target>`` whose attributes are all dropped comes back as an empty ``<target>`` from v1.8
  on (the pointer is set), and vanishes in v1.7 (no field at all).
- ``HostDevice.Driver`` exists from v1.9 with only ``iommufd``: libvirt's ``<driver name='vfio'/>``
  comes back empty. v1.8 has no field (dropped, as v1.7); the v1.8–1.9 group is modelled on
  v1.9.0's struct, and the hook reads no hostdev ``<driver>``.
- ``OS.Firmware`` (``<os firmware='efi'>``, written by v1.9's firmware auto-selection) exists
  from v1.9; v1.7 and v1.8 never write it and drop it.
"""

from __future__ import annotations

from pcitopo.kubevirt.launcher.release_groups import Release
from pcitopo.libvirt.marshal import Element, parse_plain
from pcitopo.libvirt.reread import (
    drop_maxphysaddr_and_overrides,
    drop_os_firmware,
    fold_sysinfo,
    reread_addresses,
    reread_commandlines,
    reread_controllers,
    reread_hostdevs,
    with_qemu_namespace,
)


def reparse(xml: bytes, release: Release, decimal_bus: bool = False) -> Element:
    """``xml`` after ``release``'s ``xml.Unmarshal`` into ``api.DomainSpec`` and back."""
    root = parse_plain(xml)
    target = (("busNr", "hotplug") if release.target_hotplug else ("busNr",)) if release.controller_target else None
    reread_controllers(root, target)
    reread_addresses(root, release.empty_address_type, decimal_bus)
    reread_hostdevs(root, ("iommufd",) if release.hostdev_driver else None)
    drop_maxphysaddr_and_overrides(root)
    commandline = reread_commandlines(root, release.commandline_restored)
    if not release.os_firmware:
        drop_os_firmware(root)
    fold_sysinfo(root)
    return with_qemu_namespace(root, keep=commandline)
