"""A shared cluster's tenants: the node hook's PriorityClass serves pcitopo's node hook alone, and
the namespace pcitopo's root-giving verbs are listed (docs/SECURITY.md) and rendered as a Role an
admin can bind.

Kubernetes semantics relied on (docs/SOURCES.md, "A shared cluster's tenants"): a PriorityClass
with ``preemptionPolicy: Never`` never evicts a lower-priority pod to schedule (KEP-902, GA 1.24);
a ValidatingAdmissionPolicy is evaluated for every pod CREATE/UPDATE it matches (GA 1.30);
``pods/exec`` and ``pods/attach`` are ``create`` (and, over the older websocket path, ``get``) on
the subresource, ``pods/ephemeralcontainers`` is ``update``/``patch``."""

from __future__ import annotations

import re
import shutil

import pytest

from pcitopo.kubevirt.targets import TARGETS
from testkit import REPO
from testkit.admission.manifests import TARGETS_DIR, kustomize

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize v5)")

# (api group, resource, verb) that make or enter a pod in the namespace pcitopo
ROOT_GIVING = {(g, r, v) for g, rs in (("", ("pods", "podtemplates", "replicationcontrollers")),
                                      ("apps", ("daemonsets", "deployments", "replicasets", "statefulsets")),
                                      ("batch", ("jobs", "cronjobs"))) for r in rs for v in ("create", "update", "patch")}
ROOT_GIVING |= {("", r, v) for r in ("pods/exec", "pods/attach") for v in ("create", "get")}
ROOT_GIVING |= {("", "pods/ephemeralcontainers", v) for v in ("update", "patch")}


def grants(role: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


@pytest.fixture(scope="module", params=TARGETS, ids=[t.name for t in TARGETS])
def docs(request):
    return kustomize(TARGETS_DIR / request.param.name)


def roles(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}


def test_every_target_renders_the_node_root_role_and_a_view_role_and_binds_neither(docs):
    r = roles(docs)
    assert set(r) == {"pcitopo-node-root", "pcitopo-view"}
    assert {d["metadata"]["namespace"] for d in r.values()} == {"pcitopo"}
    assert grants(r["pcitopo-node-root"]) == ROOT_GIVING
    assert not grants(r["pcitopo-view"]) & ROOT_GIVING
    assert {v for _, _, v in grants(r["pcitopo-view"])} == {"get", "list", "watch"}
    assert not [d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")], "the admin binds them"


def test_security_md_lists_every_root_giving_verb_of_the_role():
    text = (REPO / "docs" / "SECURITY.md").read_text()
    section = text[text.index("### The pcitopo namespace is root on every GPU node"):]
    start = section.index("| resource |")
    table = section[start:section.index("\n\n", start)]
    listed = set()
    for row in table.splitlines()[2:]:
        resources, verbs = row.split("|")[1:3]
        group = "apps" if "(`apps`)" in resources else "batch" if "(`batch`)" in resources else ""
        for r in re.findall(r"`([a-z/]+)`", resources.split("(")[0]):
            listed |= {(group, r, v) for v in re.findall(r"`(\w+)`", verbs)}
    assert listed == ROOT_GIVING


def test_the_node_hook_priority_class_never_preempts_and_serves_the_namespace_pcitopo_only():
    from testkit.admission.policy import Admission

    pytest.importorskip("celpy")
    docs = kustomize(TARGETS_DIR / "kubevirt-main")
    (cls,) = [d for d in docs if d["kind"] == "PriorityClass"]
    assert cls["preemptionPolicy"] == "Never" and not cls.get("globalDefault")
    (policy,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == "pcitopo-node-hook-priority"]
    (binding,) = [d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"
                  and d["spec"]["policyName"] == policy["metadata"]["name"]]
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    assert "namespaceSelector" not in policy["spec"]["matchConstraints"], "every namespace, tenants' included"

    def pod(ns: str, cls_name: str | None) -> dict:
        spec = {"containers": [{"name": "c", "image": "x"}], **({"priorityClassName": cls_name} if cls_name else {})}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns}, "spec": spec}

    def refused(obj: dict, operation: str = "CREATE") -> bool:
        return bool(Admission(policy, obj, operation=operation).denials())

    assert refused(pod("tenant-a", cls["metadata"]["name"]))
    assert refused(pod("tenant-a", cls["metadata"]["name"]), "UPDATE")
    assert not refused(pod("pcitopo", cls["metadata"]["name"]))
    assert not refused(pod("tenant-a", None)) and not refused(pod("tenant-a", "high-priority"))
    # the DaemonSet that names it lives in pcitopo, and the quota there counts its pods
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet" and d["metadata"]["name"] == "pcitopo-node-hook"]
    assert ds["metadata"]["namespace"] == "pcitopo" and ds["spec"]["template"]["spec"]["priorityClassName"] == cls["metadata"]["name"]
    (quota,) = [d for d in docs if d["kind"] == "ResourceQuota"]
    assert quota["metadata"]["namespace"] == "pcitopo"
    assert quota["spec"]["scopeSelector"]["matchExpressions"] == [
        {"scopeName": "PriorityClass", "operator": "In", "values": [cls["metadata"]["name"]]}]
