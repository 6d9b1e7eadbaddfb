"""The deploy targets: one folder under ``deploy/targets/`` per KubeVirt release line, and what each
one puts into a cluster, built from the release table (src/pcitopo/kubevirt/releases.py ``TARGETS``: a target
fits only the read releases the table gives it). ``pcitopo preflight --target NAME`` judges a
cluster against it; tests render each folder with ``kubectl kustomize`` and keep it equal to its row (gates, Plugin
objects, node hook, the Sidecar policy, the DaemonSet's node affinity).

Why the v1.9.0 target creates no Plugin object: on v1.9.0, once any Plugin object exists,
virt-launcher rebuilds every domain through libvirt-go-xml-module, which refuses a PCI hostdev
without ``mode``, and KubeVirt writes none (kubevirt#18861; PR #18866, open, is in no read release).
Every VM with a PCI host device in the cluster (anyone's) would stop starting. Without a Plugin
object virt-launcher defines the hook sidecar's reply as sent, which keeps every setting pcitopo
writes, so on v1.9.0 the hook sidecar is the whole door; the doctor's ``require`` is enforced by
the hook itself at define time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pcitopo.errors import ConfigError
from pcitopo.kubevirt.releases import TARGETS as RELEASE_TARGETS, ReleaseUnknown, resolve


@dataclass(frozen=True)
class Target:
    name: str  # the folder under deploy/targets/
    releases: str  # for people: the read releases it is for (releases.py)
    doors: tuple[str, ...]  # "hook", "plugin"
    gates: tuple[str, ...]  # KubeVirt feature gates the target's doors need (its gate patch lists them)
    plugin_objects: tuple[str, ...]  # names of the Plugin objects it creates
    node_hook: bool  # the DaemonSet serves a Plugin node hook
    sidecar_policy: bool  # it carries the ValidatingAdmissionPolicy for hooks.kubevirt.io/hookSidecars

    def fits(self, version: str) -> bool:
        """Whether ``version`` is a read release this target is for (an unread one fits none)."""
        try:
            return resolve(version).target == self.name
        except ReleaseUnknown:
            return False


TARGETS: tuple[Target, ...] = tuple(Target(t.name, t.releases, t.doors, t.gates, t.plugin_objects, t.node_hook,
                                           t.sidecar_policy) for t in RELEASE_TARGETS)

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(version: str | None) -> tuple[int, int, int] | None:
    """``v1.9.0`` -> (1, 9, 0); ``v1.10.0-alpha.0.12+abc`` -> (1, 10, 0); anything else None."""
    m = _VERSION.match(version or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def target(name: str) -> Target:
    for t in TARGETS:
        if t.name == name:
            return t
    raise ConfigError(f"unknown target {name!r}: one of {', '.join(t.name for t in TARGETS)} (folders under deploy/targets/)")
