"""One judge for every verdict: for each VM and VMI in each of the project's cluster
fixtures, `pcitopo preflight` (for that VM), `xmlfix --check --cluster` and `pcitopo domain
--cluster` give the same cluster verdict: refused by the target's Sidecar policy, refused for a
device name the cluster lacks, or not judged because the release is one pcitopo did not read.
The check also judges the guest's topology, which preflight does not: only the cluster's part of
its reasons (codes ``policy``, ``device-name``, ``kubevirt-release`` unknowns) is compared.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pcitopo.cli.main import pcitopo_main, xmlfix_main
from pcitopo.kubevirt.cluster import read_dump
from pcitopo.kubevirt.cluster_verdict import preflight
from pcitopo.kubevirt.targets import target
from pcitopo.program import EXIT_CHECK_FAILED, EXIT_UNKNOWN
from testkit import REPO

CLUSTERS = REPO / "fixtures" / "clusters"
H100 = REPO / "fixtures" / "hgx-h100"
# The target each dump is judged for, and the release to assume where the dump's is main's.
TARGET = {"v1.8.0.yaml": ("kubevirt-v1.6-v1.8", None), "main-pcitopo-plugin.yaml": ("kubevirt-main", "main+pr18866")}
DEFAULT_TARGET = ("kubevirt-v1.9.0", None)


def _workloads(dump_path: Path):
    for obj in read_dump([str(dump_path)]).workloads:
        yield f"{obj['metadata'].get('namespace')}/{obj['metadata']['name']}", obj


def _dumps(tmp: Path) -> list[Path]:
    """The fixtures with a KubeVirt CR, and the stranger's cluster on v1.10.0, a release nobody read."""
    out = [p for p in sorted(CLUSTERS.glob("*.yaml")) if read_dump([str(p)]).kubevirt is not None]
    later = tmp / "v1.10.0-stranger.yaml"
    later.write_text((CLUSTERS / "v1.9.0-stranger.yaml").read_text().replace("observedKubeVirtVersion: v1.9.0",
                                                                             "observedKubeVirtVersion: v1.10.0"))
    return out + [later]


def _preflight_says(dump_path: Path, name: str) -> set[str]:
    tgt, assume = TARGET.get(dump_path.name, DEFAULT_TARGET)
    report = preflight(read_dump([str(dump_path)]), target(tgt), assume=assume)
    if report.unknown:
        return {"release-unknown"}
    out = {"policy"} if any(r.name == name and r.refusal.certain for r in report.policy) else set()
    w = next((w for w in report.workloads if w.name == name), None)
    if w is not None and "permittedHostDevices does not list" in w.before.cause:
        out.add("device-name")
    return out


def _check_says(capsys, manifest: Path, dump_path: Path) -> set[str]:
    tgt, assume = TARGET.get(dump_path.name, DEFAULT_TARGET)
    args = ["--check", "--json", "--vmi", str(manifest), "--sysfs", str(H100), "--cluster", str(dump_path), "--target", tgt]
    rc = xmlfix_main(args + (["--assume-release", assume] if assume else []))
    out, err = capsys.readouterr()
    if rc == EXIT_UNKNOWN and "not a KubeVirt release pcitopo read" in err:
        return {"release-unknown"}
    if not out.strip():  # a device name the cluster lacks: no domain, one line
        assert rc == EXIT_CHECK_FAILED and "check: devices: " in err, err
        return {"device-name"} | ({"policy"} if "check: policy: " in err else set())
    record = json.loads(out)["check"]
    return {r["code"] for r in record["reasons"] if r["code"] in ("policy", "device-name")}


def _domain_says(capsys, manifest: Path, dump_path: Path) -> set[str]:
    tgt, assume = TARGET.get(dump_path.name, DEFAULT_TARGET)
    args = ["domain", "--vmi", str(manifest), "--sysfs", str(H100), "--cluster", str(dump_path), "--target", tgt]
    rc = pcitopo_main(args + (["--assume-release", assume] if assume else []))
    _, err = capsys.readouterr()
    if rc == EXIT_UNKNOWN and "not a KubeVirt release pcitopo read" in err:
        return {"release-unknown"}
    return ({"device-name"} if "pcitopo domain: devices: " in err else set()) | \
        ({"policy"} if "pcitopo domain: policy: " in err else set())


def test_every_cluster_fixture_vm_gets_one_verdict_from_preflight_the_check_and_the_prediction(tmp_path, capsys):
    seen, disagreements = [], []
    for dump_path in _dumps(tmp_path):
        for name, obj in _workloads(dump_path):
            manifest = tmp_path / f"{name.replace('/', '_')}.yaml"
            manifest.write_text(yaml.safe_dump(obj))
            said = {"preflight": _preflight_says(dump_path, name), "check": _check_says(capsys, manifest, dump_path)}
            said["domain"] = _domain_says(capsys, manifest, dump_path)
            seen.append((dump_path.name, name, said["preflight"]))
            if len({frozenset(v) for v in said.values()}) != 1:
                disagreements.append((dump_path.name, name, said))
    assert not disagreements, disagreements
    verdicts = {v for *_, s in seen for v in s}
    assert {"policy", "release-unknown"} <= verdicts, seen  # the fixtures exercise the verdicts compared
    assert len(seen) >= 10
