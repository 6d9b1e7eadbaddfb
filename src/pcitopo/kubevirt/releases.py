"""Every KubeVirt release fact the commands use, in one table: which releases pcitopo read (and
judges), the deploy target of each, the doors and gates, what the re-parse between hook calls
keeps, the start rules (Plugin API, KubeVirt writing the hostdev ``mode``), and the Plugin API as
read at one commit of KubeVirt main. ``targets.py``, ``doors.py``, ``launcher/releases.py`` and
``starts.py`` derive from it; docs/DEPLOY.md's tables are held equal to it by tests.

pcitopo judges only what it read (docs/SOURCES.md, "The release table"): the tags v1.6.0 to
v1.8.4 and v1.9.0, and main at :data:`MAIN_COMMIT`. Any other version (v1.9.1, v1.10.0, a vendor
build, a build of a later main) is :class:`ReleaseUnknown`: the commands say ``unknown`` (exit 4),
name the read release it would resemble, and judge it as one only when told so
(``--assume-release``). ``main+pr18866`` is main at that commit with kubevirt PR #18866 (open
there) applied: the one change the Plugin door waits for, read from the PR, for a release whose
notes list it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The commit of kubevirt/kubevirt main whose Plugin API (staging/src/kubevirt.io/api/plugin/v1alpha1/
# types.go: PluginSpec.DomainHooks, json "domainHooks") deploy/targets/kubevirt-main is written against.
MAIN_COMMIT = "d923fdb815cd2016ddaebdaaa51db04133576d72"
MAIN_DATE = "2026-08-22"
PLUGIN_API = "plugin.kubevirt.io/v1alpha1 with domainHooks"
# VEP 190 Alpha 2: what a later main may have done to the Plugin API pcitopo read.
NEXT_PLUGIN_API = ("VEP 190 Alpha 2 (kubevirt/enhancements#407) renames domainHooks to launcherHooks, and kubevirt "
                   "PR #19160 implements it")


@dataclass(frozen=True)
class Reparse:
    """A group of releases whose ``api.DomainSpec`` reads the hook's XML alike (the re-parse
    between hook calls), and how its ``allocateHotplugPorts`` makes hotplug room."""

    name: str  # pcitopo.kubevirt.launcher.release_groups.Release's value
    label: str  # the releases, for people
    model_tag: str  # the tag the group is modelled on
    controller_target: bool  # api.Controller has Target (busNr, <node> kept)
    target_hotplug: bool  # ... and Target.Hotplug
    commandline_restored: bool  # <qemu:commandline> restored after the re-parse (TransferQEMUCommandline)
    empty_address_type: bool  # type="" on an address read without type (no omitempty)
    hostdev_driver: bool  # api.HostDevice has Driver
    os_firmware: bool
    hotplug_ports: str  # "placeholders", "append", "readback" (launcher/defines.py)


REPARSE = (
    Reparse("v1.7", "v1.6, v1.7", "v1.7.4", False, False, False, True, False, False, "placeholders"),
    Reparse("v1.8-1.9", "v1.8, v1.9", "v1.9.0", True, False, False, False, True, True, "append"),
    Reparse("main", "main", "main", True, True, True, False, True, True, "readback"),
)


@dataclass(frozen=True)
class ReadRelease:
    """A release pcitopo read, with what each command relies on."""

    name: str  # what --assume-release takes
    line: tuple[int, int] | None  # (1, 8); None for main
    patches: int  # the newest patch read on the line (every one from .0 was read)
    reparse: str  # a Reparse name
    target: str  # the deploy target (deploy/targets/NAME)
    plugins: bool  # the Plugin API and gate Plugins exist (v1.9.0 on)
    writes_mode: bool  # KubeVirt writes mode on PCI hostdevs itself (PR #18866)
    read_at: str  # what was read, for people

    @property
    def shown(self) -> str:
        """The release as the output names it: ``v1.6.0 - v1.6.6``, ``v1.9.0``, ``main at d923fdb8``."""
        if self.line is None:
            return self.read_at
        first = "v{}.{}.0".format(*self.line)
        return first if not self.patches else f"{first} - v{self.line[0]}.{self.line[1]}.{self.patches}"

    @property
    def newest(self) -> str:
        return self.name if self.line is None else "v{}.{}.{}".format(*self.line, self.patches)


RELEASES = (
    ReadRelease("v1.6", (1, 6), 6, "v1.7", "kubevirt-v1.6-v1.8", False, False, "tags v1.6.0 - v1.6.6"),
    ReadRelease("v1.7", (1, 7), 4, "v1.7", "kubevirt-v1.6-v1.8", False, False, "tags v1.7.0 - v1.7.4"),
    ReadRelease("v1.8", (1, 8), 4, "v1.8-1.9", "kubevirt-v1.6-v1.8", False, False, "tags v1.8.0 - v1.8.4"),
    ReadRelease("v1.9", (1, 9), 0, "v1.8-1.9", "kubevirt-v1.9.0", True, False, "tag v1.9.0"),
    ReadRelease("main", None, 0, "main", "kubevirt-main", True, False, f"main at {MAIN_COMMIT[:8]}"),
    ReadRelease("main+pr18866", None, 0, "main", "kubevirt-main", True, True,
                f"main+pr18866 (kubevirt PR #18866 on main at {MAIN_COMMIT[:8]})"),
)
NEWEST_TAG = "v1.9"  # the row of the newest tag read: what an unread later tag resembles
DEFAULT_VERSION = "v1.9.0"  # what is judged without --kubevirt, --cluster or --assume-release (said as assumed)


@dataclass(frozen=True)
class TargetFacts:
    """A deploy target: what it puts into a cluster (tests render deploy/targets/NAME and compare)."""

    name: str
    doors: tuple[str, ...]  # "hook", "plugin"
    gates: tuple[str, ...]  # the KubeVirt feature gates its gate patch adds
    plugin_objects: tuple[str, ...]  # the Plugin objects it creates
    node_hook: bool  # its DaemonSet serves a Plugin node hook
    sidecar_policy: bool  # it carries the ValidatingAdmissionPolicies for hooks.kubevirt.io/hookSidecars

    @property
    def releases(self) -> str:
        """The read releases it is for, in the table's words."""
        return ", ".join(r.shown for r in RELEASES if r.target == self.name)


TARGETS = (
    TargetFacts("kubevirt-v1.6-v1.8", ("hook",), ("Sidecar",), (), False, True),
    TargetFacts("kubevirt-v1.9.0", ("hook",), ("Sidecar",), (), False, True),
    TargetFacts("kubevirt-main", ("plugin",), ("Plugins",), ("pcitopo",), True, False),
)


@dataclass(frozen=True)
class DoorRow:
    """Which door to run on which releases, and what reaches libvirt through it (docs/DEPLOY.md,
    "Two doors"; ``xmlfix --explain``)."""

    releases: str
    doors: str
    gates: str
    survives: str


DOOR_ROWS = (
    DoorRow("v1.6 - v1.8", "hook sidecar", "Sidecar", "everything (the last OnDefineDomain reply is defined as sent)"),
    DoorRow(f"v1.9.0 or main at {MAIN_COMMIT[:8]}, no Plugin CR in the cluster", "hook sidecar", "Sidecar",
            "everything, as on v1.8"),
    DoorRow(f"v1.9.0 or main at {MAIN_COMMIT[:8]} with Plugins (kubevirt#18861 open)", "hook sidecar and Plugin, both",
            "Sidecar, Plugins",
            "everything: the hook's mode='subsystem' lets the pipeline read the domain, the Plugin re-makes what the "
            "struct re-parse drops; without the hook no GPU VM starts"),
    DoorRow("main+pr18866: a release with kubevirt PR #18866", "Plugin (recommended)", "Plugins",
            "everything; the hook sidecar alone would lose maxphysaddr, qemu:override and model names"),
)

DOOR_NOTES = {
    "plugin": (
        f"door: the pcitopo Plugin ({DOOR_ROWS[3].releases}; gate Plugins): virt-launcher defines "
        "libvirt-go-xml-module's reading of this domain, which keeps every setting above. On v1.9.0 and on main at "
        f"{MAIN_COMMIT[:8]} KubeVirt writes PCI hostdevs without mode, so any Plugin object stops every VM with a PCI "
        "host device that pcitopo's hook sidecar does not attach to (kubevirt#18861): there, run the hook sidecar and "
        "create no Plugin object."
    ),
    "hook": (
        f"door: the hook sidecar ({DOOR_ROWS[0].releases}, {DOOR_ROWS[1].releases}; deprecated upstream since v1.9): "
        "virt-launcher defines this domain as sent while no Plugin CR exists in the cluster. With any Plugin (v1.9.0 "
        "on), it rebuilds the domain from its own struct: maxphysaddr, qemu:override and controller model names are "
        "lost unless the pcitopo Plugin runs too."
    ),
}


class ReleaseUnknown(Exception):
    """A KubeVirt version pcitopo did not read: the commands say ``unknown`` (exit 4) with
    :attr:`line`, never a verdict."""

    def __init__(self, seen: str, resembles: str | None, newer_main: bool = False) -> None:
        self.seen, self.resembles, self.newer_main = seen, resembles, newer_main
        super().__init__(self.line)

    @property
    def line(self) -> str:
        read = ", ".join(r.shown for r in RELEASES[:-1])
        what = (f"a build of KubeVirt main other than {MAIN_COMMIT[:8]}, the commit pcitopo read ({MAIN_DATE})"
                if self.newer_main else f"not a KubeVirt release pcitopo read (it read {read})")
        head = f"KubeVirt {self.seen or '(no version)'} is {what}"
        if self.resembles is None:
            return (f"{head}; it resembles none of them: name the read release it is with --assume-release "
                    f"({read_list()})")
        also = (" (or main+pr18866 if they list kubevirt PR #18866)" if self.resembles == NEWEST_TAG
                else " once you know its Plugin API still has domainHooks" if self.newer_main else "")
        shown = row(self.resembles).newest
        return (f"{head}; it would resemble {shown}: check its release notes, then judge it as that with "
                f"--assume-release {shown}{also}")


def read_list() -> str:
    """What --assume-release takes, for a message: the read releases and how to name them."""
    return (", ".join(r.shown if r.line else r.name for r in RELEASES)
            + " (a line alone, v1.8 say, is its newest patch)")


def names() -> list[str]:
    """What --assume-release takes: every read tag, its line, and main."""
    out = []
    for r in RELEASES:
        if r.line is None:
            out.append(r.name)
        else:
            out += [r.name] + [f"{r.name}.{p}" for p in range(r.patches + 1)]
    return out


def row(name: str) -> ReadRelease:
    for r in RELEASES:
        if r.name == name:
            return r
    raise KeyError(name)


_VERSION = re.compile(r"v?(\d+)\.(\d+)(?:\.(\d+))?(.*)", re.S)
_MAIN_BUILD = re.compile(r"-(?:alpha|beta|rc)\.\d+(?:\.\d+\+([0-9a-f]{7,40}))?")


def is_version(text: str) -> bool:
    """Shaped like a KubeVirt version (``v1.10.0``, ``1.9``, ``v1.9.0-vendor.3``) or ``main``."""
    return text.strip() in ("main", "main+pr18866") or _VERSION.fullmatch(text.strip()) is not None


def resolve(version: str | None) -> ReadRelease:
    """The read release ``version`` is: a read tag (``v`` optional; a line alone is its newest
    patch), ``main``, ``main+pr18866``, or a build of main at :data:`MAIN_COMMIT` (KubeVirt's
    hack/version.sh writes ``git describe`` as semver: ``v1.9.0-beta.0.1264+d923fdb815cd20``). Anything else
    raises :class:`ReleaseUnknown` naming the read release it would resemble."""
    text = (version or "").strip()
    if text in ("main", "main+pr18866"):
        return row(text)
    m = _VERSION.fullmatch(text)
    if m is None:
        raise ReleaseUnknown(text, None)
    line, patch, suffix = (int(m[1]), int(m[2])), m[3], m[4]
    known = next((r for r in RELEASES if r.line == line), None)
    newest = row(NEWEST_TAG).line
    build = _MAIN_BUILD.fullmatch(suffix) if suffix else None
    if build and build[1] and MAIN_COMMIT.startswith(build[1]):
        return row("main")  # KubeVirt's own build of the commit read
    if build and (build[1] or line > newest):  # a build of main (v1.10.0-alpha.0 is tagged on main)
        raise ReleaseUnknown(text, "main", newer_main=True)
    if known is None:
        raise ReleaseUnknown(text, NEWEST_TAG if line > newest else None)
    if suffix or (patch is not None and int(patch) > known.patches):
        raise ReleaseUnknown(text, known.name)
    return known


def check_kubevirt(text: str, option: str = "--kubevirt") -> str:
    """A release named on the command line: a KubeVirt version (read or not: an unread one is
    judged ``unknown`` later) or ``main``; anything else is one line (exit 2)."""
    from pcitopo.errors import ConfigError

    if not is_version(text):
        raise ConfigError(f"{option} {text}: not a KubeVirt release such as v1.9.0 or main (read: {read_list()})")
    return text.strip()


def check_assumed(text: str) -> str:
    """``--assume-release``'s value: a read release by name, else one line (exit 2)."""
    from pcitopo.errors import ConfigError

    name = text.strip()
    name = name if name.startswith(("v", "main")) else f"v{name}"
    if name not in names():
        raise ConfigError(f"--assume-release {text}: not a release pcitopo read: one of {read_list()}")
    return name


def judged_as(seen: str | None, assume: str | None) -> tuple[str, str]:
    """The release to judge and what was assumed ("" when nothing was). A read ``seen`` is judged
    as itself, whatever ``assume`` says (said when they differ); an unread or missing one only as
    ``assume`` (an ``--assume-release`` value, checked), else :class:`ReleaseUnknown`."""
    name = check_assumed(assume) if assume else None
    try:
        read = resolve(seen) if seen else None
    except ReleaseUnknown:
        if name is None:
            raise
        read = None
    if read is not None:
        ignored = name is not None and resolve(name) != read
        return str(seen).strip(), f"--assume-release {name} not used: {seen} is a release pcitopo read" if ignored else ""
    if name is None:
        resolve(seen)  # raises: no version at all
    return name, f"KubeVirt {seen or '(no version)'} judged as {name} (--assume-release)"
