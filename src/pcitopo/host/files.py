"""The files pcitopo is named on a command line: one bounded reader and one writer for every
layer (the guest tool too, so standard library only and Python 3.8). They live in host/, the
lowest room that reads a file a user names: below it, program.py reads only git's HEAD for
``--version`` and model/cpuinfo.py a prefix of the kernel's /proc/cpuinfo (as host/sources.py
reads sysfs attributes), and every room above host may import them.

- :func:`read_bounded`: a file or ``-`` (standard input), never more than a stated number of
  bytes in memory, so ``/dev/zero`` or a runaway pipe is one line, not a MemoryError.
- :func:`write_atomic`: every file pcitopo writes (``xmlfix -o``, ``pcitopo capture -o``,
  ``pcitopo guest-tool -o``, the doctor's outputs, NCCL's topology file in a guest). Root runs
  these in folders other components share, so:

  - a regular file (or none) is replaced whole or not at all: a temporary file with a random
    name made with O_CREAT|O_EXCL|O_NOFOLLOW beside it, then a rename. Nothing planted at a
    temporary name is written through, and readers (node-exporter, NFD) never see half a file;
  - a symlink at the path is replaced, never followed, whatever it points to;
  - a character device or a FIFO (``/dev/null``, a named pipe) is written in place, never
    replaced: renaming over ``/dev/null`` as root leaves the node without its null device;
  - a block device, a socket or a directory is refused in one line;
  - ``-`` is standard output; ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N`` and
    ``/proc/self/fd/N`` name the descriptor this process already holds (as gawk reads those
    names), written in place: they are links, and replacing ``/dev/stdout`` would break it for
    everyone.
"""

from __future__ import annotations

import binascii
import os
import re
import stat
import sys

from pcitopo.errors import ConfigError, OutputError, PcitopoError

TMP_SUFFIX = ".pcitopo-tmp"  # write_atomic's temporary files: .<name>.<random>.pcitopo-tmp
_TMP_TRIES = 1000
# The names of descriptors this process holds (see the module docstring).
_STREAM_NAME = re.compile(r"/dev/(?:stdout|stderr|fd/(\d+))|/proc/self/fd/(\d+)")
_STREAMS = {"-": 1, "/dev/stdout": 1, "/dev/stderr": 2}


def read_bounded(path: str, limit: int, what: str, error: type[PcitopoError] = ConfigError) -> bytes:
    """The bytes of ``path`` (``-``: standard input, which can be read once only: read it here
    and hand the bytes on), at most ``limit``; one line naming ``what`` when it cannot be read or
    is larger."""
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as fh:
                data = fh.read(limit + 1)
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise error(f"{what} {path} is larger than {limit} bytes")
    return data


def write_atomic(path: str, data: bytes | str, mode: int = 0o644,
                 error: type[PcitopoError] = OutputError) -> None:
    """Write ``data`` (text is UTF-8) to ``path`` as the module docstring says; ``mode`` is a
    new file's permission bits. One line (``error``) on any failure, nothing left behind."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        fd = _stream_fd(path)
        if fd in (1, 2):  # through Python's stream, after what the command printed before
            stream = sys.stdout if fd == 1 else sys.stderr
            stream.flush()
            stream.buffer.write(data)
            stream.flush()
            return
        if fd is not None:
            _write_all(fd, data)
            return
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is None or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
            _replace(path, data, mode)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            _write_in_place(path, data, error)
        else:
            raise error(f"cannot write {path}: it is {_kind(st.st_mode)}, not a file; give a file name")
    except OSError as e:
        raise error(f"cannot write {path}: {e.strerror or e}") from None


def _stream_fd(path: str) -> int | None:
    if path in _STREAMS:
        return _STREAMS[path]
    m = _STREAM_NAME.fullmatch(os.path.normpath(path))
    if m is None:
        return None
    return _STREAMS.get(m.group(0), int(m.group(1) or m.group(2) or -1))


def _kind(mode: int) -> str:
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "not a regular file"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _write_in_place(path: str, data: bytes, error: type[PcitopoError]) -> None:
    """A character device or FIFO, opened without following a link and without truncating;
    refused if it turned into something else since it was looked at."""
    fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):
            raise error(f"cannot write {path}: it changed while being opened; nothing written")
        _write_all(fd, data)
    finally:
        os.close(fd)


def _candidate() -> str:
    return binascii.hexlify(os.urandom(8)).decode()


def _replace(path: str, data: bytes, mode: int) -> None:
    directory, name = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    for _ in range(_TMP_TRIES):
        tmp = os.path.join(directory, f".{name}.{_candidate()}{TMP_SUFFIX}")
        try:
            fd = os.open(tmp, flags, 0o600)
            break
        except FileExistsError:  # something already there, a planted link included: another name
            continue
    else:
        raise FileExistsError(f"no free temporary name beside it after {_TMP_TRIES} tries")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), mode)  # on the open file: nothing planted meanwhile is chmod-ed
            fh.write(data)
        os.replace(tmp, path)  # a link at ``path`` is replaced, not followed
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
