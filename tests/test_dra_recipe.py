"""deploy/dra/: the DRA recipe that asks Kubernetes for GPU+NIC pairs on one PCIe root.

What is checked, and how:

- the ResourceClaimTemplate against the Kubernetes **1.34** JSON schema (kubernetes-validate's
  ``v1.34.0`` strict schemas: unknown fields and wrong types fail), and the VM's
  ``spec.template.spec.resourceClaims`` entries against the same release's ``PodResourceClaim``
  schema (KubeVirt's VMI spec uses that core type; it is validated inside a minimal Pod, the
  only kind the schema set can validate it in);
- the VirtualMachine itself is a KubeVirt CRD, which kubernetes-validate has no schema for: a
  structural check instead, against KubeVirt's API (``staging/src/kubevirt.io/api/core/v1``:
  ``GPU`` and ``HostDevice`` carry an inline ``ClaimRequest{claimName, requestName}``): every
  GPU and host device names a claim of ``resourceClaims`` and a request of the template, and
  every request is used exactly once;
- the pairing itself: each constraint joins exactly one GPU request and one NIC request and
  matches on ``resource.kubernetes.io/pcieRoot``; every request is in one constraint;
- the pcitopo annotations are valid options (src/pcitopo/serve/options.py) and ask for the pairing check.
"""

from __future__ import annotations

import copy

import pytest
import yaml

from pcitopo.serve.options import PREFIX, options_from_annotations
from testkit import REPO as ROOT

DRA = ROOT / "deploy" / "dra"
K8S = "1.34.0"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DRA / name).read_text()) if d]


@pytest.fixture(scope="module")
def template() -> dict:
    (doc,) = _docs("resourceclaimtemplate.yaml")
    return doc


@pytest.fixture(scope="module")
def vm() -> dict:
    (doc,) = _docs("vm-pairs.yaml")
    return doc


def _kv():
    return pytest.importorskip("kubernetes_validate")


def test_the_template_is_valid_kubernetes_1_34(template):
    kv = _kv()
    assert template["apiVersion"] == "resource.k8s.io/v1" and template["kind"] == "ResourceClaimTemplate"
    kv.validate(template, K8S, strict=True)
    # the schema does catch a mistake of the kind people make here
    bad = copy.deepcopy(template)
    bad["spec"]["spec"]["devices"]["constraints"][0]["matchAtribute"] = PCIE_ROOT
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S, strict=True)


def test_the_vm_resource_claims_are_valid_pod_resource_claims(vm):
    kv = _kv()
    claims = vm["spec"]["template"]["spec"]["resourceClaims"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
           "spec": {"containers": [{"name": "x", "image": "x"}], "resourceClaims": claims}}
    kv.validate(pod, K8S, strict=True)
    bad = copy.deepcopy(pod)
    bad["spec"]["resourceClaims"][0]["resourceClaimTemplate"] = "gpu-nic-pairs"
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S, strict=True)


def _requests(template: dict) -> dict[str, str]:
    return {r["name"]: r["exactly"]["deviceClassName"] for r in template["spec"]["spec"]["devices"]["requests"]}


def test_the_vm_uses_every_request_of_its_claim_once(vm, template):
    spec = vm["spec"]["template"]["spec"]
    claims = {c["name"]: c for c in spec["resourceClaims"]}
    assert [c.get("resourceClaimTemplateName") for c in claims.values()] == [template["metadata"]["name"]]
    assert vm["metadata"]["namespace"] == template["metadata"]["namespace"]
    devices = spec["domain"]["devices"]
    used = []
    for kind in ("gpus", "hostDevices"):
        for d in devices[kind]:
            assert "deviceName" not in d, f"{kind} {d['name']}: a DRA device names a claim, not a device plugin resource"
            assert d["claimName"] in claims, f"{kind} {d['name']} names claim {d['claimName']!r}, not in resourceClaims"
            used.append((kind, d["requestName"]))
    requests = _requests(template)
    assert sorted(r for _, r in used) == sorted(requests), "every request used by exactly one device"
    gpu_class = {requests[r] for k, r in used if k == "gpus"}
    nic_class = {requests[r] for k, r in used if k == "hostDevices"}
    assert len(gpu_class) == len(nic_class) == 1 and gpu_class != nic_class


def test_each_constraint_aligns_one_gpu_with_one_nic_by_pcie_root(vm, template):
    devices = vm["spec"]["template"]["spec"]["domain"]["devices"]
    gpus = {d["requestName"] for d in devices["gpus"]}
    nics = {d["requestName"] for d in devices["hostDevices"]}
    constraints = template["spec"]["spec"]["devices"]["constraints"]
    seen: list[str] = []
    for c in constraints:
        assert c["matchAttribute"] == PCIE_ROOT
        reqs = set(c["requests"])
        assert len(reqs & gpus) == 1 and len(reqs & nics) == 1 and len(reqs) == 2, c
        seen += c["requests"]
    assert sorted(seen) == sorted(gpus | nics), "every GPU and NIC request is in exactly one pair"


def test_the_vm_carries_valid_pcitopo_annotations_asking_for_the_pairing_check(vm):
    ann = vm["spec"]["template"]["metadata"]["annotations"]
    assert "hooks.kubevirt.io/hookSidecars" in ann
    options = options_from_annotations(ann)  # raises on a typo or a bad value
    assert options.pairing == "require"
    assert any(k.startswith(PREFIX) for k in vm["metadata"].get("annotations", {})) is False
