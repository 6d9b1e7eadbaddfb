"""Which door pcitopo comes through, per KubeVirt release, and what reaches libvirt through it:
one table for ``xmlfix --explain --door``, the serving log line and docs/DEPLOY.md ("Two doors").

Facts (kubevirt/kubevirt, user-guide; docs/SOURCES.md, "KubeVirt Plugins"):
- hook sidecars (``hooks.kubevirt.io/hookSidecars``, gate ``Sidecar``): v1.6 on; the user guide
  marks them deprecated since v1.9; the gate is still Alpha in v1.9.0 and main;
- Plugins (VEP 190, gate ``Plugins``): Alpha since v1.9.0; with any Plugin CR in the cluster,
  virt-launcher rebuilds every domain through libvirt-go-xml-module after the legacy hooks,
  and a PCI hostdev without ``mode`` stops the VM (kubevirt#18861, fix PR #18866 open at
  v1.9.0 and main as of 2026-08).
"""

from __future__ import annotations

from dataclasses import dataclass

DOORS = ("plugin", "hook")
DEFAULT_DOOR = "plugin"
# The label a VMI carries to be selected by the pcitopo Plugin's conditions (deploy/targets/kubevirt-main):
# virt-controller copies a VMI's labels to its virt-launcher pod, where the admission policy
# that injects the plugin's container matches it too.
PLUGIN_LABEL = "pcitopo.kubevirt.io/plugin"
PLUGIN_LABEL_VALUE = "true"
# The Plugin object deploy/targets/kubevirt-main creates: its name is also the folder of its domain hook's socket
# (/var/run/kubevirt-plugin/<name>/), so a cluster dump names pcitopo's Plugin by it.
PCITOPO_PLUGIN = "pcitopo"


@dataclass(frozen=True)
class ReleaseDoors:
    """One row of DEPLOY.md's table: a KubeVirt release, the doors to run, the gates, what survives."""

    release: str
    doors: str
    gates: str
    survives: str


RELEASES = (
    ReleaseDoors("v1.6 - v1.8", "hook sidecar", "Sidecar",
                 "everything (the last OnDefineDomain reply is defined as sent)"),
    ReleaseDoors("v1.9.0, no Plugin CR in the cluster", "hook sidecar", "Sidecar",
                 "everything, as on v1.8"),
    ReleaseDoors("v1.9.0 with Plugins (as released, kubevirt#18861 open)", "hook sidecar **and** Plugin, both",
                 "Sidecar, Plugins",
                 "everything: the hook's mode='subsystem' lets the pipeline read the domain, the Plugin re-makes "
                 "what the struct re-parse drops; without the hook no GPU VM starts"),
    ReleaseDoors("a release with kubevirt PR #18866", "Plugin (recommended)", "Plugins",
                 "everything; the hook sidecar alone would lose maxphysaddr, qemu:override and model names"),
)

DOOR_NOTES = {
    "plugin": (
        "door: the pcitopo Plugin (KubeVirt v1.9+, gate Plugins): virt-launcher defines libvirt-go-xml-module's "
        "reading of this domain, which keeps every setting above. Until KubeVirt carries PR #18866 (not in v1.9.0), "
        "run the hook sidecar as well: its hostdev mode is what lets a GPU VM start once any Plugin exists "
        "(kubevirt#18861)."
    ),
    "hook": (
        "door: the hook sidecar (KubeVirt v1.6-v1.8; deprecated upstream since v1.9): virt-launcher defines this "
        "domain as sent while no Plugin CR exists in the cluster. With any Plugin (v1.9+), it rebuilds the domain "
        "from its own struct: maxphysaddr, qemu:override and controller model names are lost unless the pcitopo "
        "Plugin runs too."
    ),
}


def plugin_selects(labels: dict | None) -> bool:
    """Whether the shipped Plugin's conditions select a VMI with these labels."""
    return (labels or {}).get(PLUGIN_LABEL) == PLUGIN_LABEL_VALUE


def door_text(door: str) -> str:
    """``xmlfix --explain``'s door section: the door assumed, then which door each release needs."""
    from pcitopo.topology.views.report import wrap_text

    rows = [f"- {r.release}: {r.doors.replace('**', '')} (gates {r.gates}): {r.survives}" for r in RELEASES]
    return wrap_text(DOOR_NOTES[door]) + "\n" + wrap_text("\n".join(["Which door, per KubeVirt release:", *rows])) + "\n"
