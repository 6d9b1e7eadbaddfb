"""Sysfs sources: where the reader's bytes come from.

A *source* answers four questions about a tree laid out like ``/sys``: read a small file,
read a symlink, list a directory, and (through :func:`resolve`) the realpath of a path with
chroot semantics. Three sources exist: a real directory (``/sys`` or anything shaped like it),
an in-memory tree (fixtures, tests, generated hosts), and a capture tarball loaded into memory.
None of them knows a sysfs file name beyond the directory that marks a tree as sysfs; the
reader on top (:mod:`pcitopo.host.sysfs`) does.
"""

from __future__ import annotations

import errno
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from pcitopo import SLOTS
from pcitopo.errors import SysfsError

# What marks a directory as laid out like sysfs.
PCI_DEVICES_DIR = "bus/pci/devices"

# Sysfs attribute files are tiny; anything larger is not a sysfs attribute.
MAX_ATTR_BYTES = 4096
MAX_SYMLINK_HOPS = 40



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
        self._whole: bool | None = None

    @property
    def whole(self) -> bool:
        """A live sysfs (:func:`is_live_sysfs`): a missing ``driver`` or ``iommu_group`` link is a
        fact there; in a copy it may have been left out."""
        if self._whole is None:
            self._whole = is_live_sysfs(self.root)
        return self._whole

    @property
    def label(self) -> str:
        """How outputs name the tree (:func:`path_label`): ``/sys`` live, else the directory's name."""
        real = os.path.realpath(self.root)
        return "/sys" if real == "/sys" else path_label(real)

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


@dataclass(frozen=True, **SLOTS)
class _File:
    data: bytes


@dataclass(frozen=True, **SLOTS)
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
        # (src/pcitopo/model/cpuinfo.py): True for synthetic hosts and fixtures, False for a capture file.
        self.cpu_is_local = True
        # Whether a link the tree lacks is absent on its host (:data:`WHOLE_MEMBER`): True for a
        # host built in memory from its description, for a tarball only when its capture says so.
        self.whole = True
        self.origin: str | None = None  # the capture file it was read from
        self._entries: dict[str, _File | _Link | _Dir] = {}
        self._children: dict[str, set[str]] = {"": set()}
        self.path_bytes = 0  # every entry's path and link target: what a capture's bounds count

    @property
    def label(self) -> str:
        """How outputs name the tree (:func:`path_label`): a capture by its name and digest."""
        if self.origin is None:
            return self.name
        import hashlib

        try:
            with open(self.origin, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()[:12]
        except OSError:  # gone since it was read: the name alone
            return path_label(self.origin)
        return f"{path_label(self.origin)} sha256:{digest}"

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
            self.path_bytes += len(parent)
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
        self.path_bytes += len(rel)
        self._children.setdefault(rel, set())

    def add_file(self, rel: str, data: str | bytes) -> None:
        rel = self._norm(rel)
        self._add_parents(rel)
        self._entries[rel] = _File(data.encode() if isinstance(data, str) else data)
        self.path_bytes += len(rel)

    def add_link(self, rel: str, target: str) -> None:
        rel = self._norm(rel)
        self._add_parents(rel)
        self._entries[rel] = _Link(target)
        self.path_bytes += len(rel) + len(target)

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
        """Write a deterministic ``.tar.gz``: sorted members, mtime 0, root-owned (through
        src/pcitopo/host/files.py's writer: ``pcitopo capture -o`` runs as root)."""
        from pcitopo.host.files import write_atomic

        write_atomic(os.fspath(out), self.tarball_bytes(), error=SysfsError)

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
    def from_tarball(cls, path: str | os.PathLike) -> MemoryTree:
        """Load a capture. Never extracts to disk, so member names cannot escape anywhere; read
        within the bounds of src/pcitopo/host/tarball.py, the tree's own entries and path bytes
        (the folders a name implies included) counted against them as it grows."""
        import lzma
        import tarfile
        import zlib

        from pcitopo.host.tarball import MAX_ENTRIES, MAX_PATH_BYTES, members

        name = os.fspath(path)
        tree = cls(name)
        tree.origin = name
        try:
            for m in members(name, MAX_ATTR_BYTES):
                if m.kind == "dir":
                    tree.add_dir(m.rel)
                elif m.kind == "link":
                    tree.add_link(m.rel, str(m.payload))
                else:
                    tree.add_file(m.rel, m.payload)
                if len(tree) > MAX_ENTRIES:
                    raise SysfsError(f"{name}: more than {MAX_ENTRIES} entries, not a capture")
                if tree.path_bytes > MAX_PATH_BYTES:
                    raise SysfsError(f"{name}: more than {MAX_PATH_BYTES} bytes of names and link targets, not a capture")
        except SysfsError:
            raise
        except (tarfile.TarError, OSError, EOFError, zlib.error, lzma.LZMAError) as e:  # gzip's and bz2's are OSErrors
            raise SysfsError(_not_a_capture(name, e)) from None
        return tree


SYSFS_KINDS = "/sys, a directory laid out like sysfs, a capture .tar.gz from `pcitopo capture`, or a fixture directory"


def _not_a_capture(name: str, e: BaseException) -> str:
    """One line for a --sysfs file that is not a capture (tarfile's own message
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


# What a tree lacking these links cannot tell (``pcitopo capture`` warns in the same words; the
# doctor, the prediction and ``xmlfix --check`` say unknown for it unless the source is whole).
LEFT_OUT = {"iommu_group": "IOMMU off, or left out of the source",
            "driver": "bound to no driver, or left out of the source"}
# ``pcitopo capture`` of a live sysfs records this member: the capture is as whole as its host.
WHOLE_MEMBER = "pcitopo/live-sysfs"
MOUNTINFO = "/proc/self/mountinfo"


def is_live_sysfs(path: str) -> bool:
    """Whether ``path`` is the root of a mounted sysfs (``/sys``, or the node's ``/host/sys``
    under ``kubectl debug node/...``): then this machine's /proc/cpuinfo is the node's CPU, and a
    link it lacks is absent. The mount table says so (the mount point that holds ``path``, and its
    filesystem type)."""
    real = os.path.realpath(path)
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="replace") as fh:
            mounts = [line.split(" - ", 1) for line in fh]
    except OSError:
        return False
    # fields: id parent major:minor root mount-point options ... - fstype source super-options
    return any(len(m) == 2 and len(m[0].split()) > 4 and m[0].split()[4] == real and m[1].split()[:1] == ["sysfs"]
               for m in mounts)


def is_whole(source: object) -> bool:
    """Whether ``source`` (None: a model built in memory) says a link it lacks is absent."""
    return source is None or bool(getattr(source, "whole", True))


def _read_back(tree: MemoryTree) -> MemoryTree:
    tree.whole = isinstance(tree.read(WHOLE_MEMBER), bytes)
    return tree
def path_label(path: str) -> str:
    """A source's name in outputs, the same however its path was typed (relative, absolute,
    through a symlink, from any directory): the last component of its real path, and the one
    above it when the last says only what kind of file it is (a fixture's ``sysfs.tar.gz`` or
    ``sysfs/``). Error messages keep the path as typed: that is what the user can act on."""
    real = os.path.realpath(path)
    base = os.path.basename(real)
    if base in ("sysfs.tar.gz", "sysfs"):
        return f"{os.path.basename(os.path.dirname(real))}/{base}"
    return base


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
            return _read_back(MemoryTree.from_tarball(tarball))
        raise SysfsError(f"{p}: no {PCI_DEVICES_DIR} here, and no sysfs.tar.gz or sysfs/ inside")
    if os.path.isfile(p):
        tree = _read_back(MemoryTree.from_tarball(p))
        tree.cpu_is_local = False  # a capture from another host: its width is the recorded one
        return tree
    raise SysfsError(f"{p}: no such sysfs directory or capture")
