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
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("needs kubectl (kustomize v5) to build the kustomization")
    r = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]
