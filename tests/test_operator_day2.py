"""The path a newcomer follows (README, OPERATOR.md,
DEPLOY.md, GUEST.md), as the installed console scripts print it. Each test names the finding it
covers; they run the real commands on the fixtures."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO as ROOT

BIN = Path(sys.executable).parent
B200 = ROOT / "fixtures" / "hgx-b200"
H100 = ROOT / "fixtures" / "hgx-h100"
DOCS = ROOT / "docs"


def run(cmd: str, *args: str, stdin: bytes | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=cwd, input=stdin, capture_output=True, timeout=300)


def lines(data: bytes) -> list[str]:
    return data.decode().splitlines()


# -- make demo tells one story --------------------------------------------------------

def test_demo_tells_the_readme_story():
    """`make demo`'s --explain of the golden B200 domain ended "NOT READY (4 fail)" with
    a doctor warning (BlueField-3 functions on mlx5_core passed through), while the doctor's
    sample run (docs/CLI.md) shows the fixture "ready ... 197 ok". Now the fixture binds what the
    domain passes through."""
    makefile = (ROOT / "Makefile").read_text()
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "xmlfix --explain --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml" in demo
    r = run("xmlfix", "--explain", "--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/domain.xml")
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    verdict = lines(r.stdout)[-1]
    reference = (DOCS / "CLI.md").read_text()
    assert f"$ pcitopo doctor --sysfs fixtures/hgx-b200\n{verdict}\n" in reference
    doctor = run("pcitopo", "doctor", "--sysfs", "fixtures/hgx-b200")
    assert doctor.returncode == 0 and lines(doctor.stdout)[-1] == verdict


# -- one nvidia-smi count -------------------------------------------------------------

def _counts(text: str) -> set[tuple[str, str]]:
    """Every "NCCL ... N/M" and "nvidia-smi ... N/M" figure in a text."""
    out = set()
    for view, n in re.findall(r"(NCCL|nvidia-smi):? (\d+/\d+)", text):
        out.add((view, n))
    for key, n in re.findall(r'"pairs_(nccl|nvml)_equal": ?(\d+)', text):
        out.add(("NCCL" if key == "nccl" else "nvidia-smi", f"{n}/190"))
    return out


def test_one_nvidia_smi_count_everywhere(tmp_path):
    """--explain said nvidia-smi 178/190, the picture's title and the hook's log line
    (DEPLOY.md's example) 174/190. One definition: a GPU pair joined by NVLink reads NV# on
    both sides, so it counts as the host's; every output and every doc example agrees."""
    want = {("NCCL", "190/190"), ("nvidia-smi", "178/190")}
    dom = "fixtures/hgx-b200/domain.xml"
    explain = run("xmlfix", "--explain", "--sysfs", "fixtures/hgx-b200", dom)
    check = run("xmlfix", "--check", "--sysfs", "fixtures/hgx-b200", dom)
    picture = run("pcitopo", "topo", "--dot", "--sysfs", "fixtures/hgx-b200")
    guest_picture = run("xmlfix", "--explain", "--dot", "--sysfs", "fixtures/hgx-b200", dom)
    shim = subprocess.run([str(BIN / "onDefineDomain"), "--vmi", "{}", "--domain", (ROOT / dom).read_text()],
                          cwd=ROOT, capture_output=True, timeout=120, env={"PCITOPO_SYSFS": str(B200), "PATH": "/usr/bin:/bin"})
    outputs = {
        "xmlfix --explain": lines(explain.stdout)[0],
        "xmlfix --check": check.stderr.decode(),
        "pcitopo topo --dot": picture.stdout.decode().split("\n", 3)[:3].__str__(),
        "xmlfix --explain --dot": guest_picture.stdout.decode()[:2000],
        "hook log line (shim)": shim.stderr.decode(),
    }
    for name, text in outputs.items():
        assert _counts(text) == want, (name, text[:400])
    vm_doc = (DOCS / "VM.md").read_text()  # "Check that it worked"
    log = next(x for x in vm_doc.splitlines() if '"event":"OnDefineDomain"' in x)
    assert _counts(log) == want, log
    reference = (DOCS / "CLI.md").read_text()  # --explain's verdict line, quoted
    assert "nvidia-smi: 178/190 pairs" in reference and "174/190" not in reference
    assert "174/190" not in (ROOT / "README.md").read_text()
    svg = (DOCS / "hgx-b200.svg").read_text()  # the README's picture, drawn by `xmlfix --dot`
    assert "NCCL: 190/190 pairs as on the host" in svg and "nvidia&#45;smi: 178/190 pairs" in svg
    operator = (DOCS / "OPERATOR.md").read_text()
    assert "nvidia-smi: 178/190 pairs as on the host" in operator and "174" not in operator


# -- the degraded GPU in `pcitopo partitions` -----------------------------------------

def test_partitions_show_links_and_mark_degraded():
    """With fmpm-l-degraded.json (module 1 has 16 of 18 NVLinks) the output was the
    healthy file's but for the file name. Now every GPU line shows its links and a partition
    holding a degraded GPU says so, in text and JSON."""
    fab = B200 / "fabric"
    healthy = run("pcitopo", "partitions", "--sysfs", str(B200), "--fabric", str(fab / "fmpm-l.json"))
    degraded = run("pcitopo", "partitions", "--sysfs", str(B200), "--fabric", str(fab / "fmpm-l-degraded.json"))
    assert healthy.returncode == 0 and degraded.returncode == 0, degraded.stderr
    text = degraded.stdout.decode()
    assert text.replace("fmpm-l-degraded.json", "fmpm-l.json") != healthy.stdout.decode()
    assert "degraded" not in healthy.stdout.decode()
    assert all(re.search(r"NVLinks (\d+)/\1$", ln) for ln in lines(healthy.stdout) if ln.startswith("    module"))
    headers = {int(m.group(1)): m.group(0) for m in re.finditer(r"^Partition (\d+) .*$", text, re.M)}
    for _pid, header in headers.items():
        has_module_1 = re.search(r"modules \{1,[0-9,]*\}", header) is not None  # a single GPU has no NVLink (0/0)
        assert ("degraded: module 1 has 16 of 18 NVLinks" in header) == has_module_1, header
    assert re.search(r"^    module 1 .*NVLinks 16/18", text, re.M)
    doc = json.loads(run("pcitopo", "partitions", "--sysfs", str(B200), "--fabric", str(fab / "fmpm-l-degraded.json"), "--json").stdout)
    p1 = next(p for p in doc["partitions"] if p["id"] == 1)
    assert p1["degraded"] is True
    g1 = next(g for g in p1["gpus"] if g["module"] == 1)
    assert g1["nvlinks"] == {"available": 16, "max": 18}
    assert next(p for p in doc["partitions"] if p["id"] == 2)["degraded"] is False


# -- capture says what a 64-byte config space leaves unknown ---------------------------

def _tree_with_config_cut(tmp_path: Path, size: int) -> Path:
    from pcitopo.host.sources import MemoryTree

    tree = MemoryTree.from_tarball(H100 / "sysfs.tar.gz")
    cut = 0
    for rel, entry in list(tree.iter_entries()):
        data = getattr(entry, "data", None)
        if rel.endswith("/config") and data is not None:
            tree.add_file(rel, data[:size])
            cut += 1
    assert cut > 50
    out = tmp_path / f"cut{size}.tar.gz"
    tree.write_tarball(out)
    return out


def test_capture_warns_when_config_space_is_cut_at_64_bytes(tmp_path):
    """A capture taken without CAP_SYS_ADMIN holds 64 bytes of config space, so the
    doctor's acs and ats checks are unknown on it; `capture` now says so on stderr, once."""
    src = _tree_with_config_cut(tmp_path, 64)
    r = run("pcitopo", "capture", "--sysfs", str(src), "-o", str(tmp_path / "node.tar.gz"))
    assert r.returncode == 0, r.stderr
    warn = [x for x in lines(r.stderr) if "64 bytes" in x]
    assert len(warn) == 1 and "warning" in warn[0] and "acs and ats" in warn[0] and "CAP_SYS_ADMIN" in warn[0]
    full = run("pcitopo", "capture", "--sysfs", str(H100), "-o", str(tmp_path / "full.tar.gz"))
    assert full.returncode == 0 and b"64 bytes" not in full.stderr
    operator = (DOCS / "OPERATOR.md").read_text()
    said = re.sub(r"\d+ function", "N function", warn[0])
    documented = [re.sub(r"\d+ function", "N function", x) for x in operator.splitlines() if "cut at 64 bytes" in x]
    assert "that is enough" not in operator and "CAP_SYS_ADMIN" in operator and said in documented
    step1 = "OPERATOR.md#1-capture-the-nodes-pci-tree"  # test_readme_top checks the anchor resolves
    for doc in (ROOT / "README.md", DOCS / "CLI.md"):  # where `pcitopo capture` is shown
        text = doc.read_text()
        assert "pcitopo capture" in text and step1 in text and "take it as root" not in text, doc


# -- the guest tool, one file, standard library, Python >= 3.8 -------------------------

def _guest_tool(tmp_path: Path) -> Path:
    out = tmp_path / "pcitopo-guest"
    r = run("pcitopo", "guest-tool", "-o", str(out))
    assert r.returncode == 0, r.stderr
    return out


def _self_prediction(tmp_path: Path, sysfs: Path) -> Path:
    """A prediction of a tree as itself (the host fixture standing in for a guest)."""
    topo = json.loads(run("pcitopo", "topo", "--json", "--sysfs", str(sysfs)).stdout)
    doc = {"devices": [{"host_bdf": d["bdf"], "guest_bdf": d["bdf"], "kind": d["kind"], "label": d["label"],
                        "numa": d["numa"]} for d in topo["devices"]], "pairs": topo["pairs"], "notes": []}
    f = tmp_path / "predicted.json"
    f.write_text(json.dumps(doc))
    return f


def test_guest_tool_runs_with_the_standard_library_only(tmp_path):
    """`pip install pcitopo` in the guest failed (not on PyPI). The guest side is one
    file built from the same modules; it runs under a plain `python3 -S -I` (no site-packages: no
    lxml, pydantic or pcitopo installed) and gives the full CLI's verdict."""
    tool = _guest_tool(tmp_path)
    expect = _self_prediction(tmp_path, H100)
    r = subprocess.run(["/usr/bin/python3", "-S", "-I", str(tool), "verify", "--expect", str(expect), "--sysfs", str(H100)],
                       capture_output=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    full = run("pcitopo", "verify", "--expect", str(expect), "--sysfs", str(H100))
    assert r.stderr == full.stderr.replace(b"pcitopo verify:", b"pcitopo-guest verify:")
    doc = json.loads(expect.read_text())
    doc["pairs"][0]["nccl"] = "SYS"
    expect.write_text(json.dumps(doc))
    bad = subprocess.run(["/usr/bin/python3", "-S", "-I", str(tool), "verify", "--expect", str(expect), "--sysfs", str(H100)],
                         capture_output=True, timeout=120, cwd=tmp_path)
    assert bad.returncode == 1 and b"predicted SYS" in bad.stderr
    usage = subprocess.run(["/usr/bin/python3", "-S", "-I", str(tool)], capture_output=True, timeout=60)
    assert usage.returncode == 2 and b"usage: pcitopo-guest" in usage.stderr and b"verify" in usage.stderr


def test_guest_modules_parse_as_python_3_8_and_import_only_the_stdlib(tmp_path):
    """Every module in the guest file parses with Python 3.8's grammar, needs no
    newer stdlib API (vermin --target 3.8) and imports nothing outside the standard library and
    the bundle itself."""
    import zipfile

    tool = _guest_tool(tmp_path)
    with zipfile.ZipFile(tool) as z:
        names = [n for n in z.namelist() if n.endswith(".py")]
        sources = {n: z.read(n).decode() for n in names}
    assert "__main__.py" in sources and any(n.endswith("verify.py") for n in names)
    bundled = {n[:-3].replace("/", ".").removesuffix(".__init__") for n in names}
    for name, src in sources.items():
        tree = ast.parse(src, name, feature_version=(3, 8))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            for m in mods:
                top = m.split(".")[0]
                assert top in sys.stdlib_module_names or m in bundled or top in {x.split(".")[0] for x in bundled}, (name, m)
    extracted = tmp_path / "src"
    with zipfile.ZipFile(tool) as z:
        z.extractall(extracted)
    r = subprocess.run([str(BIN / "vermin"), "--no-tips", "--violations", "-t=3.8-",
                        "--no-parse-comments", str(extracted)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stdout.decode()[-3000:]


def test_guest_tool_ships_in_the_image_and_docs_say_how_to_get_it_in():
    """The image carries it (/usr/share/pcitopo/pcitopo-guest), `make guest-tool`
    builds it, GUEST.md shows kubectl cp and cloud-init write_files, and no longer `pip install`."""
    containerfile = (ROOT / "Containerfile").read_text()
    assert "/usr/share/pcitopo/pcitopo-guest" in containerfile
    assert "\nguest-tool:" in (ROOT / "Makefile").read_text()
    guest = (DOCS / "GUEST.md").read_text()
    assert "pip install pcitopo" not in guest
    assert "kubectl cp" in guest and "write_files" in guest and "python3 pcitopo-guest verify" in guest


# -- an empty --vmi file ---------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"\n", b"   \n\n"])
def test_empty_vmi_file_is_one_line_exit_2(tmp_path, content):
    """`kubectl get vmi missing -o yaml > vmi.yaml` leaves an empty file, which was
    accepted silently (as if the VM had no annotations)."""
    vmi = tmp_path / "vmi.yaml"
    vmi.write_bytes(content)
    r = run("xmlfix", "--check", "--sysfs", str(B200), "--vmi", str(vmi), str(B200 / "domain.xml"))
    assert r.returncode == 2 and r.stdout == b""
    assert len(lines(r.stderr)) == 1 and "is empty" in r.stderr.decode() and str(vmi) in r.stderr.decode()


# -- make demo installs only what the demo uses -----------------------------------------

def _make_dry(target: str) -> str:
    r = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


def test_demo_installs_the_cli_and_graphviz_only():
    """`make demo` ran scripts/setup-debian.sh (18 Debian packages, as root) to print
    a matrix. On a fresh clone (`make -n -B`) it now installs the CLI with pip and, only when
    `dot` is missing, graphviz; `make test` still installs everything."""
    demo = _make_dry("demo")
    setup_calls = [x for x in demo.splitlines() if "setup-debian.sh" in x]
    assert setup_calls and all("ONLY=graphviz" in x and "command -v dot" in x for x in setup_calls), setup_calls
    assert "pip install --quiet -e ." in demo and "[test]" not in demo
    test = _make_dry("test")
    assert "SKIP_KERNEL=1 bash scripts/setup-debian.sh" in test and "\nbash scripts/setup-debian.sh" in test
    assert "-e '.[test]'" in test and "ONLY=" not in test
    readme = (ROOT / "README.md").read_text()
    assert "pipx install ." in readme and "python3 -m pip install ." in readme


# -- messages ------------------------------------------------------------------------

def test_unquoted_off_in_yaml_says_yaml_and_quote_it(tmp_path):
    """YAML reads an unquoted `off` as false; the message said "VMI JSON annotation
    ... is not a string"."""
    vmi = tmp_path / "vmi.yaml"
    vmi.write_text("metadata:\n  annotations:\n    pcitopo.kubevirt.io/mode: off\n")
    r = run("xmlfix", "--check", "--sysfs", str(B200), "--vmi", str(vmi), str(B200 / "domain.xml"))
    err = r.stderr.decode()
    assert r.returncode == 2 and len(err.splitlines()) == 1
    assert "YAML" in err and "JSON" not in err and "quote it" in err and 'pcitopo.kubevirt.io/mode: "off"' in err


def test_verify_says_what_matched_and_what_did_not(tmp_path):
    """"4/20 devices, 190/190 pairs checked, 20 difference(s)" read like 4 matches."""
    expect = _self_prediction(tmp_path, H100)
    doc = json.loads(expect.read_text())
    doc["pairs"][0]["nccl"] = "SYS"
    doc["devices"][1]["numa"] = 5
    expect.write_text(json.dumps(doc))
    r = run("pcitopo", "verify", "--expect", str(expect), "--sysfs", str(H100))
    last = lines(r.stderr)[-1]
    assert r.returncode == 1
    assert last == ("pcitopo verify: differs from the prediction: devices: 19 of 20 as predicted, 1 differs; "
                    "pairs: 189 of 190 as predicted, 1 differs"), last


def test_bare_pcitopo_prints_usage():
    """Bare `pcitopo` printed only "the following arguments are required: command"."""
    r = run("pcitopo")
    err = r.stderr.decode()
    assert r.returncode == 2 and err.startswith("usage: pcitopo")
    for cmd in ("topo", "partitions", "capture", "doctor", "verify", "serve", "guest-tool"):
        assert re.search(rf"^\s+{cmd}\s", err, re.M), cmd


def test_check_says_the_nvlink_sentence_once():
    """--check with a fabric whose partition is not active printed the same
    300-character NVLink sentence three times (warning, check line, closing line)."""
    r = run("xmlfix", "--check", "--sysfs", str(B200), "--fabric", str(B200 / "fabric" / "fmpm-l.json"), str(B200 / "domain.xml"))
    err = r.stderr.decode()
    assert r.returncode == 1 and err.count("which is not active") == 1, err
    assert lines(r.stderr)[-1].startswith("xmlfix: check: failed: ") and "NVLink" in lines(r.stderr)[-1]


@pytest.mark.parametrize("host, domain, extra", [
    ("hgx-b200", "domain.xml", []),
    ("hgx-b200", "cases/no-numa/domain.xml", []),
    ("hgx-h100", "domain.xml", []),
    ("hgx-b200", "domain.xml", ["--fabric", "fixtures/hgx-b200/fabric/fmpm-l-degraded.json"]),
])
def test_explain_fits_100_columns(host, domain, extra):
    """--explain lines reached 307 columns (the side-by-side matrix, doctor lines,
    notes). Now every line fits in 100."""
    r = run("xmlfix", "--explain", *extra, "--sysfs", f"fixtures/{host}", f"fixtures/{host}/{domain}")
    assert r.returncode == 0, r.stderr
    widest = max(lines(r.stdout), key=len)
    assert len(widest) <= 100, (len(widest), widest)


# -- the documented sriov-4k figure is make bench's -----------------------------------

def test_the_cli_reference_quotes_make_bench_for_topo_vfs_json():
    """The README said "about 3 s and 82 MiB"; a newcomer measured 3.8-6.0 s and
    136 MiB. `make bench` measures it (row 8) and docs/CLI.md quotes that run, with the machine."""
    perf = "".join(p.read_text() for p in sorted((ROOT / "bench").glob("perf*.py")))  # perf.py and its modules
    assert '"topo", "--vfs", "--json"' in perf and "sriov-4k" in perf
    results = (ROOT / "bench" / "RESULTS.md").read_text()
    wall = re.search(r"^\| 8 \| pcitopo topo --vfs --json, sriov-4k[^|]*\| ([\d.]+) (ms|s) \|", results, re.M)
    rss = re.search(r"^\| 8 \| peak RSS of pcitopo topo --vfs --json, sriov-4k[^|]*\| ([\d.]+) MiB \|", results, re.M)
    machine = re.search(r"^- machine: ([^,]+), (\d+) CPUs", results, re.M)
    assert wall and rss and machine, "run make bench"
    seconds = float(wall.group(1)) / (1000 if wall.group(2) == "ms" else 1)
    reference = " ".join((DOCS / "CLI.md").read_text().split())
    quote = f"in {seconds:.1f} s and {float(rss.group(1)):.0f} MiB resident"
    assert quote in reference, quote
    assert f"{machine.group(2)}-core {machine.group(1)}" in reference
    assert "about 3 s and 82 MiB" not in reference


# -- RDMA device names, NCCL_IB_HCA --------------------------------------------------

def test_nic_legend_shows_the_rdma_device_name():
    """Nvidia-smi topo -m names NICs by their RDMA device (mlx5_N); the legend now
    shows it where the host has one (infiniband/<name> below the function). hgx-h100-faults keeps
    the storage NICs on mlx5_core (hgx-h100 binds them to vfio-pci)."""
    h100 = ROOT / "fixtures" / "hgx-h100-faults"
    r = run("pcitopo", "topo", "--sysfs", str(h100))
    legend = {m.group(1): m.group(0) for m in re.finditer(r"^  (NIC\d+): .*$", r.stdout.decode(), re.M)}
    named = [x for x in legend.values() if "0000:49:00.0" in x]
    assert named and "mlx5_0" in named[0], legend
    vfio = [x for x in legend.values() if "0000:19:00.0" in x]  # on vfio-pci: no RDMA device on the host
    assert vfio and "mlx5" not in vfio[0]
    doc = json.loads(run("pcitopo", "topo", "--json", "--sysfs", str(h100)).stdout)
    rdma = {d["bdf"]: d["rdma"] for d in doc["devices"] if d["kind"] == "nic"}
    assert rdma["0000:49:00.1"] == "mlx5_1" and rdma["0000:19:00.0"] is None


def test_capture_records_rdma_names_of_any_nic(tmp_path, topo):
    """The capture kept infiniband/ only for ConnectX-7 (15b3:1021) functions; a
    ConnectX-6 Dx's mlx5 name now survives capture and shows in the legend read from it."""
    from pcitopo.synth import build_tree, parse_topo

    text = """
        numa 0 cpus=0-3
        rc 0000:00 numa=0
          rp 00:01.0 preset=intel-rp
            us 01:00.0 preset=pex-gen4
              ds 02:00.0
                ep 03:00.0 preset=h100
              ds 02:01.0
                ep 04:00.0 preset=cx6-dx rdma=mlx5_7
    """
    import textwrap

    tree = build_tree(parse_topo(textwrap.dedent(text), "cx6"))
    src = tmp_path / "src.tar.gz"
    tree.write_tarball(src)
    out = tmp_path / "cap.tar.gz"
    assert run("pcitopo", "capture", "--sysfs", str(src), "-o", str(out)).returncode == 0
    r = run("pcitopo", "topo", "--sysfs", str(out))
    assert re.search(r"^  NIC0: 0000:04:00.0 .*mlx5_7", r.stdout.decode(), re.M), r.stdout.decode()


def test_explain_suggests_nccl_ib_hca_in_guest_order():
    """--explain names the VM's GPUDirect NICs as the guest will call them, in
    guest PCI order, for NCCL_IB_HCA (the BlueField-3 functions, PHB to every GPU, are left out)."""
    r = run("xmlfix", "--explain", "--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/domain.xml")
    text = r.stdout.decode()
    assert 'NCCL_IB_HCA="=mlx5_0,mlx5_1,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_10,mlx5_11"' in text
