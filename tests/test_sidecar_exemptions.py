"""Other teams' hook sidecars on a shared cluster (fixtures/clusters/v1.9.0-shared-sidecars.yaml:
KubeVirt v1.9.0's example hooks and a second team's image, VMs and VMIs, labelled and unlabelled
namespaces): preflight names each with the params annotation that admits it; with that exemption,
as flags or as docs/DEPLOY.md's patch rendered and dumped, it exits 0 and the rendered policies
admit exactly pcitopo's image and the exempted hooks. xmlfix --check judges one VM the same way,
and pcitopo's image is the one the admin pinned, whatever its name."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit import REPO as ROOT, tool_or_skip

CLUSTERS = ROOT / "fixtures" / "clusters"
SHARED = CLUSTERS / "v1.9.0-shared-sidecars.yaml"
OURS = "registry.example.com/pcitopo@sha256:" + "4f2c0d3b" * 8
EXAMPLE_HOOK = "registry:5000/kubevirt/example-hook-sidecar@sha256:" + "5e" * 32
NETPREP = "quay.io/acme/netprep@sha256:" + "12" * 32
ENTRIES = {
    "security/scanner-0": f"pcitopo.kubevirt.io/sidecar.example-hook-sidecar: {EXAMPLE_HOOK}",
    "default/vmi-with-sidecar-hook-configmap": "pcitopo.kubevirt.io/configmap.default.my-config-map: default/my-config-map",
    "default/vm-cirros-with-sidecar-hook-configmap": "pcitopo.kubevirt.io/configmap.default.my-config-map: default/my-config-map",
    "tools/netprep-0": f"pcitopo.kubevirt.io/sidecar.netprep: {NETPREP}",
    "ml/netprep-1": f"pcitopo.kubevirt.io/sidecar.netprep: {NETPREP}",
}
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}


def run(tool: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([tool, *args], capture_output=True, text=True, cwd=cwd, timeout=300, env=ENV)


def test_preflight_names_each_other_teams_hook_with_the_entry_that_admits_it():
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--image", OURS, str(SHARED))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    for name, entry in ENTRIES.items():
        (i,) = [n for n, line in enumerate(lines) if line.startswith(f"  HARMED {name} (")]
        assert lines[i].endswith("only pcitopo's image and the admitted list are allowed"), lines[i]
        assert lines[i + 1] == ("    to admit it, vetted, add to the PodTemplate pcitopo/pcitopo-image's metadata.annotations: "
                                + entry)
    assert '"image" is not' not in r.stdout


def test_with_the_exemptions_as_flags_preflight_exits_0():
    flags = ["--allow-sidecar", EXAMPLE_HOOK, "--allow-sidecar", NETPREP, "--allow-sidecar", "configmap:default/my-config-map"]
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--image", OURS, "--json", *flags, str(SHARED))
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert report["sidecar_policy"] == [] and report["admitted"]["sidecars"] == sorted([EXAMPLE_HOOK, NETPREP])
    # one left out: only that one is named
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--image", OURS, "--json", *flags[:4], str(SHARED))
    assert r.returncode == 1 and sorted(p["name"] for p in json.loads(r.stdout)["sidecar_policy"]) == [
        "default/vm-cirros-with-sidecar-hook-configmap", "default/vmi-with-sidecar-hook-configmap"]


def _rendered_params(tmp_path) -> dict:
    """docs/DEPLOY.md's exemption patch in an overlay of the v1.9.0 target, rendered."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    section = text[text.index("## Other teams' hook sidecars"):text.index("## Upgrade pcitopo")]
    patch = section[section.index("```yaml\n") + 8:]
    patch = patch[:patch.index("```")].replace(
        "quay.io/acme/netprep@sha256:<64 hex>", NETPREP)
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "kustomization.yaml").write_text(
        "resources: [../deploy/targets/kubevirt-v1.9.0]\n"
        "images: [{name: registry.example.com/pcitopo, newName: registry.example.com/pcitopo, "
        f'digest: "{OURS.split("@")[1]}"}}]\n' + patch)
    kubectl = tool_or_skip("kubectl", why="kustomize v5")
    r = subprocess.run([kubectl, "kustomize", str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_the_documented_patch_rendered_and_dumped_admits_what_it_names(tmp_path):
    pytest.importorskip("celpy")
    from testkit.admission.policy import admit

    docs = _rendered_params(tmp_path)
    (params,) = [d for d in docs if d["kind"] == "PodTemplate"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--json", str(SHARED), str(tmp_path / "params.yaml"))
    report = json.loads(r.stdout)
    # the patch admits netprep and the ConfigMap hook, not the example image: that one alone is named
    assert [p["name"] for p in report["sidecar_policy"]] == ["security/scanner-0"], r.stdout
    assert report["admitted"]["pcitopo"][0] == {"image": OURS, "pinned": True, "vms": ["ml/llm-0"]}
    # the rendered policies, through their bindings, on the dump's VMs: the same verdicts
    objs = yaml.safe_load(SHARED.read_text())["items"]
    namespaces = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Namespace"}
    bindings = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"]
    policies = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    store = {("pcitopo", "pcitopo-image"): params}
    refused = set()
    for o in objs:
        if o["kind"] not in ("VirtualMachine", "VirtualMachineInstance"):
            continue
        where = o["metadata"]["namespace"]
        ns = namespaces.get(where, {"metadata": {"name": where}})
        if any(admit(policies[b["spec"]["policyName"]], b, o, params_store=store, namespace=ns) for b in bindings):
            refused.add(f"{o['metadata']['namespace']}/{o['metadata']['name']}")
    assert refused == {"security/scanner-0"}


@pytest.mark.parametrize("flag, said", [
    (["--allow-sidecar", "quay.io/acme/netprep:1.2"], "is not pinned by digest"),
    (["--allow-sidecar", "quay.io/acme/netprep@sha256:1234"], "is not a digest"),
    (["--allow-sidecar", "quay.io/acme/netprep:1.2@sha256:" + "12" * 32], "names a tag as well as a digest"),
    (["--allow-sidecar", "quay.io/*@sha256:" + "12" * 32], "is not a repository name"),
    (["--allow-sidecar", "configmap:default"], "is not NAMESPACE/CONFIGMAP"),
    (["--image", "registry.example.com/pcitopo:0.1.0"], "--image: 'registry.example.com/pcitopo:0.1.0' is not pinned by digest"),
])
def test_bad_exemptions_and_pins_are_one_line_exit_2(flag, said):
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", *flag, str(SHARED))
    assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1 and r.stdout == "", r.stderr


def test_a_tag_in_the_dumps_params_is_exit_2(tmp_path):
    params = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {
        "name": "pcitopo-image", "namespace": "pcitopo", "annotations": {"pcitopo.kubevirt.io/sidecar.x": "quay.io/x:1"}},
        "template": {"spec": {"containers": [{"name": "pcitopo", "image": OURS}]}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", str(SHARED), str(tmp_path / "params.yaml"))
    assert r.returncode == 2 and "pcitopo.kubevirt.io/sidecar.x" in r.stderr and r.stderr.count("\n") == 1, r.stderr


MIRROR = "platform/gpu-topology-hook@sha256:" + "4f2c0d3b" * 8


def _mirrored(tmp_path, namespace: str = "ml") -> Path:
    text = (ROOT / "deploy" / "vmi-gpu.yaml").read_text().replace("registry.example.com/pcitopo:0.1.0", MIRROR)
    path = tmp_path / f"vmi-{namespace}.yaml"
    path.write_text(text.replace("namespace: ml", f"namespace: {namespace}"))
    return path


def _check(vmi: Path, *args: str) -> subprocess.CompletedProcess:
    return run("xmlfix", "--check", "--sysfs", str(ROOT / "fixtures" / "hgx-b200"), "--vmi", str(vmi),
               str(ROOT / "fixtures" / "hgx-b200" / "examples" / "vmi-gpu" / "domain.xml"),
               "--cluster", str(CLUSTERS / "v1.9.0-stranger.yaml"), *args)


def test_a_mirrored_image_is_pcitopo_where_it_is_pinned(tmp_path):
    vmi = _mirrored(tmp_path)
    r = _check(vmi)
    assert r.returncode == 1 and "not a pcitopo image (give --image if it is pcitopo's)" in r.stderr
    r = _check(vmi, "--image", MIRROR)
    assert r.returncode == 0 and "check: ok" in r.stderr.splitlines()[-1], r.stderr
    # preflight: the dump's VM on the mirror, pinned by --image, has its hook door
    dump = tmp_path / "dump.yaml"
    dump.write_text((CLUSTERS / "v1.9.0-stranger.yaml").read_text().replace(OURS, MIRROR))
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--image", MIRROR, str(dump))
    assert r.returncode == 0 and "  ml/llm-0: has hook, plugin" in r.stdout, r.stdout
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--image", OURS, str(dump))
    assert r.returncode == 1 and "HARMED ml/llm-0" in r.stdout


def test_xmlfix_check_fails_a_vm_the_targets_policy_refuses_in_one_line(tmp_path):
    said = "xmlfix: check: policy: the Sidecar policy admits pcitopo's hook sidecar only in namespaces labelled " \
           "pcitopo.kubevirt.io/hook-sidecars=allowed"
    r = _check(_mirrored(tmp_path, "research"), "--image", MIRROR, "--target", "kubevirt-v1.9.0")
    assert r.returncode == 1 and said in r.stderr.splitlines() and "policy (above)" in r.stderr, r.stderr
    # the shipped example pins a tag: the policy refuses that too
    r = _check(ROOT / "deploy" / "vmi-gpu.yaml", "--target", "kubevirt-v1.9.0")
    assert r.returncode == 1 and "xmlfix: check: policy: image 'registry.example.com/pcitopo:0.1.0' is not pinned by digest" \
        in r.stderr, r.stderr
    # another pin: not admitted, with the entry that would keep it
    r = _check(_mirrored(tmp_path), "--image", OURS[:-2] + "00", "--target", "kubevirt-v1.9.0")
    assert r.returncode == 1 and "only pcitopo's image and the admitted list are allowed" in r.stderr, r.stderr
    # the target without the policy does not judge it
    r = _check(_mirrored(tmp_path, "research"), "--image", MIRROR, "--target", "kubevirt-main")
    assert "check: policy" not in r.stderr


def test_pcitopo_domain_with_the_params_in_the_dump_judges_the_policy_too(tmp_path):
    """A dump with pcitopo's params (and gate Sidecar on) is judged as preflight judges it: the
    shipped example pins a tag, and fails in one line; pinned by the params' digest, it passes."""
    params = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "pcitopo-image", "namespace": "pcitopo"},
              "template": {"spec": {"containers": [{"name": "pcitopo", "image": OURS}]}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text((ROOT / "deploy" / "vmi-gpu.yaml").read_text().replace("registry.example.com/pcitopo:0.1.0", OURS))
    for vmi, code in ((ROOT / "deploy" / "vmi-gpu.yaml", 1), (pinned, 0)):
        r = run("pcitopo", "domain", "--vmi", str(vmi), "--sysfs", str(ROOT / "fixtures" / "hgx-b200"),
                "--cluster", str(CLUSTERS / "v1.9.0-stranger.yaml"), "--cluster", str(tmp_path / "params.yaml"))
        assert r.returncode == code and r.stdout.startswith("<domain"), r.stderr
        said = [line for line in r.stderr.splitlines() if line.startswith("pcitopo domain: policy: ")]
        assert said == ([] if code == 0 else [
            "pcitopo domain: policy: image 'registry.example.com/pcitopo:0.1.0' is not pinned by digest: the Sidecar "
            f"policy admits hook images by digest only (@sha256:<64 hex>); pin it as {OURS}"])


def test_xmlfix_says_unknown_when_the_verdict_hinges_on_a_namespace_the_dump_lacks(tmp_path):
    r = _check(_mirrored(tmp_path, "elsewhere"), "--image", MIRROR, "--target", "kubevirt-v1.9.0")
    last = r.stderr.splitlines()[-1]
    assert r.returncode == 4 and last.startswith("xmlfix: check: unknown: policy: its namespace is not in the dump"), r.stderr
