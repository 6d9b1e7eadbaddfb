"""A cluster as ``kubectl get kubevirt,plugins.plugin.kubevirt.io,nodes,vmis,vms -A -o yaml`` prints
it: read offline, never from a live API server.

One reader for every command that takes such a dump (``pcitopo preflight``, ``xmlfix --check
--cluster``, ``pcitopo domain --cluster``). Input is one or more files, or ``-`` for standard
input; each holds a ``kind: List`` (what ``kubectl get`` prints for several kinds), a single
object, or several YAML documents (``---``) or concatenated JSON objects. Nothing in a dump is
required: a missing KubeVirt CR is a fact to report, not an error. Unreadable input is one line
(:class:`ConfigError`, exit 2 from the commands).

Facts (kubevirt/kubevirt ``staging/src/kubevirt.io/api/core/v1/types.go``; docs/SOURCES.md,
"Cluster dumps"): the KubeVirt CR carries ``spec.configuration.developerConfiguration.featureGates``,
``spec.configuration.permittedHostDevices.pciHostDevices[]`` and
``status.observedKubeVirtVersion``; Plugin objects are ``plugin.kubevirt.io/v1alpha1``, cluster
scoped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.host.files import read_bounded
from pcitopo.host.yamltext import yaml_documents
from pcitopo.kubevirt.hostdevices import PermittedHostDevices, PermittedPCI, read_permitted

KUBEVIRT_KIND = "KubeVirt"
PLUGIN_KIND = "Plugin"
PLUGIN_GROUP = "plugin.kubevirt.io"
# One dump file: `kubectl get ... -o yaml` of a thousand nodes and their VMs is a few tens of MB;
# read once, whole, so this is also what a dump may cost in memory before it is parsed.
MAX_DUMP_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class KubeVirtCR:
    name: str
    version: str | None  # status.observedKubeVirtVersion, e.g. "v1.9.0"
    gates: tuple[str, ...]
    permitted: PermittedHostDevices  # spec.configuration.permittedHostDevices (src/pcitopo/kubevirt/hostdevices.py reads it)
    machine_type: str | None  # spec.configuration.architectureConfiguration.amd64.machineType
    raw: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def permitted_pci(self) -> tuple[PermittedPCI, ...]:
        return self.permitted.pci

    @property
    def not_pci(self) -> tuple[str, ...]:
        """permittedHostDevices.mediatedDevices[] and usb[] resource names."""
        return self.permitted.not_pci


@dataclass
class ClusterDump:
    """Every object of a dump, by kind, in the order read; typed views for the few we judge."""

    objects: list[dict] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def of_kind(self, *kinds: str) -> list[dict]:
        return [o for o in self.objects if o.get("kind") in kinds]

    @property
    def kubevirt(self) -> KubeVirtCR | None:
        """The KubeVirt CR, or None when the dump lacks it; two are one line (virt-operator runs
        one KubeVirt per cluster, so two mean dumps of different clusters were mixed)."""
        crs = self.of_kind(KUBEVIRT_KIND)
        if len(crs) > 1:
            raise ConfigError(f"cluster dump {', '.join(self.sources)}: {len(crs)} KubeVirt CRs "
                              f"({', '.join(name_of(c) for c in crs)}); a cluster has one: dump one cluster")
        return kubevirt_cr(crs[0]) if crs else None

    @property
    def plugins(self) -> list[dict]:
        """Plugin objects of KubeVirt's plugin API (``plugin.kubevirt.io``), pcitopo's or anyone's."""
        return [o for o in self.of_kind(PLUGIN_KIND) if str(o.get("apiVersion", "")).startswith(PLUGIN_GROUP + "/")]

    @property
    def nodes(self) -> list[dict]:
        return self.of_kind("Node")

    @property
    def workloads(self) -> list[dict]:
        """VirtualMachines and VirtualMachineInstances, as read."""
        return self.of_kind("VirtualMachine", "VirtualMachineInstance")


def name_of(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` (or ``name`` for a cluster-scoped object)."""
    meta = mapping(obj.get("metadata"))
    name, ns = meta.get("name", "?"), meta.get("namespace")
    return f"{ns}/{name}" if ns else str(name)


def kubevirt_cr(obj: Mapping[str, Any]) -> KubeVirtCR:
    spec = mapping(obj.get("spec"))
    conf = mapping(spec.get("configuration"))
    dev_conf = mapping(conf.get("developerConfiguration"))
    disabled = set(_strings(dev_conf.get("disabledFeatureGates")))
    gates = [g for g in _strings(dev_conf.get("featureGates")) if g not in disabled]
    permitted = read_permitted(conf.get("permittedHostDevices"))
    machine = mapping(mapping(conf.get("architectureConfiguration")).get("amd64")).get("machineType")
    version = mapping(obj.get("status")).get("observedKubeVirtVersion")
    return KubeVirtCR(name_of(obj), str(version) if version else None, tuple(gates), permitted,
                      str(machine) if machine else None, obj)


def read_dump(paths: Iterable[str]) -> ClusterDump:
    """Read every file (``-``: standard input) into one dump; one line on anything unreadable."""
    dump = ClusterDump()
    for path in paths:
        data = _read(path)
        for doc in _documents(data, path):
            dump.objects.extend(_flatten(doc, path))
        dump.sources.append(path)
    return dump


def _read(path: str) -> bytes:
    return read_bounded(path, MAX_DUMP_BYTES, "cluster dump")


def _documents(data: bytes, name: str) -> list[Any]:
    if not data.strip():
        raise ConfigError(f"cluster dump {name} is empty: give what `kubectl get kubevirt,plugins.plugin.kubevirt.io,"
                          "nodes,vmis,vms -A -o yaml` prints")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"cluster dump {name} is not UTF-8 text") from None
    docs = _json_stream(text)
    if docs is not None:
        return docs
    return yaml_documents(text, f"cluster dump {name}")


def _json_stream(text: str) -> list[Any] | None:
    """Concatenated JSON values (``kubectl get -o json`` of several calls), or None if not JSON."""
    decoder, out, i = json.JSONDecoder(), [], 0
    text = text.strip()
    if not text.startswith(("{", "[")):
        return None
    while i < len(text):
        try:
            value, i = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):  # too deep for json: the YAML reader refuses it in one line
            return None
        out.append(value)
        while i < len(text) and text[i].isspace():
            i += 1
    return out


def _flatten(doc: Any, name: str) -> Iterator[dict]:
    if isinstance(doc, list):
        items = doc
    elif isinstance(doc, dict) and isinstance(doc.get("items"), list) and str(doc.get("kind", "")).endswith("List"):
        items = doc["items"]
    elif isinstance(doc, dict):
        items = [doc]
    else:
        raise ConfigError(f"cluster dump {name}: a document is a {type(doc).__name__}, not a Kubernetes object or List")
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("kind"), str):
            raise ConfigError(f"cluster dump {name}: an item has no kind (not a Kubernetes object)")
        yield item


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value if isinstance(v, str)] if isinstance(value, list) else []


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is an object, else an empty one: a dump's optional fields, read leniently."""
    return value if isinstance(value, Mapping) else {}
