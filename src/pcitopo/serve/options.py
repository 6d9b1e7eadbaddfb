"""Hook options, read from the VMI's own annotations (KubeVirt's convention for sidecars).

Every option is an annotation under one prefix, ``pcitopo.kubevirt.io/``, set on the VMI (for a
VM: on ``spec.template.metadata.annotations``), for example::

    pcitopo.kubevirt.io/on-error: "passthrough"

The options are the fields of :class:`HookOptions`, declared there and nowhere else
(docs/VM.md, "Options", lists them; a test keeps the list in step). ``mode: off`` hands the domain
back unchanged (the sidecar can stay attached to a VM template while a user opts one VM out).
``on-error: passthrough`` boots the VM with KubeVirt's own placement when the topology cannot
be mirrored, and logs why; the default ``fail`` stops the VM start with our one-line reason,
because an operator who attached this sidecar wants the topology or a loud failure, not a
silently slow VM.

``nvlink`` is the NVLink fabric check (src/pcitopo/paths/partitions.py): with the sidecar started with
``--fabric FILE``, the VM's NVIDIA GPUs must be exactly one active Fabric Manager partition with
all links. ``require`` fails the VM start with one line when they are not (whatever
``on-error`` says: booting without NVLink is what the operator asked us to prevent); ``warn``
boots and says why in the report and the log line; ``off`` skips the check. Under
``on-error: passthrough`` a domain the rewrite refused is checked on its hostdevs that are NVIDIA
GPUs of the host, and ``doctor`` (below) on its hostdevs the host has (src/pcitopo/serve/core.py).

``doctor`` runs the host-readiness checks of ``pcitopo doctor`` for the devices the hook places
and puts the findings in the log line: ``warn`` only reports, ``require`` stops the VM start
when a check fails or cannot be confirmed (whatever ``on-error`` says), ``off`` skips the
checks. A check the unprivileged sidecar cannot read (ACS and ATS need root) is taken from the
doctor's report; without it, it stays ``unknown``: ``warn`` logs it, ``require`` refuses.

``pairing`` compares, for each GPU of the VM, its best NIC in the VM with its best NIC on the
host (src/pcitopo/paths/pairing.py): a GPU given a NIC further away, in NCCL's view (the one that
decides GPUDirect RDMA), than the host offers it is one line naming the GPU, the NIC it got and
the host's NIC it could have had. ``require`` stops the VM start (whatever ``on-error`` says),
``warn`` boots and logs the lines, ``off`` skips the check. A VM without NICs, and a GPU whose
host has no NIC at PXB or closer for it, are never warned.

``link: auto`` gives our root ports the host's link speed and width; ``nccl-topo: fwcfg`` passes
NCCL's topology file for the guest through fw_cfg (src/pcitopo/libvirt/links.py,
src/pcitopo/guest/ncclfile.py): together NCCL's bandwidth model in the guest is the host's.

``mmio: auto`` sizes the guest's 64-bit MMIO space for the assigned devices' BARs (address
width, 1 GiB pages for OVMF, SeaBIOS root-port reserves); ``p2p-clique: auto`` gives PCIe GPUs
below one host switch a GPUDirect P2P clique id (src/pcitopo/guest/mmio.py, src/pcitopo/guest/cliques.py).

Values are exact, lower-case strings. An unknown annotation under the prefix is an error too
(a typo such as ``pcitopo.kubevirt.io/on-eror`` must not silently fall back to a default).
A bad option is always fatal, whatever ``on-error`` says: it is the operator's mistake, not
a topology the host cannot offer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pcitopo.errors import ConfigError, VmiError

__all__ = ["DEFAULT_OPTIONS", "PREFIX", "HookOptions", "VmiError", "VmiFacts", "annotation", "describe_options",
           "options_from_annotations", "options_from_vmi", "parse_vmi"]  # VmiError: re-exported (src/pcitopo/errors.py)

PREFIX = "pcitopo.kubevirt.io/"


def _annotation_suffix(field_name: str) -> str:
    """A field's alias, which is its annotation name after the prefix: ``on_error`` ->
    ``on-error``."""
    return field_name.replace("_", "-")


class HookOptions(BaseModel):
    """The hook's options, one field each; nothing else declares them.

    A field's alias is its annotation name after :data:`PREFIX` (derived from the field name,
    ``_`` -> ``-``); its type is a ``Literal`` of the allowed values; its default and
    description are what docs/VM.md shows. Adding an option is adding a field here; tests
    then ask for its row in docs/VM.md and for docs/SECURITY.md's review of it
    (``tests/sidecar/test_hook_docs.py``, ``tests/test_hostile.py``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, alias_generator=_annotation_suffix)

    mode: Literal["mirror", "off"] = Field("mirror", description="mirror the host PCIe topology, or leave the domain unchanged")
    on_error: Literal["fail", "passthrough"] = Field(
        "fail", description="when the topology cannot be mirrored: fail the VM start, or return the domain unchanged"
    )
    nvlink: Literal["require", "warn", "off"] = Field(
        "warn",
        description="when the VM's GPUs are not exactly one active NVLink fabric partition with all links "
        "(needs the sidecar's --fabric FILE): fail the VM start, boot and report it, or do not check",
    )
    doctor: Literal["require", "warn", "off"] = Field(
        "warn",
        description="host-readiness checks for the placed devices: require (a failed or unconfirmed check stops the VM start), "
        "warn (log only), off",
    )
    # The MMIO budget and P2P cliques: on by default, as large-BAR GPUs need them to work in the guest
    mmio: Literal["auto", "off"] = Field(
        "auto", description="size the guest's 64-bit MMIO space for the devices' BARs (address width, firmware settings)"
    )
    p2p_clique: Literal["auto", "off"] = Field(
        "auto", description="give PCIe GPUs below one host switch a GPUDirect P2P clique (x-nv-gpudirect-clique)"
    )
    pairing: Literal["require", "warn", "off"] = Field(
        "warn",
        description="each GPU's best NIC in the VM against its best NIC on the host (NCCL's class): require "
        "(a GPU given a worse NIC stops the VM start), warn (log the line and boot), off",
    )
    link: Literal["auto", "off"] = Field(
        "auto", description="give each root port pcitopo creates the host link it stands for (x-speed/x-width; "
        "32 and 64 GT/s need QEMU 9.0 or later)"
    )
    nccl_topo: Literal["fwcfg", "off"] = Field(
        "fwcfg", description="pass NCCL's topology file for this guest (the host's link speeds at the guest's "
        "addresses) through fw_cfg, for the guest to install on every boot"
    )


# Every option at its default: what a VMI without our annotations gets (nothing to validate).
DEFAULT_OPTIONS = HookOptions()
# Annotation suffix -> field name, for every option.
_SUFFIXES = {f.alias or name: name for name, f in HookOptions.model_fields.items()}


def annotation(field_name: str) -> str:
    """The full annotation name of an option: ``mode`` -> ``pcitopo.kubevirt.io/mode``."""
    return PREFIX + (HookOptions.model_fields[field_name].alias or field_name)


def _allowed(field_name: str) -> tuple[str, ...]:
    return get_args(HookOptions.model_fields[field_name].annotation)


def describe_options() -> list[tuple[str, tuple[str, ...], str, str]]:
    """(annotation, allowed values, default, description) for each option, for the docs and
    for error messages."""
    return [
        (annotation(name), _allowed(name), str(f.default), f.description or "")
        for name, f in HookOptions.model_fields.items()
    ]


def options_from_annotations(annotations: Mapping[str, Any]) -> HookOptions:
    """Validate the annotations under our prefix; anything else is ignored.

    Raises ConfigError naming the annotation and its allowed values."""
    raw: dict[str, Any] = {}
    for key, value in annotations.items():
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        suffix = key[len(PREFIX):]
        if suffix not in _SUFFIXES:
            from pcitopo.kubevirt.manifest import label_not_annotation  # only on this error: the hook's path stays light

            known = ", ".join(PREFIX + s for s in _SUFFIXES)
            label = label_not_annotation(key)
            raise ConfigError(f"unknown annotation {key}: {label}" if label else f"unknown annotation {key} (known: {known})")
        raw[suffix] = value
    if not raw:
        return DEFAULT_OPTIONS
    try:
        return HookOptions.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        suffix = str(err["loc"][0]) if err.get("loc") else "?"
        name = _SUFFIXES.get(suffix)
        allowed = " | ".join(_allowed(name)) if name else "?"
        value = raw.get(suffix)
        shown = json.dumps(value) if not isinstance(value, str) else repr(value[:60])
        raise ConfigError(f"annotation {PREFIX}{suffix} is {shown}; allowed values: {allowed}") from None


@dataclass(frozen=True)
class VmiFacts:
    """What the hook takes from the VMI JSON: who it is (for logs) and its annotations.
    (A plain dataclass: :func:`parse_vmi` checks every field's type itself.)"""

    namespace: str | None = None
    name: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        """``namespace/name`` for log lines (``-`` where unknown), each cut to the longest name
        Kubernetes allows (253): a VMI handed to a command by hand can carry any length."""
        return "/".join((n[:253] + "...") if len(n) > 253 else n for n in (self.namespace or "-", self.name or "-"))

    def domain_mismatch(self, domain_name: str | None) -> str | None:
        """Why a domain does not look like this VMI's, or None: virt-launcher names the domain
        ``<namespace>_<name>`` (kubevirt/kubevirt ``api.VMINamespaceKeyFunc``, set by the
        converter's metadata configurator), so another ``<name>`` is most likely another VM's
        ``virsh dumpxml`` beside this VMI's annotations. Nothing to compare without a VMI name."""
        if not self.name:
            return None
        want = f"{self.namespace}_{self.name}" if self.namespace else f"<namespace>_{self.name}"
        if domain_name is not None and (domain_name == want or (not self.namespace and domain_name.endswith(f"_{self.name}"))):
            return None
        return (f"the VMI is {self.ref}, whose domain KubeVirt names {want}, but the domain's <name> is "
                f"{domain_name or '(none)'}: are the VMI and the domain the same VM's?")


def parse_vmi(vmi_json: bytes | str | None) -> VmiFacts:
    """Parse the VMI JSON KubeVirt sends with every call.

    ``None`` or empty input means "no VMI" (a caller such as ``xmlfix`` without ``--vmi``):
    no annotations, so every option takes its default. Anything else must be a JSON object
    whose ``metadata`` (if present) is an object and whose ``metadata.annotations`` (if present)
    maps strings to strings, as in Kubernetes. Raises VmiError otherwise."""
    return vmi_facts(load_vmi(vmi_json))


def load_vmi(vmi_json: bytes | str | None) -> dict | None:
    """The VMI JSON as a parsed object (None for no VMI); raises VmiError otherwise. A caller
    that needs more of the VMI than :class:`VmiFacts` (the node hook) parses it once here."""
    if vmi_json is None or len(vmi_json) == 0:
        return None
    try:
        doc = json.loads(vmi_json)
    except RecursionError:
        raise VmiError("VMI JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise VmiError(f"VMI JSON is malformed: {e}") from None
    if not isinstance(doc, dict):
        raise VmiError(f"VMI JSON is a {type(doc).__name__}, not an object")
    return doc


def vmi_facts(doc: dict | None) -> VmiFacts:
    """:class:`VmiFacts` of a parsed VMI (:func:`load_vmi`); raises VmiError on a wrong type."""
    if doc is None:
        return VmiFacts()
    meta = doc.get("metadata", {})
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise VmiError("VMI JSON metadata is not an object")
    annotations = meta.get("annotations", {})
    if annotations is None:
        annotations = {}
    if not isinstance(annotations, dict):
        raise VmiError("VMI JSON metadata.annotations is not an object")
    for k, v in annotations.items():
        if not isinstance(v, str):
            raise VmiError(f"VMI JSON annotation {k} is not a string")

    def text(key: str) -> str | None:
        v = meta.get(key)
        if v is not None and not isinstance(v, str):
            raise VmiError(f"VMI JSON metadata.{key} is not a string")
        return v

    return VmiFacts(namespace=text("namespace"), name=text("name"), annotations=annotations)


def options_from_vmi(vmi_json: bytes | str | None) -> tuple[VmiFacts, HookOptions]:
    facts = parse_vmi(vmi_json)
    return facts, options_from_annotations(facts.annotations)
