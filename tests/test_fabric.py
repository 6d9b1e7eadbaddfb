"""NVLink fabric partitions: parsing fmpm -l, the module map, the boot check through xmlfix,
pcitopo partitions, the NV# column, and NVLink-switch management ConnectX-7s."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.errors import FabricError, MalformedBdfError
from pcitopo.host.sysfs import open_host
from pcitopo.model.tree import Bdf
from pcitopo.paths.fabric import SOURCE_FABRIC, SOURCE_MAP, SOURCE_NONE, load_fabric, normalise_bus_id
from pcitopo.paths.partitions import check_gpu_set, compute_nics
from testkit.fabric_kit import B200, H100, domain_with_modules, fabric, module_map, vmi_with

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HOSTILE = sorted((REPO / "tests" / "hostile_fabric").glob("*.json"))


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("PCITOPO_FABRIC", None)
    env.pop("PCITOPO_MODULE_MAP", None)
    return subprocess.run([str(BIN / args[0]), *args[1:]], input=stdin, capture_output=True, cwd=REPO, env=env, timeout=120)


def one_line_error(r: subprocess.CompletedProcess, prog: str) -> str:
    err = r.stderr.decode()
    assert r.returncode == 2, (r.returncode, err)
    assert err.count("\n") == 1 and err.startswith(f"{prog}: ") and "Traceback" not in err, err
    return err.strip()


# -- parsing -------------------------------------------------------------------------------------

def test_bus_ids_are_normalised_from_nvml_spelling():
    assert normalise_bus_id("00000000:1A:00.0") == Bdf(0, 0x1A, 0, 0)
    assert str(normalise_bus_id("00000001:C0:1f.7")) == "0001:c0:1f.7"
    assert str(normalise_bus_id("0000:1a:00.0")) == "0000:1a:00.0"
    with pytest.raises(MalformedBdfError):
        normalise_bus_id("00010000:1A:00.0")


@pytest.mark.parametrize("board", ["hgx-h100", "hgx-b200"])
def test_fixture_fabrics_load_with_the_default_partitions(board):
    host = open_host(REPO / "fixtures" / board)
    fab = load_fabric(fabric(board, "default"), host=host)
    assert fab.source == SOURCE_FABRIC and fab.mapped and len(fab.partitions) == 15
    shapes = [p.modules for p in fab.partitions]
    pairs = [{1, 3}, {2, 4}, {5, 7}, {6, 8}] if board == "hgx-h100" else [{1, 2}, {3, 4}, {5, 6}, {7, 8}]
    assert shapes[:7] == [frozenset(range(1, 9)), {1, 2, 3, 4}, {5, 6, 7, 8}, *pairs]
    assert shapes[7:] == [{m} for m in range(1, 9)]
    assert not any(p.active for p in fab.partitions)
    # module IDs are scrambled on purpose: PCI order is not module order
    by_bus = [fab.module_of(b) for b in sorted(fab.gpu_bdfs())]
    assert by_bus != sorted(by_bus)
    board_map = H100 if board == "hgx-h100" else B200
    assert all(fab.bdf_of(m) == Bdf(0, int(gpu, 16), 0, 0) for m, (gpu, _) in board_map.items())


@pytest.mark.parametrize("board", ["hgx-h100", "hgx-b200"])
def test_placeholder_bdfs_need_the_module_map_and_say_which_source(board, tmp_path):
    host = open_host(REPO / "fixtures" / board)
    bare = load_fabric(fabric(board, "vfio"), host=host)
    assert bare.source == SOURCE_NONE and not bare.mapped and not bare.gpu_bdfs()
    mapped = load_fabric(fabric(board, "vfio"), module_map(board), host)
    assert mapped.source == SOURCE_MAP and mapped.mapped
    assert mapped.gpu_bdfs() == load_fabric(fabric(board, "default"), host=host).gpu_bdfs()
    # one file holding both (a ConfigMap key holds one file): fmpm -l merged with the map
    merged = tmp_path / "fabric-and-map.json"
    merged.write_text(json.dumps({**json.loads(Path(fabric(board, "vfio")).read_text()),
                                  **json.loads(Path(module_map(board)).read_text())}))
    both = load_fabric(merged, host=host)
    assert both.source == SOURCE_MAP and [p.gpus for p in both.partitions] == [p.gpus for p in mapped.partitions]


@pytest.mark.parametrize("path", HOSTILE, ids=lambda p: p.stem)
def test_hostile_fabric_files_are_one_line_and_exit_2(path, tmp_path):
    """pcitopo reads the file at once; xmlfix reads it as the hook does, when the NVLink check
    runs: under nvlink: require a bad file stops the VM (exit 2, one line), under warn it is a
    warning and the domain is rewritten ("NVLink: not checked")."""
    args = ["--fabric", str(path)]
    if path.stem.startswith("module-map"):
        args = ["--fabric", fabric("hgx-h100", "vfio"), "--module-map", str(path)]
    for cmd in (["pcitopo", "partitions"], ["pcitopo", "topo"]):
        r = run(*cmd, "--sysfs", "fixtures/hgx-h100", *args)
        line = one_line_error(r, " ".join(cmd))
        assert path.name in line
    dom = domain_with_modules("hgx-h100", {1, 3})
    vmi = tmp_path / "vmi.json"
    vmi.write_bytes(vmi_with("require"))
    r = run("xmlfix", "--sysfs", "fixtures/hgx-h100", *args, "--vmi", str(vmi), "-", stdin=dom)
    assert path.name in one_line_error(r, "xmlfix") and not r.stdout
    vmi.write_bytes(vmi_with("warn"))
    r = run("xmlfix", "--sysfs", "fixtures/hgx-h100", *args, "--vmi", str(vmi), "-", stdin=dom)
    err = r.stderr.decode()
    assert r.returncode == 0 and r.stdout.startswith(b"<domain") and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "NVLink" in line] == [
        line for line in err.splitlines() if line.startswith("xmlfix: warning: NVLink: not checked: ") and path.name in line] != []


def test_a_bdf_the_host_lacks_is_named():
    with pytest.raises(FabricError, match=r"0000:77:00\.0.*does not have"):
        load_fabric(REPO / "tests/hostile_fabric/bdf-host-lacks.json", host=open_host(REPO / "fixtures/hgx-h100"))


# -- the boot check through xmlfix (Done-when) ------------------------------------------------------

def xmlfix_nvlink(tmp_path: Path, board: str, modules: set[int], policy: str | None, variant: str = "active",
                  extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    vmi = tmp_path / "vmi.json"
    vmi.write_bytes(vmi_with(policy))
    fab = ("--fabric", fabric(board, variant)) if variant else ()
    return run("xmlfix", "--sysfs", f"fixtures/{board}", *fab, *extra, "--vmi", str(vmi), "-",
               stdin=domain_with_modules(board, modules))


REFUSALS = [
    # (board, modules, fabric variant, words the one line must hold)
    ("hgx-h100", {1, 2}, "active", ["modules {1,2}", "no fabric partition", "nearest valid GPU sets",
                                    "partition 1 modules {1,2,3,4}", "partition 3 modules {1,3}"]),
    ("hgx-h100", {2, 4}, "active", ["partition 4 modules {2,4}", "not active", "fmpm -a 4"]),
    ("hgx-h100", {1, 3}, "degraded", ["active partition 3", "module 1 (0000:2a:00.0) has 16 of 18 NVLinks",
                                      "partition 4 modules {2,4}"]),
    ("hgx-h100", set(range(1, 9)), "active", ["partition 0", "fmpm -a 0", "first deactivate partition 3"]),
    ("hgx-b200", {1, 3}, "active", ["modules {1,3}", "no fabric partition", "partition 3 modules {1,2}"]),
    ("hgx-b200", {3, 4}, "active", ["partition 4 modules {3,4}", "fmpm -a 4"]),
    ("hgx-b200", {1, 2}, "degraded", ["16 of 18 NVLinks"]),
]


@pytest.mark.parametrize("board,modules,variant,words", REFUSALS, ids=lambda x: str(x) if not isinstance(x, list) else "")
def test_require_refuses_with_one_line_naming_the_problem(tmp_path, board, modules, variant, words):
    r = xmlfix_nvlink(tmp_path, board, modules, "require", variant)
    line = one_line_error(r, "xmlfix")
    assert not r.stdout
    for w in words:
        assert w in line, (w, line)


@pytest.mark.parametrize("board,modules,variant,words", REFUSALS, ids=lambda x: str(x) if not isinstance(x, list) else "")
def test_warn_always_boots_and_reports(tmp_path, board, modules, variant, words):
    for policy in ("warn", None):  # warn is the default
        r = xmlfix_nvlink(tmp_path, board, modules, policy, variant)
        assert r.returncode == 0 and b"<domain" in r.stdout, r.stderr
        err = r.stderr.decode()
        assert err.startswith("xmlfix: warning: NVLink: ") and all(w in err for w in words), err


@pytest.mark.parametrize("board,modules", [("hgx-h100", {1, 3}), ("hgx-b200", {1, 2}), ("hgx-h100", {1}), ("hgx-b200", {2})])
def test_require_succeeds_for_an_exact_active_partition(tmp_path, board, modules):
    active = tmp_path / "fabric.json"
    doc = json.loads(Path(fabric(board, "default")).read_text())
    wanted = {3} if len(modules) == 2 else {7 + min(modules) - 1}
    for p in doc["partitionInfo"]:
        p["isActive"] = int(p["partitionId"] in wanted)
    active.write_text(json.dumps(doc))
    vmi = tmp_path / "vmi.json"
    vmi.write_bytes(vmi_with("require"))
    r = run("xmlfix", "--sysfs", f"fixtures/{board}", "--fabric", str(active), "--vmi", str(vmi), "-",
            stdin=domain_with_modules(board, modules))
    assert r.returncode == 0 and r.stderr == b"" and b"<domain" in r.stdout, r.stderr
    # the same output as without the check: the check never edits the domain
    plain = run("xmlfix", "--sysfs", f"fixtures/{board}", "-", stdin=domain_with_modules(board, modules))
    assert plain.stdout == r.stdout


def test_require_with_placeholder_bdfs_needs_the_module_map(tmp_path):
    r = xmlfix_nvlink(tmp_path, "hgx-h100", {1, 3}, "require", "vfio")
    line = one_line_error(r, "xmlfix")
    assert "placeholder BDFs" in line and "--module-map" in line
    ok = xmlfix_nvlink(tmp_path, "hgx-h100", {1, 3}, "require", "vfio", ("--module-map", module_map("hgx-h100")))
    assert ok.returncode == 0, ok.stderr


def test_require_without_a_fabric_file_says_what_is_missing(tmp_path):
    r = xmlfix_nvlink(tmp_path, "hgx-h100", {1, 3}, "require", variant="")
    line = one_line_error(r, "xmlfix")
    assert "no fabric file" in line and "--fabric FILE" in line and "fmpm -l" in line


def test_off_and_gpu_less_domains_are_not_checked(tmp_path):
    assert xmlfix_nvlink(tmp_path, "hgx-h100", {1, 2}, "off").returncode == 0
    vmi = tmp_path / "req.json"
    vmi.write_bytes(vmi_with("require"))
    nics = domain_with_modules("hgx-h100", set())
    r = run("xmlfix", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100"), "--vmi", str(vmi), "-", stdin=nics)
    assert r.returncode == 0, r.stderr


# -- xmlfix --explain: NV# only where the guest will have it ----------------------------------------

def explain(tmp_path, board, modules, variant="active", policy="warn") -> str:
    vmi = tmp_path / "vmi.json"
    vmi.write_bytes(vmi_with(policy))
    args = ("--fabric", fabric(board, variant)) if variant else ()
    r = run("xmlfix", "--sysfs", f"fixtures/{board}", *args, "--vmi", str(vmi), "--explain", "-",
            stdin=domain_with_modules(board, modules))
    assert r.returncode == 0, r.stderr
    return re.sub(r"\n {4,}", " ", r.stdout.decode())  # lines folded at 100 columns, unfolded


def cells(text: str, value: str) -> int:
    """How many matrix cells (rows GPU0..) read ``value``, over both matrices."""
    return sum(line.split().count(value) for line in text.splitlines() if line.startswith("GPU"))


def test_explain_shows_nvlink_for_an_active_partition_only(tmp_path):
    ok = explain(tmp_path, "hgx-h100", {1, 3})
    assert cells(ok, "NV18") == 4  # GPU0-GPU1 and back, in both matrices
    assert "active partition 3 modules {1,3}: NV18" in ok
    off = explain(tmp_path, "hgx-h100", {1, 2})
    assert cells(off, "NV18") == 0 and "no fabric partition, so the guest gets no NVLink" in off
    inactive = explain(tmp_path, "hgx-h100", {2, 4})
    assert cells(inactive, "NV18") == 0 and "fmpm -a 4" in inactive
    degraded = explain(tmp_path, "hgx-h100", {1, 3}, "degraded")
    assert cells(degraded, "NV16") == 4 and "16 of 18" in degraded
    b200 = explain(tmp_path, "hgx-b200", {1, 2})
    assert cells(b200, "NV18") == 4


def test_explain_without_a_fabric_marks_nvlink_as_inferred(tmp_path):
    text = explain(tmp_path, "hgx-h100", {1, 2}, variant="")
    assert cells(text, "NV18") == 4 and "inferred from the SXM board table (no fabric file)" in text


def gpu_pair_nvlink(tmp_path, board, modules, variant="active") -> list:
    """``nvlink`` of every GPU-GPU pair in ``xmlfix --json``'s prediction."""
    r = xmlfix_nvlink(tmp_path, board, modules, "warn", variant, extra=("--json",))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    gpus = {d["host_bdf"] for d in doc["devices"] if d["kind"] == "gpu"}
    return [p["nvlink"] for p in doc["pairs"] if {p["a"], p["b"]} <= gpus]


def test_json_prediction_and_check_follow_the_fabric(tmp_path):
    # xmlfix --json (what `pcitopo verify` checks) and --check judge NVLink as --explain does:
    # with a fabric file, NV# only inside the VM's own active partition.
    assert gpu_pair_nvlink(tmp_path, "hgx-h100", {1, 3}) == [18]
    assert gpu_pair_nvlink(tmp_path, "hgx-h100", {1, 3}, "degraded") == [16]
    assert gpu_pair_nvlink(tmp_path, "hgx-h100", {1, 2}) == [None]
    assert gpu_pair_nvlink(tmp_path, "hgx-h100", {1, 2}, variant="") == [18]  # board table, no fabric
    # the VMIs carry the Plugin label alone: judged on a release with kubevirt PR #18866
    ok = xmlfix_nvlink(tmp_path, "hgx-h100", {1, 3}, "warn", extra=("--check", "--kubevirt", "main+pr18866"))
    assert "check: NVLink" not in ok.stderr.decode()
    bad = xmlfix_nvlink(tmp_path, "hgx-h100", {1, 2}, "warn", extra=("--check", "--kubevirt", "main+pr18866"))
    assert bad.returncode == 1 and "xmlfix: check: NVLink: GPUs" in bad.stderr.decode(), bad.stderr
    # the closing failure line says NVLink is why (the pairs alone would read as fine)
    last = bad.stderr.decode().strip().splitlines()[-1]
    # (by name: its sentence is the check line above, said once)
    assert last.startswith("xmlfix: check: failed: ") and last.endswith("; NVLink (above)")
    assert bad.stderr.decode().count("no fabric partition") == 1


# -- pcitopo partitions -----------------------------------------------------------------------

@pytest.mark.parametrize("board", ["hgx-h100", "hgx-b200"])
def test_partitions_json_contract(board):
    r = run("pcitopo", "partitions", "--sysfs", f"fixtures/{board}", "--fabric", fabric(board), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert {"partitions"} <= set(doc)
    assert len(doc["partitions"]) == 15
    board_map = H100 if board == "hgx-h100" else B200
    for p in doc["partitions"]:
        assert {"id", "active", "gpus", "all_pix"} <= set(p) and isinstance(p["all_pix"], bool)
        assert p["active"] is (p["id"] == 3)
        nics = [g["nic"] for g in p["gpus"]]
        assert len(set(nics)) == len(nics), "each GPU gets a NIC of its own"
        for g in p["gpus"]:
            assert {"bdf", "module", "nic", "nic_class"} <= set(g)
            gpu, nic = board_map[g["module"]]
            assert g["bdf"] == f"0000:{gpu}:00.0"
            assert g["nic"] == f"0000:{nic}:00.0" and g["nic_class"] == "PIX"
        assert p["all_pix"] is True


def test_partitions_without_bdfs_say_unknown_and_without_fabric_is_an_error():
    """Placeholder BDFs and no module map: nobody knows which GPU a module is, so ``all_pix`` is
    null (not a false "no") and the text says to give --module-map."""
    r = run("pcitopo", "partitions", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100", "vfio"), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["bdf_source"] == SOURCE_NONE
    assert all(p["all_pix"] is None and all(g["bdf"] is None and g["nic"] is None for g in p["gpus"]) for p in doc["partitions"])
    text = run("pcitopo", "partitions", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100", "vfio")).stdout.decode()
    assert "give --module-map FILE" in text.splitlines()[1]
    assert "PIX to its own NIC: no" not in text and "no compute NIC" not in text
    assert text.count("every GPU PIX to its own NIC: unknown") == 15
    line = one_line_error(run("pcitopo", "partitions", "--sysfs", "fixtures/hgx-h100"), "pcitopo partitions")
    assert "--fabric FILE" in line


def test_partitions_text_names_modules_labels_and_classes():
    r = run("pcitopo", "partitions", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100", "vfio"),
            "--module-map", module_map("hgx-h100"))
    out = r.stdout.decode()
    assert r.returncode == 0 and "GPU BDFs from the module map" in out
    assert "Partition 3   active    modules {1,3}" in out
    assert "module 3  GPU0 0000:18:00.0" in out and "NIC0 0000:19:00.0 PIX" in out


# -- pcitopo topo: the NV# column from the fabric -------------------------------------------------

def test_topo_nvlink_column_comes_from_the_fabric():
    r = run("pcitopo", "topo", "--json", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100"))
    doc = json.loads(r.stdout)
    assert "fabric file" in doc["nvlink_source"]
    linked = {(p["a"], p["b"]) for p in doc["pairs"] if p["nvlink"]}
    assert linked == {("0000:18:00.0", "0000:2a:00.0")}
    assert all(p["nvlink"] == 18 for p in doc["pairs"] if p["nvlink"])
    text = run("pcitopo", "topo", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100", "default")).stdout.decode()
    assert "NV18" not in text and "No NV# between these devices: fabric file" in text
    inferred = json.loads(run("pcitopo", "topo", "--json", "--sysfs", "fixtures/hgx-h100").stdout)
    assert inferred["nvlink_source"] == "inferred from the SXM board table"


def test_topo_fabric_and_nvlink_table_exclude_each_other(tmp_path):
    table = tmp_path / "t.json"
    table.write_text('{"boards": []}')
    r = run("pcitopo", "topo", "--sysfs", "fixtures/hgx-h100", "--fabric", fabric("hgx-h100"), "--nvlink-table", str(table))
    assert "exclude each other" in one_line_error(r, "pcitopo topo")


def test_check_gpu_set_verdicts_in_process():
    host = open_host(REPO / "fixtures/hgx-h100")
    fab = load_fabric(fabric("hgx-h100"), host=host)
    bdf = lambda m: Bdf(0, int(H100[m][0], 16), 0, 0)  # noqa: E731
    assert check_gpu_set(fab, [bdf(1), bdf(3)]).status == "ok"
    assert check_gpu_set(fab, [bdf(1), bdf(2)]).status == "not-a-partition"
    assert check_gpu_set(fab, [bdf(2), bdf(4)]).status == "inactive"
    assert check_gpu_set(fab, []).status == "no-gpus"
    assert check_gpu_set(None, [bdf(1)]).status == "no-fabric"
    v = check_gpu_set(fab, [bdf(1), bdf(3)])
    g = v.guest_nvlink(fab)
    assert g.count(host.function(bdf(1)), host.function(bdf(3))) == 18
    assert check_gpu_set(fab, [bdf(2), bdf(4)]).guest_nvlink(fab) is None
    assert len(compute_nics(host)) == 10  # 8 compute + 2 storage CX-7 (dual-port: one each)


@pytest.mark.parametrize("annotations,said", [
    ({}, "not checked"),  # the default, nvlink: warn
    ({"pcitopo.kubevirt.io/nvlink": "off"}, None),
    ({"pcitopo.kubevirt.io/mode": "off"}, None),
])
def test_xmlfix_reads_a_bad_fabric_file_only_when_the_check_runs(tmp_path, capsys, annotations, said):
    """As the hook (pcitopo.paths.fabric.FabricFile): a fabric file that cannot be read fails only
    `nvlink: require`; otherwise xmlfix's dry run boots like the hook (exit 0)."""
    from pcitopo.cli.main import xmlfix_main

    bad = tmp_path / "fabric.json"
    bad.write_text("not JSON")
    vmi = tmp_path / "vmi.json"
    vmi.write_text(json.dumps({"metadata": {"labels": {"pcitopo.kubevirt.io/plugin": "true"}, "annotations": annotations}}))
    dom = tmp_path / "domain.xml"
    dom.write_bytes(domain_with_modules("hgx-h100", {1, 3}))
    assert xmlfix_main(["--sysfs", str(REPO / "fixtures/hgx-h100"), "--fabric", str(bad), "--vmi", str(vmi), str(dom)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith("<domain")
    nvlink = [line for line in out.err.splitlines() if "NVLink" in line]
    if said is None:
        assert nvlink == []
    else:
        assert len(nvlink) == 1 and nvlink[0].startswith(f"xmlfix: warning: NVLink: {said}: fabric file {bad}: not JSON")
