"""Which door pcitopo comes through, per KubeVirt release, and what reaches libvirt through it:
the door rows and notes are the release table's (src/pcitopo/kubevirt/releases.py ``DOOR_ROWS``, ``DOOR_NOTES``),
which ``xmlfix --explain`` (src/pcitopo/cli/xmlfix.py), the serving log line and docs/DEPLOY.md ("Two doors") render.

Facts (kubevirt/kubevirt, user-guide; docs/SOURCES.md, "KubeVirt Plugins"):
- hook sidecars (``hooks.kubevirt.io/hookSidecars``, gate ``Sidecar``): v1.6 on; the user guide
  marks them deprecated since v1.9; the gate is still Alpha in v1.9.0 and main;
- Plugins (VEP 190, gate ``Plugins``): Alpha since v1.9.0; with any Plugin CR in the cluster,
  virt-launcher rebuilds every domain through libvirt-go-xml-module after the legacy hooks,
  and a PCI hostdev without ``mode`` stops the VM (kubevirt#18861, fix PR #18866 open at
  v1.9.0 and main as of 2026-08).
"""

from __future__ import annotations

DOORS = ("plugin", "hook")
# The label a VMI carries to be selected by the pcitopo Plugin's conditions (deploy/targets/kubevirt-main):
# virt-controller copies a VMI's labels to its virt-launcher pod, where the admission policy
# that injects the plugin's container matches it too.
PLUGIN_LABEL = "pcitopo.kubevirt.io/plugin"
PLUGIN_LABEL_VALUE = "true"
# The Plugin object deploy/targets/kubevirt-main creates: its name is also the folder of its domain hook's socket
# (/var/run/kubevirt-plugin/<name>/), so a cluster dump names pcitopo's Plugin by it.
PCITOPO_PLUGIN = "pcitopo"


def plugin_selects(labels: dict | None) -> bool:
    """Whether the shipped Plugin's conditions select a VMI with these labels."""
    return (labels or {}).get(PLUGIN_LABEL) == PLUGIN_LABEL_VALUE

