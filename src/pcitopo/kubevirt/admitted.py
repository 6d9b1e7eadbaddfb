"""What the hook targets' Sidecar policies admit besides a namespace's own choice: the params
object they read, the PodTemplate ``pcitopo/pcitopo-image`` (deploy/base/image.yaml).

- its container ``pcitopo``: the pcitopo image the overlay pins (kustomize's ``images:`` sets it);
- its annotations, one per admitted hook, ``pcitopo.kubevirt.io/<kind>.<label>: <value>``:
  - ``pcitopo.<label>: REPOSITORY@sha256:<64 hex>``: an earlier pcitopo image still admitted
    (an upgrade keeps the old one until no VM uses it; pcitopo's own rules apply to it);
  - ``sidecar.<label>: REPOSITORY@sha256:<64 hex>``: another team's vetted hook image;
  - ``configmap.<label>: NAMESPACE/CONFIGMAP``: a hook with no image in that namespace, which
    KubeVirt runs in its own sidecar-shim with that ConfigMap's script.
  By digest only: no tag, no wildcard. Annotations, not containers, because kustomize's
  ``images:`` rewrites every container of the pinned repository, and an earlier pcitopo digest
  must survive the overlay that pins the new one.

The same entries come from ``pcitopo preflight``'s flags (``--image``, ``--allow-sidecar``), and
preflight prints the entry that would admit a refused hook. Bad entries are one line, exit 2.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pcitopo.errors import ConfigError

PARAMS = ("pcitopo", "pcitopo-image")  # the PodTemplate's namespace and name
CONTAINER = "pcitopo"
PREFIX = "pcitopo.kubevirt.io/"
KINDS = ("pcitopo", "sidecar", "configmap")
# What the policies' CEL accepts in the params (deploy/components/hook-sidecars-policy): the
# characters an image reference can have that are not regex syntax except ".", which the CEL
# escapes when it builds its pattern; and a namespace and a ConfigMap name as Kubernetes names them.
BY_DIGEST = re.compile(r"[A-Za-z0-9._/:-]+@sha256:[0-9a-f]{64}")
ZERO = "@sha256:" + "0" * 64
CONFIGMAP = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
CONFIGMAP_FLAG = "configmap:"


@dataclass(frozen=True)
class Admitted:
    """The pcitopo images (the pinned one first; empty: not known), other teams' hook images and
    ConfigMap hooks (namespace, name) the policies admit."""

    pcitopo: tuple[str, ...] = ()
    sidecars: frozenset[str] = frozenset()
    configmaps: frozenset[tuple[str, str]] = frozenset()

    @property
    def pinned(self) -> str | None:
        return self.pcitopo[0] if self.pcitopo else None

    def with_(self, pcitopo: Iterable[str] = (), sidecars: Iterable[str] = (),
              configmaps: Iterable[tuple[str, str]] = ()) -> Admitted:
        """These entries added (pcitopo images after the ones already admitted)."""
        ours = tuple(dict.fromkeys((*self.pcitopo, *pcitopo)))
        return Admitted(ours, self.sidecars | frozenset(sidecars), self.configmaps | frozenset(configmaps))


def image_ref(text: str, what: str) -> str:
    """A hook image as the policies admit it, REPOSITORY@sha256:<64 hex>; anything else is a
    ConfigError naming ``what`` (a flag, an annotation)."""
    if not isinstance(text, str) or "@" not in text:
        raise ConfigError(f"{what}: {text!r} is not pinned by digest: give REPOSITORY@sha256:<64 hex> (no tag)")
    repo, digest = text.rsplit("@", 1)
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", digest):
        raise ConfigError(f"{what}: {digest!r} is not a digest: give sha256:<64 lower-case hex>")
    if ":" in repo.rsplit("/", 1)[-1]:
        raise ConfigError(f"{what}: {text!r} names a tag as well as a digest: give REPOSITORY@sha256:<64 hex> (no tag)")
    if not BY_DIGEST.fullmatch(text):
        raise ConfigError(f"{what}: {repo!r} is not a repository name (letters, digits, . _ / : -)")
    if text.endswith(ZERO):
        raise ConfigError(f"{what}: the all-zero digest is the base's placeholder, not an image")
    return text


def configmap_ref(text: str, what: str) -> tuple[str, str]:
    """NAMESPACE/CONFIGMAP, as Kubernetes names them."""
    if not isinstance(text, str) or not CONFIGMAP.fullmatch(text):
        raise ConfigError(f"{what}: {text!r} is not NAMESPACE/CONFIGMAP (lower-case Kubernetes names)")
    namespace, name = text.split("/", 1)
    return namespace, name


def from_flag(text: str) -> Admitted:
    """``--allow-sidecar``: an image by digest, or ``configmap:NAMESPACE/CONFIGMAP``."""
    if text.startswith(CONFIGMAP_FLAG):
        return Admitted(configmaps=frozenset([configmap_ref(text[len(CONFIGMAP_FLAG):], "--allow-sidecar")]))
    return Admitted(sidecars=frozenset([image_ref(text, "--allow-sidecar")]))


def from_params(podtemplate: Mapping[str, Any]) -> Admitted:
    """The PodTemplate's pinned image (not pinned: none) and its admitted hooks."""
    meta = podtemplate.get("metadata") if isinstance(podtemplate.get("metadata"), Mapping) else {}
    where = f"PodTemplate {PARAMS[0]}/{PARAMS[1]}"
    containers = (((podtemplate.get("template") or {}).get("spec") or {}).get("containers") or [])
    images = [c.get("image") for c in containers if isinstance(c, Mapping) and c.get("name") == CONTAINER]
    pinned = images[0] if len(images) == 1 and isinstance(images[0], str) and BY_DIGEST.fullmatch(images[0]) \
        and not images[0].endswith(ZERO) else None
    earlier, sidecars, configmaps = [], set(), set()
    for key, value in sorted((meta.get("annotations") or {}).items()):
        kind = _kind(key)
        if kind is None:
            continue
        what = f"{where} annotation {key}"
        if kind == "configmap":
            configmaps.add(configmap_ref(value, what))
        elif kind == "sidecar":
            sidecars.add(image_ref(value, what))
        else:
            earlier.append(image_ref(value, what))
    return Admitted(tuple(dict.fromkeys([pinned] if pinned else [])) + tuple(e for e in earlier if e != pinned),
                    frozenset(sidecars), frozenset(configmaps))


def _kind(key: str) -> str | None:
    if not isinstance(key, str) or not key.startswith(PREFIX):
        return None
    head = key[len(PREFIX):].split(".", 1)[0]
    return head if head in KINDS and "." in key[len(PREFIX):] else None


def entry(kind: str, value: str, label: str) -> str:
    """The params annotation that admits ``value``, as an admin writes it under
    ``metadata.annotations`` of the PodTemplate (the name part of a key is at most 63 characters)."""
    clean = re.sub(r"[^a-z0-9.-]+", "-", label.lower()).strip(".-") or "hook"
    name = f"{kind}.{clean}"[:63].rstrip(".-")
    return f"{PREFIX}{name}: {value}"


def sidecar_entry(image: str) -> str:
    repo = image.split("@", 1)[0]
    return entry("sidecar", image, repo.rsplit("/", 1)[-1].split(":", 1)[0])


def configmap_entry(namespace: str, name: str) -> str:
    return entry("configmap", f"{namespace}/{name}", f"{namespace}.{name}")


def in_dump(dump) -> Admitted | None:
    """The params the dump holds (``kubectl get podtemplates -n pcitopo``), or None."""
    found = [o for o in dump.of_kind("PodTemplate")
             if (o.get("metadata") or {}).get("namespace") == PARAMS[0] and (o.get("metadata") or {}).get("name") == PARAMS[1]]
    return from_params(found[0]) if found else None


def judged(dumped: Admitted | None, images: Iterable[str] = (), allow: Iterable[str] = ()) -> Admitted:
    """What the target's policies will admit: the dump's params, with ``images`` (``--image``:
    the pin your overlay sets, then earlier pcitopo images it still admits) in place of the
    dump's pin (its earlier ones stay: an overlay keeps its annotations), and ``allow``
    (``--allow-sidecar``) added."""
    base = dumped or Admitted()
    pins = [image_ref(i, "--image") for i in images]
    ours = (*pins, *base.pcitopo[1:]) if pins else base.pcitopo
    out = Admitted(tuple(dict.fromkeys(ours)), base.sidecars, base.configmaps)
    for flag in allow:
        extra = from_flag(flag)
        out = out.with_(sidecars=extra.sidecars, configmaps=extra.configmaps)
    return out
