"""What the targets' Sidecar policies (deploy/components/hook-sidecars-policy) will refuse, for
``pcitopo preflight`` and ``xmlfix --check --cluster``: a VM whose
``hooks.kubevirt.io/hookSidecars`` they refuse keeps running, but its next VMI (a restart) is
refused at CREATE, so it stops starting once a hook target is applied.

The policies are the rule; this is their reading for an offline dump, kept equal to them by
tests/test_sidecar_policy_model.py, which evaluates the policies' own CEL on the same annotations.
The annotation is a JSON list of entries, strings without escapes; each entry is one of:
- pcitopo's: ``image`` first, one of the pcitopo images the params admit (src/pcitopo/kubevirt/admitted.py),
  then ``imagePullPolicy``, ``args`` (none, or ``--fabric /etc/pcitopo/fabric.json``
  [``--module-map /etc/pcitopo/module-map.json``]) and ``configMap`` (``name``, ``key`` and
  ``hookPath`` at one of those two files) and ``pvc`` (only the doctor's report:
  :data:`DOCTOR_REPORT_PVC`); only in namespaces labelled
  ``pcitopo.kubevirt.io/hook-sidecars: allowed``;
- another team's, in any namespace: keys in any order, ``image`` once, one of the admitted
  sidecar images, with ``imagePullPolicy`` and ``args`` (strings) only;
- a hook with no image (KubeVirt's sidecar-shim runs the ConfigMap's script), in any namespace:
  ``configMap`` once (``name`` admitted for the VM's namespace, ``key``, ``hookPath``), with
  ``imagePullPolicy`` and ``args``.
Every image is by digest (not the all-zero placeholder); ``command``, any other ``pvc`` and other keys
are refused. The reason given is the cause first: an image not admitted is said before its grammar.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pcitopo.kubevirt.admitted import ZERO, Admitted, configmap_entry, entry, sidecar_entry

NAMESPACE_LABEL = ("pcitopo.kubevirt.io/hook-sidecars", "allowed")
FILES = ("/etc/pcitopo/fabric.json", "/etc/pcitopo/module-map.json")
ARGS = ([], ["--fabric", FILES[0]], ["--fabric", FILES[0], "--module-map", FILES[1]])
PULL = ("Always", "IfNotPresent", "Never")
# The one pvc the policy admits (deploy/doctor-report-volume.yaml), as its keys come in order.
DOCTOR_REPORT_PVC = [("name", "pcitopo-doctor-report"), ("volumePath", "/var/run/pcitopo")]
CONFIGMAP_KEYS = ("name", "key", "hookPath")
_BY_DIGEST = re.compile(r"[^\"\\\s@]+@sha256:[0-9a-f]{64}")
ONLY = "only pcitopo's image and the admitted list are allowed"


@dataclass(frozen=True)
class Refusal:
    why: str
    certain: bool  # False: it hinges on what the dump does not hold (namespace labels, the pinned image)
    admit: str | None = None  # the params annotation that would admit it (src/pcitopo/kubevirt/admitted.py)


@dataclass(frozen=True)
class _Where:
    namespace: str
    labels: Mapping[str, Any] | None  # None: the dump has no Namespace object for it
    admitted: Admitted

    @property
    def labelled(self) -> bool | None:
        if self.labels is None:
            return None
        return self.labels.get(NAMESPACE_LABEL[0]) == NAMESPACE_LABEL[1]


def refusal(annotation: Any, namespace: str, labels: Mapping[str, Any] | None, admitted: Admitted) -> Refusal | None:
    """Why the policies refuse a VMI carrying this annotation value in ``namespace`` with these
    labels (None: not in the dump), under the params ``admitted``; None when they admit it."""
    if not isinstance(annotation, str):
        return _shape("not a string")
    try:
        entries = json.loads(annotation, object_pairs_hook=list)
    except ValueError:
        return _shape("not JSON")
    if not isinstance(entries, list) or not entries:
        return _shape("not a non-empty JSON list")
    where = _Where(namespace, labels, admitted)
    found = [(i, r) for i, e in enumerate(entries) if (r := _entry(e, where)) is not None]
    if "\\" in annotation and not any(r.certain for _, r in found):
        return _shape("an escaped string (write it as deploy/ does)")
    if not found:
        return None
    i, worst = next(((i, r) for i, r in found if r.certain), found[0])
    prefix = "" if len(entries) == 1 else f"entry {i}: "
    return Refusal(prefix + worst.why, worst.certain, worst.admit)


def _shape(problem: str) -> Refusal:
    return Refusal(f"the Sidecar policy refuses its hooks.kubevirt.io/hookSidecars: {problem}", True)


def _entry(pairs: Any, where: _Where) -> Refusal | None:
    if not _is_object(pairs):
        return _shape("an entry is not an object")
    images = [v for k, v in pairs if k == "image"]
    if len(images) > 1:
        return _shape('"image" twice in one entry')
    if not images:
        return _imageless(pairs, where)
    image = images[0]
    if not isinstance(image, str) or not _BY_DIGEST.fullmatch(image):
        ours = isinstance(image, str) and repository(image) in {repository(p) for p in where.admitted.pcitopo}
        return Refusal(f"image {image!r} is not pinned by digest: the Sidecar policy admits hook images by digest only "
                       "(@sha256:<64 hex>); " + (f"pin it as {where.admitted.pinned}" if ours else "pin it, then admit that digest"),
                       True, sidecar_entry(f"{repository(image)}@sha256:<64 hex>") if isinstance(image, str) and not ours else None)
    if image.endswith(ZERO):
        return _shape("the all-zero placeholder digest")
    ours = _ours(pairs, where) if image in where.admitted.pcitopo else None
    theirs = _fields(pairs, "image", f"another team's hook ({image})") if image in where.admitted.sidecars else None
    if image in where.admitted.pcitopo and image in where.admitted.sidecars:
        return None if ours is None or theirs is None else ours
    if image in where.admitted.pcitopo or image in where.admitted.sidecars:
        return ours or theirs
    if not where.admitted.pcitopo and _named_pcitopo(image):
        return Refusal(f"the Sidecar policy admits only the pcitopo image you pin; this VM runs {image} "
                       "(give --image to judge)", False)
    if repository(image) in {repository(p) for p in where.admitted.pcitopo}:  # pcitopo's own, another digest
        return Refusal(f"the Sidecar policy refuses its hook sidecar {image}, a pcitopo digest no longer admitted: {ONLY}",
                       True, entry("pcitopo", image, "previous"))
    return Refusal(f"the Sidecar policy refuses its hook sidecar {image}: {ONLY}", True, sidecar_entry(image))


def _imageless(pairs: list, where: _Where) -> Refusal | None:
    maps = [v for k, v in pairs if k == "configMap"]
    if not maps:
        return _shape("an entry with no image and no configMap (KubeVirt's sidecar-shim would run nothing vetted)")
    name = next((v for k, v in maps[-1] if k == "name"), None) if _is_object(maps[-1]) else None
    if len(maps) == 1 and isinstance(name, str) and (where.namespace, name) not in where.admitted.configmaps:
        return Refusal(f"the Sidecar policy refuses its hook with no image (KubeVirt's sidecar-shim runs ConfigMap "
                       f"{where.namespace}/{name}'s script): {ONLY}", True, configmap_entry(where.namespace, name))
    return _fields(pairs, "configMap", "a hook with no image")


def _ours(pairs: list, where: _Where) -> Refusal | None:
    if where.labelled is False:
        return Refusal("the Sidecar policy admits pcitopo's hook sidecar only in namespaces labelled "
                       f"{NAMESPACE_LABEL[0]}={NAMESPACE_LABEL[1]}", True)
    if pairs[0][0] != "image":
        return _shape('"image" is not the first key of pcitopo\'s entry')
    for key, value in pairs[1:]:
        problem = _our_field(key, value)
        if problem:
            return _shape(problem)
    if where.labelled is None:
        return Refusal(f"its namespace is not in the dump: the Sidecar policy refuses it unless the namespace is "
                       f"labelled {NAMESPACE_LABEL[0]}={NAMESPACE_LABEL[1]}", False)
    return None


def _our_field(key: str, value: Any) -> str | None:
    if key == "imagePullPolicy":
        return None if value in PULL else f"imagePullPolicy {value!r}"
    if key == "args":
        return None if value in ARGS else f"args {value!r} (only --fabric {FILES[0]} [--module-map {FILES[1]}])"
    if key == "configMap":
        return _configmap_problem(value, lambda path: path in FILES, f"only {' or '.join(FILES)}")
    if key == "pvc":
        return None if value == DOCTOR_REPORT_PVC else "pvc other than the doctor's report (pcitopo-doctor-report at /var/run/pcitopo)"
    return f"field {key!r} (command and others may make the image run something else)"


def _fields(pairs: list, once: str, what: str) -> Refusal | None:
    """Another team's entry or an image-less one: ``once`` (image or configMap) exactly once, and
    besides it only imagePullPolicy and args (strings)."""
    for key, value in pairs:
        if key == once:
            problem = _configmap_problem(value, lambda path: True, "") if key == "configMap" else None
        elif key == "imagePullPolicy":
            problem = None if value in PULL else f"imagePullPolicy {value!r}"
        elif key == "args":
            problem = None if isinstance(value, list) and all(isinstance(a, str) for a in value) else "args not strings"
        else:
            problem = f"field {key!r} in {what} (only imagePullPolicy and args: command, pvc and others change what runs)"
        if problem:
            return _shape(problem)
    if sum(k == once for k, _ in pairs) != 1:
        return _shape(f'"{once}" twice in one entry')
    return None


def _configmap_problem(value: Any, path_ok, only: str) -> str | None:
    """name, key and hookPath, each once, strings (issue: a configMap without hookPath is refused)."""
    if not _is_object(value) or sorted(k for k, _ in value) != sorted(CONFIGMAP_KEYS):
        return "configMap needs exactly name, key and hookPath"
    for k, v in value:
        if not isinstance(v, str):
            return f"configMap field {k!r} is not a string"
        if k == "hookPath" and not path_ok(v):
            return f"configMap hookPath {v!r} ({only})"
    return None


def _is_object(value: Any) -> bool:
    """A JSON object as json.loads(object_pairs_hook=list) gives it: a list of (key, value) tuples."""
    return isinstance(value, list) and all(isinstance(p, tuple) for p in value)


def repository(image: str) -> str:
    """``registry:5000/team/hook:1.2`` -> ``registry:5000/team/hook`` (no tag, no digest)."""
    repo = image.split("@", 1)[0]
    head, _, last = repo.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def _named_pcitopo(image: str) -> bool:
    """Only while no pin is known: a repository named like pcitopo's is to check, not refused."""
    return "pcitopo" in image.split("@", 1)[0].rsplit("/", 1)[-1]
