"""The sidecar image pinned by digest
through kustomize. The image KubeVirt reads sits inside the JSON of the hookSidecars annotation,
which kustomize's `images:` cannot reach; deploy/pin-image/ copies it there, in the base and in
every overlay that lists it after its own `images:` (docs/kustomize-pinned). Rendered with the
real kustomize (kubectl's, v5+: scripts/setup-kubectl.sh finds or installs it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit import REPO as ROOT

ANNOTATION = "hooks.kubevirt.io/hookSidecars"
OVERLAY = ROOT / "docs" / "kustomize-pinned"
DEPLOY_MD = ROOT / "docs" / "DEPLOY.md"


def kustomize() -> list[str]:
    """The kustomize build command scripts/setup-kubectl.sh --check names (it downloads nothing)."""
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup-kubectl.sh"), "--check"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        pytest.skip(r.stderr.strip() or "no kustomize v5+")
    return r.stdout.split()


def render(path: Path) -> tuple[list[dict], str]:
    r = subprocess.run([*kustomize(), str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d], r.stdout


def sidecars(docs: list[dict]) -> list[dict]:
    (vm,) = [d for d in docs if d["kind"] == "VirtualMachine"]
    return json.loads(vm["spec"]["template"]["metadata"]["annotations"][ANNOTATION])


def overlay_images(path: Path) -> dict:
    (entry,) = yaml.safe_load((path / "kustomization.yaml").read_text())["images"]
    return entry


def shipped_sidecars() -> list[dict]:
    vm = yaml.safe_load((ROOT / "deploy" / "vm-gpu.yaml").read_text())
    return json.loads(vm["spec"]["template"]["metadata"]["annotations"][ANNOTATION])


def test_the_shipped_overlay_pins_the_digest_in_the_annotation():
    """`kubectl kustomize docs/kustomize-pinned`: the overlay's `images:` entry, by digest, is
    the image in the VM template's hookSidecars JSON; the rest of the JSON is the base's; the
    helper Pod is not emitted."""
    entry = overlay_images(OVERLAY)
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", entry["digest"])
    docs, out = render(OVERLAY)
    want = [{**shipped_sidecars()[0], "image": f"{entry['newName']}@{entry['digest']}"}]
    assert sidecars(docs) == want
    assert [d["kind"] for d in docs] == ["VirtualMachine"], out


def test_an_overlay_elsewhere_with_its_own_registry_and_digest(tmp_path):
    """An overlay as DEPLOY.md tells a user to write it, outside the checkout (kustomize
    refuses an overlay below its base), with another registry: that image reaches the
    annotation. Without the `transformers:` line it does not (the finding: `images:` alone
    left the base's image in the annotation), which is why the docs give that line."""
    overlay = tmp_path / "site" / "pcitopo"
    overlay.mkdir(parents=True)
    deploy = os.path.relpath(ROOT / "deploy", overlay)
    digest = "sha256:" + "ab" * 32
    text = (OVERLAY / "kustomization.yaml").read_text().replace("../../deploy", deploy)
    text = re.sub(r"newName: \S+", "newName: registry.corp.example/ml/pcitopo", text)
    text = re.sub(r"digest: sha256:[0-9a-f]{64}", f"digest: {digest}", text)
    (overlay / "kustomization.yaml").write_text(text)
    docs, _ = render(overlay)
    assert sidecars(docs)[0]["image"] == f"registry.corp.example/ml/pcitopo@{digest}"

    k = yaml.safe_load(text)
    del k["transformers"]
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(k))
    docs, _ = render(overlay)
    assert sidecars(docs) == shipped_sidecars()


def test_the_base_alone_renders_the_vm_as_shipped():
    """deploy/ on its own (`kubectl apply -k deploy/`): the annotation as vm-gpu.yaml has it,
    because the helper Pod holds the same image (keep them equal); no Pod in the output."""
    pod = yaml.safe_load((ROOT / "deploy" / "sidecar-image.yaml").read_text())
    assert pod["spec"]["containers"][0]["image"] == shipped_sidecars()[0]["image"]
    docs, _ = render(ROOT / "deploy")
    assert sidecars(docs) == shipped_sidecars()
    assert [d["kind"] for d in docs] == ["VirtualMachine"]


def test_deploy_md_says_which_tools_and_versions_the_overlay_needs():
    text = DEPLOY_MD.read_text()
    section = text[text.index("### Pin the image by digest"):text.index("## Feature gates")]
    assert "kubectl 1.22" not in section, "kubectl 1.22-1.26 (kustomize 4.x) cannot render the overlay"
    assert "kustomize v5" in section and "kubectl 1.27" in section
    assert re.search(r"standalone `kustomize`[^.]*`kustomize edit", section) or \
        re.search(r"`kustomize edit[^`]*`[^.]*standalone", section)
    assert "docs/kustomize-pinned" in section and "transformers:" in section
