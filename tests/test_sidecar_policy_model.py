"""pcitopo preflight's reading of the hook targets' Sidecar policies (kubevirt/sidecar_policy.py)
is the policies' own verdict: the same annotations, in the same namespaces, through the policies'
CEL (cel-python, in kube-apiserver's order; tests/test_tenancy.py's corpus), admit and refuse
alike. And preflight names a VM the policies would refuse at its next start, whatever its devices."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testkit import REPO as ROOT

pytest.importorskip("celpy")

from test_tenancy import ALLOWED, ALLOWED_NS, IMAGE, MALFORMED, OTHER_IMAGE, OTHER_NS, gpu_vmi, refusals  # noqa: E402

from pcitopo.kubevirt.sidecar_policy import refusal  # noqa: E402

CORPUS = {**ALLOWED, **MALFORMED, **OTHER_IMAGE}
CLUSTERS = ROOT / "fixtures" / "clusters"
OUR_IMAGE = "registry.example.com/pcitopo@sha256:" + "4f2c0d3b" * 8


def _labels(ns: dict) -> dict:
    return ns["metadata"].get("labels", {})


@pytest.mark.parametrize("namespace", [ALLOWED_NS, OTHER_NS], ids=["allowed", "unlabelled"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_model_admits_and_refuses_what_the_policies_cel_does(name, namespace):
    annotation = CORPUS[name]
    policies = refusals(gpu_vmi(annotation), namespace)
    model = refusal(annotation, _labels(namespace), IMAGE)
    assert (model is None) == (policies == []), (policies, model)
    assert model is None or model.certain


def test_without_the_namespace_or_the_pinned_image_a_well_formed_sidecar_is_only_to_check():
    (annotation,) = [ALLOWED["pcitopo by digest"]]
    assert refusal(annotation, _labels(ALLOWED_NS), IMAGE) is None
    for labels, image in ((None, IMAGE), (_labels(ALLOWED_NS), None)):
        r = refusal(annotation, labels, image)
        assert r is not None and not r.certain
    # what is refused for its form is refused whatever the dump lacks
    r = refusal(MALFORMED["a tag, not a digest"], None, None)
    assert r is not None and r.certain


def _preflight(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pcitopo.sidecar.cli", "preflight", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_preflight_names_another_teams_hook_sidecar_vm_that_the_policy_would_stop():
    r = _preflight("--target", "kubevirt-v1.9.0", "--image", OUR_IMAGE, str(CLUSTERS / "v1.9.0-other-sidecar.yaml"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "HARMED tools/netprep-0 (VirtualMachine): the Sidecar policy admits hooks.kubevirt.io/hookSidecars only in " \
           "namespaces labelled pcitopo.kubevirt.io/hook-sidecars=allowed" in r.stdout
    assert r.stdout.splitlines()[-1] == ("verdict: applying kubevirt-v1.9.0 harms 1 VM(s): "
                                         "tools/netprep-0 (stops starting: Sidecar policy)")


def test_preflight_passes_pcitopos_own_pinned_vm_in_its_allowed_namespace():
    r = _preflight("--target", "kubevirt-v1.9.0", "--image", OUR_IMAGE, "--json", str(CLUSTERS / "v1.9.0-stranger.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["sidecar_policy"] == [] and report["ok"]
    # another pin: the same VM is refused by the image policy
    r = _preflight("--target", "kubevirt-v1.9.0", "--image", OUR_IMAGE[:-1] + "0", str(CLUSTERS / "v1.9.0-stranger.yaml"))
    assert r.returncode == 1 and "HARMED ml/llm-0 (VirtualMachine): the Sidecar policy admits only the pinned image" in r.stdout


def test_the_plugin_target_carries_no_sidecar_policy_and_judges_none():
    r = _preflight("--target", "kubevirt-main", "--json", str(CLUSTERS / "v1.9.0-other-sidecar.yaml"))
    assert json.loads(r.stdout)["sidecar_policy"] == []
