"""KubeVirt's releases as the domain they build differs: which group of tags a version belongs
to, and what each group does differently (the re-parse's struct fields between hook calls,
the EFI loader, how ``allocateHotplugPorts`` makes hotplug room).

The groups (``api.DomainSpec`` in ``pkg/virt-launcher/virtwrap/api/schema.go`` per tag;
docs/SOURCES.md, "KubeVirt's re-parse, per release"):

============  ====================  ===================  ===========  =========================
release       ``Controller.Target``  ``busNr``, ``node``  ``hotplug``  ``<qemu:commandline>``
============  ====================  ===================  ===========  =========================
v1.6, v1.7    absent                 dropped              dropped      dropped
v1.8, v1.9    present                kept                 dropped      dropped
main          present                kept                 kept         restored
============  ====================  ===================  ===========  =========================

:func:`release_of` reads a version as a user or a cluster writes it (``v1.9.0``,
``status.observedKubeVirtVersion``); anything else is one line naming it.
"""

from __future__ import annotations

import re
from enum import Enum

from pcitopo.topology.errors import ConfigError

from ..targets import parse_version

# Where virt-launcher's image keeps OVMF (pkg/virt-config/virt-config.go DefaultARCHOVMFPath).
OVMF_DIR = "/usr/share/edk2/ovmf"
# The tags each group was read at (kubevirt/kubevirt): every patch release of the line.
PATCHES = {"v1.6": 6, "v1.7": 4, "v1.8": 4, "v1.9": 0}
DEFAULT_VERSION = "v1.9.0"  # the newest tag, what `pcitopo domain` assumes without --kubevirt or --cluster


class Release(Enum):
    """A group of KubeVirt releases whose ``api.DomainSpec`` reads the hook's XML alike."""

    V1_7 = "v1.7"  # v1.6.0 .. v1.7.4
    V1_9 = "v1.8-1.9"  # v1.8.0 .. v1.9.0 (modelled on v1.9.0)
    MAIN = "main"

    @property
    def controller_target(self) -> bool:
        return self is not Release.V1_7

    @property
    def target_hotplug(self) -> bool:
        return self is Release.MAIN

    @property
    def commandline_restored(self) -> bool:
        return self is Release.MAIN

    @property
    def empty_address_type(self) -> bool:
        """``type=""`` on an address read without ``type`` (no ``omitempty``)."""
        return self is Release.V1_7

    @property
    def hostdev_driver(self) -> bool:
        return self is not Release.V1_7

    @property
    def os_firmware(self) -> bool:
        return self is not Release.V1_7

    @property
    def model_tag(self) -> str:
        """The tag the group is modelled on."""
        return {Release.V1_7: "v1.7.4", Release.V1_9: "v1.9.0", Release.MAIN: "main"}[self]

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
        return {Release.V1_7: "placeholders", Release.V1_9: "append", Release.MAIN: "readback"}[self]


RELEASES = tuple(Release)


def release_of(version: str) -> Release:
    """The group of ``version``: ``v1.6.0`` .. ``v1.9.0`` (``v`` optional, a line alone means its
    newest patch) or ``main``; a KubeVirt build suffix (``v1.9.0-rc.1``, ``v1.8.2+abc``) counts as
    its tag, and v1.10 on (what a build of main reports) is main. Any other version:
    :class:`ConfigError` naming it."""
    text = str(version).strip()
    if text == "main":
        return Release.MAIN
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?", text)
    line = f"v{m[1]}.{m[2]}" if m else None
    if m and int(m[1]) == 1 and int(m[2]) >= 10:  # a build of main reports the next line: v1.10.0-alpha.0
        return Release.MAIN
    if line not in PATCHES or (m[3] is not None and int(m[3]) > PATCHES[line]):
        known = ", ".join(f"{k}.0-{k}.{n}" if n else f"{k}.0" for k, n in PATCHES.items())
        raise ConfigError(f"--kubevirt {text}: unknown KubeVirt release (known: {known}, main)")
    return Release.V1_7 if line in ("v1.6", "v1.7") else Release.V1_9


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
    return text if text == "main" or text.startswith("v") else f"v{text}"
