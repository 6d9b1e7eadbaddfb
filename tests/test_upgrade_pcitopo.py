"""docs/DEPLOY.md "Upgrade pcitopo", run as written on dumps, as tests/test_quickstarts.py runs the
quick starts: a cluster whose opted-in VMs run the old digest takes the new one in three steps,
and at no step does the target's Sidecar policy refuse an opted-in VM's next start.

The block after ``<!-- upgrade: TARGET -->`` runs line by line in a scratch folder that sees this
checkout's ``deploy/``: ``pcitopo preflight`` is the real one and must exit 0; ``cat > F <<'EOF'``
writes F; ``kubectl apply -k site`` is the real ``kubectl kustomize`` whose objects replace the
state's; ``kubectl get … > cluster.yaml`` writes the state as a dump. Between the step-2 lines the
VMs move to the new digest one at a time (what their owners do), and after every command each
opted-in VM is held to the state's policies and params by their CEL (cel-python)."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit import REPO as ROOT, needs_tool

pytest.importorskip("celpy")
from testkit.admission.policy import admit  # noqa: E402

pytestmark = needs_tool("kubectl", why="kustomize v5 renders the documented overlays")

DEPLOY_MD = (ROOT / "docs" / "DEPLOY.md").read_text()
OLD = "sha256:" + "4f2c0d3b" * 8  # what the dump's pcitopo VM runs (fixtures/clusters/v1.9.0-stranger.yaml)
NEW = "sha256:" + "9a1e" * 16
REPO = "registry.example.com/pcitopo"
HOOKS = "hooks.kubevirt.io/hookSidecars"
ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}  # this checkout's pcitopo


def block(target: str = "kubevirt-v1.9.0") -> list[str]:
    text = DEPLOY_MD[DEPLOY_MD.index(f"<!-- upgrade: {target} -->"):]
    body = text[text.index("```sh\n") + 6:]
    return body[:body.index("```")].replace("sha256:<new>", NEW).replace("sha256:<old>", OLD).splitlines()


def key(obj: dict) -> str:
    return "/".join((obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))


class Cluster:
    def __init__(self, workdir, objects: list[dict]):
        self.workdir, self.objects = workdir, {key(o): o for o in objects}
        self.preflights: list[str] = []

    def render(self, folder: str) -> list[dict]:
        r = subprocess.run(["kubectl", "kustomize", str(self.workdir / folder)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return [d for d in yaml.safe_load_all(r.stdout) if d]

    def apply(self, folder: str) -> None:
        for doc in self.render(folder):
            self.objects[key(doc)] = doc

    def dump(self, path: str) -> None:
        (self.workdir / path).write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(self.objects.values())}))

    def vms(self) -> list[dict]:
        return [o for o in self.objects.values() if o["kind"] == "VirtualMachine"
                and HOOKS in o["spec"]["template"]["metadata"].get("annotations", {})]

    def move(self, vm: dict) -> None:
        meta = vm["spec"]["template"]["metadata"]
        meta["annotations"][HOOKS] = meta["annotations"][HOOKS].replace(OLD, NEW)

    def refused(self) -> list[str]:
        """Each opted-in VM's next VMI, held to the state's policies through their bindings."""
        store = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                 for o in self.objects.values() if o["kind"] == "PodTemplate"}
        out = []
        for vm in self.vms():
            vmi = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                   "metadata": {**copy.deepcopy(vm["spec"]["template"]["metadata"]), "name": vm["metadata"]["name"],
                                "namespace": vm["metadata"]["namespace"]}, "spec": vm["spec"]["template"]["spec"]}
            ns = self.objects[f"Namespace//{vm['metadata']['namespace']}"]
            for b in [o for o in self.objects.values() if o["kind"] == "ValidatingAdmissionPolicyBinding"]:
                policy = self.objects[f"ValidatingAdmissionPolicy//{b['spec']['policyName']}"]
                out += [f"{key(vm)}: {r}" for r in admit(policy, b, vmi, params_store=store, namespace=ns)]
        return out

    def run(self, line: str) -> None:
        if line.startswith("kubectl get ") and "> " in line:
            self.dump(line.split("> ", 1)[1])
        elif line.startswith("kubectl apply -k "):
            self.apply(line.split()[-1])
        elif line.startswith("pcitopo preflight "):
            r = subprocess.run(line.split(), cwd=self.workdir, capture_output=True, text=True, timeout=300, env=ENV)
            assert r.returncode == 0, r.stdout + r.stderr
            self.preflights.append(r.stdout)
        else:
            raise AssertionError(f"no stand-in for {line!r}")


def before(tmp_path) -> Cluster:
    """The cluster before the upgrade: the stranger dump with the target applied at the old digest,
    and a second opted-in VM on it."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "kustomization.yaml").write_text(
        f'resources: [../deploy/targets/kubevirt-v1.9.0]\nimages: [{{name: {REPO}, newName: {REPO}, digest: "{OLD}"}}]\n')
    items = yaml.safe_load((ROOT / "fixtures" / "clusters" / "v1.9.0-stranger.yaml").read_text())["items"]
    cluster = Cluster(tmp_path, items)
    (llm,) = cluster.vms()
    second = copy.deepcopy(llm)
    second["metadata"]["name"] = "llm-1"
    cluster.objects[key(second)] = second
    cluster.apply("site")
    return cluster


def test_the_documented_upgrade_refuses_no_opted_in_vm_at_any_step(tmp_path):
    cluster = before(tmp_path)
    assert cluster.refused() == []
    lines, step = block(), 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("# "):
            step = int(line[2]) if line[2].isdigit() else step
        elif line.startswith("cat > "):
            end = lines.index("EOF", i)
            (tmp_path / line.split()[2]).write_text("\n".join(lines[i + 1:end]) + "\n")
            i = end
        elif step == 2 and line.startswith("pcitopo preflight"):
            for vm in cluster.vms():  # the owners move their VMs one at a time; preflight after each
                cluster.run(line)
                assert cluster.refused() == []
                cluster.move(vm)
            cluster.dump("cluster.yaml")
            cluster.run(line)
        else:
            cluster.run(line)
        assert cluster.refused() == [], (line, cluster.refused())
        i += 1
    first, during, *_, last = cluster.preflights
    assert f"{REPO}@{OLD} (earlier, still admitted): 2 VM(s) run it: ml/llm-0, ml/llm-1" in first
    assert re.search(rf"{REPO}@{OLD} \(earlier, still admitted\): 2 VM\(s\) run it", during)
    assert f"{REPO}@{OLD} (earlier, still admitted): no VM runs it: drop it" in last
    assert f"{REPO}@{NEW} (pinned): 2 VM(s) run it: ml/llm-0, ml/llm-1" in last
    (params,) = [o for o in cluster.objects.values() if o["kind"] == "PodTemplate"]
    assert "annotations" not in params["metadata"] or not params["metadata"]["annotations"]


def test_without_the_old_digest_kept_preflight_names_every_vm_with_the_entry_that_keeps_it(tmp_path):
    cluster = before(tmp_path)
    cluster.dump("cluster.yaml")
    r = subprocess.run(["pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--image", f"{REPO}@{NEW}", "--json",
                        "cluster.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 1, r.stdout + r.stderr
    report = json.loads(r.stdout)
    assert sorted(p["name"] for p in report["sidecar_policy"]) == ["ml/llm-0", "ml/llm-1"]
    assert {p["admit"] for p in report["sidecar_policy"]} == {f"pcitopo.kubevirt.io/pcitopo.previous: {REPO}@{OLD}"}
