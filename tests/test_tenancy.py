"""deploy/tenancy/: multi-tenant clusters (issue 26, finding 9).

- hook-sidecars-policy.yaml, a ValidatingAdmissionPolicy: hooks.kubevirt.io/hookSidecars only in
  namespaces an admin labels, and only with pcitopo's image by digest;
- attach-gpu-vmis.yaml, a MutatingAdmissionPolicy: every GPU VMI opts into the pcitopo Plugin.

Both are validated against Kubernetes 1.34's strict schemas (the MutatingAdmissionPolicy as the
v1beta1 that 1.34 serves, from deploy/tenancy-k8s-1.34) and their CEL is evaluated with
cel-python (testkit/admission) on VMIs and VMs an owner could write.
"""

from __future__ import annotations

import copy
import json

import pytest

from testkit import REPO as ROOT

pytest.importorskip("celpy")
from testkit.admission.policy import Admission  # noqa: E402  (needs cel-python)
from testkit.admission.manifests import kind, kustomize, load  # noqa: E402

TENANCY = ROOT / "deploy" / "tenancy"
K8S = "1.34.0"
LABEL = "pcitopo.kubevirt.io/plugin"
HOOKS = "hooks.kubevirt.io/hookSidecars"
NS_LABEL = "pcitopo.kubevirt.io/hook-sidecars"
DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example.com/pcitopo@{DIGEST}"
PARAMS = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pcitopo-admission", "namespace": "pcitopo"},
          "data": {"image": IMAGE, "digest": DIGEST, "legacyHook": "false"}}
ALLOWED_NS = {"metadata": {"name": "ml", "labels": {NS_LABEL: "allowed"}}}
OTHER_NS = {"metadata": {"name": "team-b", "labels": {"kubernetes.io/metadata.name": "team-b"}}}


@pytest.fixture(scope="module")
def vap() -> dict:
    return kind(load(TENANCY / "hook-sidecars-policy.yaml"), "ValidatingAdmissionPolicy")


@pytest.fixture(scope="module")
def attach() -> dict:
    return kind(load(TENANCY / "attach-gpu-vmis.yaml"), "MutatingAdmissionPolicy")


def gpu_vmi(annotation: str | None = None) -> dict:
    doc = copy.deepcopy(kind(load(ROOT / "deploy" / "vmi-gpu.yaml"), "VirtualMachineInstance"))
    doc["metadata"]["annotations"].pop(HOOKS)
    doc["metadata"].pop("labels", None)  # the example's own Plugin label: these VMIs come without one
    if annotation is not None:
        doc["metadata"]["annotations"][HOOKS] = annotation
    return doc


def sidecars(*entries: dict) -> str:
    return json.dumps(list(entries))


OURS = {"image": IMAGE, "imagePullPolicy": "IfNotPresent"}
ALLOWED = {
    "pcitopo by digest": sidecars(OURS),
    "the same digest from a mirror": sidecars({"image": f"mirror.local:5000/pcitopo@{DIGEST}"}),
    "with the fabric ConfigMap": sidecars({"image": IMAGE, "args": ["--fabric", "/etc/pcitopo/fabric.json"],
                                           "configMap": {"name": "pcitopo-fabric-node-a", "key": "fabric.json",
                                                         "hookPath": "/etc/pcitopo/fabric.json"}}),
    "two entries, compact JSON": json.dumps([OURS, {"image": IMAGE}], separators=(",", ":")),
}
DENIED = {
    "a tag, not a digest": sidecars({"image": "registry.example.com/pcitopo:0.1.0"}),
    "another digest": sidecars({"image": "registry.example.com/pcitopo@sha256:" + "cd" * 32}),
    "no image (KubeVirt's sidecar-shim runs the owner's script)": sidecars({"args": ["--version", "v1alpha2"]}),
    "a command in our image": sidecars({"image": IMAGE, "command": ["/bin/sh", "-c", "id"]}),
    "a ConfigMap over the entrypoint": sidecars({"image": IMAGE, "configMap": {
        "name": "x", "key": "run", "hookPath": "/opt/pcitopo/bin/pcitopo"}}),
    "a hookPath that climbs out": sidecars({"image": IMAGE, "configMap": {
        "name": "x", "key": "run", "hookPath": "/etc/pcitopo/../../opt/pcitopo/bin/pcitopo"}}),
    "a pvc": sidecars({"image": IMAGE, "pvc": {"name": "data", "volumePath": "/data", "sharedComputePath": "/x"}}),
    "a second entry of another image": sidecars(OURS, {"image": "evil.example/x:latest"}),
    "Go's case-insensitive key": '[{"image": "%s", "Image": "evil.example/x:latest"}]' % IMAGE,
    "an escaped key": '[{"image": "%s", "\\u0069mage": "evil.example/x:latest"}]' % IMAGE,
    "image not the first key": sidecars({"imagePullPolicy": "Always", "image": IMAGE}),
    "not JSON": "[{image: %s}]" % IMAGE,
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_f9_vap_allows_pcitopo_by_digest_in_named_namespaces(vap, name):
    a = Admission(vap, gpu_vmi(ALLOWED[name]), params=PARAMS, namespace=ALLOWED_NS)
    assert a.denials() == []
    assert a.trace["variables.checked"] is True and a.trace["variables.namespaceAllowed"] is True


@pytest.mark.parametrize("name", sorted(DENIED))
def test_f9_vap_denies_other_sidecars(vap, name):
    (message,) = Admission(vap, gpu_vmi(DENIED[name]), params=PARAMS, namespace=ALLOWED_NS).denials()
    assert message.startswith("hooks.kubevirt.io/hookSidecars may only run pcitopo's image by digest (sha256:abab")


def test_f9_vap_denies_hook_sidecars_outside_named_namespaces(vap):
    (message,) = Admission(vap, gpu_vmi(ALLOWED["pcitopo by digest"]), params=PARAMS, namespace=OTHER_NS).denials()
    assert message.startswith("hooks.kubevirt.io/hookSidecars is not allowed in namespace team-b")


def test_f9_vap_leaves_vmis_without_hook_sidecars_alone(vap):
    a = Admission(vap, gpu_vmi(None), params=PARAMS, namespace=OTHER_NS)
    assert a.denials() == [] and a.trace["variables.checked"] is False


def test_f9_vap_checks_a_vms_template(vap):
    vm = kind(load(ROOT / "deploy" / "vm-gpu.yaml"), "VirtualMachine")  # a tag, not a digest
    assert Admission(vap, vm, params=PARAMS, namespace=ALLOWED_NS).denials() != []
    pinned = copy.deepcopy(vm)
    pinned["spec"]["template"]["metadata"]["annotations"][HOOKS] = ALLOWED["pcitopo by digest"]
    assert Admission(vap, pinned, params=PARAMS, namespace=ALLOWED_NS).denials() == []


def test_f9_vap_lets_running_vmis_be_updated(vap):
    """A VMI created before the policy keeps running: updates that leave the annotation as it
    was are not checked (virt-controller updates VMIs all the time)."""
    old = gpu_vmi(DENIED["a tag, not a digest"])
    new = copy.deepcopy(old)
    new["metadata"].setdefault("labels", {})["kubevirt.io/nodeName"] = "node-a"
    assert Admission(vap, new, old=old, params=PARAMS, namespace=OTHER_NS, operation="UPDATE").denials() == []
    new["metadata"]["annotations"][HOOKS] = DENIED["a command in our image"]
    assert Admission(vap, new, old=old, params=PARAMS, namespace=ALLOWED_NS, operation="UPDATE").denials() != []


def test_f9_vap_refuses_an_inconsistent_params_configmap(vap):
    params = copy.deepcopy(PARAMS)
    params["data"]["image"] = "registry.example.com/pcitopo:0.1.0"
    denials = Admission(vap, gpu_vmi(ALLOWED["pcitopo by digest"]), params=params, namespace=ALLOWED_NS).denials()
    assert any("needs digest: sha256:<64 hex> and an image ending in @<that digest>" in d for d in denials)


# -- attach pcitopo to every GPU VMI ------------------------------------------------------------------

def no_gpu_vmi() -> dict:
    doc = gpu_vmi(None)
    del doc["spec"]["domain"]["devices"]["gpus"]
    return doc


def test_f9_map_opts_every_gpu_vmi_into_the_plugin(attach):
    a = Admission(attach, gpu_vmi(None), params=PARAMS, namespace=OTHER_NS)
    out = a.mutated()
    assert out["metadata"]["labels"] == {LABEL: "true"}
    assert HOOKS not in out["metadata"]["annotations"]  # legacyHook off: no hook sidecar
    assert out["metadata"]["annotations"] == gpu_vmi(None)["metadata"]["annotations"]
    host_devices = no_gpu_vmi()
    host_devices["spec"]["domain"]["devices"]["hostDevices"] = [{"name": "nic0", "deviceName": "mellanox.com/cx7"}]
    host_devices["metadata"]["labels"] = {"app": "train"}
    out = Admission(attach, host_devices, params=PARAMS, namespace=OTHER_NS).mutated()
    assert out["metadata"]["labels"] == {"app": "train", LABEL: "true"}


def test_f9_map_leaves_other_vmis_and_owners_choice_alone(attach):
    assert Admission(attach, no_gpu_vmi(), params=PARAMS, namespace=OTHER_NS).mutated() is None
    opted_out = gpu_vmi(None)
    opted_out["metadata"]["labels"] = {LABEL: "false"}
    assert Admission(attach, opted_out, params=PARAMS, namespace=OTHER_NS).mutated() is None


def test_f9_map_adds_the_legacy_hook_only_where_asked_and_allowed(attach, vap):
    """KubeVirt v1.9.0 (kubevirt#18861): legacyHook: "true" also adds pcitopo's hook sidecar,
    in namespaces where hook-sidecars-policy.yaml allows it; the result passes that policy."""
    params = copy.deepcopy(PARAMS)
    params["data"]["legacyHook"] = "true"
    out = Admission(attach, gpu_vmi(None), params=params, namespace=ALLOWED_NS).mutated()
    assert json.loads(out["metadata"]["annotations"][HOOKS]) == [{"image": IMAGE, "imagePullPolicy": "IfNotPresent"}]
    assert Admission(vap, out, params=params, namespace=ALLOWED_NS).denials() == []
    out = Admission(attach, gpu_vmi(None), params=params, namespace=OTHER_NS).mutated()
    assert HOOKS not in out["metadata"]["annotations"]
    bare = gpu_vmi(None)
    del bare["metadata"]["annotations"]
    out = Admission(attach, bare, params=params, namespace=ALLOWED_NS).mutated()
    assert set(out["metadata"]["annotations"]) == {HOOKS} and out["metadata"]["labels"] == {LABEL: "true"}


def test_f9_policies_are_valid_kubernetes_1_34():
    kv = pytest.importorskip("kubernetes_validate")
    docs = kustomize(ROOT / "deploy" / "tenancy-k8s-1.34")
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                                              "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    for doc in docs:
        kv.validate(doc, K8S, strict=True)
    for doc in kustomize(TENANCY):
        if doc["kind"].startswith("Mutating"):
            assert doc["apiVersion"] == "admissionregistration.k8s.io/v1"
            kv.validate(doc, "1.36.0", strict=True)


def test_f9_security_md_says_what_each_policy_protects_against():
    text = (ROOT / "docs" / "SECURITY.md").read_text()
    section = text[text.index("## Multi-tenant clusters"):text.index("## Resource bounds")]
    assert "The trust model" in section and "the admin chooses the container" in section
    for policy in ("hook-sidecars-policy.yaml", "attach-gpu-vmis.yaml"):
        part = section[section.index(f"`{policy}`"):]
        assert part.index("*Protects against:*") < part.index("*Does not protect against:*"), policy
