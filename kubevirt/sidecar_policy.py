"""What the targets' Sidecar policies (deploy/components/hook-sidecars-policy) will refuse, for
``pcitopo preflight``: a VM whose ``hooks.kubevirt.io/hookSidecars`` they refuse keeps running, but
its next VMI (a restart, a migration's target is the same VMI) is refused at CREATE, so the VM
stops starting once a hook target is applied. Another team's hook sidecar is the usual case.

The policies are the rule; this is their reading for an offline dump, kept equal to them by
tests/test_sidecar_policy_model.py, which evaluates the policies' own CEL on the same annotations.
The two policies:
- pcitopo-hook-sidecars (no params): only in namespaces labelled
  ``pcitopo.kubevirt.io/hook-sidecars: allowed``, and only the documented form: a JSON list of
  objects whose first key is ``image`` (a repository by digest, not the all-zero placeholder),
  other keys only ``imagePullPolicy``, ``args`` (none, or ``--fabric /etc/pcitopo/fabric.json``
  [``--module-map /etc/pcitopo/module-map.json``]), ``configMap`` (``name``, ``key``,
  ``hookPath`` at one of those two files) and ``pvc`` (only the doctor's report:
  :data:`DOCTOR_REPORT_PVC`), strings without escapes;
- pcitopo-hook-sidecars-image (params: the PodTemplate): in those namespaces, only the
  PodTemplate's exact image.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

NAMESPACE_LABEL = ("pcitopo.kubevirt.io/hook-sidecars", "allowed")
FILES = ("/etc/pcitopo/fabric.json", "/etc/pcitopo/module-map.json")
ARGS = ([], ["--fabric", FILES[0]], ["--fabric", FILES[0], "--module-map", FILES[1]])
PULL = ("Always", "IfNotPresent", "Never")
# The one pvc the policy admits (deploy/doctor-report-volume.yaml), as its keys come in order.
DOCTOR_REPORT_PVC = [("name", "pcitopo-doctor-report"), ("volumePath", "/var/run/pcitopo")]
_BY_DIGEST = re.compile(r"[^\"\\\s@]+@sha256:[0-9a-f]{64}")
_ZERO = "@sha256:" + "0" * 64


@dataclass(frozen=True)
class Refusal:
    why: str
    certain: bool  # False: it hinges on what the dump does not hold (namespace labels, the pinned image)


def refusal(annotation: Any, namespace_labels: Mapping[str, Any] | None, image: str | None) -> Refusal | None:
    """Why the policies refuse a VMI carrying this annotation value in a namespace with these labels
    (None: the dump has no Namespace object for it), with ``image`` pinned in the PodTemplate
    (None: not known); None when they admit it."""
    shape = _shape_problem(annotation)
    if namespace_labels is not None and namespace_labels.get(NAMESPACE_LABEL[0]) != NAMESPACE_LABEL[1]:
        return Refusal("the Sidecar policy admits hooks.kubevirt.io/hookSidecars only in namespaces labelled "
                       f"{NAMESPACE_LABEL[0]}={NAMESPACE_LABEL[1]}", True)
    if shape:
        return Refusal(f"the Sidecar policy refuses its hooks.kubevirt.io/hookSidecars: {shape}", True)
    images = sorted({e["image"] for e in json.loads(annotation)})
    if image is not None and images != [image]:
        return Refusal(f"the Sidecar policy admits only the pinned image {image}, not {', '.join(images)}", True)
    if namespace_labels is None:
        return Refusal(f"its namespace is not in the dump: the Sidecar policy refuses it unless the namespace is "
                       f"labelled {NAMESPACE_LABEL[0]}={NAMESPACE_LABEL[1]}", False)
    if image is None:
        return Refusal(f"the Sidecar policy admits only the image you pin; this VM runs {', '.join(images)} "
                       "(give --image to judge)", False)
    return None


def _shape_problem(annotation: Any) -> str | None:
    if not isinstance(annotation, str):
        return "not a string"
    if "\\" in annotation:
        return "an escaped string (write it as deploy/ does)"
    try:
        entries = json.loads(annotation, object_pairs_hook=list)
    except ValueError:
        return "not JSON"
    if not isinstance(entries, list) or not entries:
        return "not a non-empty JSON list"
    for i, entry in enumerate(entries):
        problem = _entry_problem(entry)
        if problem:
            return f"entry {i}: {problem}"
    return None


def _entry_problem(pairs: Any) -> str | None:
    if not isinstance(pairs, list) or not pairs:
        return "not an object"
    key, image = pairs[0]
    if key != "image":
        return '"image" is not its first key'
    if not isinstance(image, str) or not _BY_DIGEST.fullmatch(image):
        return f"image {image!r} is not a repository by digest (@sha256:<64 hex>)"
    if image.endswith(_ZERO):
        return "the all-zero placeholder digest"
    for key, value in pairs[1:]:
        problem = _field_problem(key, value)
        if problem:
            return problem
    return None


def _field_problem(key: str, value: Any) -> str | None:
    if key == "imagePullPolicy":
        return None if value in PULL else f"imagePullPolicy {value!r}"
    if key == "args":
        return None if value in ARGS else f"args {value!r} (only --fabric {FILES[0]} [--module-map {FILES[1]}])"
    if key == "configMap":
        if not isinstance(value, list) or not value:
            return "configMap is not an object"
        for k, v in value:
            if k not in ("name", "key", "hookPath") or not isinstance(v, str):
                return f"configMap field {k!r}"
            if k == "hookPath" and v not in FILES:
                return f"configMap hookPath {v!r} (only {' or '.join(FILES)})"
        return None
    if key == "pvc":
        return None if value == DOCTOR_REPORT_PVC else "pvc other than the doctor's report (pcitopo-doctor-report at /var/run/pcitopo)"
    return f"field {key!r} (command and others may make the image run something else)"
