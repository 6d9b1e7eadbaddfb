"""Item 3: guest cells that match the devices.

KubeVirt's ``guestMappingPassthrough`` makes one guest cell per host NUMA node of the pod's CPUs.
The 8×B200 example (deploy/vm-gpu.yaml) cut to 64 vCPUs, on its stand-in node (fixtures/hgx-b200,
4 nodes of 56 CPUs), with CPUs from nodes 0 and 1 only, the node set kubelet's packed
allocation gives it (kubelet v1.33: 9 on node 0, 56 on node 1; tests/test_kubelet_cpus.py). The
devices on nodes 2 and 3 then have no guest cell. The spread case is the example as shipped,
168 vCPUs, more than three nodes hold, which kubelet's distribute-cpus-across-numa spreads over
all four: four cells.

Both domains are built the way test_deploy builds the examples' (testkit.kubevirt_vmi), then
given the pod's CPUs by hand (:func:`with_pod_cpus`): a given domain, the path the hook judges.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lxml import etree

from pcitopo.guest.rewrite import Why, rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.libvirt.domain import parse_cpuset
from pcitopo.model.tree import Role
from testkit import REPO as ROOT
from testkit.kubevirt_sim import DomainSpec, kubevirt_domain
from testkit.kubevirt_vmi import as_vmi, domain_for_vmi
from testkit.server_proc import ServerProcess, serve_argv, wait_for_socket

BIN = Path(sys.executable).parent
B200 = ROOT / "fixtures" / "hgx-b200"
GIB = 1024**3
PLANNER_BUG = "planner bug"


@pytest.fixture(scope="module")
def host():
    return open_host(B200)


def node_cpus(host) -> dict[int, list[int]]:
    return {nid: sorted(parse_cpuset(n.cpulist or "")) for nid, n in sorted(host.numa_nodes().items())}


def packed(host, n: int) -> list[int]:
    """The pod's CPUs as kubelet's static policy packs them: whole nodes first, in order."""
    return [c for cpus in node_cpus(host).values() for c in cpus][:n]


def distributed(host, n: int, nodes: int) -> list[int]:
    """The pod's CPUs as distribute-cpus-across-numa spreads them over ``nodes`` nodes."""
    per = n // nodes
    return [c for cpus in list(node_cpus(host).values())[:nodes] for c in cpus[:per]]


def with_pod_cpus(xml: bytes, host, cpus: list[int]) -> bytes:
    """The domain's guest cells rebuilt from the pod's CPUs as guestMappingPassthrough does:
    vCPU k on pod CPU k, one cell per host node of those CPUs (its <memnode> that node), the
    memory split evenly in 1 GiB pages."""
    root = etree.fromstring(xml)
    node_of = {c: nid for nid, cs in node_cpus(host).items() for c in cs}
    by_node: dict[int, list[int]] = {}
    for vcpu, cpu in enumerate(cpus):
        by_node.setdefault(node_of[cpu], []).append(vcpu)
    numa = root.find("cpu/numa")
    old = numa.findall("cell")
    assert sum(len(parse_cpuset(c.get("cpus"))) for c in old) == len(cpus), "one pod CPU per vCPU"
    total, unit = sum(int(c.get("memory")) for c in old), old[0].get("unit")
    tune, cputune = root.find("numatune"), root.find("cputune")
    for parent, tag in ((numa, "cell"), (tune, "memnode"), (cputune, "vcpupin")):
        for el in parent.findall(tag):
            parent.remove(el)
    tune.find("memory").set("nodeset", ",".join(str(n) for n in sorted(by_node)))
    per_cell = total // len(by_node) // GIB * GIB
    for cell, (node, vcpus) in enumerate(sorted(by_node.items())):
        etree.SubElement(numa, "cell", id=str(cell), cpus=f"{vcpus[0]}-{vcpus[-1]}", memory=str(per_cell), unit=unit)
        etree.SubElement(tune, "memnode", cellid=str(cell), mode="strict", nodeset=str(node))
    for vcpu, cpu in reversed(list(enumerate(cpus))):
        cputune.insert(0, etree.Element("vcpupin", vcpu=str(vcpu), cpuset=str(cpu)))
    return etree.tostring(root)


def example_vmi(cores: int | None = None) -> dict:
    vmi = as_vmi(yaml.safe_load((ROOT / "deploy" / "vm-gpu.yaml").read_text()))
    if cores is not None:
        vmi = copy.deepcopy(vmi)
        vmi["spec"]["domain"]["cpu"]["cores"] = cores
    return vmi


def vcpus(vmi: dict) -> int:
    cpu = vmi["spec"]["domain"]["cpu"]
    return cpu["sockets"] * cpu["cores"] * cpu["threads"]


@pytest.fixture(scope="module")
def cases(host, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name → (domain.xml, vmi.json): ``packed`` (64 vCPUs on nodes 0-1) and ``spread`` (the
    example's 168 vCPUs, 42 on each node)."""
    d = tmp_path_factory.mktemp("cells")
    out = {}
    small, big = example_vmi(cores=16), example_vmi()
    for name, vmi, cpus in (("packed", small, packed(host, vcpus(small))),
                            ("spread", big, distributed(host, vcpus(big), 4))):
        (d / f"{name}.xml").write_bytes(with_pod_cpus(domain_for_vmi(host, vmi), host, cpus))
        (d / f"{name}.json").write_text(json.dumps(vmi))
        out[name] = (d / f"{name}.xml", d / f"{name}.json")
    return out


def xmlfix(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "xmlfix"), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def check(cases, name: str) -> subprocess.CompletedProcess:
    xml, vmi = cases[name]
    return xmlfix("--check", "--sysfs", str(B200), "--vmi", str(vmi), str(xml))


NODE23 = ["0000:9c:00.0", "0000:9d:00.0", "0000:a0:00.0", "0000:a1:00.0",
          "0000:bc:00.0", "0000:bd:00.0", "0000:c0:00.0", "0000:c1:00.0"]


def numa_line(text: str) -> str:
    lines = [x for x in text.splitlines() if "have no guest cell (" in x]
    assert len(lines) == 1, text
    return lines[0].removeprefix("xmlfix: check: ")


def test_cells_the_cases_are_what_kubelet_gives(cases):
    """The packed pod's cells are host nodes 0 and 1 (56 + 8 vCPUs); the spread pod's all four."""
    def cells(name):
        root = etree.parse(str(cases[name][0])).getroot()
        return [(m.get("nodeset"), len(parse_cpuset(c.get("cpus"))))
                for m, c in zip(root.findall("numatune/memnode"), root.findall("cpu/numa/cell"))]

    assert cells("packed") == [("0", 56), ("1", 8)]
    assert cells("spread") == [("0", 42), ("1", 42), ("2", 42), ("3", 42)]


def test_cells_packed_check_names_the_devices_the_nodes_and_the_fix(cases):
    r = check(cases, "packed")
    assert r.returncode == 1, r.stderr
    assert PLANNER_BUG not in r.stderr
    line = numa_line(r.stderr)
    assert line.startswith("NUMA: 8 device(s) of host nodes 2,3 have no guest cell (" + ", ".join(NODE23) + ")")
    assert "here nodes 0,1 only" in line and "span host nodes 0,1,2,3" in line
    assert "more than 168 dedicated CPUs" in line  # 3 nodes × 56 CPUs
    assert 'distribute-cpus-across-numa: "true"' in line and "beta since Kubernetes 1.33" in line
    assert "1.23-1.32" in line and "CPUManagerPolicyAlphaOptions" in line
    # the pairs that differ are put down to the missing cells, never to the planner
    assert "12 pair(s) differ" in r.stderr and "no guest cell (see the NUMA line)" in r.stderr


def test_cells_spread_check_passes(cases):
    r = check(cases, "spread")
    assert r.returncode == 0, r.stderr
    assert "no guest cell" not in r.stderr and PLANNER_BUG not in r.stderr


def unwrap(text: str) -> str:
    """--explain folds long lines at 100 columns, continuing them indented by four."""
    return re.sub(r"\n    (?=\S)", " ", text)


def test_cells_packed_explain_says_the_same_line(cases):
    xml, vmi = cases["packed"]
    r = xmlfix("--explain", "--sysfs", str(B200), "--vmi", str(vmi), str(xml))
    assert r.returncode == 0, r.stderr
    text = unwrap(r.stdout)
    assert PLANNER_BUG not in text
    assert numa_line(check(cases, "packed").stderr) in text.splitlines()
    assert "Differences (12 pair(s)): a device's host NUMA node has no guest cell" in text


def test_cells_differences_are_put_down_to_the_missing_cells(host, cases):
    """Every pair that differs has an end without a guest cell, and says so; none is unexpected."""
    report = rewrite_domain(cases["packed"][0].read_bytes(), host).report
    assert [str(b) for b in report.missing_cells.devices] == NODE23
    missing = {str(b) for b in report.missing_cells.devices}
    differ = [p for p in report.pairs if p.guest != p.host and p.why is not Why.BROADCOM_COLLAPSE]
    assert len(differ) == 16  # 4 × 4 pairs across nodes 2 and 3 (the 4 NVLink GPU pairs among them)
    assert all(p.why is Why.MISSING_CELLS and {str(p.a), str(p.b)} <= missing for p in differ)
    assert not any(p.why is Why.UNEXPECTED for p in report.pairs)
    assert rewrite_domain(cases["spread"][0].read_bytes(), host).report.missing_cells is None


def test_cells_devices_on_one_node_ask_for_alignment_not_size(host):
    """One GPU and its NIC on host node 2, the pod's CPUs on node 0 (topology manager policy
    none): more CPUs would not help, aligning them with the devices would."""
    gpu = next(f.bdf for f in host.functions() if host.role(f) == Role.GPU and host.numa_of(f) == 2)
    nic = next(f.bdf for f in host.functions() if host.role(f) == Role.NIC and host.numa_of(f) == 2)
    xml = with_pod_cpus(kubevirt_domain(host, DomainSpec("one", (gpu, nic))), host, packed(host, 4))
    line = rewrite_domain(xml, host).report.missing_cells.line
    assert line.startswith(f"NUMA: 2 device(s) of host node 2 have no guest cell ({', '.join(map(str, sorted((gpu, nic))))})")
    assert "here node 0 only" in line and "put the pod's CPUs on host node 2" in line
    assert "topologyManagerPolicy best-effort or restricted" in line and "more than" not in line


def test_cells_hook_log_line_carries_the_line(cases, tmp_path):
    """The sidecar's OnDefineDomain log line has ``numa_cells``: the same line; none when spread."""
    d = tmp_path / "hook-sidecar-0"
    d.mkdir()
    srv = ServerProcess(serve_argv(d / "pcitopo.sock", B200), tmp_path / "server.log")
    try:
        wait_for_socket(d / "pcitopo.sock", proc=srv.proc)
        srv.socket = d / "pcitopo.sock"
        for name in ("packed", "spread"):
            xml, vmi = cases[name]
            srv.define(xml.read_bytes(), vmi.read_bytes())
        calls = [r for r in srv.log_lines() if r.get("event") == "OnDefineDomain"]
    finally:
        srv.stop()
    assert [r["outcome"] for r in calls] == ["rewritten", "rewritten"]
    assert calls[0]["numa_cells"] == numa_line(check(cases, "packed").stderr)
    assert "numa_cells" not in calls[1]
    assert PLANNER_BUG not in json.dumps(calls)


def deploy_md_block(title: str) -> str:
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    m = re.search(rf"<!-- {title} -->\n```\n(.*?)```", text, re.S)
    assert m, f"docs/DEPLOY.md has no block marked <!-- {title} -->"
    return m[1]


@pytest.mark.parametrize("name", ["packed", "spread"])
def test_cells_deploy_md_quotes_the_check_output(cases, name):
    """DEPLOY.md's "Guest NUMA cells" pastes what `xmlfix --check` prints for both cases."""
    r = check(cases, name)
    shown = deploy_md_block(f"check-{name}")
    assert shown == f"$ xmlfix --check --sysfs fixtures/hgx-b200 --vmi vmi.json domain.xml\n{r.stderr}"


# -- pcitopo doctor: the node's kubelet CPU manager ------------------------------------------------

KUBELET = ROOT / "tests" / "data" / "kubelet"


def docs_text() -> str:
    return "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
POD = "7d6c3f0e-2b1a-4c55-9e0f-5a7b8c9d0e1f"


def doctor(capsys, *args: str) -> tuple[int, str]:
    from pcitopo.cli.main import pcitopo_main

    code = pcitopo_main(["doctor", "--sysfs", str(B200), *args])
    return code, capsys.readouterr().out


def kubelet_lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if x.startswith("kubelet: ")]


def test_cells_doctor_reports_the_packed_kubelet(capsys):
    code, out = doctor(capsys, "--kubelet-dir", str(KUBELET / "packed"))
    assert code == 0 and out.splitlines()[-1].startswith("verdict: ready")
    assert kubelet_lines(out) == [
        "kubelet: CPU manager policy static (cpu_manager_state), options none (distribute-cpus-across-numa not "
        "set: a pod's CPUs fill whole NUMA nodes first), topology manager policy best-effort",
        f"kubelet: pod {POD} container compute: 65 exclusive CPUs on host NUMA nodes 0,1",
    ]
    assert "\n".join(kubelet_lines(out)) in docs_text()  # the docs quote it as printed
    _, nfd = doctor(capsys, "--kubelet-dir", str(KUBELET / "packed"), "--nfd")
    assert "pcitopo.kubevirt.io/kubelet-cpu-manager-policy=static" in nfd.splitlines()
    assert "pcitopo.kubevirt.io/kubelet-distribute-cpus-across-numa=false" in nfd.splitlines()


def test_cells_doctor_reports_the_spread_kubelet(capsys):
    code, out = doctor(capsys, "--kubelet-dir", str(KUBELET / "spread"), "--json")
    kubelet = json.loads(out)["kubelet"]
    assert kubelet["policy"] == "static" and kubelet["options"] == {"distribute-cpus-across-numa": "true"}
    assert kubelet["topology_manager_policy"] == "best-effort" and kubelet["unread"] == []
    assert kubelet["exclusive"] == [{"pod": POD, "container": "compute", "cpus": 169, "nodes": [0, 1, 2, 3]}]
    _, out = doctor(capsys, "--kubelet-dir", str(KUBELET / "spread"))
    assert kubelet_lines(out)[0] == ("kubelet: CPU manager policy static (cpu_manager_state), options "
                                     "distribute-cpus-across-numa=true, topology manager policy best-effort")
    assert "\n".join(kubelet_lines(out)) in docs_text()  # the docs quote it as printed


def test_cells_doctor_says_when_it_cannot_read_the_kubelet(capsys, tmp_path):
    code, out = doctor(capsys, "--kubelet-dir", str(tmp_path))
    assert code == 0
    assert kubelet_lines(out) == [
        f"kubelet: cannot read the CPU manager's settings: {tmp_path}/cpu_manager_state (absent); "
        f"{tmp_path}/config.yaml (absent); policy and options unknown (the doctor DaemonSet: add the doctor-kubelet "
        "component of your distribution, docs/OPERATOR.md; by hand: --kubelet-dir, and --kubelet-config if the "
        "kubelet's --config is elsewhere)"]
    (tmp_path / "cpu_manager_state").write_text("{not json")
    (tmp_path / "kubelet.yaml").write_text("cpuManagerPolicy: static\n")
    _, out = doctor(capsys, "--kubelet-dir", str(tmp_path), "--kubelet-config", str(tmp_path / "kubelet.yaml"))
    assert kubelet_lines(out) == [
        "kubelet: CPU manager policy static (config file), options none (distribute-cpus-across-numa not set: a "
        "pod's CPUs fill whole NUMA nodes first), topology manager policy none (the default) (not read: "
        f"{tmp_path}/cpu_manager_state (not the CPU manager's checkpoint JSON))"]


def test_cells_doctor_reads_the_kubelet_only_on_its_node(capsys):
    """A fixture or a capture is another node: its doctor run does not read this machine's
    kubelet files unless told to (--kubelet-dir), and its outputs stay as they were."""
    _, out = doctor(capsys)
    assert kubelet_lines(out) == []
    _, out = doctor(capsys, "--json")
    assert "kubelet" not in json.loads(out)


def test_cells_doctor_daemonset_mounts_the_kubelet_files_read_only(capsys, tmp_path):
    """With the kubeadm component (deploy/components/doctor-kubelet-kubeadm; the base mounts no
    kubelet file, so that it starts on every distribution: tests/test_every_distribution.py)."""
    import shutil

    from pcitopo.cli.main import pcitopo_main
    from testkit.admission.manifests import kustomize, overlay, pod_specs

    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl (kustomize v5)")
    site = overlay(tmp_path / "site", "kubevirt-v1.9.0", new_name="r.example/p", digest="sha256:" + "ab" * 32,
                   components=("doctor-kubelet-kubeadm",))
    (pod,) = [spec for name, spec in pod_specs(kustomize(site)) if name == "pcitopo-doctor"]
    c = pod["containers"][0]
    argv = c["command"] + c["args"]
    del argv[argv.index("--every"):argv.index("--every") + 2]  # one pass here
    where = argv[argv.index("--kubelet-dir") + 1]
    # only the two files the doctor reads, each read-only, never the kubelet's directory (pod secrets)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"] if m["mountPath"].startswith(where)}
    assert sorted(mounts) == [f"{where}/config.yaml", f"{where}/cpu_manager_state"]
    for path, mount in mounts.items():
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["hostPath"] == {"path": "/var/lib/kubelet/" + path.rsplit("/", 1)[1], "type": "File"}
    # the same arguments, pointed at a fixture, the packed node's kubelet files and a scratch directory
    real = {"/host/sys": str(B200), where: str(KUBELET / "packed"), "/textfile/pcitopo.prom": str(tmp_path / "p.prom"),
            "/features.d/pcitopo": str(tmp_path / "nfd"), "/var/run/pcitopo/doctor.json": str(tmp_path / "doctor.json")}
    assert pcitopo_main([real.get(a, a) for a in argv[1:]]) == 0
    assert "container compute: 65 exclusive CPUs on host NUMA nodes 0,1" in capsys.readouterr().out
    assert "pcitopo.kubevirt.io/kubelet-cpu-manager-policy=static" in (tmp_path / "nfd").read_text()
