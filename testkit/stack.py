"""The virtualisation stacks the tests run: Debian 13's (what KubeVirt's users boot on) and the
machine's own Debian 12.

KubeVirt 1.8-1.9's virt-launcher ships QEMU 10.1, libvirt 11.9-11.10, SeaBIOS 1.16.3 and edk2
20241117. Debian 13 ("trixie") carries the nearest set (QEMU 10.0, libvirt 11.3, SeaBIOS 1.16.3, OVMF
2025.02); it cannot be installed on Debian 12, so ``scripts/setup-trixie.sh`` (``make setup``)
builds a trixie root with mmdebstrap under ``.cache/trixie/root`` and the guest-boot tier runs
its libvirtd and QEMU from there (tests/e2e/README.md). Debian 12's stack (QEMU 7.2, libvirt 9.0,
SeaBIOS 1.16.2, OVMF 2022.11) is the machine's own, kept for the schema check and for tests that
say why they need it.

:func:`debian13` / :data:`DEBIAN12` name a stack; :meth:`Stack.versions` reads what it really
carries (``qemu-system-x86_64 --version``, ``libvirtd --version``, the firmware packages'
versions from its dpkg database); :meth:`StackVersions.line` is the "tested with" line every
boot table prints.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testkit import REPO


class StackMissing(RuntimeError):
    """The stack is not set up here (the message names the command that sets it up)."""


@dataclass(frozen=True)
class StackVersions:
    """What a stack carries, as its binaries and its package database say."""

    stack: str  # "Debian 13 (trixie)"
    qemu: str  # "10.0.13"
    libvirt: str  # "11.3.0"
    seabios: str  # "1.16.3" (upstream part of the package version)
    ovmf: str  # "2025.02"
    packages: tuple[tuple[str, str], ...]  # (package, Debian version) of each of the above

    def line(self) -> str:
        """``Debian 13 (trixie): QEMU 10.0.13, libvirt 11.3.0, SeaBIOS 1.16.3, OVMF 2025.02
        (qemu-system-x86 1:10.0.13+ds-0+deb13u1, ...)``."""
        pkgs = ", ".join(f"{p} {v}" for p, v in self.packages)
        return f"{self.stack}: {self.short()} ({pkgs})"

    def short(self) -> str:
        """``QEMU 10.0.13, libvirt 11.3.0, SeaBIOS 1.16.3, OVMF 2025.02``."""
        return f"QEMU {self.qemu}, libvirt {self.libvirt}, SeaBIOS {self.seabios}, OVMF {self.ovmf}"

    def as_dict(self) -> dict[str, object]:
        return {"stack": self.stack, "qemu": self.qemu, "libvirt": self.libvirt,
                "seabios": self.seabios, "ovmf": self.ovmf, "packages": dict(self.packages)}


# (package, what it is in StackVersions)
_PACKAGES = (("qemu-system-x86", "qemu"), ("libvirt-daemon", "libvirt"), ("seabios", "seabios"),
             ("ovmf", "ovmf"))


@dataclass(frozen=True)
class Stack:
    """A root directory holding QEMU, libvirt and firmware; ``root is None`` is the machine's own."""

    name: str  # "debian13", "debian12"
    label: str  # "Debian 13 (trixie)"
    root: Path | None

    def path(self, inside: str) -> Path:
        """Where a path of the stack (``/usr/share/libvirt/schemas/domain.rng``) is on this machine."""
        return Path(inside) if self.root is None else self.root / inside.lstrip("/")

    def argv(self, *cmd: str) -> list[str]:
        """A command run from the stack (``chroot ROOT`` for a separate root: root only)."""
        return list(cmd) if self.root is None else ["chroot", str(self.root), *cmd]

    @property
    def domain_rng(self) -> Path:
        """The stack's libvirt domain RelaxNG schema."""
        return self.path("/usr/share/libvirt/schemas/domain.rng")

    def versions(self) -> StackVersions:
        return _versions(self)


DEBIAN12 = Stack("debian12", "Debian 12 (bookworm)", None)


def trixie_dir() -> Path:
    """``$PCITOPO_TRIXIE`` or ``<repo>/.cache/trixie`` (same rule as scripts/setup-trixie.sh)."""
    return Path(os.environ.get("PCITOPO_TRIXIE") or REPO / ".cache" / "trixie").resolve()


def debian13() -> Stack:
    """The Debian 13 root ``make setup`` built; :class:`StackMissing` if it is not there."""
    d = trixie_dir()
    root = d / "root"
    if not (d / "stamp").is_file() or not (root / "usr/bin/qemu-system-x86_64").exists():
        raise StackMissing(f"no Debian 13 root in {d}: run `bash scripts/setup-trixie.sh` (make setup)")
    return Stack("debian13", "Debian 13 (trixie)", root)


STACKS = {"debian13": debian13, "debian12": lambda: DEBIAN12}


def stack_named(name: str) -> Stack:
    try:
        return STACKS[name]()
    except KeyError:
        raise StackMissing(f"unknown stack {name!r}: one of {', '.join(STACKS)}") from None


def _dpkg_versions(stack: Stack) -> dict[str, str]:
    """Package versions from the stack's dpkg status file (readable without running anything)."""
    out: dict[str, str] = {}
    text = stack.path("/var/lib/dpkg/status").read_text(errors="replace")
    for para in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", para, re.M))
        if fields.get("Package") and "installed" in fields.get("Status", "").split():
            out[fields["Package"]] = fields.get("Version", "")
    return out


def _upstream(debian_version: str) -> str:
    """``1:10.0.13+ds-0+deb13u1`` → ``10.0.13``; ``2025.02-8+deb13u1`` → ``2025.02``."""
    v = debian_version.split(":", 1)[-1].rsplit("-", 1)[0]
    return re.split(r"[+~]", v, maxsplit=1)[0]


def _ran(stack: Stack, *cmd: str) -> str | None:
    """First line of a stack binary's output, or None where it cannot run (chroot needs root)."""
    if stack.root is not None and os.geteuid() != 0:
        return None
    try:
        r = subprocess.run(stack.argv(*cmd), capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None


@functools.cache
def _versions(stack: Stack) -> StackVersions:
    pkgs = _dpkg_versions(stack)
    missing = [p for p, _ in _PACKAGES if p not in pkgs]
    if missing:
        raise StackMissing(f"{stack.label}: {', '.join(missing)} not installed")
    up = {what: _upstream(pkgs[p]) for p, what in _PACKAGES}
    # the binaries' own word where they can run: "QEMU emulator version 10.0.13 (Debian ...)",
    # "libvirtd (libvirt) 11.3.0"
    qemu = _ran(stack, "qemu-system-x86_64", "--version")
    libvirt = _ran(stack, "libvirtd", "--version")
    if qemu and (m := re.search(r"version (\S+)", qemu)):
        up["qemu"] = m.group(1)
    if libvirt and (m := re.search(r"\) (\S+)$", libvirt)):
        up["libvirt"] = m.group(1)
    return StackVersions(stack.label, up["qemu"], up["libvirt"], up["seabios"], up["ovmf"],
                         tuple((p, pkgs[p]) for p, _ in _PACKAGES))


def main(argv: list[str] | None = None) -> int:
    """``python -m testkit.stack [--json]``: the "tested with" line (or JSON object) of every
    stack set up here."""
    import json
    import sys

    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    found: dict[str, dict[str, object]] = {}
    for name in STACKS:
        try:
            v = stack_named(name).versions()
        except StackMissing as e:
            print(f"{name}: {e}", file=sys.stderr)
            continue
        found[name] = v.as_dict()
        if not as_json:
            print(v.line())
    if as_json:
        print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
