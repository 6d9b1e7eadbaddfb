"""Typed errors. Every failure a user can cause is one of these, with a one-line reason.

The programs (CLI, gRPC server, shim) print ``str(err)`` and exit 2 / return a gRPC error; nothing else
escapes as a traceback.
"""

from __future__ import annotations


class PcitopoError(Exception):
    """Base class: a failure with a one-line, user-facing reason."""

    kind = "error"

    MAX_REASON = 1000

    def __init__(self, reason: str):
        # One bounded line, always: callers log it, print it, and send it as gRPC status details
        # (HTTP/2 metadata is capped at 16 KiB; a hostile alias must not crowd out the cause).
        text = " ".join(str(reason).split())
        if len(text) > self.MAX_REASON:
            # Keep both ends: the subject up front, the cause usually at the end.
            text = f"{text[:600]} ...[{len(text) - 900} characters cut]... {text[-300:]}"
        self.reason = text
        super().__init__(self.reason)

    def __str__(self) -> str:
        return self.reason


def quoted(value: object, limit: int = 80) -> str:
    """A user-supplied value (alias, attribute text) as it may appear inside a reason."""
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}...({len(text)} chars)"


class SysfsError(PcitopoError):
    """The sysfs tree or capture is unreadable or malformed."""

    kind = "sysfs"


class UnknownDeviceError(PcitopoError):
    """A BDF asked for is not on the host."""

    kind = "unknown-device"


class MalformedBdfError(PcitopoError, ValueError):
    """Text that is not a PCI address at all (a ValueError too: it is bad input, not a lookup miss)."""

    kind = "malformed-bdf"


class DomainError(PcitopoError):
    """The domain XML is malformed, hostile, or not something we can rewrite."""

    kind = "domain"


class PlanError(PcitopoError):
    """The devices cannot be placed (out of buses, slots, functions)."""

    kind = "plan"


class ConfigError(PcitopoError):
    """A hook option (VMI annotation, CLI flag) has a bad value."""

    kind = "config"


class FabricError(PcitopoError):
    """An NVLink fabric file (``fmpm -l`` output) or module map is unreadable, malformed, or
    names GPUs this host does not have."""

    kind = "fabric"


class NvlinkError(PcitopoError):
    """``pcitopo.kubevirt.io/nvlink: require`` and the VM's GPU set will not get NVLink."""

    kind = "nvlink"


class PairingError(PcitopoError):
    """``pcitopo.kubevirt.io/pairing: require`` and a GPU of the VM was given a NIC further than
    the best one the host has for it."""

    kind = "pairing"


class VmiError(ConfigError):
    """The VMI JSON handed to the hook is malformed (not JSON, or not shaped like a VMI)."""

    kind = "vmi"


class InternalError(PcitopoError):
    """An unexpected exception inside the hook's rewrite or its checks (a bug of ours), as a
    one-line error, so the operator's ``on-error``/``nvlink`` policy still decides and no program
    shows a traceback."""

    kind = "internal"

    @classmethod
    def of(cls, e: BaseException, where: str = "") -> InternalError:
        """Wrap an unexpected exception: ``[where: ]TypeName: message``."""
        return cls(f"{where + ': ' if where else ''}{type(e).__name__}: {e}")


class MmioError(PcitopoError):
    """The guest cannot map the assigned devices' BARs (even the host's width is too small)."""

    kind = "mmio"


class FirmwareWarning(PcitopoError):
    """A firmware limit the settings cannot repair: the VM boots, some BARs stay unassigned."""

    kind = "mmio-firmware"


# -- the doctor and its fleet outputs (moved here from src/pcitopo/checks/doctor.py and src/pcitopo/views/exports.py) --

class DoctorError(PcitopoError):
    """``doctor: require`` and a check failed: the VM must not start on this host as it is."""

    kind = "doctor"


class OutputError(PcitopoError):
    """An output file (``--prometheus-out``, ``--nfd-out``) cannot be written."""

    kind = "output"
