"""Which VMs start, per KubeVirt release: one model for ``pcitopo preflight`` and ``xmlfix --check``.

Given a VMI (a VirtualMachine read as the VMI it starts), the cluster that decides (release,
feature gates, Plugin objects) and the VMI's doors, :func:`judge` says one of: starts with all of
pcitopo's settings; starts but loses some (named); does not start; starts without pcitopo. Each
verdict carries one line naming the cause. The rules, read from KubeVirt's source at each tag
(docs/SOURCES.md, "Which VMs start, per release"):

- virt-api refuses a VMI whose ``hooks.kubevirt.io/hookSidecars`` is non-empty while gate
  ``Sidecar`` is off (``vmi-create-admitter.go``); virt-controller cannot render the launcher pod
  when the annotation does not parse (``hooks.UnmarshalHookSidecarList``): no start, any release.
- Plugins exist from v1.9.0 (gate ``Plugins``); virt-handler sends every Plugin object to every
  launcher only while the gate is on (``buildPluginsJSON``), and virt-launcher then runs the
  pipeline whatever the conditions (``SetDomainSpecStrWithHooks``): ``translate.ToLibvirtDomain``
  refuses a PCI hostdev without ``mode``, which KubeVirt writes (kubevirt#18861; PR #18866, open,
  is in no read release: the release table's ``writes_mode``). Only pcitopo's hook sets ``mode``.
- with any Plugin object, the hook's reply is first re-read into KubeVirt's struct
  (``ApplySidecarHooks``), which drops ``<maxphysaddr>``, ``<qemu:override>`` and controller model
  names; only a Plugin that selects the VMI (pcitopo's, by its label) writes them again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from pcitopo.kubevirt.cluster import mapping
from pcitopo.kubevirt.doors import PCITOPO_PLUGIN, PLUGIN_LABEL, PLUGIN_LABEL_VALUE, plugin_selects
from pcitopo.kubevirt.hostdevices import judge_names
from pcitopo.kubevirt.manifest import HOOK_SIDECARS, NOT_STARTED, hook_sidecar_attachment
from pcitopo.kubevirt.releases import DEFAULT_VERSION, ReadRelease, ReleaseUnknown, resolve

SIDECAR_GATE = "Sidecar"
PLUGINS_GATE = "Plugins"
# What KubeVirt's struct (api.DomainSpec) keeps no field for, in the order people know them.
SETTINGS = ("maxphysaddr", "qemu:override", "controller model names")


class Start(Enum):
    OK = "starts with all of pcitopo's settings"
    LOST = "starts but loses settings"
    NO_START = "does not start"
    DETACHED = "pcitopo not attached"


@dataclass(frozen=True)
class Verdict:
    start: Start
    cause: str
    lost: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.start is Start.OK

    @property
    def starts(self) -> bool:
        return self.start is not Start.NO_START

    @property
    def line(self) -> str:
        what = f"starts without {', '.join(self.lost)}" if self.start is Start.LOST else self.start.value
        return f"{what}: {self.cause}"


@dataclass(frozen=True)
class Cluster:
    """What decides whether a VM starts: the release, the enabled gates, the Plugin objects'
    names, and the device resources that are not PCI (mediated and USB devices carry ``mode``)."""

    release: str
    gates: frozenset[str] = frozenset()
    plugins: tuple[str, ...] = ()
    not_pci: frozenset[str] = frozenset()
    assumed: str = ""  # what was assumed and why ("" when all of it was read from a cluster)
    pcitopo_images: tuple[str, ...] = ()  # the images the admin pinned as pcitopo's (src/pcitopo/kubevirt/admitted.py)
    # the CR's permittedHostDevices (src/pcitopo/kubevirt/hostdevices.py) where preflight judges names; the
    # check judges them itself (xmlfix _device_facts), so that it says them once
    permitted: Any = None

    @property
    def read(self) -> ReadRelease:
        """The release table's row for :attr:`release` (a read release: callers resolve first)."""
        return resolve(self.release)

    @property
    def has_plugins_api(self) -> bool:
        return self.read.plugins

    @property
    def pipeline_runs(self) -> bool:
        """virt-launcher runs the Plugin pipeline for every VM: a Plugin object, the gate on."""
        return self.has_plugins_api and PLUGINS_GATE in self.gates and bool(self.plugins)

    @property
    def writes_mode(self) -> bool:
        """KubeVirt itself sets ``mode`` on PCI hostdevs (PR #18866)."""
        return self.read.writes_mode

    def with_target(self, tgt) -> Cluster:
        """The cluster after ``tgt`` (a :class:`~pcitopo.kubevirt.targets.Target`) is applied."""
        plugins = self.plugins + tuple(p for p in tgt.plugin_objects if p not in self.plugins)
        return replace(self, gates=self.gates | set(tgt.gates), plugins=plugins)

    def describe(self) -> str:
        gates = ", ".join(g for g in (SIDECAR_GATE, PLUGINS_GATE) if g in self.gates) or "neither Sidecar nor Plugins"
        plugins = f"Plugin objects {', '.join(self.plugins)}" if self.plugins else "no Plugin object"
        text = f"KubeVirt {self.release} (gates {gates}; {plugins})"
        return f"{text}, assumed: {self.assumed}" if self.assumed else text


def assumed_cluster(vmi: Mapping[str, Any], release: str, why: str, door: str | None = None) -> Cluster:
    """The cluster a VMI's doors imply on ``release``: the annotation implies gate Sidecar; the
    pcitopo label (or ``door`` plugin) implies gate Plugins and pcitopo's Plugin object, from
    v1.9.0 on; ``door`` hook implies no Plugin object."""
    labels, annotations = _labels(vmi), _annotations(vmi)
    gates = {SIDECAR_GATE} if annotations.get(HOOK_SIDECARS) else set()
    plugins: tuple[str, ...] = ()
    wants_plugin = door == "plugin" or (door is None and plugin_selects(labels))
    if wants_plugin and resolve(release).plugins:
        gates.add(PLUGINS_GATE)
        plugins = (PCITOPO_PLUGIN,)
    said = "the pcitopo Plugin object, as its label implies" if plugins else "no Plugin object"
    return Cluster(release, frozenset(gates), plugins, assumed=f"{why}; {said}")


def pci_devices(vmi: Mapping[str, Any], not_pci: Iterable[str] = ()) -> list[str]:
    """The VMI's devices that KubeVirt passes as PCI hostdevs: ``gpus`` and ``hostDevices``
    (device plugin or DRA claim), SR-IOV interfaces; mediated and USB resources aside."""
    devices = mapping(mapping(mapping(vmi.get("spec")).get("domain")).get("devices"))
    skip = set(not_pci)
    out = []
    for kind in ("gpus", "hostDevices"):
        for dev in devices.get(kind) or []:
            if isinstance(dev, Mapping) and (dev.get("claimName") or dev.get("deviceName") not in skip):
                out.append(f"{kind} {dev.get('name', '?')}")
    for iface in devices.get("interfaces") or []:
        if isinstance(iface, Mapping) and "sriov" in iface:
            out.append(f"SR-IOV interface {iface.get('name', '?')}")
    return out


def opted_in(vmi: Mapping[str, Any], pinned: tuple[str, ...] = ()) -> bool:
    """The VMI asks for pcitopo: its label, its hook, or any ``pcitopo.kubevirt.io/`` annotation."""
    annotations = _annotations(vmi)
    return (PLUGIN_LABEL in _labels(vmi) or hook_sidecar_attachment(annotations, pinned).attached
            or any(isinstance(k, str) and k.startswith("pcitopo.kubevirt.io/") for k in annotations))


def judge(vmi: Mapping[str, Any], cluster: Cluster, *, pci: bool | None = None,
          settings: tuple[str, ...] = SETTINGS) -> Verdict:
    """Whether ``vmi`` starts on ``cluster``, and with which of pcitopo's settings. ``pci``
    overrides what the VMI's spec says (the domain shows the hostdevs); ``settings`` are what the
    rewrite writes that KubeVirt's struct drops (:func:`lost_settings`)."""
    labels, annotations = _labels(vmi), _annotations(vmi)
    hook = hook_sidecar_attachment(annotations, cluster.pcitopo_images)
    rel = f"KubeVirt {cluster.release}"
    if hook.then == NOT_STARTED:
        return Verdict(Start.NO_START, f"{hook.why}; virt-controller cannot render the launcher pod (every release, either door)")
    if annotations.get(HOOK_SIDECARS) and SIDECAR_GATE not in cluster.gates:
        return Verdict(Start.NO_START, f"virt-api refuses a VMI with {HOOK_SIDECARS} while gate {SIDECAR_GATE} is off")
    refused = judge_names(vmi, cluster.permitted, ()).failed if cluster.permitted is not None else ()
    if refused:  # before any hostdev is judged: a USB device the CR does not list is not a PCI one
        return Verdict(Start.NO_START, refused[0].split(": ", 1)[1])
    devices = pci_devices(vmi, cluster.not_pci)
    has_pci = bool(devices) if pci is None else pci
    plugins = ", ".join(cluster.plugins)
    if cluster.pipeline_runs and has_pci and not hook.attached and not cluster.writes_mode:
        dev = devices[0] if devices else "its PCI host device"
        return Verdict(Start.NO_START, f"{rel} runs Plugin objects ({plugins}) for every VM and refuses {dev}: KubeVirt "
                       "writes its PCI hostdev without mode (kubevirt#18861); only pcitopo's hook sidecar sets it")
    ours = cluster.pipeline_runs and PCITOPO_PLUGIN in cluster.plugins and plugin_selects(labels)
    if ours and hook.attached:
        return Verdict(Start.OK, f"both doors on {rel}: the hook's mode='subsystem' lets the Plugin pipeline read "
                       "the domain, the pcitopo Plugin writes the settings again")
    if ours:
        return Verdict(Start.OK, f"the pcitopo Plugin selects the VMI (label {PLUGIN_LABEL}) on {rel}")
    if hook.attached and cluster.pipeline_runs:
        return Verdict(Start.LOST, f"with Plugin objects ({plugins}) {rel} re-reads the hook sidecar's reply into its "
                       f"struct before the pipeline, and {_no_pcitopo_plugin(labels, cluster)}", settings)
    if hook.attached:
        return Verdict(Start.OK, f"the hook sidecar ({hook.why}); with no Plugin pipeline {rel} defines its reply as sent")
    return Verdict(Start.DETACHED, f"{hook.why}; {_label_does_nothing(labels, cluster)}")


def doors_needed(cluster: Cluster) -> tuple[str, ...]:
    """The doors a VM with PCI host devices needs on ``cluster`` to keep every setting."""
    if not cluster.pipeline_runs:
        return ("hook",)
    return ("plugin",) if cluster.writes_mode else ("hook", "plugin")


def explain_door(vmi: Mapping[str, Any] | None, release: ReadRelease | None) -> str:
    """The door ``xmlfix --explain`` describes when none is given: the hook sidecar wherever a
    Plugin object would stop VMs (KubeVirt writes no hostdev ``mode``: v1.9.0, main as read) or
    there is no Plugin API, or when the release is unknown; where KubeVirt writes ``mode``, the
    door the VM asks for (its label, else its hook annotation), else the Plugin."""
    if release is None or not (release.plugins and release.writes_mode):
        return "hook"
    vmi = vmi if isinstance(vmi, Mapping) else {}
    if plugin_selects(_labels(vmi)):
        return "plugin"
    return "hook" if HOOK_SIDECARS in _annotations(vmi) else "plugin"


def domain_facts(domain_xml: bytes) -> tuple[bool | None, tuple[str, ...]]:
    """Whether a (rewritten) domain holds a PCI hostdev, and which of :data:`SETTINGS` it
    carries; (None, all of them) when it cannot be read."""
    from pcitopo.libvirt.device_elements import has_controller_model_names, has_pci_hostdev
    from pcitopo.libvirt.lenient import readable_root
    from pcitopo.libvirt.machine import has_maxphysaddr
    from pcitopo.libvirt.overrides import has_override

    root = readable_root(domain_xml)
    if root is None:
        return None, SETTINGS

    found = {"maxphysaddr": has_maxphysaddr(root), "qemu:override": has_override(root),
             "controller model names": has_controller_model_names(root)}
    has_pci = has_pci_hostdev(root)
    return has_pci or None, tuple(s for s in SETTINGS if found[s]) or SETTINGS


def cluster_of(dump, release: str | None = None, assume: str | None = None) -> Cluster | None:
    """The deciding facts of a cluster dump (:class:`~pcitopo.kubevirt.cluster.ClusterDump`);
    ``release`` (``--kubevirt``) overrides its version, ``assume`` (``--assume-release``) judges
    it as that read release. None when neither the dump nor ``release`` gives a version; a
    version pcitopo did not read raises :class:`~pcitopo.kubevirt.releases.ReleaseUnknown`."""
    from pcitopo.kubevirt.cluster import name_of
    from pcitopo.kubevirt.releases import judged_as

    cr = dump.kubevirt
    version = release or (cr.version if cr is not None else None)
    if not version and not assume:
        return None
    name, said = judged_as(version, assume)
    why = "; ".join(x for x in ("release from --kubevirt" if release else "", said) if x)
    return Cluster(name, frozenset(cr.gates if cr else ()), tuple(name_of(p) for p in dump.plugins),
                   frozenset(cr.not_pci if cr else ()), why)


# -- xmlfix --check: the VMI judged on the release named, or the one assumed --------------------

DEFAULT_RELEASE = DEFAULT_VERSION  # the newest read tag (kubevirt-v1.9.0), and the strictest


@dataclass(frozen=True)
class ReleaseCheck:
    verdict: Verdict | None  # None: the release is unknown (:attr:`unknown` says why)
    cluster: Cluster | None
    lines: tuple[str, ...]  # what fails the check, one line each, tagged "sidecar:"/"plugin:"/"kubevirt:"
    unknown: str = ""  # the release is not one pcitopo read: the line that says so

    @property
    def on(self) -> str:
        """The verdict line's part: which release (and Plugin objects) the VMI was judged on."""
        if self.verdict is None or self.cluster is None:
            return "KubeVirt release unknown (above)"
        return f"{self.verdict.start.value if self.verdict.ok else 'judged'} on {self.cluster.describe()}"


def release_check(vmi: Mapping[str, Any], door: str | None, dump_paths: list[str] | None, release: str | None,
                  domain_xml: bytes = b"", assume: str | None = None,
                  pinned: tuple[str, ...] = ()) -> ReleaseCheck:
    """``xmlfix --check --vmi``: the VMI on the cluster of ``dump_paths`` (``--cluster``), or on
    ``release`` (``--kubevirt``) or :data:`DEFAULT_RELEASE` with the gates and Plugin objects its
    doors (or ``door``) imply; ``assume`` (``--assume-release``) judges an unread release as a
    read one. ``door`` also asks that the VMI come through that door."""
    from pcitopo.errors import ConfigError
    from pcitopo.kubevirt.manifest import attachment
    from pcitopo.kubevirt.releases import check_kubevirt, judged_as

    if release is not None:
        check_kubevirt(release)
    try:
        if dump_paths:
            from pcitopo.kubevirt.cluster import read_dump

            cluster = cluster_of(read_dump(dump_paths), release, assume)
            if cluster is None:
                raise ConfigError(f"cluster dump {', '.join(dump_paths)} has no KubeVirt CR with "
                                  "status.observedKubeVirtVersion: give --kubevirt VERSION as well")
        else:
            name, said = judged_as(release or DEFAULT_RELEASE, assume)
            why = "; ".join(x for x in ("release from --kubevirt" if release else "no --cluster or --kubevirt", said) if x)
            cluster = assumed_cluster(vmi, name, why, door)
    except ReleaseUnknown as e:
        return ReleaseCheck(None, None, (), e.line)
    cluster = replace(cluster, pcitopo_images=pinned)  # pcitopo's images as the admin pinned them
    has_pci, settings = domain_facts(domain_xml) if domain_xml else (None, SETTINGS)
    verdict = judge(vmi, cluster, pci=has_pci, settings=settings)
    lines = []
    via = attachment(vmi, door, pinned) if door else None
    if via is not None and not via.attached:
        lines.append(via.line)
    said = via is not None and not via.attached and (verdict.start is Start.DETACHED or via.then == NOT_STARTED)
    if not verdict.ok and not said:
        lines.append(f"kubevirt: {verdict.line}")
    return ReleaseCheck(verdict, cluster, tuple(lines))


def _no_pcitopo_plugin(labels: Mapping[str, Any], cluster: Cluster) -> str:
    if PCITOPO_PLUGIN not in cluster.plugins:
        return f"no {PCITOPO_PLUGIN} Plugin object writes them again"
    return f"the {PCITOPO_PLUGIN} Plugin does not select it (no label {PLUGIN_LABEL}: \"{PLUGIN_LABEL_VALUE}\")"


def _label_does_nothing(labels: Mapping[str, Any], cluster: Cluster) -> str:
    rel = f"KubeVirt {cluster.release}"
    if not plugin_selects(labels):
        return f"no label {PLUGIN_LABEL}: \"{PLUGIN_LABEL_VALUE}\" for the pcitopo Plugin"
    if not cluster.has_plugins_api:
        return f"its label does nothing on {rel}: Plugins came with v1.9.0"
    if PLUGINS_GATE not in cluster.gates:
        return f"its label does nothing while gate {PLUGINS_GATE} is off"
    return f"its label does nothing: no {PCITOPO_PLUGIN} Plugin object in the cluster"


def _labels(vmi: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(vmi.get("metadata")).get("labels"))


def _annotations(vmi: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(mapping(vmi.get("metadata")).get("annotations"))

