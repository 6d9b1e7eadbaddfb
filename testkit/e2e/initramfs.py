"""Build the e2e guest's initramfs: busybox-static, the real lspci with its
shared libraries, pci.ids, and an /init that prints the guest's PCI tree to
the serial console and powers off.

The printout is line based; every line the init writes starts with ``@@`` so
it can be picked out of a serial log that also carries kernel messages::

    @@PCITOPO-BEGIN 1
    @@DEV <BDF> <realpath>
    @@ATTR <BDF> <name> <value as cat printed it, may contain spaces>
    @@ABSENT <BDF> <name>          (the file does not exist in the guest)
    @@UNREADABLE <BDF> <name>      (it exists but reading it failed)
    @@LINK <BDF> <name> <link text>
    @@RES <BDF> <line> <start> <end> <flags>   (the function's `resource` file)
    @@DMESG <kernel line about BARs and windows>
    @@NODE <N> <cpulist>
    @@INFO <key> <value>           (acpi_tables, cmdline, kernel, physbits, bios_vendor, bios_version)
    @@LSPCI <one line of `lspci -tvnn`>
    @@FWCFG-SIZE <name> <bytes>    (each fw_cfg blob under opt/)
    @@FWCFG <name> <hex>           (its bytes in hex, 1024 digits a line)
    @@PCITOPO-END

The archive is a gzip'd newc cpio written here in Python (deterministic:
mtime 0, uid/gid 0) and cached under ``.cache/e2e/`` keyed by a hash of
everything that goes into it.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

BEGIN_MARKER = "@@PCITOPO-BEGIN 1"
END_MARKER = "@@PCITOPO-END"

# Per-function attribute files the init prints: the reader's own lists
# (src/pcitopo/host/sysfs.py) so the guest tree always carries what the reader reads,
# with a fallback for when the package is not importable.
_FALLBACK_ATTRS = (
    "vendor", "device", "class", "subsystem_vendor", "subsystem_device",
    "numa_node", "max_link_speed", "max_link_width", "current_link_speed",
    "current_link_width", "local_cpulist",
)
_FALLBACK_LINKS = ("driver", "iommu_group", "physfn")
# Printed too (bus-range checks, see guesttree.bus_overlaps); the reader ignores them.
EXTRA_ATTRS = ("secondary_bus_number", "subordinate_bus_number")
try:
    from pcitopo.host.sysfs import LINK_ATTRS as _LINKS, OPTIONAL_ATTRS as _OPT, REQUIRED_ATTRS as _REQ

    ATTRS = tuple(dict.fromkeys((*_REQ, *_OPT, *_FALLBACK_ATTRS, *EXTRA_ATTRS)))
    LINKS = tuple(dict.fromkeys((*_LINKS, *_FALLBACK_LINKS)))
except ImportError:  # pragma: no cover
    ATTRS, LINKS = (*_FALLBACK_ATTRS, *EXTRA_ATTRS), _FALLBACK_LINKS

BUSYBOX = Path("/bin/busybox")
PCI_IDS = Path("/usr/share/misc/pci.ids")

INIT_SCRIPT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /sbin /usr/bin /usr/sbin
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
echo 1 > /proc/sys/kernel/printk 2>/dev/null
echo "@@PCITOPO-BEGIN 1"
for d in /sys/bus/pci/devices/*; do
    [ -e "$d" ] || continue
    b=${d##*/}
    echo "@@DEV $b $(readlink -f "$d")"
    for a in __ATTRS__; do
        if [ -e "$d/$a" ]; then
            if v=$(cat "$d/$a" 2>/dev/null); then
                echo "@@ATTR $b $a $v"
            else
                echo "@@UNREADABLE $b $a"
            fi
        else
            echo "@@ABSENT $b $a"
        fi
    done
    for l in __LINKS__; do
        [ -L "$d/$l" ] && echo "@@LINK $b $l $(readlink "$d/$l")"
    done
    if [ -r "$d/resource" ]; then
        n=0
        while read -r s e f; do echo "@@RES $b $n $s $e $f"; n=$((n+1)); done < "$d/resource"
    fi
done
echo "@@INFO physbits $(grep -m1 'address sizes' /proc/cpuinfo | sed 's/.*: //')"
dmesg | grep -E 'BAR|addressable|no space|ailed to assign|root bus resource' | head -200 | while IFS= read -r line; do echo "@@DMESG $line"; done
for n in /sys/devices/system/node/node*; do
    [ -e "$n/cpulist" ] && echo "@@NODE ${n##*/node} $(cat "$n/cpulist")"
done
echo "@@INFO acpi_tables $(ls /sys/firmware/acpi/tables 2>/dev/null | tr '\n' ' ')"
echo "@@INFO cmdline $(cat /proc/cmdline)"
echo "@@INFO kernel $(uname -r)"
echo "@@INFO bios_vendor $(cat /sys/class/dmi/id/bios_vendor 2>/dev/null)"
echo "@@INFO bios_version $(cat /sys/class/dmi/id/bios_version 2>/dev/null)"
lspci -tvnn 2>&1 | while IFS= read -r line; do echo "@@LSPCI $line"; done
# the fw_cfg blobs the domain passed (sysfs needs the qemu_fw_cfg module), byte-exact in hex
[ -e /lib/qemu_fw_cfg.ko ] && insmod /lib/qemu_fw_cfg.ko 2>/dev/null
echo "@@INFO fw_cfg $([ -d /sys/firmware/qemu_fw_cfg ] && echo present || echo absent)"
# (by_name/ holds links to by_key/<selector>/, which has the name and the raw bytes)
for k in /sys/firmware/qemu_fw_cfg/by_key/*; do
    [ -r "$k/name" ] || continue
    n=$(cat "$k/name")
    case "$n" in opt/*) ;; *) continue ;; esac
    echo "@@FWCFG-SIZE $n $(wc -c < "$k/raw")"
    { od -An -v -tx1 "$k/raw" | tr -d ' \n'; echo; } | fold -w 1024 | while IFS= read -r h; do echo "@@FWCFG $n $h"; done
done
echo "@@PCITOPO-END"
sync
# Without ACPI the kernel cannot power off (it would halt and QEMU would keep
# running); a forced reboot ends the domain too (<on_reboot>destroy).
if [ -d /sys/firmware/acpi ]; then poweroff -f; fi
reboot -f
"""  # noqa: E501 -- the dmesg line of this shell script: split, the script's text would change


def init_script() -> str:
    return INIT_SCRIPT.replace("__ATTRS__", " ".join(ATTRS)).replace(
        "__LINKS__", " ".join(LINKS)
    )


def _ldd(binary: Path) -> list[Path]:
    """Shared objects a dynamically linked binary needs (ldd's resolution)."""
    out = subprocess.run(
        ["ldd", str(binary)], check=True, capture_output=True, text=True, timeout=30
    ).stdout
    libs: list[Path] = []
    for line in out.splitlines():
        m = re.search(r"=>\s*(/\S+)", line) or re.match(r"\s*(/\S+)\s+\(", line)
        if m:
            libs.append(Path(m.group(1)))
    return libs


@dataclass(frozen=True)
class _Entry:
    path: str  # inside the archive, no leading slash
    mode: int
    data: bytes = b""


def _cpio_newc(entries: list[_Entry]) -> bytes:
    out = bytearray()

    def put(name: str, mode: int, data: bytes, ino: int) -> None:
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join(
            f"{v:08x}"
            for v in (ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0)
        )
        out.extend(hdr.encode())
        out.extend(nb)
        out.extend(b"\0" * ((4 - (len(hdr) + len(nb)) % 4) % 4))
        out.extend(data)
        out.extend(b"\0" * ((4 - len(data) % 4) % 4))

    for ino, e in enumerate(entries, start=1):
        put(e.path, e.mode, e.data, ino)
    put("TRAILER!!!", 0, b"", 0)
    return bytes(out)


def _entries() -> list[_Entry]:
    lspci = Path(shutil.which("lspci") or "/usr/bin/lspci")
    files: dict[str, tuple[int, bytes]] = {}
    dirs: set[str] = set()
    symlinks: dict[str, str] = {}

    def add_file(dest: str, src: Path, mode: int = 0o755) -> None:
        files[dest.lstrip("/")] = (mode, src.read_bytes())

    def add_host_path(p: Path) -> None:
        """Copy a library under its own path, and under its resolved path
        when it is a symlink (ld.so looks names up as ldd printed them)."""
        real = p.resolve()
        add_file(str(real), real)
        if str(real) != str(p):
            symlinks[str(p).lstrip("/")] = str(real)

    add_file("bin/busybox", BUSYBOX)
    add_file("usr/bin/lspci", lspci.resolve())
    for lib in _ldd(lspci):
        add_host_path(lib)
    add_file(str(PCI_IDS), PCI_IDS, 0o644)
    files["init"] = (0o755, init_script().encode())
    module = fw_cfg_module()
    if module is not None:
        add_file("lib/qemu_fw_cfg.ko", module, 0o644)
    # Debian's merged /usr: /lib64 -> usr/lib64 etc. may appear as symlinked
    # dirs on the host; in the archive all are real dirs, which is fine.
    for name in list(files) + list(symlinks):
        parent = os.path.dirname(name)
        while parent:
            dirs.add(parent)
            parent = os.path.dirname(parent)
    for d in ("proc", "sys", "dev", "bin", "sbin", "usr/bin", "usr/sbin", "tmp", "etc"):
        dirs.add(d)
    entries = [_Entry(d, 0o040755) for d in sorted(dirs)]
    entries += [_Entry(n, 0o100000 | m, data) for n, (m, data) in sorted(files.items())]
    entries += [
        _Entry(n, 0o120777, t.encode()) for n, t in sorted(symlinks.items()) if n not in files
    ]
    return entries


def fw_cfg_module() -> Path | None:
    """The guest kernel's ``qemu_fw_cfg`` module (scripts/setup-debian.sh puts it next to the
    kernel), or None: the guest then shows no fw_cfg blobs (``@@INFO fw_cfg absent``)."""
    from .paths import SetupMissing, cache_dir, find_kernel

    try:
        kernel = find_kernel()
    except SetupMissing:
        return None
    module = cache_dir() / ("qemu_fw_cfg-" + kernel.name.removeprefix("vmlinuz-") + ".ko")
    return module if module.exists() else None


def build_initramfs(cache_dir: Path) -> Path:
    """Return the path of the (cached) initramfs, building it if needed."""
    entries = _entries()
    h = hashlib.sha256()
    for e in entries:
        h.update(e.path.encode() + b"\0" + str(e.mode).encode() + b"\0")
        h.update(hashlib.sha256(e.data).digest())
    key = h.hexdigest()[:16]
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"initramfs-{key}.cpio.gz"
    if target.exists():
        return target
    data = gzip.compress(_cpio_newc(entries), compresslevel=6, mtime=0)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(target)
    for old in cache_dir.glob("initramfs-*.cpio.gz"):
        if old != target:
            old.unlink(missing_ok=True)
    return target
