"""Boot a domain :func:`.bootable.make_bootable` made bootable with a private libvirtd under
TCG, and read the guest's PCI tree back.
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lxml import etree

from .bootable import KERNEL_CMDLINE, BootError, _parser, firmware_log_path, make_bootable
from .guesttree import (
    GuestAddr,
    GuestPrintout,
    StandIn,
    _int,
    guest_sysfs_tree,
    map_guest_bdfs,
    parse_printout,
)
from .initramfs import END_MARKER, build_initramfs
from .libvirtd import PrivateLibvirtd
from .paths import cache_dir, find_kernel


class QemuAborted(BootError):
    """QEMU itself failed an internal assertion and aborted (not the guest, not the domain)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# The stack's QEMU, with its TCG on one thread for all vCPUs: QEMU 10.0's multi-threaded TCG
# races one vCPU's MMIO access against another's change of the memory map while the firmware
# programs BARs. Seen here, in CI and on a fresh clone: "iotlb_to_section: Assertion
# `section_index < d->map.sections_nb' failed" (QEMU aborts), and guests that never reach /init
# with an empty serial log; a multi-cell golden domain (4 vCPUs) hit both on its first boot.
# One TCG thread cannot race with itself. This is how the tier emulates, not what it proves:
# KubeVirt's VMs run under KVM. libvirt has no setting for TCG's threading and passes
# ``-accel tcg``; the wrapper adds ``thread=single`` and execs the QEMU of the root it runs in.
TCG_WRAPPER_NAME = "qemu-system-x86_64-tcg-single"
TCG_WRAPPER = """#!/bin/sh
# pcitopo e2e (testkit/e2e/guestboot.py, tcg_single_emulator): the stack's QEMU with its TCG on
# one thread; PCITOPO_QEMU names another binary (the wrapper's own test).
n=$#
prev=
while [ "$n" -gt 0 ]; do
    a=$1
    shift
    n=$((n - 1))
    if [ "$prev" = "-accel" ]; then
        case $a in
            tcg) a=tcg,thread=single ;;
            tcg,*thread=*) ;;
            tcg,*) a="$a,thread=single" ;;
        esac
    fi
    set -- "$@" "$a"
    prev=$a
done
exec "${PCITOPO_QEMU:-/usr/bin/qemu-system-x86_64}" "$@"
"""


def tcg_single_emulator() -> Path:
    """The wrapper (``TCG_WRAPPER``) in the e2e cache, which the private libvirtd sees at the
    same path; written when missing or different."""
    path = cache_dir() / TCG_WRAPPER_NAME
    if not path.exists() or path.read_text() != TCG_WRAPPER:
        tmp = path.with_name(path.name + f".{os.getpid()}")
        tmp.write_text(TCG_WRAPPER)
        tmp.chmod(0o755)
        os.replace(tmp, path)
    return path


class GuestSilent(BootError):
    """The guest wrote nothing to its serial console while QEMU spun for ``silent_after`` CPU
    seconds (or ``SILENT_WALL_FACTOR`` times that of wall time): it never reached /init."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


# QEMU 10.0's multi-threaded TCG can abort on a race between one vCPU's MMIO access and another's
# change of the memory map while the firmware programs BARs ("iotlb_to_section: Assertion
# `section_index < d->map.sections_nb' failed"); seen once in a full e2e run on a heavily loaded
# machine, not reproduced by the same boot again. A fresh QEMU gets one more try. The same boot
# (OCI H100 shape, SeaBIOS 1.16.3, 2 vCPUs) also once never reached /init in CI: an empty serial
# log after 600 s, where it takes 20 s of QEMU CPU here and passed 25 times in a row, under load
# too; that also gets one more try (``silent_after``), with the firmware's debug log printed.
QEMU_ABORT_RETRIES = 1
# A boot of the e2e tiers reaches /init within 20-25 QEMU CPU seconds on a quiet machine and
# 60-80 under a load of 10-17; with ``silent_after=S`` an empty serial log after S QEMU CPU
# seconds, or SILENT_WALL_FACTOR x S of wall time (a QEMU that spins no more), is a hang
SILENT_WALL_FACTOR = 1.75


def _qemu_abort(log_text: str) -> str | None:
    """The assertion line of a QEMU that aborted, from its log."""
    for line in log_text.splitlines():
        if line.startswith("qemu-system-") and "Assertion" in line and line.rstrip().endswith("failed."):
            return line.strip()
    return None




# ---------------------------------------------------------------------------
# booting


@dataclass
class GuestResult:
    name: str
    printout: GuestPrintout
    mapping: dict[GuestAddr, StandIn]  # guest address -> hostdev
    bdf_map: dict[str, StandIn]  # guest BDF -> hostdev
    defined_xml: bytes  # `virsh dumpxml` after define (all addresses filled in)
    bootable_xml: bytes
    serial_log: Path
    work_dir: Path
    timings: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    qemu_argv: tuple[str, ...] = ()  # what QEMU ran with, read from /proc while it ran

    @property
    def firmware(self) -> str:
        """The firmware that booted the guest, as its SMBIOS tables name it (vendor and version
        from ``/sys/class/dmi/id``): ``SeaBIOS 1.16.3-debian-1.16.3-2``,
        ``Debian distribution of EDK II 2025.02-8+deb13u1``; empty if the guest had none."""
        info = self.printout.info
        return " ".join(v for v in (info.get("bios_vendor", ""), info.get("bios_version", "")) if v)

    def unmapped(self) -> list[StandIn]:
        """Stand-ins (with a guest address) that did not show up where the
        domain put them: their hierarchy vanished or moved."""
        found = {id(s) for s in self.bdf_map.values()}
        return [s for s in self.mapping.values() if id(s) not in found]

    def sysfs_tree(self, out_dir: str | os.PathLike | None = None) -> Path:
        return guest_sysfs_tree(self.printout, out_dir or self.work_dir / "sysfs")


_seq = itertools.count()


def boot(domain_xml: bytes, **kwargs) -> GuestResult:
    """:func:`boot_once`, once more (``QEMU_ABORT_RETRIES``) if QEMU itself aborted on an internal
    assertion, or (with ``silent_after``) if the guest stayed silent (:class:`GuestSilent`);
    the retry is printed with its reason and noted in ``GuestResult.notes``. Any other failure,
    and a second one, is raised as it is."""
    aborts: list[str] = []
    while True:
        try:
            r = boot_once(domain_xml, **kwargs)
        except (QemuAborted, GuestSilent) as e:
            if len(aborts) >= QEMU_ABORT_RETRIES:
                raise
            what = "QEMU aborted" if isinstance(e, QemuAborted) else "guest silent"
            aborts.append(f"{what}: {e.reason}")
            print(f"\n[e2e] {what} ({e.reason}); booting the same domain once more", flush=True)
            continue
        r.notes += [f"an earlier try: {a}" for a in aborts]
        return r


def boot_once(
    domain_xml: bytes,
    *,
    kinds: Mapping[str, str] | None = None,
    libvirtd: PrivateLibvirtd | None = None,
    timeout: float = 120.0,
    work_dir: str | os.PathLike | None = None,
    memory_mib: int = 512,
    keep_cpu: Sequence[str] = (),
    loader: str | None = None,
    silent_after: float | None = None,
    cmdline: str = KERNEL_CMDLINE,
) -> GuestResult:
    """Make ``domain_xml`` (a rewritten domain) bootable, define and start it
    on a private libvirtd (``libvirtd`` if given, else a fresh one stopped
    afterwards), wait for the guest's end marker, destroy/undefine it and
    return the parsed printout. Raises ``BootError`` (with the tail of the
    serial and QEMU logs) on any failure or after ``timeout`` seconds;
    ``silent_after``: raise :class:`GuestSilent` early when the serial log stays empty past
    that many QEMU CPU seconds (or ``SILENT_WALL_FACTOR`` times that of wall time), for a boot
    known to reach /init; a control boot that may legitimately never get there leaves it None."""
    t0 = time.monotonic()
    name = f"pcitopo-e2e-{os.getpid()}-{next(_seq)}"
    wd, serial = _work_dir(work_dir, name)
    notes: list[str] = []
    unplaced: list[StandIn] = []
    bootable, mapping = make_bootable(
        domain_xml, find_kernel(), build_initramfs(cache_dir()), serial, kinds=kinds, name=name,
        memory_mib=memory_mib, notes=notes, unplaced=unplaced, keep_cpu=keep_cpu, loader=loader, cmdline=cmdline,
        emulator=str(tcg_single_emulator()),
    )
    (wd / "bootable.xml").write_bytes(bootable)
    timings: dict[str, float] = {"prepare": time.monotonic() - t0}

    own = libvirtd is None
    lv = libvirtd or PrivateLibvirtd()
    defined = False
    try:
        t = time.monotonic()
        if own:
            lv.start()
            timings["libvirtd_start"] = time.monotonic() - t
        deadline = t0 + timeout
        left = _time_left(deadline)
        _define(lv, wd / "bootable.xml", left, timings)
        defined = True
        defined_xml = _read_back(lv, name, wd, left)
        mapping.update(_placed_by_libvirt(defined_xml, unplaced))
        qemu_argv, text = _run(lv, name, serial, deadline, timeout, silent_after, left, timings)
    finally:
        _teardown(lv, name, defined, own, timings)
    printout = parse_printout(text)
    timings["total"] = time.monotonic() - t0
    return GuestResult(
        name=name, printout=printout, mapping=mapping,
        bdf_map=map_guest_bdfs(printout, defined_xml, mapping),
        defined_xml=defined_xml, bootable_xml=bootable, serial_log=serial,
        work_dir=wd, timings=timings, notes=notes, qemu_argv=qemu_argv,
    )


def _work_dir(work_dir: str | os.PathLike | None, name: str) -> tuple[Path, Path]:
    """The boot's work dir (old runs pruned when it is the cache's) and its serial log, not there yet."""
    if work_dir is None:
        _prune_runs(cache_dir() / "runs")
    wd = Path(work_dir) if work_dir else cache_dir() / "runs" / name
    wd.mkdir(parents=True, exist_ok=True)
    serial = (wd / "serial.log").resolve()
    if serial.exists():
        serial.unlink()
    return wd, serial


def _time_left(deadline: float) -> Callable[[], float]:
    """Seconds left until ``deadline`` for the next virsh call, one at least."""
    def left() -> float:
        return max(1.0, deadline - time.monotonic())

    return left


def _define(lv: PrivateLibvirtd, xml: Path, left: Callable[[], float], timings: dict[str, float]) -> None:
    """``virsh define`` of the bootable XML; BootError with libvirt's reason when it refuses."""
    t = time.monotonic()
    r = lv.virsh("define", str(xml), check=False, timeout=left())
    if r.returncode != 0:
        raise BootError(f"virsh define failed: {r.stderr.strip()}")
    timings["define"] = time.monotonic() - t


def _read_back(lv: PrivateLibvirtd, name: str, wd: Path, left: Callable[[], float]) -> bytes:
    """The domain as libvirt defined it (every address filled in), kept as defined.xml."""
    defined_xml = lv.virsh("dumpxml", name, timeout=left()).stdout.encode()
    (wd / "defined.xml").write_bytes(defined_xml)
    return defined_xml


def _run(lv: PrivateLibvirtd, name: str, serial: Path, deadline: float, timeout: float, silent_after: float | None,
         left: Callable[[], float], timings: dict[str, float]) -> tuple[tuple[str, ...], str]:
    """Start the defined domain and wait for its guest's end marker: (QEMU's argv, the serial log)."""
    t = time.monotonic()
    r = lv.virsh("start", name, check=False, timeout=left())
    if r.returncode != 0:
        raise BootError(f"virsh start failed: {r.stderr.strip()}\n{_tail(lv.qemu_log(name))}")
    qemu_argv = _qemu_argv(lv, name)
    text = _wait_for_end(lv, name, serial, t, deadline, timeout, silent_after, left)
    timings["run"] = time.monotonic() - t
    cpu = _qemu_cpu_seconds(lv, name)
    if cpu is not None:
        timings["qemu_cpu"] = cpu
    return qemu_argv, text


def _wait_for_end(lv: PrivateLibvirtd, name: str, serial: Path, t: float, deadline: float, timeout: float,
                  silent_after: float | None, left: Callable[[], float]) -> str:
    """The serial log once it holds the end marker (the guest started at ``t``); :class:`BootError`
    (or :class:`QemuAborted`, :class:`GuestSilent`) with the logs' tails when it never does."""
    text = ""
    while True:
        text = serial.read_text(errors="replace") if serial.exists() else ""
        if END_MARKER in text:
            break
        st = lv.virsh("domstate", name, check=False, timeout=left()).stdout.strip()
        if st.startswith("shut off") or st.startswith("crashed"):
            text = serial.read_text(errors="replace") if serial.exists() else ""
            if END_MARKER in text:
                break
            message = (f"guest stopped ({st}) before the end marker\n"
                       f"--- serial ---\n{_tail(serial)}\n--- qemu log ---\n{_tail(lv.qemu_log(name))}")
            abort = _qemu_abort(_tail(lv.qemu_log(name), 200))
            if abort:
                raise QemuAborted(message, abort)
            raise BootError(message)
        now = time.monotonic()
        silent = silent_after is not None and not text and _silent(lv, name, now - t, silent_after)
        if now > deadline or silent:
            cpu = _qemu_cpu_seconds(lv, name)
            what = f"no end marker after {timeout:.0f}s" if not silent else f"serial log empty after {now - t:.0f}s"
            message = (f"{what} (QEMU used {'?' if cpu is None else f'{cpu:.0f}'} CPU seconds)"
                       f"\n--- serial ---\n{_tail(serial)}"
                       f"\n--- firmware debug log ---\n{_tail(firmware_log_path(serial), 25)}"
                       f"\n--- qemu log ---\n{_tail(lv.qemu_log(name), 15)}")
            if silent:
                last = _tail(firmware_log_path(serial), 1).strip() or "no firmware output"
                raise GuestSilent(message, f"{what}, the firmware's last line: {last}")
            raise BootError(message)
        time.sleep(0.2)
    return text


def _teardown(lv: PrivateLibvirtd, name: str, defined: bool, own: bool, timings: dict[str, float]) -> None:
    """The domain destroyed and undefined (once the guest has powered off), and a daemon of
    our own stopped."""
    t = time.monotonic()
    if defined:
        # the guest powers off right after the marker; a destroy of a
        # running QEMU costs ~1.5 s more than letting it end
        end = time.monotonic() + 3
        while time.monotonic() < end:
            st = lv.virsh("domstate", name, check=False, timeout=10).stdout
            if not st.strip() or st.startswith("shut off"):
                break
            time.sleep(0.1)
        lv.virsh("destroy", name, check=False, timeout=30)
        lv.virsh("undefine", name, check=False, timeout=30)
    timings["teardown"] = time.monotonic() - t
    if own:
        lv.stop()
        lv.cleanup(keep_logs=False)


def _silent(lv: PrivateLibvirtd, name: str, running: float, cpu_limit: float) -> bool:
    if running > SILENT_WALL_FACTOR * cpu_limit:
        return True
    cpu = _qemu_cpu_seconds(lv, name)
    return cpu is not None and cpu > cpu_limit


def _qemu_argv(lv: PrivateLibvirtd, name: str) -> tuple[str, ...]:
    """The command line of the domain's running QEMU (after the wrapper's exec), or ()."""
    try:
        pid = int(lv.qemu_pidfile(name).read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return tuple(a.decode(errors="replace") for a in f.read().split(b"\0") if a)
    except (OSError, ValueError):
        return ()


def _qemu_cpu_seconds(lv: PrivateLibvirtd, name: str) -> float | None:
    """CPU time (user + system, all threads) the domain's QEMU has used so far: unlike wall
    time, it hardly depends on what else runs on the machine, so boots on different stacks or
    under different load compare by it."""
    try:
        pid = int(lv.qemu_pidfile(name).read_text().strip())
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    # fields after the command name start at stat's 3rd; utime and stime are the 14th and 15th
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _placed_by_libvirt(defined_xml: bytes, unplaced: list[StandIn]) -> dict[GuestAddr, StandIn]:
    """Guest addresses libvirt gave the stand-ins that had none."""
    if not unplaced:
        return {}
    root = etree.fromstring(defined_xml, _parser())
    out: dict[GuestAddr, StandIn] = {}
    for st in unplaced:
        for el in root.iterfind(f"devices/{st.element}"):
            a = el.find("alias")
            addr = el.find("address")
            if a is not None and a.get("name") == st.alias and addr is not None:
                out[GuestAddr(_int(addr.get("bus")), _int(addr.get("slot")),
                              _int(addr.get("function"), 0))] = st
    return out


def _prune_runs(runs: Path, keep: int = 30) -> None:
    """Keep the work dirs (serial log, XML) of the last ``keep`` boots."""
    if not runs.is_dir():
        return
    dirs = sorted((d for d in runs.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for d in dirs[: max(0, len(dirs) - keep)]:
        shutil.rmtree(d, ignore_errors=True)


def _tail(p: Path, n: int = 40) -> str:
    try:
        return "\n".join(p.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({p} not readable)"
