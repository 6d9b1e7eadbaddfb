"""KubeVirt's releases as the domain they build differs: which group of tags a version belongs
to, and what each group does differently (the re-parse's struct fields between hook calls,
the EFI loader, how ``allocateHotplugPorts`` makes hotplug room).

The groups (the release table's ``REPARSE``, src/pcitopo/kubevirt/releases.py; ``api.DomainSpec`` in
``pkg/virt-launcher/virtwrap/api/schema.go`` per tag; docs/SOURCES.md, "KubeVirt's re-parse, per release"):

============  ====================  ===================  ===========  =========================
release       ``Controller.Target``  ``busNr``, ``node``  ``hotplug``  ``<qemu:commandline>``
============  ====================  ===================  ===========  =========================
v1.6, v1.7    absent                 dropped              dropped      dropped
v1.8, v1.9    present                kept                 dropped      dropped
main          present                kept                 kept         restored
============  ====================  ===================  ===========  =========================

:func:`release_of` reads a version as a user or a cluster writes it (``v1.9.0``,
``status.observedKubeVirtVersion``); a release pcitopo did not read is ``unknown``.
"""

from __future__ import annotations

from enum import Enum

from pcitopo.kubevirt import releases as table
from pcitopo.kubevirt.targets import parse_version

# Where virt-launcher's image keeps OVMF (pkg/virt-config/virt-config.go DefaultARCHOVMFPath).
OVMF_DIR = "/usr/share/edk2/ovmf"
DEFAULT_VERSION = table.DEFAULT_VERSION  # the newest tag, what `pcitopo domain` assumes without --kubevirt or --cluster


class Release(Enum):
    """A group of KubeVirt releases whose ``api.DomainSpec`` reads the hook's XML alike; its
    traits are the release table's (src/pcitopo/kubevirt/releases.py ``REPARSE``)."""

    V1_7 = "v1.7"  # v1.6.0 .. v1.7.4
    V1_9 = "v1.8-1.9"  # v1.8.0 .. v1.9.0 (modelled on v1.9.0)
    MAIN = "main"

    @property
    def _traits(self) -> table.Reparse:
        return next(g for g in table.REPARSE if g.name == self.value)

    @property
    def controller_target(self) -> bool:
        return self._traits.controller_target

    @property
    def target_hotplug(self) -> bool:
        return self._traits.target_hotplug

    @property
    def commandline_restored(self) -> bool:
        return self._traits.commandline_restored

    @property
    def empty_address_type(self) -> bool:
        """``type=""`` on an address read without ``type`` (no ``omitempty``)."""
        return self._traits.empty_address_type

    @property
    def hostdev_driver(self) -> bool:
        return self._traits.hostdev_driver

    @property
    def os_firmware(self) -> bool:
        return self._traits.os_firmware

    @property
    def model_tag(self) -> str:
        """The tag the group is modelled on."""
        return self._traits.model_tag

    @property
    def ovmf_code(self) -> str:
        """The EFI loader of the group's model tag (:func:`ovmf_code`)."""
        return ovmf_code(self.model_tag)

    @property
    def hotplug_ports(self) -> str:
        """How ``allocateHotplugPorts`` (``virtwrap/manager.go``) makes hotplug room:
        ``"placeholders"`` (v1.6, v1.7: max(16 − PCI devices, 6) placeholder interfaces, defined
        once and read back), ``"append"`` (v1.8, v1.9: max(0, 4 − interfaces) placeholders, read
        back only when there are any, then root ports appended up to index 31), ``"readback"``
        (main: always read back, append, ``hotplug='off'`` on occupied root ports)."""
        return self._traits.hotplug_ports


RELEASES = tuple(Release)


def release_of(version: str) -> Release:
    """The group of ``version``, a read release (src/pcitopo/kubevirt/releases.py :func:`resolve`: ``v1.6.0``
    .. ``v1.9.0``, ``v`` optional, a line alone its newest patch; ``main``; a build of the main
    commit read). A version not read raises :class:`~pcitopo.kubevirt.releases.ReleaseUnknown`
    (``unknown``, exit 4); a string that is no version at all is one line (:class:`ConfigError`)."""
    return Release(table.resolve(table.check_kubevirt(str(version))).reparse)


def ovmf_code(version: str) -> str:
    """The EFI loader with secure boot off, per tag: ``efi/efi.go`` ``DetectEFIEnvironment``
    prefers ``OVMF_CODE.secboot.fd`` (with the plain vars) over ``OVMF_CODE.fd`` from v1.9.0 on;
    v1.6.0 to v1.8.4 take ``OVMF_CODE.fd`` (the secure-boot code only where it is missing)."""
    release_of(version)  # one line for an unknown version
    v = parse_version(str(version).strip())
    name = "OVMF_CODE.fd" if v is not None and v < (1, 9, 0) else "OVMF_CODE.secboot.fd"
    return f"{OVMF_DIR}/{name}"


def version_text(version: str) -> str:
    """``version`` as the output names it: ``v1.9.0``, ``v1.8`` (its newest patch) or ``main``."""
    text = str(version).strip()
    return text if text.startswith(("main", "v")) else f"v{text}"
