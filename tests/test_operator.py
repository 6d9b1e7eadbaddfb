"""The commands and the hook as an operator meets them. Each test names the
finding it covers (f1 ... f12); every one runs the installed console scripts on fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from lxml import etree

from pcitopo.libvirt.lenient import with_hostdev_modes
from testkit import REPO as ROOT, tool_or_skip

BIN = Path(sys.executable).parent
H100 = ROOT / "fixtures" / "hgx-h100"


def run(cmd: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=ROOT, input=stdin, capture_output=True, timeout=120)


def edited(src: Path, dest: Path, edit) -> Path:
    """A copy of a fixture domain with ``edit(tree)`` applied (lxml, no string surgery)."""
    tree = etree.parse(str(src))
    edit(tree)
    tree.write(str(dest), encoding="utf-8")
    return dest


# -- --diff shows only what changed in meaning ---------------------------------------

def test_diff_shows_only_meaningful_changes(tmp_path):
    """The diff of hgx-h100 was 605 changed lines, 154 of them removals that only
    re-serialised (``<x></x>`` → ``<x/>``). Now the only removals are the 20 hostdev source
    addresses that lose ``type='pci'`` and the 20 hostdevs that gain libvirt's default
    ``mode='subsystem'``, and the diff applied to the input gives the output."""
    r = run("xmlfix", "--diff", "--sysfs", str(H100), str(H100 / "domain.xml"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.decode().splitlines()
    removed = [x for x in lines if x.startswith("-") and not x.startswith("---")]
    assert len(removed) == 40, removed[:5]
    assert all('<address type="pci" domain="0x0000"' in x or x == '-\t\t<hostdev type="pci" managed="no">' for x in removed)
    assert sum(x.startswith("+") and '<hostdev mode="subsystem" type="pci" managed="no">' in x for x in lines) == 20
    assert not any("></" in x for x in lines if x[:1] in "+-")
    # Nothing to change: nothing printed.
    assert run("xmlfix", "--diff", "--sysfs", str(H100), str(H100 / "expected.xml")).stdout == b""
    # The diff is exact: applying it to the (re-serialised) input gives xmlfix's output.
    from pcitopo.libvirt.document import parse_domain, serialize

    src = (H100 / "domain.xml").read_bytes()
    base = tmp_path / "base.xml"
    base.write_bytes(serialize(parse_domain(src), src))
    patch = subprocess.run([tool_or_skip("patch", why="applies the diff"), "-s", str(base)], input=r.stdout, capture_output=True)
    assert patch.returncode == 0, patch.stderr
    assert base.read_bytes() == (H100 / "expected.xml").read_bytes()


# -- --check means "the guest will see what the host has" --------------------------

def _drop_hostdevs(tree):
    devices = tree.find("devices")
    for hd in devices.findall("hostdev"):
        devices.remove(hd)


def test_check_passes_without_hostdevs(tmp_path):
    """A domain with no hostdevs only gains a pcie-root; the guest sees what the host
    gives it (nothing), so --check passes."""
    d = edited(H100 / "domain.xml", tmp_path / "none.xml", _drop_hostdevs)
    r = run("xmlfix", "--check", "--sysfs", str(H100), str(d))
    assert r.returncode == 0, r.stderr
    assert b"no PCI hostdevs" in r.stderr


def _one_cell(tree):
    """kubevirt-numa with only guest cell 0 (backed by host node 0); host node 1's devices stay."""
    numa = tree.find("cpu/numa")
    numa.remove(numa.find("cell[@id='1']"))
    numa.find("cell[@id='0']").set("cpus", "0-7")
    tune = tree.find("numatune")
    tune.remove(tune.find("memnode[@cellid='1']"))


def test_check_fails_when_a_host_node_has_no_guest_cell(tmp_path):
    """One guest cell leaves host node 1's devices without a cell: --check fails and
    names them; --explain no longer claims everything equals the host."""
    d = edited(H100 / "cases" / "kubevirt-numa" / "domain.xml", tmp_path / "one-cell.xml", _one_cell)
    r = run("xmlfix", "--check", "--sysfs", str(H100), str(d))
    assert r.returncode == 1
    err = r.stderr.decode()
    assert "NUMA: 10 device(s) of host node 1 have no guest cell" in err and "check: failed" in err
    out = run("xmlfix", "--explain", "--sysfs", str(H100), str(d)).stdout.decode()
    assert "Every pair" not in out and "equals the host" not in out
    assert "NUMA: 10 device(s) of host node 1 have no guest cell" in out


def _passthrough_vmi(tmp_path) -> Path:
    vmi = tmp_path / "vmi.json"
    vmi.write_text(json.dumps({"metadata": {"name": "vm", "namespace": "ns",
                                            "annotations": {"pcitopo.kubevirt.io/on-error": "passthrough"}}}))
    return vmi


def _missing_bdf(tree):
    tree.find("devices/hostdev/source/address").set("bus", "0x77")


def test_passthrough_is_never_silent(tmp_path):
    """On-error passthrough with a hostdev the host lacks printed nothing and exited
    0; now the reason is on stderr, and --check fails."""
    d = edited(H100 / "domain.xml", tmp_path / "missing.xml", _missing_bdf)
    vmi = _passthrough_vmi(tmp_path)
    r = run("xmlfix", "--vmi", str(vmi), "--sysfs", str(H100), str(d))
    assert r.returncode == 0 and r.stdout == with_hostdev_modes(d.read_bytes())[0]  # as sent, but for the mode
    assert b"left unchanged (passthrough)" in r.stderr and b"0000:77:00.0" in r.stderr
    r = run("xmlfix", "--check", "--vmi", str(vmi), "--sysfs", str(H100), str(d))
    assert r.returncode == 1 and b"0000:77:00.0" in r.stderr and b"would not rewrite" in r.stderr


def test_operator_guide_shows_the_real_passthrough_line(tmp_path):
    """docs/OPERATOR.md quotes the line xmlfix prints for a hostdev the host lacks (it once
    showed an ``unknown-device: ...`` line the command never prints)."""
    d = edited(H100 / "domain.xml", tmp_path / "missing.xml", _missing_bdf)
    r = run("xmlfix", "--vmi", str(_passthrough_vmi(tmp_path)), "--sysfs", "fixtures/hgx-h100", str(d))
    prefix = "xmlfix: domain left unchanged (passthrough): domain: hostdev "
    lines = [x for x in r.stderr.decode().splitlines() if x.startswith(prefix)]
    assert len(lines) == 1  # other stderr lines (the doctor's warning for the devices it could check) may come first
    line = lines[0]
    assert line in (ROOT / "docs" / "OPERATOR.md").read_text().splitlines()


# -- --explain opens with a verdict, groups reasons, NVLink pairs are not PCIe diffs --

def test_explain_verdict_and_grouped_reasons():
    """One verdict line first; each reason once; an NV18 GPU pair is not listed as a
    PIX/PXB difference (hgx-b200)."""
    r = run("xmlfix", "--explain", "--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/domain.xml")
    out = r.stdout.decode()
    first = " ".join(x.strip() for x in out.split("\n\n")[0].splitlines())  # folded at 100 columns
    assert first == ("Verdict: NCCL: 190/190 pairs as on the host; nvidia-smi: 178/190 pairs as on the host, "
                     "12 PXB→PIX by design (Broadcom flattening); GPUDirect RDMA: 8/8 GPUs have a NIC at PIX or PXB in the guest")
    assert out.count("Broadcom two-level complex collapsed") == 1
    diffs = out.split("Differences")[1].split("NUMA map")[0]
    assert "GPU0-GPU1" not in diffs and "NIC0-GPU1" in diffs
    assert "joined by NVLink" in diffs


def test_explain_without_guest_cells_says_what_to_set_in_kubevirt():
    """No guest NUMA cells → the KubeVirt settings that create them; the same reason
    is printed once for its 84 pairs, with a bounded list."""
    r = run("xmlfix", "--explain", "--sysfs", str(H100), str(H100 / "cases" / "no-numa" / "domain.xml"))
    out = " ".join(r.stdout.decode().replace("\n    ", " ").split(" "))  # unfold the 100-column lines
    assert out.startswith("Verdict: NCCL: 106/190 pairs as on the host, 84 SYS→PHB (no guest NUMA cells)")
    assert "guestMappingPassthrough" in out and "dedicatedCpuPlacement" in out and "hugepages" in out
    assert out.count("cross-node pairs cannot show SYS") == 1
    assert "... and 72 more" in out


# -- xmlfix --json predicts the guest; pcitopo verify checks it ------------------------

def test_json_is_the_predicted_guest():
    """The prediction's contract, keyed by host BDF (the booted check is in
    tests/e2e/test_verify_boot.py)."""
    r = run("xmlfix", "--json", "--sysfs", str(H100), str(H100 / "domain.xml"))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"pcitopo", "schema", "devices", "pairs", "notes", "pairing", "nvlink_source", "nvlink_reason"}
    assert doc["nvlink_source"] == "inferred from the SXM board table"
    assert doc["pairing"] == {"policy": "warn", "status": "ok", "gpus_checked": 8, "findings": []}
    # NCCL's bandwidth on the host, per GPU path
    assert set(doc["devices"][0]) == {"host_bdf", "guest_bdf", "kind", "label", "numa", "nccl_cpu_gbps"}
    assert set(doc["pairs"][0]) == {"a", "b", "nccl", "nvml", "nvlink", "nccl_gbps"}
    assert len(doc["devices"]) == 20 and len(doc["pairs"]) == 190
    gpu0 = doc["devices"][0]
    assert (gpu0["host_bdf"], gpu0["label"], gpu0["kind"], gpu0["numa"]) == ("0000:18:00.0", "GPU0", "gpu", 0)
    assert any(p["nvlink"] == 18 for p in doc["pairs"])
    r = run("xmlfix", "--json", "--explain", "--sysfs", str(H100), str(H100 / "domain.xml"))
    assert r.returncode == 2 and b"--json" in r.stderr and r.stdout == b""


def test_verify_against_the_guest_derived_from_the_output():
    """The guest tree derived from the rewritten XML is as predicted; a wrong
    prediction is named pair by pair."""
    from pcitopo.checks.verify import load_expectation, verify_guest
    from pcitopo.guest.rewrite import rewrite_domain
    from pcitopo.guest.verdict import prediction
    from pcitopo.host.sysfs import open_host
    from pcitopo.nccl.topoxml import parse

    host = open_host(H100)
    result = rewrite_domain((H100 / "domain.xml").read_bytes(), host)
    doc = prediction(result, host)
    # the guest with the NCCL topology file the domain passes installed
    nccl = parse(result.nccl_topo.data)
    ok = verify_guest(load_expectation(json.dumps(doc).encode(), "p.json"), result.guest.topology, nccl)
    assert ok.problems == [] and ok.devices_checked == 20 and ok.pairs_checked == 190
    doc["pairs"][0]["nvml"] = "SYS"
    doc["devices"][2]["guest_bdf"] = "0000:01:1f.0"
    bad = verify_guest(load_expectation(json.dumps(doc).encode(), "p.json"), result.guest.topology, nccl)
    assert len(bad.problems) == 2
    assert "GPU0-NIC0 (host 0000:18:00.0-0000:19:00.0" in bad.problems[1] and "nvidia-smi PIX, predicted SYS" in bad.problems[1]
    assert "NIC1 (host 0000:29:00.0): predicted at guest 0000:01:1f.0, the guest has no such device" == bad.problems[0]
    up = next(f for f in result.guest.topology.functions() if result.guest.topology.role(f).value == "upstream-port")
    doc = prediction(result, host)
    doc["devices"][0]["guest_bdf"] = str(up.bdf)
    bad = verify_guest(load_expectation(json.dumps(doc).encode(), "p.json"), result.guest.topology, nccl)
    assert f"predicted a gpu at guest {up.bdf}, the guest has an upstream-port (" in bad.problems[0]


def test_verify_door_and_bad_prediction_files(tmp_path):
    """`pcitopo verify` reads a sysfs-shaped tree and a prediction; a bad file is one
    line naming the field. (Here the "guest" is the host fixture itself, predicted as itself.)"""
    topo = json.loads(run("pcitopo", "topo", "--json", "--sysfs", str(H100)).stdout)
    doc = {"devices": [{"host_bdf": d["bdf"], "guest_bdf": d["bdf"], "kind": d["kind"], "label": d["label"],
                        "numa": d["numa"]} for d in topo["devices"]],
           "pairs": topo["pairs"], "notes": []}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(doc))
    r = run("pcitopo", "verify", "--expect", str(f), "--sysfs", str(H100))
    assert r.returncode == 0 and b"as predicted: all 20 devices and all 190 pairs" in r.stderr
    doc["pairs"][3]["nccl"] = "PIXX"
    f.write_text(json.dumps(doc))
    r = run("pcitopo", "verify", "--expect", str(f), "--sysfs", str(H100))
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"pairs[3].nccl" in r.stderr
    f.write_text('{"devices": [{"host_bdf": "0000:18:00.0"}], "pairs": []}')
    r = run("pcitopo", "verify", "--expect", str(f), "--sysfs", str(H100))
    assert r.returncode == 2 and b"devices[0].guest_bdf is missing" in r.stderr


# -- a dry run on a node ---------------------------------------------------------------

def test_capture_to_stdout_then_xmlfix_on_it(tmp_path):
    """`pcitopo capture -o -` wrote a file named '-'; now the tarball goes to stdout
    (byte-identical to -o FILE), and xmlfix reads it back: the documented node dry run."""
    r = subprocess.run([str(BIN / "pcitopo"), "capture", "--sysfs", str(H100), "-o", "-"],
                       cwd=tmp_path, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "-").exists() and b"into stdout" in r.stderr
    node = tmp_path / "node.tar.gz"
    node.write_bytes(r.stdout)
    assert run("pcitopo", "capture", "--sysfs", str(H100), "-o", str(tmp_path / "f.tar.gz")).returncode == 0
    assert (tmp_path / "f.tar.gz").read_bytes() == r.stdout
    r = run("xmlfix", "--check", "--sysfs", str(node), str(H100 / "domain.xml"))
    assert r.returncode == 0 and b"check: ok" in r.stderr
    assert b"/host/sys" in run("pcitopo", "capture", "--help").stdout


# -- messages that leaked internals ----------------------------------------------------

def test_sysfs_pointing_at_an_xml_file_is_one_clear_line():
    """Was tarfile's ReadError chain (gz, bz2, xz, tar)."""
    r = run("xmlfix", "--sysfs", str(H100 / "domain.xml"), str(H100 / "domain.xml"))
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1
    assert "it is XML, a domain?" in err and "--sysfs takes /sys" in err
    assert "ReadError" not in err and "method gz" not in err


def test_bad_nvlink_table_names_the_field(tmp_path):
    """Was "2 validation errors for _Table"."""
    table = tmp_path / "t.json"
    table.write_text('{"boards": [{"name": "x", "gpus": "10de:2330", "links": 18}]}')
    r = run("pcitopo", "topo", "--sysfs", str(H100), "--nvlink-table", str(table))
    err = r.stderr.decode()
    assert r.returncode == 2 and err.count("\n") == 1
    assert "boards[0].gpus: Input should be a valid list" in err and "_Table" not in err


def test_yaml_vmi_is_accepted(tmp_path):
    """`kubectl get vmi -o yaml` gave "Expecting value"; its annotations now apply
    exactly as the JSON's do (here: mode off leaves the domain unchanged, and says so)."""
    vmi = tmp_path / "vmi.yaml"
    vmi.write_text(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: gpu-vm\n"
        "  namespace: ml\n  annotations:\n    pcitopo.kubevirt.io/mode: \"off\"\nspec:\n  domain: {}\n"
    )
    r = run("xmlfix", "--vmi", str(vmi), "--sysfs", str(H100), str(H100 / "domain.xml"))
    assert r.returncode == 0, r.stderr
    assert r.stdout == with_hostdev_modes((H100 / "domain.xml").read_bytes())[0] and b"unchanged-off" in r.stderr
    vmi.write_text("metadata:\n  name: [unclosed\n")
    r = run("xmlfix", "--vmi", str(vmi), "--sysfs", str(H100), str(H100 / "domain.xml"))
    assert r.returncode == 2 and r.stderr.count(b"\n") == 1 and b"neither JSON nor YAML at line" in r.stderr


def test_host_without_gpus_says_so_and_shows_the_nics(tmp_path):
    """A host with one NIC and no GPU printed a 1x1 NIC matrix."""
    from pcitopo.synth import build_tree, parse_topo

    text = ("numa 0 cpus=0-7\nrc 0000:15 numa=0\n  ep 15:00.0 preset=intel-vtd\n"
            "  rp 15:01.0 preset=intel-rp\n    ep 16:00.0 preset=cx7-eth\n")
    build_tree(parse_topo(text, "nogpu")).write_tarball(tmp_path / "nogpu.tar.gz")
    r = run("pcitopo", "topo", "--sysfs", str(tmp_path / "nogpu.tar.gz"))
    out = r.stdout.decode()
    assert r.returncode == 0 and out.startswith("no GPUs found")
    assert "NIC0: 0000:16:00.0" in out and "NUMA Affinity 0" in out and "NIC0  X" not in out


# -- small ones ----------------------------------------------------------------------

def test_json_and_tree_are_exclusive():
    """`--json --tree` silently printed JSON."""
    r = run("pcitopo", "topo", "--json", "--tree", "--sysfs", str(H100))
    assert r.returncode == 2 and r.stdout == b"" and b"--json and --tree" in r.stderr


def test_the_documented_json_contract_lists_every_top_level_key():
    """The documented `topo --json` contract (docs/CLI.md) once omitted host, nvlink_source and warnings."""
    keys = list(json.loads((H100 / "topo.json").read_text()))
    reference = (ROOT / "docs" / "CLI.md").read_text()
    contract = reference.split("the stable contract", 1)[1].split("\n- ", 1)[0]
    for k in keys:
        assert f'"{k}"' in contract, k
