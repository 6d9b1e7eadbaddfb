"""A VMI as people paste it, for ``xmlfix --vmi``, and whether KubeVirt will run pcitopo for it.

- ``kubectl get vmi NAME -o yaml`` as well as ``-o json``; a ``VirtualMachine`` (``kubectl get
  vm``, or the shipped examples) is read as the VMI virt-controller starts from it; any other
  kind is refused in one line; of a multi-document file (a VM kept with its ConfigMap), the one
  VM or VMI document is read.
- label and annotation values must be strings: an unquoted YAML ``true`` is bad input (exit 2),
  whichever of the two it is on; :func:`label_not_annotation` says where a label put among the
  annotations belongs.
- :func:`attachment`: whether a door attaches pcitopo to the VMI, as KubeVirt reads that door
  (``xmlfix --check --vmi`` fails when none does: the VM would boot with KubeVirt's flat
  placement and no error anywhere).

KubeVirt itself always hands the hook JSON of a VMI, so the hook never comes here, and
PyYAML is imported only when the input is not JSON (the sidecar's memory budget stays as it was).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pcitopo.errors import ConfigError
from pcitopo.host.yamltext import yaml_documents

VMI_KIND = "VirtualMachineInstance"
VM_KIND = "VirtualMachine"
OUR_PREFIXES = ("pcitopo.kubevirt.io/", "hooks.kubevirt.io/")  # annotations that matter on the VMI only


def vmi_as_json(data: bytes, name: str) -> bytes:
    """The VMI as JSON bytes: a VMI's JSON unchanged, YAML converted (safe loader: plain data
    only), a VirtualMachine turned into its VMI; a list of exactly one object (``kubectl get vmi
    -o yaml`` without a name) is unwrapped, and of a multi-document YAML file (a VM kept with its
    ConfigMap) the one VM or VMI document is taken. An empty file (what ``kubectl get vmi missing
    -o yaml > vmi.yaml`` leaves) is an error, not a VMI without annotations."""
    if not data.strip():
        raise ConfigError(f"VMI {name} is empty (kubectl writes nothing when the VMI does not exist): "
                          "give `kubectl get vmi NAME -o yaml` of an existing VMI")
    doc = _json_or_none(data)
    if doc is None and data.lstrip()[:1] in (b"{", b"["):
        return data  # meant as JSON: parse_vmi judges it, with its own messages
    yaml_input = doc is None
    if yaml_input:
        doc = _the_vm_document(_load_yaml(data, name), name)
    doc = _one_item(doc, name)
    if not isinstance(doc, dict):
        if not yaml_input:
            return data  # parse_vmi says what it is
        raise ConfigError(f"VMI {name} is YAML but not an object (got {type(doc).__name__})")
    vmi = as_vmi(doc, name)
    _check_strings(vmi, data if yaml_input else None, name)
    if not yaml_input and vmi is doc:
        return data
    try:
        return json.dumps(vmi, default=str).encode()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"VMI {name}: {e}") from None


def manifest_document(data: bytes, name: str) -> dict:
    """The VM or VMI object a ``--vmi`` file holds, as written (a VirtualMachine stays one: its
    instance type and preference are the prediction's), chosen by the same rules as
    :func:`vmi_as_json`, which the caller runs first for its checks and messages."""
    doc = _json_or_none(data)
    if doc is None:
        doc = _the_vm_document(_load_yaml(data, name), name)
    doc = _one_item(doc, name)
    if not isinstance(doc, dict):
        raise ConfigError(f"{name}: no {VM_KIND} or {VMI_KIND} in it")
    return doc


def _one_item(doc: Any, name: str) -> Any:
    """A list of exactly one object (``kubectl get vmi -o yaml`` without a name) unwrapped."""
    if isinstance(doc, dict) and isinstance(doc.get("items"), list):
        if len(doc["items"]) != 1:
            raise ConfigError(f"VMI {name} is a list of {len(doc['items'])} objects: give one VMI (kubectl get vmi NAME -o yaml)")
        return doc["items"][0]
    return doc


def label_not_annotation(key: str) -> str | None:
    """Where ``key`` belongs when it is a label written among the annotations (the Plugin door's
    label, src/pcitopo/kubevirt/doors.py), for the unknown-annotation message; None for any other key."""
    from pcitopo.kubevirt.doors import PLUGIN_LABEL, PLUGIN_LABEL_VALUE

    if key != PLUGIN_LABEL:
        return None
    return (f"{key} is a label, not an annotation: labels go under metadata.labels (for a {VM_KIND}, "
            f'spec.template.metadata.labels), as {key}: "{PLUGIN_LABEL_VALUE}"')


def as_vmi(doc: dict, name: str) -> dict:
    """The VMI a manifest stands for: a VMI (or an object without ``kind``) itself; for a
    VirtualMachine the VMI virt-controller creates from it (KubeVirt's ``setupVMIFromVM``,
    pkg/virt-controller/watch/vm: the template's metadata, labels and annotations included, with
    the VM's name and namespace, and the template's spec). Any other kind: one line."""
    kind = doc.get("kind")
    if kind in (None, VMI_KIND):
        return doc
    if kind != VM_KIND:
        raise ConfigError(f"{name} is a {kind}: --vmi takes a {VMI_KIND} or a {VM_KIND} "
                          "(kubectl get vmi NAME -o yaml, or the VM's manifest)")
    spec = doc.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    if not isinstance(template, dict):
        raise ConfigError(f"{name} is a {VM_KIND} without spec.template: no VMI to read")
    meta = template.get("metadata") or {}
    vm_meta = doc.get("metadata") or {}
    if not isinstance(meta, dict) or not isinstance(vm_meta, dict):
        raise ConfigError(f"{name}: the {VM_KIND}'s metadata or spec.template.metadata is not an object")
    _ignored_on_the_vm(vm_meta, meta, name)
    meta = {**meta, "name": vm_meta.get("name"), "namespace": vm_meta.get("namespace")}
    meta.pop("generateName", None)
    return {"apiVersion": doc.get("apiVersion"), "kind": VMI_KIND,
            "metadata": {k: v for k, v in meta.items() if v is not None}, "spec": template.get("spec") or {}}


def _ignored_on_the_vm(vm_meta: dict, template_meta: dict, name: str) -> None:
    """pcitopo's and the sidecar's annotations on the VM's own metadata do nothing (KubeVirt
    copies only the template's): one line rather than a check of a VM without them."""
    own = vm_meta.get("annotations") if isinstance(vm_meta.get("annotations"), dict) else {}
    kept = template_meta.get("annotations") if isinstance(template_meta.get("annotations"), dict) else {}
    for key in own:
        if isinstance(key, str) and key.startswith(OUR_PREFIXES) and key not in kept:
            if label := label_not_annotation(key):
                raise ConfigError(f"{name}: annotation {label}")
            raise ConfigError(f"{name}: annotation {key} is on the {VM_KIND}'s own metadata, where KubeVirt ignores it: "
                              "move it to spec.template.metadata.annotations")


def _json_or_none(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None


def _load_yaml(data: bytes, name: str) -> list[Any]:
    return yaml_documents(data, f"VMI {name}")


def _the_vm_document(docs: list[Any], name: str) -> Any:
    """The document --vmi stands for: the only one, or, of several (a VM kept in one file with
    its ConfigMap or Secret, as ``kubectl apply -f`` takes them), the one VM or VMI among them.
    Several VMs or VMIs: one line, since which of them the domain belongs to is not ours to guess."""
    if len(docs) <= 1:
        return docs[0] if docs else None
    vms = [d for d in docs if isinstance(d, dict) and d.get("kind") in (VMI_KIND, VM_KIND)]
    if len(vms) == 1:
        return vms[0]
    kinds = ", ".join(str(d.get("kind")) if isinstance(d, dict) else type(d).__name__ for d in docs)
    if not vms:
        raise ConfigError(f"VMI {name} has {len(docs)} YAML documents ({kinds}) and none is a {VMI_KIND} or a "
                          f"{VM_KIND}: give the VM's manifest or `kubectl get vmi NAME -o yaml`")
    names = ", ".join(f"{d.get('kind')} {_meta_name(d)}" for d in vms)
    raise ConfigError(f"VMI {name} has {len(vms)} {VM_KIND}/{VMI_KIND} documents ({names}): --vmi reads one; "
                      "give a file with only the VM whose domain this is")


def _meta_name(doc: dict) -> str:
    meta = doc.get("metadata")
    return str(meta.get("name")) if isinstance(meta, dict) and meta.get("name") is not None else "(no name)"


def _check_strings(doc: dict, yaml_text: bytes | None, name: str) -> None:
    """Label and annotation values are strings (Kubernetes refuses anything else). YAML reads an
    unquoted ``off``, ``no``, ``true`` or ``1`` as a boolean or a number: say so in YAML's terms,
    with the line to write instead. One kind of mistake, one exit code: bad input (2), for a
    label as for an annotation. JSON annotations are judged by parse_vmi, JSON labels here in
    its words (``yaml_text`` None: the input was JSON)."""
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        return  # parse_vmi judges the shape
    for what in ("annotation", "label"):
        values = meta.get(what + "s")
        if not isinstance(values, dict) or (yaml_text is None and what == "annotation"):
            continue
        for key, value in values.items():
            if yaml_text is None and not isinstance(value, str):
                raise ConfigError(f"VMI JSON {what} {key} is not a string")
            if isinstance(value, (bool, int, float)):
                raw = _raw_value(yaml_text, str(key)) or json.dumps(value)
                kind = "a boolean" if isinstance(value, bool) else "a number"
                raise ConfigError(f"VMI {name}: YAML reads the unquoted {raw} of {what} {key} as {kind}, but "
                                  f'{what}s are strings: quote it ({key}: "{raw}")')


def _raw_value(data: bytes, key: str) -> str | None:
    """The value as written after ``key:`` in the YAML text, for the message."""
    m = re.search(rb"^[ \t-]*['\"]?" + re.escape(key.encode()) + rb"['\"]?[ \t]*:[ \t]*([^\s#]+)", data, re.M)
    return m.group(1).decode("utf-8", "replace") if m else None


# -- is pcitopo attached? ---------------------------------------------------------------------

NOT_ATTACHED = "the VM would boot with KubeVirt's own flat placement"
NOT_STARTED = "virt-controller cannot render the launcher pod (its json.Unmarshal fails), so the VM would not start"


@dataclass(frozen=True)
class Attachment:
    """Whether KubeVirt will run pcitopo for a VMI: ``door`` is what attaches it (``None``: no
    door does) and ``why`` says how, or what is wrong, in one line; ``kind`` names the door
    checked (``sidecar`` for the hook sidecar, ``plugin`` for the Plugin)."""

    door: str | None
    why: str
    then: str = NOT_ATTACHED  # what KubeVirt does with the VMI when no door attaches pcitopo
    kind: str = "sidecar"

    @property
    def attached(self) -> bool:
        return self.door is not None

    @property
    def line(self) -> str:
        return (f"{self.kind}: attached by {self.door}: {self.why}" if self.attached
                else f"{self.kind}: not attached: {self.why}; {self.then}")


def attachment(vmi: Mapping[str, Any], door: str | None = "hook", pinned: Collection[str] = ()) -> Attachment:
    """Whether ``door`` attaches pcitopo to ``vmi`` (a VMI object): ``hook``, the hook-sidecar
    annotation (:func:`hook_sidecar_attachment`); ``plugin``, the label the pcitopo Plugin's
    conditions select (:func:`plugin_attachment`); None, either of them (the hook's verdict
    first), and when neither does, both reasons."""
    meta = vmi.get("metadata") if isinstance(vmi.get("metadata"), dict) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), dict) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    if door == "plugin":
        return plugin_attachment(labels)
    hook = hook_sidecar_attachment(annotations, pinned)
    if door == "hook" or hook.attached:
        return hook
    plugin = plugin_attachment(labels)
    if plugin.attached:
        return plugin
    return Attachment(None, f"{hook.why}; nor does the Plugin door: {plugin.why}", hook.then)


def plugin_attachment(labels: Mapping[str, Any]) -> Attachment:
    """The Plugin door: the kubevirt-main target's Plugin selects a VMI, and its admission policy injects
    the container into the VMI's pod, by one label (``pcitopo.kubevirt.doors``)."""
    from pcitopo.kubevirt.doors import PLUGIN_LABEL, PLUGIN_LABEL_VALUE, plugin_selects

    want = f'{PLUGIN_LABEL}: "{PLUGIN_LABEL_VALUE}"'
    if plugin_selects(dict(labels)):
        return Attachment("the pcitopo Plugin", f"label {want}", kind="plugin")
    if PLUGIN_LABEL in labels:
        why = f"label {PLUGIN_LABEL} is {json.dumps(labels[PLUGIN_LABEL])}, the Plugin selects {want}"
    else:
        near = [k for k in labels if isinstance(k, str) and _near(k, PLUGIN_LABEL)]
        why = f"no label {want}" + (f" ({near[0]} is not it)" if near else "")
    return Attachment(None, f"{why}: the pcitopo Plugin's conditions select only VMIs labelled so (deploy/targets/kubevirt-main)",
                      "the VM would boot with KubeVirt's own flat placement (or, on a v1.9 release with the hook "
                      "sidecar alone, without the settings KubeVirt's struct drops; check with --door hook)", kind="plugin")


# -- the hook-sidecar door: hooks.kubevirt.io/hookSidecars, as KubeVirt reads it ----------------
# KubeVirt (pkg/hooks/hooks.go, UnmarshalHookSidecarList) reads the annotation with Go's
# json.Unmarshal into a list of HookSidecar: keys match the fields' JSON names exactly, else
# case-insensitively (the last matching key wins); unknown keys are silently ignored; a value of
# the wrong type fails the whole parse. An entry without an image runs KubeVirt's sidecar-shim
# image (the hook script then comes from configMap or pvc). docs/SOURCES.md lists the source.

HOOK_SIDECARS = "hooks.kubevirt.io/hookSidecars"
HOOK_DOOR = HOOK_SIDECARS
PCITOPO_IMAGE_NAME = "pcitopo"  # the image's repository name (its last path component) holds it
_STR, _STRS, _OBJ = "a string", "a list of strings", "an object"
SIDECAR_FIELDS: dict[str, str] = {"image": _STR, "imagePullPolicy": _STR, "command": _STRS, "args": _STRS,
                                  "configMap": _OBJ, "pvc": _OBJ, "downwardAPI": _STR}
OBJECT_FIELDS: dict[str, tuple[str, ...]] = {"configMap": ("name", "key", "hookPath"),
                                             "pvc": ("name", "volumePath", "sharedComputePath")}


class _Obj(list):
    """A JSON object as its (key, value) pairs in order: Go's decoder lets the last match win."""


class _Unparsable(Exception):
    """Where Go's json.Unmarshal into KubeVirt's HookSidecar list would fail."""


def hook_sidecar_attachment(annotations: Mapping[str, Any], pinned: Collection[str] = ()) -> Attachment:
    """The hook-sidecar door: attached when an entry of the annotation, as KubeVirt parses it,
    runs a pcitopo image: one the admin ``pinned`` (``--image``, the target's params: exactly,
    whatever its name, a mirror's included) or one whose repository is named pcitopo; otherwise
    why not, in one line (a near-miss key, invalid JSON, a value KubeVirt cannot parse, an entry
    whose image is missing or another one)."""
    raw = annotations.get(HOOK_SIDECARS)
    if raw is None:
        near = [k for k in annotations if isinstance(k, str) and _near(k, HOOK_SIDECARS)]
        hint = f": {near[0]} is not an annotation KubeVirt reads (did you mean {HOOK_SIDECARS}?)" if near else ""
        return Attachment(None, f"no {HOOK_SIDECARS} annotation{hint}")
    try:
        entries = _sidecar_list(raw)
    except _Unparsable as e:
        return Attachment(None, f"KubeVirt cannot parse {HOOK_SIDECARS}: {e}", NOT_STARTED)
    if not entries:
        return Attachment(None, f"{HOOK_SIDECARS} lists no sidecar")
    said = []
    for i, (image, unknown) in enumerate(entries):
        if image and (image in pinned or _is_pcitopo(image)):
            return Attachment(HOOK_DOOR, f"entry {i} runs {image}")
        said.append(f"entry {i} runs {image}, not a {PCITOPO_IMAGE_NAME} image"
                    + (" nor the one pinned (--image)" if pinned else " (give --image if it is pcitopo's)") if image
                    else f"entry {i} has no image{_unknown_hint(unknown)}, so KubeVirt runs its sidecar-shim there")
    return Attachment(None, f"{HOOK_SIDECARS} runs no {PCITOPO_IMAGE_NAME} image: " + "; ".join(said))


def _near(key: str, wanted: str) -> bool:
    """A key that looks meant as ``wanted``: another case, a letter missing or added, a typo, the
    prefix wrong or missing (``kubevirt.io/hookSidecars``)."""
    if key == wanted:
        return False
    name = wanted.rsplit("/", 1)[-1].lower().rstrip("s")
    return (key.lower().rstrip("s").endswith(name)
            or difflib.SequenceMatcher(None, key.lower(), wanted.lower()).ratio() >= 0.9)


def _unknown_hint(unknown: list[str]) -> str:
    if not unknown:
        return ""
    key = unknown[0]
    close = difflib.get_close_matches(key, list(SIDECAR_FIELDS), n=1, cutoff=0.6)
    mean = f': did you mean "{close[0]}"?' if close else ""
    return f' (KubeVirt ignores the unknown key "{key}"{mean})'


def _is_pcitopo(image: str) -> bool:
    """``registry/path/pcitopo:tag`` or ``...@sha256:...``: the repository's last component."""
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1].split(":", 1)[0]
    return PCITOPO_IMAGE_NAME in last


def _sidecar_list(raw: Any) -> list[tuple[str, list[str]]]:
    """Each entry's image ("" when none) and unknown keys, as Go decodes the annotation."""
    if not isinstance(raw, str):
        raise _Unparsable(f"the value is {type(raw).__name__}, not a string")
    try:
        doc = json.loads(raw, object_pairs_hook=_Obj, parse_constant=_no_constant)
    except ValueError as e:
        msg = getattr(e, "msg", str(e))
        where = f" at line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else ""
        raise _Unparsable(f"not valid JSON ({msg}{where})") from None
    if doc is None:
        return []
    if isinstance(doc, _Obj) or not isinstance(doc, list):
        raise _Unparsable(f"it is {_json_type(doc)}, KubeVirt wants a list of sidecars")
    return [_sidecar_entry(i, e) for i, e in enumerate(doc)]


def _sidecar_entry(i: int, entry: Any) -> tuple[str, list[str]]:
    if entry is None:
        return "", []
    if not isinstance(entry, _Obj):
        raise _Unparsable(f"entry {i} is {_json_type(entry)}, not an object")
    values: dict[str, Any] = {}
    unknown = []
    for key, value in entry:
        field_name = _field(key, SIDECAR_FIELDS)
        if field_name is None:
            unknown.append(key)
            continue
        _check_type(f"entry {i} {field_name}", value, SIDECAR_FIELDS[field_name])
        if field_name in OBJECT_FIELDS and value is not None:
            for sub, subvalue in value:
                if _field(sub, dict.fromkeys(OBJECT_FIELDS[field_name])) is not None:
                    _check_type(f"entry {i} {field_name}.{sub}", subvalue, _STR)
        values[field_name] = value
    return values.get("image") or "", unknown


def _field(key: str, fields: Mapping[str, Any]) -> str | None:
    """The field a JSON key sets, as Go's decoder picks it: exact name, else case-insensitive."""
    if key in fields:
        return key
    return next((f for f in fields if f.lower() == key.lower()), None)


def _check_type(where: str, value: Any, want: str) -> None:
    if value is None:
        return  # Go leaves the field as it is
    ok = {_STR: isinstance(value, str), _OBJ: isinstance(value, _Obj),
          _STRS: isinstance(value, list) and not isinstance(value, _Obj) and all(isinstance(x, str) or x is None for x in value)}[want]
    if not ok:
        raise _Unparsable(f"{where} is {_json_type(value)}, KubeVirt wants {want}")


def _json_type(value: Any) -> str:
    if isinstance(value, _Obj):
        return "an object"
    if isinstance(value, bool):
        return "a boolean"
    return {str: "a string", int: "a number", float: "a number", list: "a list"}.get(type(value), "null")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
