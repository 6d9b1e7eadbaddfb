"""The deploy targets: one folder under ``deploy/targets/`` per KubeVirt release line, and what each
one puts into a cluster. ``pcitopo preflight --target NAME`` judges a cluster against this table;
tests render each folder with ``kubectl kustomize`` and keep it equal to its row (gates, Plugin
objects, node hook, the Sidecar policy, the DaemonSet's node affinity).

Why the v1.9.0 target creates no Plugin object: on v1.9.0, once any Plugin object exists,
virt-launcher rebuilds every domain through libvirt-go-xml-module, which refuses a PCI hostdev
without ``mode``, and KubeVirt writes none (kubevirt#18861, fixed by PR #18866, not in v1.9.0).
Every VM with a PCI host device in the cluster (anyone's) would stop starting. Without a Plugin
object virt-launcher defines the hook sidecar's reply as sent, which keeps every setting pcitopo
writes, so on v1.9.0 the hook sidecar is the whole door; the doctor's ``require`` is enforced by
the hook itself at define time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pcitopo.topology.errors import ConfigError

@dataclass(frozen=True)
class Target:
    name: str  # the folder under deploy/targets/
    releases: str  # for people: "v1.6 - v1.8"
    doors: tuple[str, ...]  # "hook", "plugin"
    gates: tuple[str, ...]  # KubeVirt feature gates the target's doors need (its gate patch lists them)
    plugin_objects: tuple[str, ...]  # names of the Plugin objects it creates
    node_hook: bool  # the DaemonSet serves a Plugin node hook
    sidecar_policy: bool  # it carries the ValidatingAdmissionPolicy for hooks.kubevirt.io/hookSidecars
    min_version: tuple[int, int, int]
    below_version: tuple[int, int, int] | None  # None: no upper bound

    def fits(self, version: str) -> bool:
        v = parse_version(version)
        return v is not None and self.min_version <= v and (self.below_version is None or v < self.below_version)


TARGETS: tuple[Target, ...] = (
    Target("kubevirt-v1.6-v1.8", "v1.6 - v1.8", ("hook",), ("Sidecar",), (), False, True, (1, 6, 0), (1, 9, 0)),
    Target("kubevirt-v1.9.0", "v1.9.x (kubevirt#18861 open)", ("hook",), ("Sidecar",), (), False, True,
           (1, 9, 0), (1, 10, 0)),
    # Assumed: the first release after the v1.9 line carries PR #18866 (it is on main, not in v1.9.0).
    Target("kubevirt-main", "main, and releases with PR #18866", ("plugin",), ("Plugins",), ("pcitopo",), True, False,
           (1, 10, 0), None),
)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(version: str | None) -> tuple[int, int, int] | None:
    """``v1.9.0`` -> (1, 9, 0); ``v1.10.0-alpha.0.12+abc`` -> (1, 10, 0); anything else None."""
    m = _VERSION.match(version or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


_DEV_BUILD = re.compile(r"-(alpha|beta|rc)\.\d+\.\d+|\+")


def is_dev_build(version: str | None) -> bool:
    """A build between tags: KubeVirt's hack/version.sh writes ``git describe`` (a main build after
    the tag v1.9.0-beta.0 reports ``v1.9.0-beta.0.1264+d923fdb815cd20``), so its version does not
    say whether it carries a fix merged after that tag, such as PR #18866."""
    return bool(_DEV_BUILD.search(version or ""))


def target(name: str) -> Target:
    for t in TARGETS:
        if t.name == name:
            return t
    raise ConfigError(f"unknown target {name!r}: one of {', '.join(t.name for t in TARGETS)} (folders under deploy/targets/)")
