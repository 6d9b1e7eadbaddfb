"""Hook options, read from the VMI's own annotations (KubeVirt's convention for sidecars).

Every option is an annotation under one prefix, ``pcitopo.kubevirt.io/``, set on the VMI (for a
VM: on ``spec.template.metadata.annotations``)::

    pcitopo.kubevirt.io/mode: "mirror"        # mirror | off            (default mirror)
    pcitopo.kubevirt.io/on-error: "fail"      # fail | passthrough      (default fail)
    pcitopo.kubevirt.io/mmio: "auto"          # auto | off              (default auto)
    pcitopo.kubevirt.io/p2p-clique: "auto"    # auto | off              (default auto)

``mmio: auto`` sizes the guest's 64-bit MMIO space for the assigned devices' BARs (address
width, 1 GiB pages for OVMF, SeaBIOS root-port reserves); ``p2p-clique: auto`` gives PCIe GPUs
below one host switch a GPUDirect P2P clique id (topology/mmio.py, topology/cliques.py).

``mode: off`` hands the domain back unchanged (the sidecar can stay attached to a VM template
while a user opts one VM out). ``on-error: passthrough`` boots the VM with KubeVirt's own
placement when the topology cannot be mirrored, and logs why; the default ``fail`` stops the
VM start with our one-line reason, because an operator who attached this sidecar wants the
topology or a loud failure, not a silently slow VM.

Values are exact, lower-case strings. An unknown annotation under the prefix is an error too
(a typo such as ``pcitopo.kubevirt.io/on-eror`` must not silently fall back to a default).
A bad option is always fatal, whatever ``on-error`` says: it is the operator's mistake, not
a topology the host cannot offer.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Mapping

from topology.errors import ConfigError

if TYPE_CHECKING:
    from pydantic import BaseModel

    HookOptions = BaseModel  # built on first use: see _build_hook_options

PREFIX = "pcitopo.kubevirt.io/"


class VmiError(ConfigError):
    """The VMI JSON handed to the hook is malformed (not JSON, or not shaped like a VMI)."""

    kind = "vmi"


# -- the options -----------------------------------------------------------------------------
#
# Annotations under our prefix are validated by a pydantic model, ``HookOptions``. Importing
# pydantic and building the model costs ~10 MiB of the sidecar's resident memory and ~0.1 s of
# CPU at start (bench/perf.py; KubeVirt's sidecar limit is 64M), while a VMI without any
# annotation under our prefix has nothing to validate. So the model is built on first use
# (``HookOptions`` is a lazy module attribute, PEP 562), and a VMI without our annotations gets
# ``DEFAULT_OPTIONS``: the model's defaults as a plain object that compares equal to
# ``HookOptions()``. The two below are checked against the model when it is built.

# Annotation suffix -> option (field) name.
_ANNOTATIONS = {"mode": "mode", "on-error": "on_error", "mmio": "mmio", "p2p-clique": "p2p_clique"}


@dataclass(frozen=True, eq=False)
class DefaultOptions:
    """``HookOptions()`` without importing pydantic: every option at its default."""

    mode: str = "mirror"
    on_error: str = "fail"
    mmio: str = "auto"  # issue 11
    p2p_clique: str = "auto"  # issue 11

    def __eq__(self, other: object) -> bool:
        if not all(hasattr(other, n) for n in _ANNOTATIONS.values()):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _ANNOTATIONS.values())

    def __hash__(self) -> int:
        return hash(tuple(getattr(self, n) for n in _ANNOTATIONS.values()))


DEFAULT_OPTIONS = DefaultOptions()


def _build_hook_options() -> type:
    from pydantic import BaseModel, ConfigDict, Field

    class HookOptions(BaseModel):
        """The hook's options; field aliases are the annotation names without the prefix."""

        model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

        mode: Literal["mirror", "off"] = Field("mirror", description="mirror the host PCIe topology, or leave the domain unchanged")
        on_error: Literal["fail", "passthrough"] = Field(
            "fail",
            alias="on-error",
            description="when the topology cannot be mirrored: fail the VM start, or return the domain unchanged",
        )
        # issue 11
        mmio: Literal["auto", "off"] = Field(
            "auto", description="size the guest's 64-bit MMIO space for the devices' BARs (address width, firmware settings)"
        )
        p2p_clique: Literal["auto", "off"] = Field(
            "auto",
            alias="p2p-clique",
            description="give PCIe GPUs below one host switch a GPUDirect P2P clique (x-nv-gpudirect-clique)",
        )

    HookOptions.__module__ = __name__
    HookOptions.__qualname__ = "HookOptions"
    names = {(f.alias or name): name for name, f in HookOptions.model_fields.items()}
    if names != _ANNOTATIONS or HookOptions() != DEFAULT_OPTIONS:
        raise AssertionError("sidecar.config: _ANNOTATIONS / DefaultOptions disagree with HookOptions")
    return HookOptions


_build_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name == "HookOptions":
        with _build_lock:  # two first calls at once build it once
            model = globals().get("HookOptions")
            if model is None:
                model = globals()["HookOptions"] = _build_hook_options()
        return model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _model() -> type:
    """The pydantic model (built, and pydantic imported, on the first call)."""
    return globals().get("HookOptions") or __getattr__("HookOptions")


def _annotation_names() -> dict[str, str]:
    """Annotation suffix -> field name, for every option."""
    return dict(_ANNOTATIONS)


def _allowed(field: str) -> tuple[str, ...]:
    ann = _model().model_fields[field].annotation
    return tuple(getattr(ann, "__args__", ()))


def describe_options() -> list[tuple[str, tuple[str, ...], str, str]]:
    """(annotation, allowed values, default, description) for each option, for the docs and
    for error messages."""
    out = []
    model = _model()
    for suffix, name in _annotation_names().items():
        f = model.model_fields[name]
        out.append((PREFIX + suffix, _allowed(name), str(f.default), f.description or ""))
    return out


def options_from_annotations(annotations: Mapping[str, Any]) -> HookOptions | DefaultOptions:
    """Validate the annotations under our prefix; anything else is ignored.

    Raises ConfigError naming the annotation and its allowed values."""
    names = _annotation_names()
    raw: dict[str, Any] = {}
    for key, value in annotations.items():
        if not isinstance(key, str) or not key.startswith(PREFIX):
            continue
        suffix = key[len(PREFIX):]
        if suffix not in names:
            known = ", ".join(PREFIX + s for s in names)
            raise ConfigError(f"unknown annotation {key} (known: {known})")
        raw[suffix] = value
    if not raw:
        return DEFAULT_OPTIONS  # nothing to validate (and pydantic stays unimported)
    model = _model()
    from pydantic import ValidationError

    try:
        return model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        suffix = str(err["loc"][0]) if err.get("loc") else "?"
        field = names.get(suffix, suffix)
        allowed = " | ".join(_allowed(field)) if field in model.model_fields else "?"
        value = raw.get(suffix)
        shown = json.dumps(value) if not isinstance(value, str) else repr(value[:60])
        raise ConfigError(f"annotation {PREFIX}{suffix} is {shown}; allowed values: {allowed}") from None


@dataclass(frozen=True)
class VmiFacts:
    """What the hook takes from the VMI JSON: who it is (for logs) and its annotations.
    (A plain dataclass: :func:`parse_vmi` checks every field's type itself.)"""

    namespace: str | None = None
    name: str | None = None
    uid: str | None = None
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def ref(self) -> str:
        """``namespace/name`` for log lines (``-`` where unknown)."""
        return f"{self.namespace or '-'}/{self.name or '-'}"


def parse_vmi(vmi_json: bytes | str | None) -> VmiFacts:
    """Parse the VMI JSON KubeVirt sends with every call.

    ``None`` or empty input means "no VMI" (a caller such as ``xmlfix`` without ``--vmi``):
    no annotations, so every option takes its default. Anything else must be a JSON object
    whose ``metadata`` (if present) is an object and whose ``metadata.annotations`` (if present)
    maps strings to strings, as in Kubernetes. Raises VmiError otherwise."""
    if vmi_json is None or len(vmi_json) == 0:
        return VmiFacts()
    try:
        doc = json.loads(vmi_json)
    except RecursionError:
        raise VmiError("VMI JSON is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise VmiError(f"VMI JSON is malformed: {e}") from None
    if not isinstance(doc, dict):
        raise VmiError(f"VMI JSON is a {type(doc).__name__}, not an object")
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

    return VmiFacts(namespace=text("namespace"), name=text("name"), uid=text("uid"), annotations=annotations)


def options_from_vmi(vmi_json: bytes | str | None) -> tuple[VmiFacts, HookOptions | DefaultOptions]:
    facts = parse_vmi(vmi_json)
    return facts, options_from_annotations(facts.annotations)
