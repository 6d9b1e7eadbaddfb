"""What ``pcitopo doctor`` finds, as data: a :class:`Finding` per check and device, its
:class:`Fix`, and the :class:`DoctorReport` that holds them. The checks are
:mod:`pcitopo.checks.doctor`; the report for people is :mod:`pcitopo.views.doctor_report`, for
fleets :mod:`pcitopo.views.exports`.

A fix is kept in parts so that the same fix for many devices can be printed once: the shell
commands for one device (``run``, naming it by its address) can go in a loop over the devices,
the words around them cannot.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pcitopo.model.tree import PciFunction, Role

if TYPE_CHECKING:
    from pcitopo.checks.kubeletcpu import KubeletFacts

CHECKS = ("iommu", "vfio-driver", "iommu-group", "acs", "ats", "link", "numa", "bar")
STATUSES = ("ok", "warn", "fail", "unknown")


@dataclass(frozen=True, slots=True)
class Fix:
    """What to do about a finding, in the state it was found in.

    ``run``: shell commands for this one device (its BDF spelled out), or empty when the fix is
    not a command (a BIOS setting, a reboot, reseating a card); ``setup``: commands run once
    before them (``modprobe vfio-pci``); ``first``: what must hold or be done before, in words;
    ``after``: a note on the commands."""

    run: str = ""
    setup: str = ""
    first: str = ""
    after: str = ""

    def text(self, run: str | None = None) -> str:
        """The fix as one line; ``run`` replaces this device's commands (a loop over many)."""
        commands = "; ".join(c for c in (self.setup, self.run if run is None else run) if c)
        out = f"{self.first}: {commands}" if self.first and commands else (self.first or commands)
        return f"{out} ({self.after})" if self.after else out

    def loop_over(self, bdf: str) -> str:
        """This device's commands with its address as ``$d``: the body of a loop over devices."""
        return self.run.replace(bdf, "$d")


@dataclass(frozen=True, slots=True)
class Finding:
    """One check on one device (``bdf`` None for host-wide checks).

    ``kind`` says what was found in words that hold for every device it is found on (``bound
    to no driver, not vfio-pci``): the report prints one line per kind. ``above`` (bridges
    only) names the checked devices below the bridge. The first five fields are the JSON
    contract, in its order (a finding read back from ``--json`` is built from them)."""

    check: str
    status: str
    bdf: str | None
    message: str
    fix: str | None = None  # the fix as one line (``remedy.text()`` when the doctor made it)
    label: str | None = None  # GPU0, NIC3, downstream-port above GPU0, ...: for people and metrics only
    kind: str | None = None
    above: tuple[str, ...] = ()
    remedy: Fix | None = None  # the fix in parts (None on a finding read back from --json)

    def as_json(self) -> dict:
        """The fixed contract: exactly these five keys."""
        return {"check": self.check, "status": self.status, "bdf": self.bdf, "message": self.message, "fix": self.fix}


@dataclass(frozen=True, slots=True)
class Target:
    """A device the doctor checks, with how strict the driver check is."""

    function: PciFunction
    label: str
    role: Role
    must_be_vfio: bool


@dataclass(frozen=True)
class DoctorReport:
    host: str
    findings: tuple[Finding, ...]
    targets: tuple[Target, ...] = ()  # the devices checked (for the fleet outputs)
    # the node's kubelet CPU manager settings, when the doctor was asked to read them (on a node)
    kubelet: KubeletFacts | None = None

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for f in self.findings:
            counts[f.status] += 1
        return counts

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    def as_json(self) -> dict:
        doc = {"checks": [f.as_json() for f in self.findings], "summary": self.summary()}
        if self.kubelet is not None:
            doc["kubelet"] = self.kubelet.as_json()
        return doc


__all__ = ["CHECKS", "STATUSES", "DoctorReport", "Finding", "Fix", "Target"]
