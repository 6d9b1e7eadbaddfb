"""docs/DEPLOY.md, "Upgrade KubeVirt", run as written, in order, on a cluster dump.

The cluster is the `kubevirt-v1.9.0` quick start's (tests/test_quickstarts.py runs it the same
way, with the same stand-in `kubectl`), taken up to its roll back. Then:

- ``before``: preflight exits 0 on v1.9.0 and no Plugin object exists;
- the upgrade itself (KubeVirt's, not pcitopo's): the dump's KubeVirt CR now reports v1.10.0, a
  release pcitopo did not read;
- ``after``: preflight says unknown (exit 4) for it, then judges the Plugin target on it as
  main+pr18866 (exit 0), and the switch applies the Plugin target beside the hook sidecar's
  policies and adds the gate;
- ``roll back``: the cluster is again what it was right after the upgrade.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import test_quickstarts as qs  # the quick starts' offline cluster and stand-in kubectl

from testkit import REPO as ROOT

BLOCKS = dict(re.findall(r"<!-- upgrade-kubevirt: ([^>]+?) -->\n```sh\n(.*?)```", qs.DEPLOY_MD, re.S))
NEW_RELEASE = "v1.10.0"
# kinds the roll back deletes by name, beyond those the quick starts use
EXTRA_KINDS = {"mutatingadmissionpolicy": "MutatingAdmissionPolicy",
               "validatingadmissionpolicybinding": "ValidatingAdmissionPolicyBinding", "resourcequota": "ResourceQuota",
               "mutatingadmissionpolicybinding": "MutatingAdmissionPolicyBinding", "priorityclass": "PriorityClass"}


def bin_dir(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "kubectl"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
                      f"import test_quickstarts as q\nq.KINDS.update({EXTRA_KINDS!r})\nsys.exit(q.stand_in(sys.argv[1:]))\n")
    script.chmod(0o755)
    return bindir


def objects(state: Path) -> dict:
    return json.loads(state.read_text())["objects"]


def upgrade(state: Path, version: str) -> dict:
    """What KubeVirt's own upgrade changes in the dump: the version its CR reports."""
    s = json.loads(state.read_text())
    (cr,) = [o for o in s["objects"].values() if o["kind"] == "KubeVirt"]
    cr["status"]["observedKubeVirtVersion"] = cr["status"]["targetKubeVirtVersion"] = version
    state.write_text(json.dumps(s))
    return s["objects"]


def test_the_section_has_its_three_blocks_and_names_the_release_notes_to_read():
    assert list(BLOCKS) == ["before", "after", "roll back"]
    section = qs.DEPLOY_MD[qs.DEPLOY_MD.index("## Upgrade KubeVirt"):]
    for needle in ("PR #18866", "PR #19160", "launcherHooks", "kubevirt/enhancements#407", "--assume-release main+pr18866"):
        assert needle in section


def test_upgrade_kubevirt_runs_in_order_and_its_roll_back_restores_the_upgraded_cluster(tmp_path):
    pytest.importorskip("celpy")
    pytest.importorskip("kubernetes_validate")
    real = shutil.which("kubectl")
    if real is None:
        pytest.skip("needs kubectl (kustomize v5)")
    work = tmp_path / "checkout"
    work.mkdir()
    for folder in ("deploy", "docs", "fixtures"):
        os.symlink(ROOT / folder, work / folder)
    cluster = qs.Cluster.start("kubevirt-v1.9.0", work)
    env = {**os.environ, "PATH": f"{bin_dir(tmp_path)}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "REAL_KUBECTL": real, "QUICKSTART_STATE": str(cluster.state)}

    def bash(script: str) -> subprocess.CompletedProcess:
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", script.replace("sha256:<digest>", qs.DIGEST)], cwd=work,
                           env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}\nstdout (tail):\n{r.stdout[-2000:]}"
        assert not json.loads(cluster.state.read_text()).get("errors"), json.loads(cluster.state.read_text())["errors"]
        return r

    quickstart = qs.quickstarts()["kubevirt-v1.9.0"]
    bash(quickstart[:quickstart.index("\n# Roll back")])  # the cluster the section starts from
    bash(BLOCKS["before"])
    upgraded = upgrade(cluster.state, NEW_RELEASE)
    (line,) = [c for _, c in qs.commands(BLOCKS["after"]) if c.endswith("|| [ $? -eq 4 ]")]
    r = bash(BLOCKS["after"])
    assert f"verdict: unknown: KubeVirt {NEW_RELEASE} is not a KubeVirt release pcitopo read" in r.stdout
    assert "verdict: ok: applying kubevirt-main harms no VM" in r.stdout
    alone = subprocess.run(["bash", "-c", line.split(" || ")[0]], cwd=work, env=env, capture_output=True, text=True,
                           timeout=300)
    assert alone.returncode == 4, alone.stdout  # what the `|| [ $? -eq 4 ]` stands for
    switched = objects(cluster.state)
    (cr,) = [o for o in switched.values() if o["kind"] == "KubeVirt"]
    gates = cr["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert {"Sidecar", "Plugins"} <= set(gates)
    names = {(o["kind"], o["metadata"]["name"]) for o in switched.values()}
    assert {("Plugin", "pcitopo"), ("ValidatingAdmissionPolicy", "pcitopo-hook-sidecars"),
            ("DaemonSet", "pcitopo-node-hook")} <= names
    bash(BLOCKS["roll back"])
    assert objects(cluster.state) == upgraded, "the roll back leaves the cluster as the upgrade left it"
