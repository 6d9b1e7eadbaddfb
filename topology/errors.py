"""Typed errors. Every failure a user can cause is one of these, with a one-line reason.

Doors (CLI, gRPC, shim) print ``str(err)`` and exit 2 / return a gRPC error; nothing else
escapes as a traceback.
"""

from __future__ import annotations


class PcitopoError(Exception):
    """Base class: a failure with a one-line, user-facing reason."""

    kind = "error"

    def __init__(self, reason: str):
        # One line, always: callers log and print it verbatim.
        self.reason = " ".join(str(reason).split())
        super().__init__(self.reason)

    def __str__(self) -> str:
        return self.reason


class SysfsError(PcitopoError):
    """The sysfs tree or capture is unreadable or malformed."""

    kind = "sysfs"


class UnknownDeviceError(PcitopoError):
    """A BDF asked for is not on the host."""

    kind = "unknown-device"


class DomainError(PcitopoError):
    """The domain XML is malformed, hostile, or not something we can rewrite."""

    kind = "domain"


class PlanError(PcitopoError):
    """The devices cannot be placed (out of buses, slots, functions)."""

    kind = "plan"


class ConfigError(PcitopoError):
    """A hook option (VMI annotation, CLI flag) has a bad value."""

    kind = "config"
