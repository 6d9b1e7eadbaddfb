"""The deploy docs and manifests say what the code does."""

from __future__ import annotations

import json
import re

import pytest

from pcitopo.serve.options import PREFIX, describe_options, options_from_annotations
from pcitopo.serve.server import DEFAULT_SOCKET
from testkit.hookkit import REPO

DEPLOY_MD = (REPO / "docs" / "DEPLOY.md").read_text()
VM_MD = (REPO / "docs" / "VM.md").read_text()  # one VM: its options, what it writes
MANIFESTS = sorted((REPO / "deploy").glob("*.yaml"))


def test_every_option_is_documented_with_its_values_and_default():
    rows = [line for line in VM_MD.splitlines() if line.startswith(f"| `{PREFIX}")]
    documented = {re.match(r"\| `([^`]+)`", r).group(1): r for r in rows}
    assert set(documented) == {name for name, *_ in describe_options()}
    for name, allowed, default, _ in describe_options():
        cells = [c.strip() for c in documented[name].strip("|").split("|")]
        assert re.findall(r"`([^`]+)`", cells[1]) == list(allowed), name
        assert cells[2] == f"`{default}`", name


def test_the_socket_path_and_entrypoint_in_the_docs_are_the_real_ones():
    assert DEFAULT_SOCKET in DEPLOY_MD
    assert "`pcitopo serve`" in DEPLOY_MD


@pytest.mark.parametrize("path", [p for p in MANIFESTS if p.name.startswith(("vm", "vmi"))], ids=lambda p: p.name)
def test_example_vms_attach_the_sidecar_with_valid_options(path):
    import yaml

    from pcitopo.kubevirt.doors import plugin_selects

    text = path.read_text()
    doc = next(d for d in yaml.safe_load_all(text) if d and d.get("kind") in ("VirtualMachine", "VirtualMachineInstance"))
    meta = doc["spec"]["template"]["metadata"] if doc["kind"] == "VirtualMachine" else doc["metadata"]
    ann = meta["annotations"]
    assert plugin_selects(meta.get("labels")), "both doors: the Plugin's label beside the hook's annotation"
    sidecars = json.loads(ann["hooks.kubevirt.io/hookSidecars"])
    assert len(sidecars) == 1 and set(sidecars[0]) <= {"image", "imagePullPolicy"}, "no command/args: the entrypoint serves"
    ours = {k: v for k, v in ann.items() if k.startswith(PREFIX)}
    assert ours, "show at least one option"
    options_from_annotations(ours)  # raises on a bad one
    for needle in ("dedicatedCpuPlacement: true", "guestMappingPassthrough", "hugepages", "sriov: {}", "gpus:"):
        assert needle in text, needle
    if "kind: VirtualMachine\n" in text:
        template = text.index("  template:\n")
        assert text.index("hooks.kubevirt.io/hookSidecars") > text.index("    metadata:\n", template), \
            "a VM's annotations belong on spec.template.metadata"


def test_the_kubevirt_cr_enables_sidecars_with_the_memory_the_docs_recommend():
    text = (REPO / "deploy" / "kubevirt-cr.yaml").read_text()
    assert re.search(r"featureGates:\s*\n\s*- Sidecar", text)
    assert re.search(r"supportContainerResources:\s*\n\s*- type: sidecar", text)
    assert text.count("memory: 96Mi") == 2 and "96Mi" in DEPLOY_MD


def test_the_memory_figures_are_stated_once_in_deploy_md():
    """The measured memory lives in docs/DEPLOY.md's "Memory budget"; the manifests and
    SECURITY.md refer to it instead of quoting figures that drift apart."""
    assert "### Memory budget" in DEPLOY_MD and "≤ 56 MiB" in DEPLOY_MD
    for path in [*MANIFESTS, REPO / "docs" / "SECURITY.md"]:
        text = path.read_text()
        assert not re.search(r"\d+(\.\d+)? ?(MiB|MB)\b.*(idle|resident|peak|after)", text), path.name
        if path.name == "kubevirt-cr.yaml" or path.name == "SECURITY.md":
            assert "Memory budget" in text, path.name
