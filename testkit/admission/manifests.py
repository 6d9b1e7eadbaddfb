"""Reading deploy/'s manifests as a cluster would get them: YAML documents, and kustomize builds
(`kubectl kustomize`, kustomize v5; skipped where no kubectl is installed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kind(docs: list[dict], k: str) -> dict:
    """The one document of kind ``k``."""
    (doc,) = [d for d in docs if d["kind"] == k]
    return doc


def kustomize(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(kustomize_text(path)) if d]


# -- deploy targets (deploy/targets/<name>) ------------------------------------------------------

from testkit import REPO  # noqa: E402

DEPLOY = REPO / "deploy"
TARGETS_DIR = DEPLOY / "targets"
PLACEHOLDER = "registry.example.com/pcitopo"  # the image name deploy/ writes; an overlay's images: entry names it
ZERO_DIGEST = "sha256:" + "0" * 64


def overlay(where: Path, target: str, *, new_name: str, digest: str, components: tuple[str, ...] = ()) -> Path:
    """A user's overlay of ``deploy/targets/<target>`` outside the checkout (kustomize refuses an
    overlay below its base), as the targets' comments tell a user to write it: the target, one
    `images:` entry, and optional components from deploy/components/."""
    import os

    where.mkdir(parents=True, exist_ok=True)
    k = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
         "resources": [os.path.relpath(TARGETS_DIR / target, where)],
         "images": [{"name": PLACEHOLDER, "newName": new_name, "digest": digest}]}
    if components:
        k["components"] = [os.path.relpath(DEPLOY / "components" / c, where) for c in components]
    (where / "kustomization.yaml").write_text(yaml.safe_dump(k, sort_keys=False))
    return where


def kustomize_text(path: Path) -> str:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("needs kubectl (kustomize v5) to build the kustomization")
    r = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def pod_specs(docs: list[dict]) -> list[tuple[str, dict]]:
    """(DaemonSet name, pod spec) of every DaemonSet rendered."""
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in docs if d["kind"] == "DaemonSet"]


def template_image(docs: list[dict]) -> dict:
    """The PodTemplate pcitopo/pcitopo-image: the admission policies' params."""
    (pt,) = [d for d in docs if d["kind"] == "PodTemplate" and d["metadata"]["name"] == "pcitopo-image"]
    return pt
