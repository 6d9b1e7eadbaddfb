"""Reading a capture tarball (``pcitopo capture``'s ``.tar.gz``) within fixed bounds.

A capture is untrusted input (``--sysfs`` takes whatever file it is given), and ``tarfile`` on
its own is not bounded: it keeps every member it has read (``TarFile.members``), reads a PAX or
GNU long-name header whole however large it says it is, and seeks through a member's claimed
size. So the members are read one at a time and dropped, the decompressed stream refuses any
one read larger than a header can be and any position past :data:`MAX_STREAM_BYTES`, and the
caller's tree counts its entries and path bytes (:data:`MAX_ENTRIES`, :data:`MAX_PATH_BYTES`).
Every bound breached is one line (:class:`SysfsError`), before the memory is spent.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
from typing import BinaryIO, Iterator, NamedTuple

from pcitopo.errors import SysfsError

# A capture of a host with 4,096 VFs (fixtures/sriov-4k) has 96k members and 6.7 MB of names;
# these leave room for twice that host and stop a hostile file in about a second.
MAX_ENTRIES = 250_000  # members and the folders they imply
MAX_PATH_BYTES = 32 * 1024 * 1024  # every entry's path in the tree, and the link targets
MAX_NAME_BYTES = 4096  # one name or link target: Linux's PATH_MAX
MAX_CONTENT_BYTES = 256 * 1024 * 1024  # the attribute files' bytes together
MAX_STREAM_BYTES = 1024 * 1024 * 1024  # the tar stream, headers included, decompressed
MAX_HEADER_READ = 64 * 1024  # a PAX header of two PATH_MAX names is < 10 KiB


class Member(NamedTuple):
    """One capture entry: ``kind`` is ``dir``, ``link`` (``payload``: the target) or ``file``
    (``payload``: its bytes)."""

    rel: str
    kind: str
    payload: str | bytes


class _Bounded(io.RawIOBase):
    """The decompressed tar stream as ``tarfile`` reads it, with a cap on each read and on the
    position (a seek is checked before the decompressor runs through it)."""

    def __init__(self, inner: BinaryIO, name: str):
        self._inner, self._name = inner, name

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._inner.tell()

    def _check(self, end: int) -> None:
        if end > MAX_STREAM_BYTES:
            raise SysfsError(f"{self._name}: more than {MAX_STREAM_BYTES} bytes of tar stream, not a capture")

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > MAX_HEADER_READ:
            raise SysfsError(f"{self._name}: a member header or name of more than {MAX_HEADER_READ} bytes, not a capture")
        self._check(self._inner.tell() + size)
        return self._inner.read(size)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = offset if whence == io.SEEK_SET else self._inner.tell() + offset if whence == io.SEEK_CUR else -1
        if target < 0:
            raise SysfsError(f"{self._name}: a seek tarfile should never make, not a capture")
        self._check(target)
        return self._inner.seek(target)


def _decompressed(raw: BinaryIO) -> BinaryIO:
    head = raw.read(6)
    raw.seek(0)
    if head.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if head.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if head.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return raw


_HEADER_TYPES = (b"x", b"g", b"L", b"K")  # PAX and GNU headers: their data is the next member's names
_NO_DATA_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6")  # what tarfile does not skip a size for
_SCAN_CHUNK = 256 * 1024


def _count_members(stream: BinaryIO, name: str) -> None:
    """Refuse a tarball with too many members before ``tarfile`` parses any (it takes ~30 us a
    member; this scan a few): walks the 512-byte headers a chunk at a time, skipping data as
    tarfile does, and stops quietly at anything unusual (sparse files, bad numbers), which
    tarfile then reads under its own bounds."""
    count = 0
    chunk, at, base = b"", 0, 0  # ``chunk`` holds the stream from ``base``; ``at`` is in it
    while True:
        if at + 512 > len(chunk):
            stream.seek(base + at)
            base, chunk, at = base + at, stream.read(_SCAN_CHUNK), 0
            if len(chunk) < 512:
                return
        block = chunk[at:at + 512]
        if not block.strip(b"\0"):
            return
        kind = block[156:157]
        try:
            size = int(block[124:136].strip(b"\0 ") or b"0", 8)
        except ValueError:
            return
        if kind == b"S":
            return
        if kind in _HEADER_TYPES:
            if size > MAX_HEADER_READ:
                raise SysfsError(f"{name}: a member header or name of more than {MAX_HEADER_READ} bytes, not a capture")
        else:
            count += 1
            if count > MAX_ENTRIES:
                raise SysfsError(f"{name}: more than {MAX_ENTRIES} members, not a capture")
        at += 512 + (0 if kind in _NO_DATA_TYPES else -(-size // 512) * 512)
        if base + at > MAX_STREAM_BYTES:
            raise SysfsError(f"{name}: more than {MAX_STREAM_BYTES} bytes of tar stream, not a capture")


def members(name: str, max_file_bytes: int) -> Iterator[Member]:
    """The capture's entries in file order, each read and dropped before the next (directories,
    links and regular files; hard links, devices and FIFOs are not part of a capture and are
    skipped). One line when a bound is breached or the file is not a tarball."""
    total = 0
    with open(name, "rb") as raw, _decompressed(raw) as stream:
        _count_members(stream, name)
        stream.seek(0)
        with tarfile.open(fileobj=_Bounded(stream, name), mode="r:") as tar:  # type: ignore[arg-type]
            count = 0
            while True:
                member = tar.next()
                tar.members.clear()  # tarfile keeps every member it read; a capture needs none back
                if member is None:
                    return
                count += 1
                if count > MAX_ENTRIES:
                    raise SysfsError(f"{name}: more than {MAX_ENTRIES} members, not a capture")
                rel = member.name[2:] if member.name.startswith("./") else member.name
                if len(member.name) > MAX_NAME_BYTES or len(member.linkname) > MAX_NAME_BYTES:
                    raise SysfsError(f"{name}: a member name or link target longer than {MAX_NAME_BYTES} bytes, not a capture")
                if not rel or rel == ".":
                    continue
                if member.isdir():
                    yield Member(rel, "dir", "")
                elif member.issym():
                    yield Member(rel, "link", member.linkname)
                elif member.isfile():
                    if member.size > max_file_bytes:
                        raise SysfsError(f"{name}: member {rel} is {member.size} bytes, not a sysfs attribute")
                    total += member.size
                    if total > MAX_CONTENT_BYTES:
                        raise SysfsError(f"{name}: more than {MAX_CONTENT_BYTES} bytes of content")
                    fh = tar.extractfile(member)
                    yield Member(rel, "file", fh.read() if fh else b"")
