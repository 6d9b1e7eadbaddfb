"""deploy/targets/<name>: each target, rendered with `kubectl kustomize`, is its row of
src/pcitopo/kubevirt/targets.py (gates, Plugin objects, node hook, the Sidecar policy, the DaemonSets' node
affinity), every object it renders is valid Kubernetes, and one `images:` entry in a user's
overlay reaches every image reference it renders."""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from pcitopo.kubevirt.nodes import GPU_NODE_TERMS, is_gpu_node
from pcitopo.kubevirt.targets import TARGETS
from testkit import REPO
from testkit.admission.cluster import schedules_on
from testkit.admission.manifests import PLACEHOLDER, TARGETS_DIR, ZERO_DIGEST, kustomize, kustomize_text, overlay, pod_specs, template_image
from testkit.admission.plugin_api import plugin_errors
from testkit.admission.policy import apply_patch

kv = pytest.importorskip("kubernetes_validate")

NAMES = [t.name for t in TARGETS]
GATES_PATH = "/spec/configuration/developerConfiguration/featureGates/-"
DIGEST = "sha256:" + "5e" * 32
PINNED = f"registry.corp.example/ml/pcitopo@{DIGEST}"


@pytest.fixture(scope="module", params=TARGETS, ids=NAMES)
def rendered(request):
    return request.param, kustomize(TARGETS_DIR / request.param.name)


def test_every_target_of_the_table_has_a_folder_and_no_folder_is_left_over():
    assert sorted(p.name for p in TARGETS_DIR.iterdir() if p.is_dir()) == sorted(NAMES)


# -- the KubeVirt CR's gates --------------------------------------------------------------------------

def gate_patch(name: str) -> list[dict]:
    return json.loads((TARGETS_DIR / name / "gates.json").read_text())


@pytest.mark.parametrize("target", TARGETS, ids=NAMES)
def test_gate_patch_appends_the_targets_gates_and_keeps_the_users(target):
    """gates.json only appends (`add .../featureGates/-`), so `kubectl patch --type=json` keeps
    every gate the cluster had; on a CR without a featureGates list it fails rather than make one
    that would stand for the user's: the quick start's line before it makes an empty one
    (tests/test_quickstarts.py runs that case)."""
    patch = gate_patch(target.name)
    assert {op["op"] for op in patch} == {"add"} and {op["path"] for op in patch} == {GATES_PATH}
    assert tuple(op["value"] for op in patch) == target.gates
    cr = {"apiVersion": "kubevirt.io/v1", "kind": "KubeVirt", "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
          "spec": {"configuration": {"developerConfiguration": {"featureGates": ["CPUManager", "HostDevices"]}}}}
    out = apply_patch(cr, patch)
    assert out["spec"]["configuration"]["developerConfiguration"]["featureGates"] == ["CPUManager", "HostDevices",
                                                                                      *target.gates]
    bare = copy.deepcopy(cr)
    del bare["spec"]["configuration"]["developerConfiguration"]
    with pytest.raises(KeyError):
        apply_patch(bare, patch)


def quickstart_lines(name: str) -> list[str]:
    """The command lines of the target's quick start in docs/DEPLOY.md."""
    text = (REPO / "docs" / "DEPLOY.md").read_text()
    block = re.search(rf"<!-- quickstart: {re.escape(name)} -->\n```sh\n(.*?)```", text, re.S)[1]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


@pytest.mark.parametrize("target", TARGETS, ids=NAMES)
def test_each_target_says_how_it_is_applied_and_rolled_back(target):
    """The comment of each kustomization.yaml gives the quick start's own lines, verbatim: the
    check that nothing exists, `kubectl create`, the gate patch by file, and the one roll back
    recipe (the gate only if added, behind a test op; the Plugin object first where there is one)."""
    text = (TARGETS_DIR / target.name / "kustomization.yaml").read_text()
    comment = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert f"pcitopo preflight --target {target.name}" in comment
    assert "#   kubectl create -f site.yaml" in comment and "kubectl apply" not in comment
    lines = quickstart_lines(target.name)
    gate_steps = [x for x in lines if "gates-before.json" in x or "go-template" in x]
    assert any(f"--patch-file deploy/targets/{target.name}/gates.json" in x for x in gate_steps)
    for line in gate_steps:
        assert f"#   {line}" in comment.splitlines(), line
    rollback = comment[comment.index("Roll back"):comment.index("Optional components")]
    steps = [line[4:] for line in rollback.splitlines() if line.startswith("#   ")]
    assert steps == lines[lines.index("kubectl delete -f vm.yaml") + 1:], "one roll back recipe, the quick start's"
    for gate in target.gates:
        assert '\\"op\\":\\"test\\"' in rollback and f'\\"value\\":\\"{gate}\\"' in rollback
    for name in target.plugin_objects:
        assert steps[0] == f"kubectl delete plugins.plugin.kubevirt.io {name}", steps
    if not target.plugin_objects:
        assert "kubectl delete plugins" not in comment


# -- what each target renders ------------------------------------------------------------------------

def node_hook_served(docs: list[dict]) -> bool:
    return any("--node-hook" in " ".join(c.get("args", []) + c.get("command", []))
               for _, spec in pod_specs(docs) for c in spec["containers"])


def sidecar_policies(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and "hooks.kubevirt.io/hookSidecars" in json.dumps(d)]


def test_target_renders_its_row(rendered):
    target, docs = rendered
    plugins = [d for d in docs if d["kind"] == "Plugin"]
    assert tuple(p["metadata"]["name"] for p in plugins) == target.plugin_objects
    assert node_hook_served(docs) is target.node_hook
    assert any(p["spec"].get("nodeHooks") for p in plugins) is target.node_hook
    policies = sidecar_policies(docs)
    assert bool(policies) is target.sidecar_policy
    bound = {d["spec"]["policyName"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    for policy in policies:
        assert policy["spec"]["matchConditions"], "a VM/VMI without the annotation is never evaluated"
        assert policy["metadata"]["name"] in bound
        assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    if "Sidecar" in target.gates:
        assert target.sidecar_policy, "the Sidecar gate never without its policy"
    assert "Sidecar" not in target.gates or "hook" in target.doors
    assert "Plugins" not in target.gates or target.plugin_objects


def test_target_daemonsets_select_exactly_the_gpu_node_terms(rendered):
    _, docs = rendered
    want = [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]} for k, v in GPU_NODE_TERMS]
    specs = pod_specs(docs)
    assert specs
    for name, spec in specs:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == want, name
        assert "nodeSelector" not in spec, name


NODES = {
    "NFD default (class, vendor)": {"feature.node.kubernetes.io/pci-0302_10de.present": "true"},
    "GPU Operator's NFD (vendor)": {"feature.node.kubernetes.io/pci-10de.present": "true",
                                    "nvidia.com/gpu.deploy.sandbox-device-plugin": "true"},
    "GPU Feature Discovery": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "GPU Operator, KubeVirt mode": {"nvidia.com/gpu.workload.config": "vm-passthrough"},
}
CPU_ONLY = {
    "CPU-only node with NFD": {"feature.node.kubernetes.io/pci-0300_1a03.present": "true",
                               "feature.node.kubernetes.io/pci-0200_15b3.present": "true",
                               "kubernetes.io/os": "linux"},
    "GPU Operator, container mode, no GPU": {"nvidia.com/gpu.workload.config": "container",
                                             "nvidia.com/gpu.present": "false"},
}


@pytest.mark.parametrize("node", sorted(NODES) + sorted(CPU_ONLY))
def test_target_daemonsets_land_on_every_gpu_label_set_and_no_cpu_only_node(rendered, node):
    """The rendered affinity evaluated as the scheduler does (terms OR, expressions AND), against
    the labels each GPU labeller sets, and against nodes without a GPU."""
    _, docs = rendered
    labels = NODES.get(node) or CPU_ONLY[node]
    for name, spec in pod_specs(docs):
        assert schedules_on(spec, labels) is (node in NODES), (name, node)
    assert is_gpu_node(labels) is (node in NODES)  # preflight's reading of the same terms


def test_the_affinity_evaluation_ands_expressions_and_ors_terms():
    spec = {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}, {"key": "b", "operator": "In", "values": ["1"]}]},
        {"matchExpressions": [{"key": "c", "operator": "Exists"}]}]}}}}
    assert not schedules_on(spec, {"a": "1"}) and schedules_on(spec, {"a": "1", "b": "1"}) and schedules_on(spec, {"c": ""})
    assert not schedules_on({**spec, "nodeSelector": {"d": "1"}}, {"c": ""})


# -- schemas ---------------------------------------------------------------------------------------

def kubernetes_release(target, components: tuple[str, ...] = ()) -> str:
    """The oldest Kubernetes whose schemas serve every object: ValidatingAdmissionPolicy v1 from
    1.30, MutatingAdmissionPolicy v1 from 1.36 (v1beta1, through map-v1beta1, from 1.34)."""
    if "plugin" in target.doors or any(c.startswith("attach") for c in components):
        return "1.34.0" if "map-v1beta1" in components else "1.36.0"
    return "1.30.0"


def test_every_rendered_object_is_valid_kubernetes(rendered):
    target, docs = rendered
    release = kubernetes_release(target)
    for doc in docs:
        if doc["kind"] == "Plugin":
            assert plugin_errors(doc) == []
        else:
            kv.validate(doc, release, strict=True)
            kv.validate(doc, kv.latest_version(), strict=True)
    bad = copy.deepcopy(next(d for d in docs if d["kind"] == "DaemonSet"))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, release, strict=True)


COMPONENTS = {"kubevirt-v1.6-v1.8": ("attach-hook", "map-v1beta1"), "kubevirt-v1.9.0": ("attach-hook", "map-v1beta1"),
              "kubevirt-main": ("attach-plugin", "hook-sidecars-policy", "map-v1beta1")}


@pytest.mark.parametrize("target", TARGETS, ids=NAMES)
def test_targets_with_components_for_kubernetes_1_34_are_valid_there(tmp_path, target):
    """Each target with its optional component and map-v1beta1 (MutatingAdmissionPolicy as
    v1beta1): valid against Kubernetes 1.34, no v1 MutatingAdmissionPolicy left."""
    components = COMPONENTS[target.name]
    docs = kustomize(overlay(tmp_path / "site", target.name, new_name="r.example/p", digest=DIGEST, components=components))
    maps = [d for d in docs if d["kind"].startswith("MutatingAdmissionPolicy")]
    assert maps and {d["apiVersion"] for d in maps} == {"admissionregistration.k8s.io/v1beta1"}
    for doc in docs:
        if doc["kind"] != "Plugin":
            kv.validate(doc, kubernetes_release(target, components), strict=True)


# -- pinning ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS, ids=NAMES)
def test_one_images_entry_pins_every_image_reference_the_target_renders(tmp_path, target):
    """An overlay with one `images:` entry (name, newName, digest), with every component the
    target can take: no string anywhere in the output (CEL, annotations and JSON included) still
    names the placeholder image or the all-zero digest; every container image, and the params
    the policies read, is the pinned one."""
    site = overlay(tmp_path / "site", target.name, new_name=PINNED.split("@")[0], digest=DIGEST,
                   components=COMPONENTS[target.name])
    text = kustomize_text(site)
    assert PLACEHOLDER not in text and "0" * 64 not in text
    docs = [d for d in yaml.safe_load_all(text) if d]
    images = [c["image"] for _, spec in pod_specs(docs) for c in spec["containers"]]
    images += [c["image"] for c in template_image(docs)["template"]["spec"]["containers"]]
    assert images and set(images) == {PINNED}
    # and the target alone is unpinned everywhere, with the all-zero digest (never a tag)
    alone = kustomize_text(TARGETS_DIR / target.name)
    refs = set(re.findall(r"registry\.example\.com/pcitopo\S*", alone))
    assert refs == {f"{PLACEHOLDER}@{ZERO_DIGEST}"}


@pytest.mark.parametrize("target", TARGETS, ids=NAMES)
def test_the_gate_rollback_returns_the_cr_to_what_it_was(target):
    """The rollback's patch from the kustomization's comment, with `$i` the index the go-template
    prints (the gate's position), undoes gates.json exactly; at any other index its test op
    fails, so it never removes another gate."""
    text = (TARGETS_DIR / target.name / "kustomization.yaml").read_text()
    (line,) = [x for x in text.splitlines() if x.startswith("#   ") and " -p " in x and "$i" in x]
    template = line.split(' -p "', 1)[1].rstrip('"').replace('\\"', '"')
    before = {"spec": {"configuration": {"developerConfiguration": {"featureGates": ["CPUManager", "HostDevices"]}}}}
    after = apply_patch(before, gate_patch(target.name))
    gates = after["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    (gate,) = target.gates
    assert apply_patch(after, json.loads(template.replace("$i", str(gates.index(gate))))) == before
    with pytest.raises(ValueError):
        apply_patch(after, json.loads(template.replace("$i", "0")))
