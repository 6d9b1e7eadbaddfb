"""What the doctor wrote, for the checks the node hook cannot make itself.

The node hook runs with every capability dropped. The kernel then cuts a device's ``config``
file to its first 64 bytes (``pci_read_config``, drivers/pci/pci-sysfs.c), so the checks that
read extended capabilities (``acs``: ACS control of each bridge, ``ats``: ATS of each NIC) come
out ``unknown``. The doctor, in the same DaemonSet with what it needs to read them, writes its
``--json`` report to a file (``pcitopo doctor --json-out FILE``, format
``{"checks": [{"check", "status", "bdf", "message", "fix"}], "summary": {...}}``); the node
hook takes those two checks from there, and keeps them ``unknown`` (saying why) when the file is
missing, malformed or stale: older than ``MAX_AGE_S`` or than the node's boot (ACS set with
``setpci`` does not survive a reboot).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
from collections.abc import Collection, Mapping

from pcitopo.checks.doctor import STATUSES, DoctorReport, Finding
from pcitopo.errors import ConfigError
from pcitopo.host.files import read_bounded

DEFAULT_DOCTOR_REPORT = "/var/run/pcitopo/doctor.json"
CONFIG_CHECKS = ("acs", "ats")
MAX_AGE_S = 1800  # three rounds of the DaemonSet's doctor (every 600 s)
MAX_BYTES = 16 * 1024 * 1024
_ADDRESS = re.compile(r"\b[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\b")


def boot_time() -> float | None:
    """The node's boot, seconds since the epoch (``btime`` in /proc/stat)."""
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _parse(data: bytes) -> dict[tuple[str, str], Finding] | None:
    """The config-space findings of a doctor --json report, or None if it is not one."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    checks = doc.get("checks") if isinstance(doc, dict) else None
    if not isinstance(checks, list):
        return None
    out: dict[tuple[str, str], Finding] = {}
    for c in checks:
        if not isinstance(c, dict) or c.get("check") not in CONFIG_CHECKS:
            continue
        bdf, status, message, fix = c.get("bdf"), c.get("status"), c.get("message"), c.get("fix")
        if not isinstance(bdf, str) or status not in STATUSES or not isinstance(message, str) or not isinstance(fix, (str, type(None))):
            return None
        out[(c["check"], bdf)] = Finding(c["check"], status, bdf, message, fix)
    return out


class DoctorFile:
    """The doctor's report at ``path``, read again only when the file changes (one entry)."""

    def __init__(self, path: str, max_age: float = MAX_AGE_S):
        self.path = path
        self.max_age = max_age
        self._lock = threading.Lock()
        self._seen: tuple | None = None
        self._parsed: dict[tuple[str, str], Finding] | None = None

    def findings(self) -> tuple[Mapping[tuple[str, str], Finding], str | None]:
        """(acs/ats findings by (check, bdf), None) or ({}, why the file cannot be used)."""
        try:
            st = os.stat(self.path)
        except OSError as e:
            return {}, f"the doctor's report {self.path} is {'missing' if isinstance(e, FileNotFoundError) else 'unreadable'}"
        age = time.time() - st.st_mtime
        boot = boot_time()
        if age > self.max_age or (boot is not None and st.st_mtime < boot):
            why = "older than the node's boot" if boot is not None and st.st_mtime < boot else f"{int(age)} s old"
            return {}, f"the doctor's report {self.path} is stale ({why})"
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            if key != self._seen:
                try:
                    data = read_bounded(self.path, MAX_BYTES, "the doctor's report")
                except ConfigError as e:  # not remembered: a file made readable keeps its mtime
                    return {}, e.reason
                self._seen, self._parsed = key, _parse(data)
            parsed = self._parsed
        if parsed is None:
            return {}, f"the doctor's report {self.path} is not `pcitopo doctor --json` output"
        return parsed, None


def with_doctor_file(report: DoctorReport, doctor: DoctorFile | None) -> tuple[DoctorReport, str | None]:
    """``report`` with its unknown acs/ats findings taken from the doctor's file where it has
    them (the rest say why they stay unknown), and what came of the file (None: not needed)."""
    unknown = [f for f in report.findings if f.status == "unknown" and f.check in CONFIG_CHECKS and f.bdf]
    if not unknown:
        return report, None
    found, why = doctor.findings() if doctor is not None else ({}, "no --doctor-report")
    out, used = [], 0
    for f in report.findings:
        d = found.get((f.check, f.bdf)) if f in unknown else None
        if d is not None:
            used += 1
            f = dataclasses.replace(f, status=d.status, message=f"{d.message} (the doctor's report)", fix=d.fix)
        elif f in unknown:
            f = dataclasses.replace(f, message=f"{f.message}; {why or 'the doctor did not check it'}")
        out.append(f)
    note = why or f"{used} of {len(unknown)} unknown acs/ats findings from {doctor.path}"
    return dataclasses.replace(report, findings=tuple(out)), note


def owner_text(f: Finding, mine: Collection[str] = frozenset()) -> str:
    """The finding in one line for the VM's owner (a refusal reaches the VM's events): the check
    first, then where and what, with any address not in ``mine`` (the VM's devices and the
    bridges above them) shown as "another device": an IOMMU group's other member may be another
    VM's. Both hooks refuse with it (the node hook, the domain hook)."""
    where = f"{f.label} {f.bdf}" if f.label and f.bdf else (f.bdf or "the host")
    text = f"{f.check} {where}: {f.message}" + (f"; fix: {f.fix}" if f.fix else "")
    return _ADDRESS.sub(lambda m: m.group(0) if m.group(0) in mine else "another device", text)
