"""pcitopo preflight's reading of the hook targets' Sidecar policies (src/pcitopo/kubevirt/sidecar_policy.py)
is the policies' own verdict: the same annotations, in the same namespaces, under the same params
(the PodTemplate pcitopo/pcitopo-image, with and without admitted hooks), through the policies'
CEL (cel-python, in kube-apiserver's order; tests/test_tenancy.py's corpus), admit and refuse
alike, on VMs and VMIs.

KubeVirt's own example hook sidecars are part of the corpus (kubevirt/kubevirt v1.9.0,
examples/vmi-with-sidecar-hook.yaml: an image by tag; examples/vmi-with-sidecar-hook-configmap.yaml
and vm-cirros-with-sidecar-hook-configmap.yaml: no image, KubeVirt's sidecar-shim runs the
ConfigMap's script; copies in tests/data/kubevirt-v1.9.0-examples)."""

from __future__ import annotations

import copy
import json

import pytest

from testkit import REPO as ROOT

pytest.importorskip("celpy")

from test_tenancy import (  # noqa: E402
    ALLOWED,
    ALLOWED_NS,
    IMAGE,
    MALFORMED,
    NOT_OUR_FORM,
    OTHER_IMAGE,
    OTHER_NS,
    gpu_vmi,
    image_params,
    refusals,
    sidecars,
)

from pcitopo.kubevirt.admitted import Admitted, from_params  # noqa: E402
from pcitopo.kubevirt.sidecar_policy import ONLY, refusal  # noqa: E402
from testkit.admission.manifests import load  # noqa: E402

HOOKS = "hooks.kubevirt.io/hookSidecars"
EXAMPLES = ROOT / "tests" / "data" / "kubevirt-v1.9.0-examples"


def example_annotation(name: str) -> str:
    (doc,) = load(EXAMPLES / name)
    meta = doc["spec"]["template"]["metadata"] if doc["kind"] == "VirtualMachine" else doc["metadata"]
    return meta["annotations"][HOOKS]


KUBEVIRT_HOOK = example_annotation("vmi-with-sidecar-hook.yaml")  # registry:5000/kubevirt/example-hook-sidecar:devel
KUBEVIRT_HOOK_PINNED = KUBEVIRT_HOOK.replace(":devel", "@sha256:" + "5e" * 32)
CONFIGMAP_HOOK = example_annotation("vmi-with-sidecar-hook-configmap.yaml")
CONFIGMAP_HOOK_VM = example_annotation("vm-cirros-with-sidecar-hook-configmap.yaml")
NETPREP = "quay.io/acme/netprep@sha256:" + "12" * 32
SECOND_TEAM = {
    "KubeVirt's example hook (a tag)": KUBEVIRT_HOOK,
    "KubeVirt's example hook, pinned": KUBEVIRT_HOOK_PINNED,
    "KubeVirt's ConfigMap hook (VMI)": CONFIGMAP_HOOK,
    "KubeVirt's ConfigMap hook (VM)": CONFIGMAP_HOOK_VM,
    "a second team's image": sidecars({"image": NETPREP, "args": ["--mtu", "9000"], "imagePullPolicy": "IfNotPresent"}),
    "a second team's image, another digest": sidecars({"image": NETPREP[:-2] + "34"}),
    "a second team's image with a command": sidecars({"image": NETPREP, "command": ["/bin/sh"]}),
    "a second team's image with a configMap": sidecars({"image": NETPREP, "configMap": {
        "name": "x", "key": "k", "hookPath": "/usr/bin/onDefineDomain"}}),
    "pcitopo's and a second team's": sidecars({"image": IMAGE}, {"image": NETPREP}),
    "the ConfigMap hook under another name": CONFIGMAP_HOOK.replace("my-config-map", "their-config-map"),
    "the ConfigMap hook without hookPath": CONFIGMAP_HOOK.replace(', "hookPath": "/usr/bin/onDefineDomain"', ""),
}
CORPUS = {**ALLOWED, **MALFORMED, **OTHER_IMAGE, **NOT_OUR_FORM, **SECOND_TEAM}

NONE = image_params()
EXEMPT = image_params()
EXEMPT["metadata"]["annotations"] = {
    "pcitopo.kubevirt.io/sidecar.netprep": NETPREP,
    "pcitopo.kubevirt.io/sidecar.example-hook-sidecar": "registry:5000/kubevirt/example-hook-sidecar@sha256:" + "5e" * 32,
    "pcitopo.kubevirt.io/configmap.team-b.my-config-map": "team-b/my-config-map",
    "pcitopo.kubevirt.io/configmap.ml.my-config-map": "ml/my-config-map",
}
PARAMS = {"no exemption": NONE, "exemptions": EXEMPT}


def as_vm(vmi: dict) -> dict:
    meta = vmi["metadata"]
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace", "ml")},
            "spec": {"runStrategy": "Always", "template": {"metadata": {"annotations": meta["annotations"]},
                                                           "spec": vmi["spec"]}}}


def _labels(ns: dict) -> dict:
    return ns["metadata"].get("labels", {})


@pytest.mark.parametrize("params", sorted(PARAMS))
@pytest.mark.parametrize("kind", ["VirtualMachineInstance", "VirtualMachine"])
@pytest.mark.parametrize("namespace", [ALLOWED_NS, OTHER_NS], ids=["labelled", "unlabelled"])
@pytest.mark.parametrize("name", sorted(CORPUS))
def test_the_model_admits_and_refuses_what_the_policies_cel_does(name, namespace, kind, params):
    annotation = CORPUS[name]
    vmi = gpu_vmi(annotation)
    vmi["metadata"]["namespace"] = namespace["metadata"]["name"]
    obj = vmi if kind == "VirtualMachineInstance" else as_vm(vmi)
    policies = refusals(obj, namespace, store={("pcitopo", "pcitopo-image"): PARAMS[params]})
    model = refusal(annotation, namespace["metadata"]["name"], _labels(namespace), from_params(PARAMS[params]))
    assert (model is None) == (policies == []), (policies, model)
    assert model is None or model.certain


def _admitted(params: dict = NONE) -> Admitted:
    return from_params(params)


def test_exempt_hooks_pass_in_any_namespace_and_everything_else_is_still_refused():
    for ns in (ALLOWED_NS, OTHER_NS):
        where = ns["metadata"]["name"]
        for name in ("KubeVirt's example hook, pinned", "KubeVirt's ConfigMap hook (VMI)", "KubeVirt's ConfigMap hook (VM)",
                     "a second team's image"):
            assert refusal(SECOND_TEAM[name], where, _labels(ns), _admitted(EXEMPT)) is None, (name, where)
        for name in ("KubeVirt's example hook (a tag)", "a second team's image, another digest",
                     "a second team's image with a command", "the ConfigMap hook under another name",
                     "the ConfigMap hook without hookPath"):
            assert refusal(SECOND_TEAM[name], where, _labels(ns), _admitted(EXEMPT)) is not None, (name, where)
    # a ConfigMap hook is admitted in its namespace only
    assert refusal(CONFIGMAP_HOOK, "tools", {}, _admitted(EXEMPT)) is not None


def test_the_cause_comes_first_with_the_entry_that_admits_it():
    """KubeVirt's examples put "args" before "image": the cause is that the image is not
    admitted, not the key order; the refusal carries the params annotation that admits it."""
    r = refusal(KUBEVIRT_HOOK_PINNED, "team-b", {}, _admitted())
    assert r.why.endswith(ONLY) and '"image" is not' not in r.why
    assert r.admit == ("pcitopo.kubevirt.io/sidecar.example-hook-sidecar: "
                       "registry:5000/kubevirt/example-hook-sidecar@sha256:" + "5e" * 32)
    r = refusal(CONFIGMAP_HOOK, "team-b", {}, _admitted())
    assert "ConfigMap team-b/my-config-map's script" in r.why and r.why.endswith(ONLY)
    assert r.admit == "pcitopo.kubevirt.io/configmap.team-b.my-config-map: team-b/my-config-map"
    r = refusal(KUBEVIRT_HOOK, "team-b", {}, _admitted())
    assert "is not pinned by digest" in r.why
    assert r.admit == "pcitopo.kubevirt.io/sidecar.example-hook-sidecar: registry:5000/kubevirt/example-hook-sidecar@sha256:<64 hex>"


def test_the_printed_entry_admits_the_hook_in_the_policies():
    """What preflight prints is what the admin pastes: under the PodTemplate's annotations it
    makes the policies admit exactly that hook."""
    for annotation, ns in ((KUBEVIRT_HOOK_PINNED, OTHER_NS), (CONFIGMAP_HOOK, OTHER_NS), (SECOND_TEAM["a second team's image"],
                                                                                         ALLOWED_NS)):
        vmi = gpu_vmi(annotation)
        vmi["metadata"]["namespace"] = ns["metadata"]["name"]
        entry = refusal(annotation, ns["metadata"]["name"], _labels(ns), _admitted()).admit
        params = copy.deepcopy(NONE)
        key, value = entry.split(": ", 1)
        params["metadata"]["annotations"] = {key: value}
        assert refusals(vmi, ns, store={("pcitopo", "pcitopo-image"): params}) == [], entry
        assert refusals(vmi, ns) != []


def test_without_the_namespace_or_the_pinned_image_a_well_formed_sidecar_is_only_to_check():
    (annotation,) = [ALLOWED["pcitopo by digest"]]
    pinned = Admitted((IMAGE,))
    assert refusal(annotation, "ml", _labels(ALLOWED_NS), pinned) is None
    for labels, admitted in ((None, pinned), (_labels(ALLOWED_NS), Admitted())):
        r = refusal(annotation, "ml", labels, admitted)
        assert r is not None and not r.certain
    # what is refused for its form is refused whatever the dump lacks
    r = refusal(MALFORMED["a tag, not a digest"], "ml", None, Admitted())
    assert r is not None and r.certain


def test_earlier_pcitopo_images_the_params_keep_are_pcitopos():
    """An upgrade keeps the old digest admitted (pcitopo.kubevirt.io/pcitopo.<label>): pcitopo's
    rules apply to it, in the CEL and in the model."""
    old = IMAGE[:-2] + "cd"
    params = image_params()
    params["metadata"]["annotations"] = {"pcitopo.kubevirt.io/pcitopo.previous": old}
    vmi = gpu_vmi(sidecars({"image": old}))
    store = {("pcitopo", "pcitopo-image"): params}
    assert refusals(vmi, ALLOWED_NS, store=store) == [] and refusals(vmi, ALLOWED_NS) != []
    assert refusal(sidecars({"image": old}), "ml", _labels(ALLOWED_NS), from_params(params)) is None
    assert refusals(vmi, OTHER_NS, store=store) != []
    assert refusal(sidecars({"image": old, "args": ["--sysfs", "/x"]}), "ml", _labels(ALLOWED_NS), from_params(params)) is not None


def test_bad_params_refuse_in_the_cel_and_are_one_line_in_the_reader():
    from pcitopo.errors import ConfigError

    for value in ("quay.io/acme/netprep:1.2", "quay.io/acme/netprep@sha256:" + "12" * 31, "quay.io/*@sha256:" + "12" * 32):
        params = image_params()
        params["metadata"]["annotations"] = {"pcitopo.kubevirt.io/sidecar.bad": value}
        assert any("one of them is not so" in r for r in refusals(gpu_vmi(ALLOWED["pcitopo by digest"]), ALLOWED_NS,
                                                                 store={("pcitopo", "pcitopo-image"): params}))
        with pytest.raises(ConfigError) as e:
            from_params(params)
        assert "\n" not in str(e.value) and "pcitopo.kubevirt.io/sidecar.bad" in str(e.value)


def test_the_examples_are_kubevirts_own():
    for name in ("vmi-with-sidecar-hook.yaml", "vmi-with-sidecar-hook-configmap.yaml",
                 "vm-cirros-with-sidecar-hook-configmap.yaml"):
        head = (EXAMPLES / name).read_text().splitlines()[0]
        assert head.startswith("# kubevirt/kubevirt v1.9.0") and f"examples/{name}" in head
    assert json.loads(CONFIGMAP_HOOK)[0]["configMap"]["hookPath"] == "/usr/bin/onDefineDomain"
    assert "image" not in json.loads(CONFIGMAP_HOOK)[0]


def _preflight(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pcitopo.cli.main", "preflight", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


CLUSTERS = ROOT / "fixtures" / "clusters"
OUR_IMAGE = "registry.example.com/pcitopo@sha256:" + "4f2c0d3b" * 8


def test_preflight_names_another_teams_tagged_hook_by_its_cause():
    r = _preflight("--target", "kubevirt-v1.9.0", "--image", OUR_IMAGE, str(CLUSTERS / "v1.9.0-other-sidecar.yaml"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "HARMED tools/netprep-0 (VirtualMachine): image 'quay.io/acme/netprep:1.2' is not pinned by digest" in r.stdout
    assert r.stdout.splitlines()[-1] == ("verdict: applying kubevirt-v1.9.0 harms 1 VM(s): "
                                         "tools/netprep-0 (stops starting: Sidecar policy)")


def test_preflight_passes_pcitopos_own_pinned_vm_in_its_allowed_namespace():
    r = _preflight("--target", "kubevirt-v1.9.0", "--image", OUR_IMAGE, "--json", str(CLUSTERS / "v1.9.0-stranger.yaml"))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["sidecar_policy"] == [] and report["ok"]
    # another pin: the same VM is refused, with the entry that keeps its digest admitted
    r = _preflight("--target", "kubevirt-v1.9.0", "--image", OUR_IMAGE[:-1] + "0", str(CLUSTERS / "v1.9.0-stranger.yaml"))
    assert r.returncode == 1 and "HARMED ml/llm-0 (VirtualMachine): the Sidecar policy refuses its hook sidecar " \
        f"{OUR_IMAGE}, a pcitopo digest no longer admitted" in r.stdout
    assert f"pcitopo.kubevirt.io/pcitopo.previous: {OUR_IMAGE}" in r.stdout


def test_the_plugin_target_carries_no_sidecar_policy_and_says_the_gate_is_open():
    r = _preflight("--target", "kubevirt-main", "--json", str(CLUSTERS / "v1.9.0-other-sidecar.yaml"))
    report = json.loads(r.stdout)
    assert report["sidecar_policy"] == [] and "hook-sidecars-policy" in report["sidecar_open"]
