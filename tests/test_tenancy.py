"""Multi-tenant clusters: the policies that make the `Sidecar` gate safe
(deploy/components/hook-sidecars-policy, in every target that turns the gate on), and the
components that attach pcitopo to every GPU VMI (attach-hook, attach-plugin).

- hook-sidecars.yaml (no params): hooks.kubevirt.io/hookSidecars only in the forms the policies
  know (pcitopo's, another team's image by digest, an image-less ConfigMap hook);
- hook-sidecars-image.yaml (params: the PodTemplate pcitopo/pcitopo-image): pcitopo's images
  (in labelled namespaces only) and the hooks the params admit, exactly, registry included;
- attach-hook.yaml, attach-plugin.yaml: MutatingAdmissionPolicies.

Their CEL is evaluated with cel-python (testkit/admission) on VMIs and VMs an owner could write,
in kube-apiserver's order (params before matchConditions); their schemas are checked in
tests/test_targets.py.
"""

from __future__ import annotations

import copy
import json

import pytest

from testkit import REPO as ROOT

pytest.importorskip("celpy")
from testkit.admission.manifests import kind, load  # noqa: E402
from testkit.admission.policy import Admission, admit  # noqa: E402  (needs cel-python)

COMPONENTS = ROOT / "deploy" / "components"
POLICY = COMPONENTS / "hook-sidecars-policy"
LABEL = "pcitopo.kubevirt.io/plugin"
HOOKS = "hooks.kubevirt.io/hookSidecars"
NS_LABEL = "pcitopo.kubevirt.io/hook-sidecars"
DIGEST = "sha256:" + "ab" * 32
IMAGE = f"registry.example.com/pcitopo@{DIGEST}"
ALLOWED_NS = {"metadata": {"name": "ml", "labels": {NS_LABEL: "allowed"}}}
OTHER_NS = {"metadata": {"name": "team-b", "labels": {"kubernetes.io/metadata.name": "team-b"}}}


def image_params(image: str = IMAGE) -> dict:
    pt = copy.deepcopy(kind(load(ROOT / "deploy" / "base" / "image.yaml"), "PodTemplate"))
    pt["template"]["spec"]["containers"][0]["image"] = image
    return pt


PARAMS = image_params()
STORE = {("pcitopo", "pcitopo-image"): PARAMS}


def policy_and_bindings(path, name: str) -> list[tuple[dict, dict]]:
    docs = load(path)
    (policy,) = [d for d in docs if d["kind"].endswith("Policy") and d["metadata"]["name"] == name]
    return [(policy, b) for b in docs if b["kind"].endswith("PolicyBinding") and b["spec"]["policyName"] == name]


(SHAPE,) = policy_and_bindings(POLICY / "hook-sidecars.yaml", "pcitopo-hook-sidecars")
PINNED_IMAGE = policy_and_bindings(POLICY / "hook-sidecars-image.yaml", "pcitopo-hook-sidecars-image")


def refusals(obj: dict, namespace: dict, *, store=STORE, old: dict | None = None, operation: str = "CREATE") -> list[str]:
    """Both hook-sidecars policies, through every binding, on one request, as kube-apiserver runs
    every bound policy."""
    return [r for policy, binding in (SHAPE, *PINNED_IMAGE)
            for r in admit(policy, binding, obj, params_store=store, namespace=namespace, old=old, operation=operation)]


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
FABRIC = {"image": IMAGE, "args": ["--fabric", "/etc/pcitopo/fabric.json"],
          "configMap": {"name": "pcitopo-fabric-node-a", "key": "fabric.json", "hookPath": "/etc/pcitopo/fabric.json"}}
ALLOWED = {
    "pcitopo by digest": sidecars(OURS),
    "with the fabric ConfigMap": sidecars(FABRIC),
    "with the fabric and a module map": sidecars({**FABRIC, "args": ["--fabric", "/etc/pcitopo/fabric.json",
                                                                     "--module-map", "/etc/pcitopo/module-map.json"]}),
    "two entries, compact JSON": json.dumps([OURS, {"image": IMAGE}], separators=(",", ":")),
    "with the doctor's report": sidecars({**FABRIC, "pvc": {"name": "pcitopo-doctor-report", "volumePath": "/var/run/pcitopo"}}),
}
# Refused by the shape policy (no params needed)
MALFORMED = {
    "a tag, not a digest": sidecars({"image": "registry.example.com/pcitopo:0.1.0"}),
    "the all-zero placeholder": sidecars({"image": "registry.example.com/pcitopo@sha256:" + "0" * 64}),
    "no image (KubeVirt's sidecar-shim runs the owner's script)": sidecars({"args": ["--version", "v1alpha2"]}),
    "a command in our image": sidecars({"image": IMAGE, "command": ["/bin/sh", "-c", "id"]}),
    "a ConfigMap over the entrypoint": sidecars({"image": IMAGE, "configMap": {
        "name": "x", "key": "run", "hookPath": "/opt/pcitopo/bin/pcitopo"}}),
    "a hookPath that climbs out": sidecars({"image": IMAGE, "configMap": {
        "name": "x", "key": "run", "hookPath": "/etc/pcitopo/../../opt/pcitopo/bin/pcitopo"}}),
    "a pvc": sidecars({"image": IMAGE, "pvc": {"name": "data", "volumePath": "/data", "sharedComputePath": "/x"}}),
    "the doctor's report shared with compute": sidecars({"image": IMAGE, "pvc": {
        "name": "pcitopo-doctor-report", "volumePath": "/var/run/pcitopo", "sharedComputePath": "/var/run/pcitopo"}}),
    "another claim at the report's path": sidecars({"image": IMAGE, "pvc": {"name": "data", "volumePath": "/var/run/pcitopo"}}),
    "the report's claim over the entrypoint": sidecars({"image": IMAGE, "pvc": {
        "name": "pcitopo-doctor-report", "volumePath": "/opt/pcitopo/bin"}}),
    "a second entry by tag": sidecars(OURS, {"image": "evil.example/x:latest"}),
    "Go's case-insensitive key": '[{"image": "%s", "Image": "evil.example/x:latest"}]' % IMAGE,
    "an escaped key": '[{"image": "%s", "\\u0069mage": "evil.example/x:latest"}]' % IMAGE,
    "not JSON": "[{image: %s}]" % IMAGE,
    "a configMap without hookPath": sidecars({"image": IMAGE, "configMap": {"name": "x", "key": "fabric.json"}}),
    "no image, a configMap without hookPath": sidecars({"args": [], "configMap": {"name": "x", "key": "run"}}),
    "no image, a configMap and a pvc": sidecars({"configMap": {"name": "x", "key": "run", "hookPath": "/usr/bin/onDefineDomain"},
                                                 "pvc": {"name": "d", "volumePath": "/d", "sharedComputePath": "/x"}}),
    "image twice": '[{"image": "%s", "image": "%s"}]' % (IMAGE, IMAGE),
}
# Forms another team's entry may have, refused for pcitopo's image (by the image policy, which
# knows which image is pcitopo's)
NOT_OUR_FORM = {
    "an undocumented arg": sidecars({"image": IMAGE, "args": ["--sysfs", "/etc/pcitopo/fake"]}),
    "a fake topology under /etc/pcitopo": sidecars({"image": IMAGE, "args": ["--fabric", "/etc/pcitopo/mine.json"]}),
    "image not the first key": sidecars({"imagePullPolicy": "Always", "image": IMAGE}),
}
# Well-formed, refused by the image policy (pcitopo's exact image, from the PodTemplate)
OTHER_IMAGE = {
    "another digest": sidecars({"image": "registry.example.com/pcitopo@sha256:" + "cd" * 32}),
    "our digest from another registry": sidecars({"image": f"mirror.local:5000/pcitopo@{DIGEST}"}),
    "our image with a suffix": sidecars({"image": f"registry.example.com/pcitopo@{DIGEST}"[:-1] + "c"}),
    "a second entry of another image": sidecars(OURS, {"image": "evil.example/x@sha256:" + "ef" * 32}),
}


@pytest.mark.parametrize("name", sorted(ALLOWED))
def test_pcitopos_hook_sidecar_is_admitted_in_allowed_namespaces(name):
    assert refusals(gpu_vmi(ALLOWED[name]), ALLOWED_NS) == []


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_sidecars_outside_the_documented_form_are_refused_without_params(name):
    """The shape policy refuses these on its own: it reads no params, so it holds whatever
    happens to the PodTemplate."""
    policy, binding = SHAPE
    (message,) = admit(policy, binding, gpu_vmi(MALFORMED[name]), params_store={}, namespace=ALLOWED_NS)
    assert message.startswith("hooks.kubevirt.io/hookSidecars may only run images by digest (@sha256:<64 hex>)")


ONLY = "only pcitopo's image and the admitted list are allowed"


@pytest.mark.parametrize("name", sorted(OTHER_IMAGE) + sorted(NOT_OUR_FORM))
def test_any_image_but_pcitopos_exact_one_is_refused(name):
    (message,) = refusals(gpu_vmi({**OTHER_IMAGE, **NOT_OUR_FORM}[name]), ALLOWED_NS)
    assert message.startswith(f"hooks.kubevirt.io/hookSidecars in namespace ml: {ONLY}: pcitopo's {IMAGE} in namespaces")


def test_hook_sidecars_are_refused_outside_allowed_namespaces():
    (message,) = refusals(gpu_vmi(ALLOWED["pcitopo by digest"]), OTHER_NS)
    assert message.startswith(f"hooks.kubevirt.io/hookSidecars in namespace team-b: {ONLY}")


def test_vmis_without_hook_sidecars_are_never_evaluated():
    for ns in (ALLOWED_NS, OTHER_NS):
        for policy, _ in (SHAPE, *PINNED_IMAGE):
            a = Admission(policy, gpu_vmi(None), params=PARAMS, namespace=ns)
            assert a.matches() is False and a.trace["matchConditions.has-hook-sidecars"] is False


def test_losing_the_params_refuses_creates_and_never_the_updates_of_running_vms_elsewhere():
    """kube-apiserver looks up the params before the matchConditions: without the PodTemplate,
    the image policy refuses what its bindings select. In the namespaces that allow pcitopo's
    hook sidecar, every VM/VMI write; everywhere else only creates (a VMI's pod and its sidecars
    are made at create), so KubeVirt's updates to running VMIs go on; the shape policy (no
    params) still refuses what it refuses."""
    plain = gpu_vmi(None)
    assert refusals(plain, OTHER_NS, store={}, old=plain, operation="UPDATE") == []
    (lost,) = refusals(plain, OTHER_NS, store={})
    assert "no params found" in lost
    (lost,) = refusals(plain, ALLOWED_NS, store={}, old=plain, operation="UPDATE")
    assert "no params found" in lost
    assert refusals(gpu_vmi(MALFORMED["a pvc"]), OTHER_NS, store={}, old=plain, operation="UPDATE") != []


@pytest.mark.parametrize("image", ["registry.example.com/pcitopo@sha256:" + "0" * 64, "registry.example.com/pcitopo:0.1.0"])
def test_an_unpinned_podtemplate_refuses_every_annotation_and_says_so(image):
    store = {("pcitopo", "pcitopo-image"): image_params(image)}
    denials = refusals(gpu_vmi(ALLOWED["pcitopo by digest"]), ALLOWED_NS, store=store)
    assert any(d.startswith("the PodTemplate pcitopo/pcitopo-image must name one container \"pcitopo\"") for d in denials)


def test_a_vms_template_is_checked():
    vm = kind(load(ROOT / "deploy" / "vm-gpu.yaml"), "VirtualMachine")  # a tag, not a digest
    assert refusals(vm, ALLOWED_NS) != []
    pinned = copy.deepcopy(vm)
    pinned["spec"]["template"]["metadata"]["annotations"][HOOKS] = ALLOWED["pcitopo by digest"]
    assert refusals(pinned, ALLOWED_NS) == []


def test_running_vmis_can_be_updated():
    """A VMI created before the policy keeps running: updates that leave the annotation as it
    was are not evaluated (virt-controller updates VMIs all the time); a changed one is."""
    old = gpu_vmi(MALFORMED["a tag, not a digest"])
    new = copy.deepcopy(old)
    new["metadata"].setdefault("labels", {})["kubevirt.io/nodeName"] = "node-a"
    assert refusals(new, OTHER_NS, old=old, operation="UPDATE") == []
    new["metadata"]["annotations"][HOOKS] = MALFORMED["a command in our image"]
    assert refusals(new, ALLOWED_NS, old=old, operation="UPDATE") != []


# -- attach pcitopo to every GPU VMI ------------------------------------------------------------------

ATTACH_HOOK = kind(load(COMPONENTS / "attach-hook" / "attach-hook.yaml"), "MutatingAdmissionPolicy")
ATTACH_PLUGIN = kind(load(COMPONENTS / "attach-plugin" / "attach-plugin.yaml"), "MutatingAdmissionPolicy")


def no_gpu_vmi() -> dict:
    doc = gpu_vmi(None)
    del doc["spec"]["domain"]["devices"]["gpus"]
    return doc


def test_attach_plugin_opts_every_gpu_vmi_into_the_plugin():
    out = Admission(ATTACH_PLUGIN, gpu_vmi(None), namespace=OTHER_NS).mutated()
    assert out["metadata"]["labels"] == {LABEL: "true"}
    assert out["metadata"]["annotations"] == gpu_vmi(None)["metadata"]["annotations"]
    host_devices = no_gpu_vmi()
    host_devices["spec"]["domain"]["devices"]["hostDevices"] = [{"name": "nic0", "deviceName": "mellanox.com/cx7"}]
    host_devices["metadata"]["labels"] = {"app": "train"}
    out = Admission(ATTACH_PLUGIN, host_devices, namespace=OTHER_NS).mutated()
    assert out["metadata"]["labels"] == {"app": "train", LABEL: "true"}
    assert "paramKind" not in ATTACH_PLUGIN["spec"]


def test_attach_plugin_leaves_other_vmis_and_owners_choice_alone():
    assert Admission(ATTACH_PLUGIN, no_gpu_vmi(), namespace=OTHER_NS).mutated() is None
    opted_out = gpu_vmi(None)
    opted_out["metadata"]["labels"] = {LABEL: "false"}
    assert Admission(ATTACH_PLUGIN, opted_out, namespace=OTHER_NS).mutated() is None


def test_attach_hook_adds_pcitopos_pinned_hook_that_the_policies_admit():
    out = Admission(ATTACH_HOOK, gpu_vmi(None), params=PARAMS, namespace=ALLOWED_NS).mutated()
    assert json.loads(out["metadata"]["annotations"][HOOKS]) == [OURS]
    assert refusals(out, ALLOWED_NS) == []
    bare = gpu_vmi(None)
    del bare["metadata"]["annotations"]
    out = Admission(ATTACH_HOOK, bare, params=PARAMS, namespace=ALLOWED_NS).mutated()
    assert set(out["metadata"]["annotations"]) == {HOOKS}
    assert refusals(out, ALLOWED_NS) == []


def test_attach_hook_only_where_allowed_only_if_pinned_and_never_over_the_owners():
    ((hook, binding),) = policy_and_bindings(COMPONENTS / "attach-hook" / "attach-hook.yaml", "pcitopo-attach-hook")
    assert hook["spec"]["matchConstraints"]["namespaceSelector"] == {"matchLabels": {NS_LABEL: "allowed"}}
    assert binding["spec"]["paramRef"]["name"] == "pcitopo-image"
    assert Admission(ATTACH_HOOK, no_gpu_vmi(), params=PARAMS, namespace=ALLOWED_NS).mutated() is None
    owners = gpu_vmi(ALLOWED["with the fabric ConfigMap"])
    assert Admission(ATTACH_HOOK, owners, params=PARAMS, namespace=ALLOWED_NS).mutated() is None
    for image in ("registry.example.com/pcitopo@sha256:" + "0" * 64, "registry.example.com/pcitopo:0.1.0"):
        assert Admission(ATTACH_HOOK, gpu_vmi(None), params=image_params(image), namespace=ALLOWED_NS).mutated() is None


def test_security_md_says_what_each_policy_protects_against():
    text = (ROOT / "docs" / "SECURITY.md").read_text()
    section = text[text.index("## Multi-tenant clusters"):text.index("## Resource bounds")]
    assert "The trust model" in section and "the admin chooses the container" in section
    for policy in ("hook-sidecars.yaml", "hook-sidecars-image.yaml", "attach-hook.yaml", "attach-plugin.yaml"):
        part = section[section.index(f"`{policy}`"):]
        assert part.index("*Protects against:*") < part.index("*Does not protect against:*"), policy
    who = text[text.index("### Who may change the image"):]
    assert "podtemplates" in who and "pcitopo" in who
