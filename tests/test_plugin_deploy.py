"""deploy/targets/kubevirt-main: pcitopo as a KubeVirt Plugin.

What is checked, and how:

- the Plugin CR against KubeVirt v1.9.0's API (``staging/src/kubevirt.io/api/plugin/v1alpha1/
  types.go``): a CRD, so no Kubernetes schema; a structural check of every field name, type and
  enum instead (``PLUGIN_API`` below), plus virt-operator's own policies on Plugin objects
  (``tests/data/kubevirt-v1.9.0-policies.yaml``), evaluated with cel-python;
- the hooks' conditions with cel-python: the node hook's as virt-handler evaluates it (the VMI
  through its json names), the domain hook's on a model of what virt-launcher's environment
  gives it (the VMI's Go field names; ``go_view``);
- every Kubernetes object against Kubernetes' strict schemas (kubernetes-validate): in
  tests/test_targets.py, the v1beta1 form (component map-v1beta1) against 1.34, the shipped v1
  form against 1.36; here, the pod the injector patches;
- the node hooks as virt-handler calls them (testkit/admission/cluster.py, from KubeVirt's
  ``CallNodeHooks``): which VMs wait on the node hook, and what a ``require`` VM does on a node
  where the node hook does not run;
- the MutatingAdmissionPolicy evaluated with cel-python (testkit/admission) against a
  virt-launcher pod as KubeVirt v1.9.0 renders it (``tests/data/virt-launcher-pod.json``:
  labels from ``podLabels``, the pod security context from ``computePodSecurityContext`` in
  ``pkg/virt-controller/services/template.go``; volumes and the compute container's mounts,
  among them the emptyDir ``kubevirt-plugin-sockets`` at /var/run/kubevirt-plugin, from
  ``rendervolumes.go``), its JSON patch applied, and the patched pod held to virt-operator's
  subPath policy and to the socket rule.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml

from testkit import REPO as ROOT

celpy = pytest.importorskip("celpy")
from testkit.admission.cluster import call_node_hooks  # noqa: E402
from testkit.admission.manifests import kind, load  # noqa: E402
from testkit.admission.plugin_api import PLUGIN_API, structure_errors  # noqa: E402
from testkit.admission.policy import Admission, evaluate  # noqa: E402  (needs cel-python)

PLUGIN = ROOT / "deploy" / "targets" / "kubevirt-main"
DATA = ROOT / "tests" / "data"
K8S = "1.34.0"
LABEL = "pcitopo.kubevirt.io/plugin"
SOCKETS = "kubevirt-plugin-sockets"


@pytest.fixture(scope="module")
def plugin() -> dict:
    return kind(load(PLUGIN / "plugin.yaml"), "Plugin")


@pytest.fixture(scope="module")
def injector() -> dict:
    return kind(load(PLUGIN / "injector.yaml"), "MutatingAdmissionPolicy")


PINNED = "registry.example.com/pcitopo@sha256:" + "5e" * 32


def image_params(image: str) -> dict:
    """The PodTemplate pcitopo/pcitopo-image (deploy/base/image.yaml) with this image, as an
    overlay's `images:` entry leaves it."""
    pt = copy.deepcopy(kind(load(ROOT / "deploy" / "base" / "image.yaml"), "PodTemplate"))
    pt["template"]["spec"]["containers"][0]["image"] = image
    return pt


@pytest.fixture(scope="module")
def params() -> dict:
    return image_params(PINNED)


@pytest.fixture()
def pod() -> dict:
    return json.loads((DATA / "virt-launcher-pod.json").read_text())


def kubevirt_policy(name: str) -> dict:
    return next(d for d in load(DATA / "kubevirt-v1.9.0-policies.yaml") if d["metadata"]["name"] == name)


# -- the Plugin CR ---------------------------------------------------------------------------------

def test_deploy_plugin_cr_has_kubevirt_v1_9_0_structure(plugin):
    assert plugin["apiVersion"] == "plugin.kubevirt.io/v1alpha1" and plugin["kind"] == "Plugin"
    assert set(plugin) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(plugin["metadata"]) == {"name"}, "cluster-scoped: no namespace"
    assert structure_errors(plugin["spec"], PLUGIN_API, "spec") == []
    # the check does fail on what people get wrong
    bad = copy.deepcopy(plugin["spec"])
    bad["nodeHooks"][0]["permittedHooks"] = ["PreVmStart"]
    bad["domainHooks"][0]["timeout"] = 15
    bad["domainHooks"][0]["sidecar"]["socket"] = bad["domainHooks"][0]["sidecar"].pop("socketPath")
    assert len(structure_errors(bad, PLUGIN_API, "spec")) == 4


def test_deploy_plugin_cr_hooks_as_asked(plugin):
    """A sidecar domain hook (Fail) and one PreVMStart node hook per doctor policy on the same
    socket: require under Fail, warn under Ignore; each with its own condition and a timeout; no
    plugin-level condition (v1.9.0 and main disagree on where it applies)."""
    spec = plugin["spec"]
    assert "condition" not in spec
    (dh,) = spec["domainHooks"]
    require, warn = spec["nodeHooks"]
    assert dh["sidecar"]["socketPath"] == f"/var/run/kubevirt-plugin/{plugin['metadata']['name']}/domain.sock"
    assert dh["failureStrategy"] == "Fail" and dh["condition"] and dh["timeout"]
    for nh in (require, warn):
        assert nh["socket"] == "/var/run/kubevirt/plugins/pcitopo/node.sock" and nh["permittedHooks"] == ["PreVMStart"]
        assert nh["condition"] and nh["timeout"]
    assert (require["failureStrategy"], warn["failureStrategy"]) == ("Fail", "Ignore")
    assert spec["mutatingAdmissionPolicies"] == [{"name": "pcitopo-plugin-injector"}]


@pytest.mark.parametrize("name", ["kubevirt-plugin-validation-policy", "kubevirt-plugin-socket-path-policy"])
def test_deploy_plugin_cr_passes_virt_operators_policies(plugin, name):
    policy = kubevirt_policy(name)
    assert Admission(policy, plugin).denials() == []
    bad = copy.deepcopy(plugin)
    bad["metadata"]["name"] = "pcitopo2"  # the socket folder no longer matches the Plugin's name
    bad["spec"]["domainHooks"][0]["failureStrategy"] = "fail"
    assert Admission(policy, bad).denials() != []


def vmi(labels: dict | None) -> dict:
    meta = {"name": "train-0", "namespace": "ml"}
    if labels is not None:
        meta["labels"] = labels
    return {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta,
            "spec": {"domain": {"devices": {"gpus": [{"name": "gpu0", "deviceName": "nvidia.com/B200"}]}}}}


def go_view(obj: dict) -> dict:
    """The VMI as virt-launcher's CEL environment sees it (v1.9.0
    pkg/virt-launcher/virtwrap/plugins/cel/evaluator.go: ext.NativeTypes of the Go struct, no
    json tags): ObjectMeta's fields promoted under their Go names, a nil map read as empty.
    A model of the fields our condition reads, not of the whole struct."""
    meta = obj.get("metadata") or {}
    return {"Name": meta.get("name", ""), "Namespace": meta.get("namespace", ""),
            "Labels": meta.get("labels") or {}, "Annotations": meta.get("annotations") or {}}


OPTED = [({LABEL: "true"}, True), ({LABEL: "false"}, False), ({"app": "x"}, False), (None, False),
         ({LABEL: "True"}, False)]


@pytest.mark.parametrize("labels,expected", OPTED)
def test_deploy_plugin_conditions_select_opted_in_vmis(plugin, labels, expected):
    """The node hooks' conditions on the VMI's JSON (virt-handler: json names); the domain hook's
    on the Go-name view. Both select exactly the VMIs labelled pcitopo.kubevirt.io/plugin: "true"
    (a VMI without a doctor annotation: the warn hook)."""
    node = [h["condition"] for h in plugin["spec"]["nodeHooks"]]
    domain = plugin["spec"]["domainHooks"][0]["condition"]
    assert [evaluate(c, {"vmi": vmi(labels)}) for c in node] == [False, expected]
    assert evaluate(domain, {"vmi": go_view(vmi(labels))}) is expected


def test_deploy_plugin_conditions_use_each_environments_names(plugin):
    """The two spellings are not interchangeable: a Go name under the json view is an error (a
    hard error for KubeVirt), which is why each hook carries its own."""
    node = " ".join(h["condition"] for h in plugin["spec"]["nodeHooks"])
    domain = plugin["spec"]["domainHooks"][0]["condition"]
    assert "vmi.metadata.labels" in node and "vmi.Labels" not in node
    assert "vmi.Labels" in domain and "metadata" not in domain
    with pytest.raises(celpy.CELEvalError):
        evaluate(domain, {"vmi": vmi({LABEL: "true"})})


# -- the injector: Kubernetes schemas -----------------------------------------------------------------

def _kv():
    return pytest.importorskip("kubernetes_validate")


def test_deploy_kubernetes_1_34_serves_map_as_v1beta1_only():
    """Which MutatingAdmissionPolicy versions each release's schema set has: 1.34 v1alpha1 and
    v1beta1 (v1beta1 off by default), v1 from 1.36."""
    kv = _kv()
    root = Path(kv.__file__).parent / "kubernetes-json-schema"

    def versions(release: str) -> set[str]:
        names = (root / f"v{release}-local-strict").glob("mutatingadmissionpolicy-admissionregistration-*.json")
        return {p.stem.rsplit("-", 1)[1] for p in names}

    assert versions("1.34.0") == {"v1alpha1", "v1beta1"}
    assert versions("1.35.0") == {"v1alpha1", "v1beta1"}
    assert "v1" in versions("1.36.0")


# -- the injector: its CEL on a virt-launcher pod ---------------------------------------------------

def injected(pod: dict, injector: dict, params: dict) -> tuple[Admission, dict | None]:
    a = Admission(injector, pod, params=params, namespace={"metadata": {"name": pod["metadata"]["namespace"]}})
    return a, a.mutated()


def test_deploy_injector_matches_only_opted_in_launcher_pods(pod, injector, params):
    a, out = injected(pod, injector, params)
    assert out is not None
    assert all(v is True for k, v in a.trace.items() if k.startswith("matchConditions."))
    for change in ({LABEL: "false"}, {"kubevirt.io": "virt-exporter"}):
        other = copy.deepcopy(pod)
        other["metadata"]["labels"].update(change)
        assert injected(other, injector, params)[1] is None, change
    del pod["metadata"]["labels"][LABEL]
    assert injected(pod, injector, params)[1] is None
    # the objectSelector says the same as the matchConditions
    assert injector["spec"]["matchConstraints"]["objectSelector"]["matchLabels"] == {"kubevirt.io": "virt-launcher", LABEL: "true"}


def test_deploy_injector_is_idempotent_and_needs_the_plugin_volume(pod, injector, params):
    _, once = injected(pod, injector, params)
    assert injected(once, injector, params)[1] is None  # already injected: no second container
    pod["spec"]["volumes"] = [v for v in pod["spec"]["volumes"] if v["name"] != SOCKETS]  # Plugins gate off
    assert injected(pod, injector, params)[1] is None


@pytest.mark.parametrize("image", [
    "registry.example.com/pcitopo@sha256:" + "0" * 64,  # the shipped placeholder
    "registry.example.com/pcitopo:0.1.0",  # a tag
    "registry.example.com/pcitopo@sha256:" + "5e" * 31,  # a short digest
    "registry.example.com/pcitopo@sha256:" + "5E" * 32,  # not lower-case hex
])
def test_injector_injects_nothing_from_an_unpinned_image(pod, injector, image):
    """Until the PodTemplate names an image by digest (64 lower-case hex, not all zeros) the
    injector adds no container; the Plugin's domain hook (Fail) then keeps the VM from starting
    rather than let it run an unpinned image or run without pcitopo."""
    a, out = injected(pod, injector, image_params(image))
    assert out is None and a.trace["matchConditions.image-pinned"] is False
    assert injected(pod, injector, image_params(PINNED))[1] is not None


def container(pod: dict, name: str) -> dict:
    (c,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return c


def test_deploy_injected_container_is_what_the_plugin_needs(pod, injector, params, plugin):
    _, out = injected(pod, injector, params)
    c = container(out, "pcitopo")
    assert out["spec"]["containers"][:-1] == pod["spec"]["containers"]  # appended, nothing else changed
    assert c["image"] == PINNED and "command" not in c
    entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", (ROOT / "Containerfile").read_text(), re.M)[1])
    assert entry + c["args"] == ["pcitopo", "serve", "--plugin", "pcitopo", "--sysfs", "/sys",
                                 "--doctor-report", "/var/run/pcitopo/doctor.json"]
    # the doctor's report (doctor: require): the folder the doctor DaemonSet writes, read-only,
    # whole (the doctor renames a new file over the old: a file mount would keep the old one)
    (report,) = [m for m in c["volumeMounts"] if m["name"] == "pcitopo-doctor-report"]
    (vol,) = [v for v in out["spec"]["volumes"] if v["name"] == "pcitopo-doctor-report"]
    doctor = next(d for d in yaml.safe_load_all((ROOT / "deploy/base/doctor.yaml").read_text()) if d and d["kind"] == "DaemonSet")
    written = {v["name"]: v for v in doctor["spec"]["template"]["spec"]["volumes"]}["reports"]["hostPath"]["path"]
    assert report == {"name": "pcitopo-doctor-report", "mountPath": "/var/run/pcitopo", "readOnly": True}
    assert vol["hostPath"] == {"path": written, "type": "DirectoryOrCreate"} and c["args"][-1].startswith(report["mountPath"] + "/")
    sc = c["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"], sc["runAsNonRoot"]) == (107, 107, True)
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": "200m", "memory": "96Mi"}
    # the socket rule: pcitopo's mount of the shared folder is <compute's mount>/<plugin name>,
    # the folder of the Plugin's socketPath, so compute dials the same path pcitopo binds
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == SOCKETS]
    (compute,) = [m for m in container(out, "compute")["volumeMounts"] if m["name"] == SOCKETS]
    name = plugin["metadata"]["name"]
    socket = plugin["spec"]["domainHooks"][0]["sidecar"]["socketPath"]
    assert mount["subPath"] == name
    assert mount["mountPath"] == f"{compute['mountPath']}/{mount['subPath']}" == socket.rsplit("/", 1)[0]


def test_deploy_patched_pod_passes_virt_operators_subpath_policy(pod, injector, params):
    policy = kubevirt_policy("kubevirt-plugin-sidecar-subpath-policy")
    _, out = injected(pod, injector, params)
    a = Admission(policy, out)
    assert a.denials() == []
    assert a.trace["variables.containersHaveSubPath"] is True
    # and the policy does refuse a container that mounts the folder whole
    del container(out, "pcitopo")["volumeMounts"][0]["subPath"]
    assert Admission(policy, out).denials() == ["sidecar containers must use subPath when mounting the plugin socket volume"]


def test_deploy_patched_pod_is_a_valid_kubernetes_1_34_pod(pod, injector, params):
    """Kubernetes type-checks the typed objects a mutation builds (Object.spec.containers{...});
    cel-python builds plain maps, so the patched pod goes through the strict schema instead."""
    kv = _kv()
    _, out = injected(pod, injector, params)
    kv.validate(out, K8S, strict=True)
    bad = copy.deepcopy(out)
    container(bad, "pcitopo")["securityContext"]["runAsUsr"] = 107
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S, strict=True)


def test_deploy_injector_mounts_the_fabric_like_the_hook_sidecar(pod, injector, params):
    """deploy/nvlink-fabric.yaml hands the hook sidecar `--fabric /etc/pcitopo/fabric.json`
    from a ConfigMap's key fabric.json; the label pcitopo.kubevirt.io/fabric-configmap does the
    same for the Plugin's container."""
    kv = _kv()
    legacy = kind(load(ROOT / "deploy" / "nvlink-fabric.yaml"), "VirtualMachineInstance")
    (sidecar,) = json.loads(legacy["metadata"]["annotations"]["hooks.kubevirt.io/hookSidecars"])
    pod["metadata"]["labels"]["pcitopo.kubevirt.io/fabric-configmap"] = sidecar["configMap"]["name"]
    _, out = injected(pod, injector, params)
    c = container(out, "pcitopo")
    assert c["args"][-2:] == sidecar["args"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "pcitopo-fabric"]
    (vol,) = [v for v in out["spec"]["volumes"] if v["name"] == "pcitopo-fabric"]
    assert mount["mountPath"] == sidecar["configMap"]["hookPath"] and mount["readOnly"]
    assert vol["configMap"]["name"] == sidecar["configMap"]["name"]
    assert vol["configMap"]["items"] == [{"key": sidecar["configMap"]["key"], "path": mount["subPath"]}]
    kv.validate(out, K8S, strict=True)
    assert Admission(kubevirt_policy("kubevirt-plugin-sidecar-subpath-policy"), out).denials() == []


# -- the node hook in the doctor's DaemonSet ----------------------------------------------------------

def test_deploy_node_hook_container_serves_where_virt_handler_dials(plugin):
    kv = _kv()
    docs = load(PLUGIN / "node-hook.yaml")
    ds = kind(docs, "DaemonSet")
    kv.validate(ds, "1.30.0", strict=True)
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    script = c["args"][0]
    assert "exec pcitopo serve \"$@\"" in script and "--node-hook --sysfs /host/sys" in script
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]}
    for hook in plugin["spec"]["nodeHooks"]:
        folder = hook["socket"].rsplit("/", 1)[0]
        # bound on the host at the path the Plugin names: the same folder, at the same path
        assert mounts[folder]["hostPath"] == {"path": folder, "type": "DirectoryOrCreate"}
    assert mounts["/host/sys"]["hostPath"]["path"] == "/sys"
    cr = mounts["/etc/pcitopo/kubevirt"]["configMap"]
    assert cr == {"name": "pcitopo-kubevirt-cr", "optional": True}
    assert "--permitted-host-devices /etc/pcitopo/kubevirt/kubevirt.yaml" in script
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # a socket folder of its own, never the host's whole plugins folder (other vendors' sockets),
    # served as uid 107: the init container gives it that one folder and nothing else
    (folder,) = {hook["socket"].rsplit("/", 1)[0] for hook in plugin["spec"]["nodeHooks"]}
    assert folder == "/var/run/kubevirt/plugins/pcitopo"
    assert not [p for p, v in mounts.items() if "hostPath" in v and p.rstrip("/") == "/var/run/kubevirt/plugins"]
    assert c["securityContext"]["runAsUser"] == 107 and c["securityContext"]["runAsNonRoot"] is True
    (init,) = pod["initContainers"]
    assert init["command"] == ["chown", "107:107", folder]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN"]}
    assert [m["mountPath"] for m in init["volumeMounts"]] == [folder]


# -- which VMs wait on the node hook ------------------------------------------------------------------

SOCKET = "/var/run/kubevirt/plugins/pcitopo/node.sock"


def doctor_vmi(policy: str | None, opted: bool = True) -> dict:
    doc = vmi({LABEL: "true"} if opted else {"app": "x"})
    if policy is not None:
        doc["metadata"]["annotations"] = {"pcitopo.kubevirt.io/doctor": policy}
    return doc


@pytest.mark.parametrize("policy,strategies", [("require", ["Fail"]), ("warn", ["Ignore"]), (None, ["Ignore"]),
                                               ("off", [])])
def test_each_doctor_policy_calls_the_node_hook_under_its_own_strategy(plugin, policy, strategies):
    err, calls = call_node_hooks([plugin], "PreVMStart", doctor_vmi(policy), {SOCKET})
    assert err is None and [c.failure_strategy for c in calls] == strategies
    assert all(c.socket == SOCKET for c in calls)
    assert call_node_hooks([plugin], "PreVMStart", doctor_vmi(policy, opted=False), {SOCKET}) == (None, [])
    assert call_node_hooks([plugin], "PostVMStop", doctor_vmi(policy), {SOCKET}) == (None, [])


@pytest.mark.parametrize("policy", ["warn", None, "off"])
def test_a_vm_that_did_not_ask_for_require_never_waits_on_the_node_hook(plugin, policy):
    """On a node where the node hook does not run (no pcitopo-node-hook pod: the socket is not
    there), a VM without doctor: require starts: its hook is Ignore, or not called at all."""
    err, _ = call_node_hooks([plugin], "PreVMStart", doctor_vmi(policy), serving=set())
    assert err is None


def test_a_require_vm_on_a_node_without_the_node_hook_does_not_start(plugin):
    """What the quick start says: a VM with pcitopo.kubevirt.io/doctor: require, on a node where
    the DaemonSet pcitopo-node-hook has no pod, does not start there. virt-handler cannot dial the
    socket, the require hook is Fail, so PreVMStart returns an error; virt-handler returns before
    it defines the domain (KubeVirt pkg/virt-handler/vm.go, PreVMStart before
    syncVirtualMachine), the VMI stays Scheduled, not Running, and the sync is retried until the
    node hook serves or the VMI is deleted. Other vendors' Plugins sort by name, before or after."""
    err, calls = call_node_hooks([plugin], "PreVMStart", doctor_vmi("require"), serving=set())
    assert err == f"node hook PreVMStart from plugin pcitopo failed: failed to dial plugin pcitopo at {SOCKET}"
    assert [c.failure_strategy for c in calls] == ["Fail"]
    other = {"metadata": {"name": "acme"}, "spec": {"nodeHooks": [
        {"socket": "/var/run/kubevirt/plugins/acme.sock", "permittedHooks": ["PreVMStart"], "failureStrategy": "Ignore"}]}}
    err, calls = call_node_hooks([plugin, other], "PreVMStart", doctor_vmi("require"), serving={SOCKET})
    assert err is None and [c.plugin for c in calls] == ["acme", "pcitopo"]


def test_the_node_hook_container_runs_its_real_command(tmp_path):
    """The node-hook container's script, run by /bin/sh as the container runs it, with the host
    paths pointed at a fixture and a scratch folder (and the socket there): `pcitopo serve
    --node-hook` starts and serves, reading the doctor's report from where the doctor writes it."""
    import shutil
    import tempfile

    from testkit.server_proc import BIN, ServerProcess

    ds = kind(load(PLUGIN / "node-hook.yaml"), "DaemonSet")
    (c,) = ds["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["/bin/sh", "-c"]
    short = Path(tempfile.mkdtemp(prefix="pcitopo-nh-"))  # AF_UNIX paths are short
    try:
        sock = short / "pcitopo.sock"
        script = (c["args"][0].replace("/host/sys", str(ROOT / "fixtures" / "hgx-b200"))
                  .replace("/var/run/pcitopo/doctor.json", str(tmp_path / "doctor.json"))
                  .replace("/etc/pcitopo/kubevirt/kubevirt.yaml", str(tmp_path / "kubevirt.yaml"))
                  .replace('exec pcitopo serve "$@"', f'exec {BIN}/pcitopo serve "$@" --socket {sock}'))
        with ServerProcess(["/bin/sh", "-c", script], tmp_path / "log", socket=sock) as server:
            server.wait_for_socket()
            # the socket is bound before the "serving" line is written: give the line a moment
            import time

            deadline = time.monotonic() + 10
            while not (lines := [x for x in server.log_lines() if x.get("event") == "serving"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            (serving,) = lines
            assert serving["door"] == "node-hook"
    finally:
        shutil.rmtree(short, ignore_errors=True)
