"""Sysfs sources and the lazy reader.

A *source* answers four questions about a tree laid out like ``/sys``: read a small file,
read a symlink, list a directory, and (through :func:`resolve`) the realpath of a path with
chroot semantics. Three sources exist: a real directory (``/sys`` or anything shaped like it),
an in-memory tree (fixtures, tests, generated hosts), and a capture tarball loaded into memory.
The reader on top (:class:`SysfsReader`) is the only code that knows sysfs file names; fixtures
and live hosts go through exactly the same reader.
"""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from .bars import Bar, parse_resource
from .cpuinfo import ADDRESS_SIZES_MEMBER, HostWidth, local_width, recorded_width
from .errors import MalformedBdfError, SysfsError
from .model import Bdf, Link, NumaNode, PciFunction, Topology, is_bdf

# The attribute files the reader uses: one list, shared by the reader and `pcitopo capture`.
REQUIRED_ATTRS = ("vendor", "device", "class")
OPTIONAL_ATTRS = (
    "subsystem_vendor",
    "subsystem_device",
    "numa_node",
    "max_link_speed",
    "max_link_width",
    "current_link_speed",
    "current_link_width",
    "local_cpulist",
)
LINK_ATTRS = ("driver", "iommu_group", "physfn")
# Multi-line attribute files the reader uses: the BARs (topology/bars.py, the MMIO budget).
# Kept apart from OPTIONAL_ATTRS, whose files are one line each.
RESOURCE_ATTRS = ("resource",)
# Read only for NVLink-switch management candidates (topology/nvswitch_mgmt.py): the VPD image
# (root-readable; bounded like any attribute) and which class children a function registered.
VPD_ATTR = "vpd"
CLASS_DIRS = ("infiniband", "net")
NODE_ATTRS = ("cpulist",)

# -- pcitopo doctor (issue 13): what the host-readiness checks read, besides the above ---------
# Per function: config space (64 bytes unprivileged, 4096 as root), BARs, the driver override.
DOCTOR_ATTRS = ("config", *RESOURCE_ATTRS, "driver_override")
# kernel/iommu_groups/<N>/devices/<BDF> (links) and .../type; class/iommu/<unit> (links).
IOMMU_GROUPS_DIR = "kernel/iommu_groups"
IOMMU_GROUP_ATTRS = ("type",)
IOMMU_CLASS_DIR = "class/iommu"
# -- end pcitopo doctor ------------------------------------------------------------------------

# Every per-function file `pcitopo capture` keeps (links and the VPD image are handled apart):
# the one list, so a capture reads like the host for the reader, the MMIO budget and the doctor.
CAPTURED_ATTRS = tuple(dict.fromkeys(REQUIRED_ATTRS + OPTIONAL_ATTRS + RESOURCE_ATTRS + DOCTOR_ATTRS))

PCI_DEVICES_DIR = "bus/pci/devices"
NODE_DIR = "devices/system/node"

# Sysfs attribute files are tiny; anything larger is not a sysfs attribute.
MAX_ATTR_BYTES = 4096
MAX_SYMLINK_HOPS = 40

# Bounds for capture tarballs (a capture of a host with thousands of VFs is a few MB).
MAX_TAR_MEMBERS = 2_000_000
MAX_TAR_BYTES = 256 * 1024 * 1024


class Unreadable:
    """Marker for a file that exists but cannot be read (permissions, I/O error)."""

    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why

    def __repr__(self) -> str:  # pragma: no cover - debugging aid
        return f"Unreadable({self.why!r})"


class Source(Protocol):
    """What the reader needs from a tree shaped like sysfs. Paths are relative, '/'-separated."""

    name: str

    def read(self, rel: str) -> bytes | Unreadable | None:
        """File content (bounded), ``Unreadable`` if it exists but cannot be read, None if absent."""

    def readlink(self, rel: str) -> str | None:
        """Link text if ``rel`` itself is a symlink, else None."""

    def listdir(self, rel: str) -> list[str] | None:
        """Names in a directory (not following a final symlink), None if not a directory."""


def resolve(source: Source, rel: str) -> str:
    """Realpath of ``rel`` inside the source, with chroot semantics (absolute links and '..'
    never leave the tree). Raises SysfsError on a symlink loop."""
    parts = [p for p in rel.split("/") if p and p != "."]
    done: list[str] = []
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = "/".join(done + [part])
        target = source.readlink(candidate)
        if target is None:
            done.append(part)
            continue
        hops += 1
        if hops > MAX_SYMLINK_HOPS:
            raise SysfsError(f"{source.name}: symlink loop while resolving {rel}")
        if target.startswith("/"):
            done = []
            # A capture of /sys may hold absolute links into /sys itself.
            target = target[len("/sys/"):] if target.startswith("/sys/") else target
        parts = [p for p in target.split("/") if p and p != "."] + parts
    return "/".join(done)


class DirSource:
    """A directory laid out like sysfs (``/sys`` itself, or a fixture directory)."""

    def __init__(self, root: str | os.PathLike):
        self.root = os.fspath(root)
        self.name = self.root

    def _abs(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    def read(self, rel: str) -> bytes | Unreadable | None:
        try:
            # O_NOFOLLOW: attribute files are never symlinks in sysfs; a link here is hostile.
            fd = os.open(self._abs(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:
                return Unreadable("is a symlink")
            return Unreadable(e.strerror or str(e))
        try:
            return os.read(fd, MAX_ATTR_BYTES + 1)
        except OSError as e:
            return Unreadable(e.strerror or str(e))
        finally:
            os.close(fd)

    def readlink(self, rel: str) -> str | None:
        try:
            return os.readlink(self._abs(rel))
        except OSError:
            return None

    def listdir(self, rel: str) -> list[str] | None:
        path = self._abs(rel)
        try:
            if os.path.islink(path):
                return None
            return os.listdir(path)
        except OSError:
            return None


@dataclass(frozen=True, slots=True)
class _File:
    data: bytes


@dataclass(frozen=True, slots=True)
class _Link:
    target: str


class _Dir:
    __slots__ = ()


_DIR = _Dir()


class MemoryTree:
    """An in-memory tree shaped like sysfs: what synthetic hosts and captures are made of.

    It is also a :class:`Source`, so the reader reads it exactly as it reads ``/sys``.
    """

    def __init__(self, name: str = "<memory>"):
        self.name = name
        # Whether this machine's CPU stands for the tree's host when the tree records no width
        # (topology/cpuinfo.py): True for synthetic hosts and fixtures, False for a capture file.
        self.cpu_is_local = True
        self._entries: dict[str, _File | _Link | _Dir] = {}
        self._children: dict[str, set[str]] = {"": set()}

    # -- building -------------------------------------------------------------------------
    def _add_parents(self, rel: str) -> None:
        parent, _, leaf = rel.rpartition("/")
        while True:
            kids = self._children.setdefault(parent, set())
            kids.add(leaf)
            if not parent or parent in self._entries:
                if parent and not isinstance(self._entries[parent], _Dir):
                    raise SysfsError(f"{self.name}: {parent} is not a directory")
                break
            self._entries[parent] = _DIR
            parent, _, leaf = parent.rpartition("/")

    @staticmethod
    def _norm(rel: str) -> str:
        norm = posixpath.normpath(rel.strip("/"))
        if norm.startswith("..") or norm == ".":
            raise SysfsError(f"path outside the tree: {rel!r}")
        return norm

    def add_dir(self, rel: str) -> None:
        rel = self._norm(rel)
        if rel in self._entries:
            return
        self._add_parents(rel)
        self._entries[rel] = _DIR
        self._children.setdefault(rel, set())

    def add_file(self, rel: str, data: str | bytes) -> None:
        rel = self._norm(rel)
        self._add_parents(rel)
        self._entries[rel] = _File(data.encode() if isinstance(data, str) else data)

    def add_link(self, rel: str, target: str) -> None:
        rel = self._norm(rel)
        self._add_parents(rel)
        self._entries[rel] = _Link(target)

    def __len__(self) -> int:
        return len(self._entries)

    # -- Source ---------------------------------------------------------------------------
    def read(self, rel: str) -> bytes | Unreadable | None:
        entry = self._entries.get(rel)
        if entry is None:
            return None
        if isinstance(entry, _File):
            return entry.data[: MAX_ATTR_BYTES + 1]
        if isinstance(entry, _Link):
            return Unreadable("is a symlink")
        return Unreadable("is a directory")

    def readlink(self, rel: str) -> str | None:
        entry = self._entries.get(rel)
        return entry.target if isinstance(entry, _Link) else None

    def listdir(self, rel: str) -> list[str] | None:
        if rel and not isinstance(self._entries.get(rel), _Dir):
            return None
        return sorted(self._children.get(rel, ()))

    # -- persistence ----------------------------------------------------------------------
    def iter_entries(self) -> Iterator[tuple[str, _File | _Link | _Dir]]:
        for rel in sorted(self._entries):
            yield rel, self._entries[rel]

    def write_tarball(self, out: str | os.PathLike) -> None:
        """Write a deterministic ``.tar.gz``: sorted members, mtime 0, root-owned."""
        data = self.tarball_bytes()
        tmp = f"{os.fspath(out)}.tmp"
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, out)

    def tarball_bytes(self) -> bytes:
        """The deterministic ``.tar.gz`` (see :meth:`write_tarball`) as bytes."""
        import gzip
        import io
        import tarfile

        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, entry in self.iter_entries():
                info = tarfile.TarInfo(rel)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                if isinstance(entry, _File):
                    info.type = tarfile.REGTYPE
                    info.mode = 0o444
                    info.size = len(entry.data)
                    tar.addfile(info, io.BytesIO(entry.data))
                elif isinstance(entry, _Link):
                    info.type = tarfile.SYMTYPE
                    info.mode = 0o777
                    info.linkname = entry.target
                    tar.addfile(info)
                else:
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
        packed = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0, compresslevel=9) as gz:
            gz.write(raw.getvalue())
        return packed.getvalue()

    def write_dir(self, out: str | os.PathLike) -> None:
        """Materialise the tree as a real directory (symlinks kept as symlinks)."""
        root = Path(out)
        root.mkdir(parents=True, exist_ok=True)
        for rel, entry in self.iter_entries():
            dest = root / rel
            if isinstance(entry, _Dir):
                dest.mkdir(parents=True, exist_ok=True)
            elif isinstance(entry, _File):
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(entry.data)
            else:
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.is_symlink() or dest.exists():
                    dest.unlink()
                os.symlink(entry.target, dest)

    @classmethod
    def from_tarball(cls, path: str | os.PathLike) -> "MemoryTree":
        """Load a capture. Never extracts to disk, so member names cannot escape anywhere."""
        import gzip
        import tarfile

        name = os.fspath(path)
        tree = cls(name)
        total = 0
        try:
            with tarfile.open(name, mode="r:*") as tar:
                for count, member in enumerate(tar, 1):
                    if count > MAX_TAR_MEMBERS:
                        raise SysfsError(f"{name}: more than {MAX_TAR_MEMBERS} members, not a capture")
                    rel = member.name
                    if rel.startswith("./"):
                        rel = rel[2:]
                    if not rel or rel == ".":
                        continue
                    if member.isdir():
                        tree.add_dir(rel)
                    elif member.issym():
                        tree.add_link(rel, member.linkname)
                    elif member.isfile():
                        if member.size > MAX_ATTR_BYTES:
                            raise SysfsError(f"{name}: member {rel} is {member.size} bytes, not a sysfs attribute")
                        total += member.size
                        if total > MAX_TAR_BYTES:
                            raise SysfsError(f"{name}: more than {MAX_TAR_BYTES} bytes of content")
                        fh = tar.extractfile(member)
                        tree.add_file(rel, fh.read() if fh else b"")
                    # hard links, devices, fifos: not part of a capture; ignored
        except SysfsError:
            raise
        except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as e:
            raise SysfsError(_not_a_capture(name, e)) from None
        return tree


SYSFS_KINDS = "/sys, a directory laid out like sysfs, a capture .tar.gz from `pcitopo capture`, or a fixture directory"


def _not_a_capture(name: str, e: BaseException) -> str:
    """One line for a --sysfs file that is not a capture (finding 8: tarfile's own message
    chains four decompressors' errors). Says what the file looks like when that is obvious."""
    import tarfile

    try:
        with open(name, "rb") as fh:
            head = fh.read(512).lstrip()
    except OSError as oe:
        return f"{name}: cannot read it ({oe.strerror or oe})"
    if head.startswith(b"<"):
        what = "it is XML, a domain?"
    elif head[:1] in (b"{", b"["):
        what = "it is JSON"
    elif head.startswith(b"\x1f\x8b") or isinstance(e, (EOFError, tarfile.ReadError)) and "end of" in str(e):
        what = "truncated or damaged"
    else:
        what = "not a gzip'd tar"
    return f"{name}: not a readable capture tarball ({what}); --sysfs takes {SYSFS_KINDS}"


def default_sysfs() -> str:
    """The sysfs root every command uses unless told otherwise (KubeVirt's shim passes only
    --vmi and --domain, so the environment is the one way to point it elsewhere)."""
    return os.environ.get("PCITOPO_SYSFS") or "/sys"


def open_source(path: str | os.PathLike = "/sys") -> Source:
    """Pick the source for a path: a sysfs-shaped directory, a capture tarball, or a fixture
    directory holding ``sysfs.tar.gz`` or ``sysfs/``."""
    p = os.fspath(path)
    if os.path.isdir(p):
        if os.path.isdir(os.path.join(p, PCI_DEVICES_DIR)):
            return DirSource(p)
        if os.path.isdir(os.path.join(p, "sysfs", PCI_DEVICES_DIR)):
            return DirSource(os.path.join(p, "sysfs"))
        tarball = os.path.join(p, "sysfs.tar.gz")
        if os.path.isfile(tarball):
            return MemoryTree.from_tarball(tarball)
        raise SysfsError(f"{p}: no {PCI_DEVICES_DIR} here, and no sysfs.tar.gz or sysfs/ inside")
    if os.path.isfile(p):
        tree = MemoryTree.from_tarball(p)
        tree.cpu_is_local = False  # a capture from another host: its width is the recorded one
        return tree
    raise SysfsError(f"{p}: no such sysfs directory or capture")


class SysfsReader:
    """Reads PCI functions and NUMA nodes from a source. The only code that knows sysfs names."""

    def __init__(self, source: Source):
        self.source = source
        self.name = source.name
        self.warnings: list[str] = []
        # readlink answers for resolve(): every device's path repeats the same prefixes
        # (bus/pci/devices, devices/pci0000:15/0000:15:01.0, ...), read once here.
        self._links: dict[str, str | None] = {}

    def readlink(self, rel: str) -> str | None:
        """``source.readlink``, remembered for the life of this reader (like the functions it
        loads: sysfs device links do not change while the device exists)."""
        try:
            return self._links[rel]
        except KeyError:
            target = self._links[rel] = self.source.readlink(rel)
            return target

    def _warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)

    def _text(self, rel: str, required: bool) -> str | None:
        data = self.source.read(rel)
        if data is None:
            if required:
                raise SysfsError(f"{self.name}: required attribute {rel} is missing")
            return None
        if isinstance(data, Unreadable):
            if required:
                raise SysfsError(f"{self.name}: required attribute {rel} is unreadable ({data.why})")
            self._warn(f"{rel}: unreadable ({data.why}), ignored")
            return None
        if len(data) > MAX_ATTR_BYTES:
            if required:
                raise SysfsError(f"{self.name}: {rel} is larger than a sysfs attribute")
            self._warn(f"{rel}: larger than a sysfs attribute, ignored")
            return None
        return data.decode("utf-8", "replace").strip()

    def _int(self, rel: str, base: int, required: bool = False) -> int | None:
        text = self._text(rel, required)
        if text is None:
            return None
        try:
            return int(text, base)
        except ValueError:
            if required:
                raise SysfsError(f"{self.name}: {rel} holds {text[:40]!r}, not a number") from None
            self._warn(f"{rel}: {text[:40]!r} is not a number, ignored")
            return None

    def _bars(self, rel: str) -> tuple[Bar, ...] | None:
        """A function's ``resource`` file; absent or malformed → None (with a warning)."""
        text = self._text(rel, False)
        if text is None:
            return None
        try:
            return parse_resource(text)
        except SysfsError as e:
            self._warn(f"{rel}: {e.reason}, ignored")
            return None

    def _link_name(self, rel: str) -> str | None:
        target = self.source.readlink(rel)
        return target.rstrip("/").rsplit("/", 1)[-1] if target else None

    def load(self, bdf: "Bdf") -> "PciFunction | None":
        link = f"{PCI_DEVICES_DIR}/{bdf}"
        if self.readlink(link) is None and self.source.listdir(link) is None:
            return None
        real = resolve(self, link)
        comps = real.split("/")
        if len(comps) < 3 or comps[0] != "devices" or comps[-1] != str(bdf):
            raise SysfsError(f"{self.name}: {link} resolves to {real}, not a device directory")
        # The root complex is the first non-BDF component above the chain of BDFs (NCCL's walk
        # stops at the same place); anything above it (ACPI, VMBus wrappers) is not PCI.
        i = len(comps) - 1
        while i > 0 and is_bdf(comps[i]):
            i -= 1
        if i == len(comps) - 1 or i == 0:
            raise SysfsError(f"{self.name}: {real} has no root complex above {bdf}")
        path = tuple(comps[i:])
        base = real
        vendor = self._int(f"{base}/vendor", 16, required=True)
        device = self._int(f"{base}/device", 16, required=True)
        class_code = self._int(f"{base}/class", 16, required=True)
        numa = self._int(f"{base}/numa_node", 10)
        physfn_name = self._link_name(f"{base}/physfn")
        physfn = None
        if physfn_name is not None:
            try:
                physfn = Bdf.parse(physfn_name)
            except MalformedBdfError:
                self._warn(f"{base}/physfn: {physfn_name!r} is not a PCI address, ignored")
        group = self._link_name(f"{base}/iommu_group")
        return PciFunction(
            bdf=bdf,
            path=path,
            vendor=vendor,
            device=device,
            class_code=class_code,
            subsystem_vendor=self._int(f"{base}/subsystem_vendor", 16),
            subsystem_device=self._int(f"{base}/subsystem_device", 16),
            numa_node=numa if numa is not None and numa >= 0 else -1,
            link=Link(
                max_speed=self._text(f"{base}/max_link_speed", False),
                max_width=self._int(f"{base}/max_link_width", 10),
                current_speed=self._text(f"{base}/current_link_speed", False),
                current_width=self._int(f"{base}/current_link_width", 10),
            ),
            driver=self._link_name(f"{base}/driver"),
            iommu_group=int(group) if group and group.isdigit() else None,
            physfn=physfn,
            local_cpulist=self._text(f"{base}/local_cpulist", False),
            bars=self._bars(f"{base}/resource"),
        )

    def host_width(self) -> HostWidth:
        """The width of the host this source describes (see topology/cpuinfo.py); the caller
        (``Topology.host_width``) keeps it."""
        return source_width(self.source)

    def read_vpd(self, bdf: "Bdf") -> bytes | None:
        """The function's VPD image, or None when absent or unreadable (not root)."""
        data = self.source.read(f"{resolve(self, f'{PCI_DEVICES_DIR}/{bdf}')}/{VPD_ATTR}")
        return data[:MAX_ATTR_BYTES] if isinstance(data, bytes) else None

    def read_class_dirs(self, bdf: "Bdf") -> tuple[str, ...]:
        """Which of ``infiniband/`` and ``net/`` the function has (a driver registered an RDMA
        device or a network interface on it)."""
        base = resolve(self, f"{PCI_DEVICES_DIR}/{bdf}")
        return tuple(d for d in CLASS_DIRS if self.source.listdir(f"{base}/{d}") is not None)

    def all_bdfs(self) -> list["Bdf"]:
        names = self.source.listdir(PCI_DEVICES_DIR)
        if names is None:
            raise SysfsError(f"{self.name}: {PCI_DEVICES_DIR} is not a directory")
        out = []
        for n in names:
            if is_bdf(n):
                out.append(Bdf.parse(n))
            else:
                self._warn(f"{PCI_DEVICES_DIR}/{n}: not a PCI address, ignored")
        return out

    def numa_nodes(self) -> dict[int, "NumaNode"]:
        nodes: dict[int, NumaNode] = {}
        for n in self.source.listdir(NODE_DIR) or []:
            if n.startswith("node") and n[4:].isdigit():
                nodes[int(n[4:])] = NumaNode(int(n[4:]), self._text(f"{NODE_DIR}/{n}/cpulist", False))
        return dict(sorted(nodes.items()))


def source_width(source: Source) -> HostWidth:
    """Recorded in the source (a capture) → that; a capture file without it → unknown; else this
    machine's /proc/cpuinfo or $PCITOPO_CPUINFO (a live /sys, a sysfs directory, a fixture)."""
    data = source.read(ADDRESS_SIZES_MEMBER)
    if isinstance(data, bytes):
        return recorded_width(data, source.name)
    if isinstance(data, Unreadable):
        return HostWidth(None, f"{source.name}: {ADDRESS_SIZES_MEMBER} {data.why}")
    if not getattr(source, "cpu_is_local", True):
        return HostWidth(None, f"not recorded in {source.name} (taken by an older pcitopo capture; capture again to record it): the MMIO check is skipped")
    return local_width()


def open_host(path: str | os.PathLike = "/sys") -> "Topology":
    """The host model for a sysfs directory, a capture tarball, or a fixture directory."""
    return Topology(SysfsReader(open_source(path)))
