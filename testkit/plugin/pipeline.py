"""virt-launcher v1.9.0's define with legacy hooks and Plugins, modelled from KubeVirt's source:
``SetDomainSpecStrWithHooks`` (``pkg/virt-launcher/virtwrap/util/libvirt_helper.go``) and
``ApplyDomainHooks`` (``pkg/virt-launcher/virtwrap/plugins/pipeline.go``), tag v1.9.0.

One define:
1. the legacy hooks (``hooks.kubevirt.io/hookSidecars``) get KubeVirt's domain; the last reply
   is read into ``api.DomainSpec`` (the release's lossy re-parse, :mod:`pcitopo.kubevirt.launcher.reparse`);
2. with no Plugin CR in the cluster, the legacy reply string is defined as sent;
3. with any Plugin CR (matching or not), ``translate.ToLibvirtDomain`` reads the struct into
   libvirtxml's ``Domain`` (where a hostdev without ``mode`` fails: kubevirt#18861), each
   matching domain hook gets ``Domain.Marshal()`` and its reply is read back with
   ``Domain.Unmarshal``, and the last ``Domain.Marshal()`` is defined.
A boot defines two or three times (``allocateHotplugPorts``, ``virtwrap/manager.go``); between
defines virt-launcher reads libvirt's domain back into ``api.DomainSpec``
(:func:`testkit.kubevirt_sim.next_call_input`), so every hook call gets a rebuilt domain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pcitopo.kubevirt.launcher.release_groups import Release
from testkit.kubevirt_sim import kubevirt_reparse, next_call_input

from .libvirtxml import LibvirtxmlError, marshal, round_trip, unmarshal

Hook = Callable[[bytes], bytes]


@dataclass
class Boot:
    """What one boot defined (one XML per define), or where it stopped."""

    defines: list[bytes] = field(default_factory=list)
    plugin_inputs: list[bytes] = field(default_factory=list)  # what the (first) plugin got, per define
    error: str | None = None


def define_once(domain: bytes, legacy: Hook | None, plugins: Sequence[Hook], plugins_exist: bool,
                release: Release, seen: list[bytes] | None = None) -> bytes:
    """The XML libvirt gets for one define; LibvirtxmlError where virt-launcher fails."""
    spec = domain
    if legacy is not None:
        reply = legacy(domain)
        if not plugins_exist:
            return reply  # defined raw
        spec = kubevirt_reparse(reply, release=release)
    elif not plugins_exist:
        return domain
    current = unmarshal(spec)  # translate.ToLibvirtDomain
    for i, plugin in enumerate(plugins):
        sent = marshal(current)
        if seen is not None and i == 0:
            seen.append(sent)
        reply = plugin(sent)
        if not reply:
            raise LibvirtxmlError("domain hook returned an empty domain")
        current = unmarshal(reply)
    return marshal(current)


def boot(domain: bytes, legacy: Hook | None = None, plugins: Sequence[Hook] = (), plugins_exist: bool = True,
         release: Release = Release.V1_9, defines: int = 3) -> Boot:
    """``defines`` defines of one boot, each on libvirt's read-back of the one before."""
    out = Boot()
    current = domain
    for _ in range(defines):
        try:
            xml = define_once(current, legacy, plugins, plugins_exist, release, out.plugin_inputs)
        except LibvirtxmlError as e:
            out.error = f"failed to allocate hotplug ports: {e}"
            return out
        out.defines.append(xml)
        current = next_call_input(xml, release)
    return out


def as_libvirtxml(xml: bytes) -> bytes:
    """``xml`` compared as libvirtxml would hold it (both sides through the same model)."""
    return round_trip(xml)


def with_kubevirt_18866(xml: bytes) -> bytes:
    """KubeVirt's domain as a release with PR #18866 writes it: ``mode='subsystem'`` on its PCI
    hostdevs (``createPCIHostDevice``); the rest as before."""
    from lxml import etree

    from pcitopo.libvirt.marshal import to_kubevirt_bytes

    root = etree.fromstring(xml)
    for hd in root.iter("hostdev"):
        if hd.get("type") == "pci" and hd.get("mode") is None:
            hd.set("mode", "subsystem")
    return to_kubevirt_bytes(root)
