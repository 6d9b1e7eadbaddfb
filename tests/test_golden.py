"""`pcitopo golden make/check` for a team's own nodes, the versioned JSON verdict,
captures of planned nodes from the installed package, and outputs no locale, path spelling or
environment variable changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lxml import etree

from pcitopo.cli.main import pcitopo_main
from testkit import REPO as ROOT

BIN = Path(sys.executable).parent
B200 = ROOT / "fixtures" / "hgx-b200"
VM = "all-gpus-nics"


def run(cmd: str, *args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=cwd, capture_output=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def golden(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("golden") / "b200"
    assert pcitopo_main(["golden", "make", str(B200), "-o", str(out)]) == 0
    return out


def check(golden_dir: Path, capsys, node: Path = B200) -> tuple[int, str]:
    capsys.readouterr()
    code = pcitopo_main(["golden", "check", str(node), str(golden_dir)])
    return code, capsys.readouterr().out


def copy(golden_dir: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "g"
    shutil.copytree(golden_dir, dest)
    return dest


def test_make_writes_plain_reviewable_files(golden):
    files = sorted(str(p.relative_to(golden)) for p in golden.rglob("*") if p.is_file())
    assert files == ["all-gpus-nics/domain.xml", "all-gpus-nics/nccl-topo.xml", "all-gpus-nics/prediction.json",
                     "all-gpus-nics/verdict.json", "all-gpus-nics/verdict.txt", "all-gpus-nics/vm.yaml", "golden.json"]
    nccl = etree.fromstring((golden / VM / "nccl-topo.xml").read_bytes())  # XML, not base64
    assert nccl.tag == "system" and nccl.find("cpu/pci[@class='0x060400']/pci[@class='0x030200']") is not None
    record = json.loads((golden / "golden.json").read_text())
    from pcitopo import __version__

    assert record["pcitopo"] == __version__ and record["node"]["name"] == "hgx-b200"
    assert len(record["node"]["sha256"]) == 64 and record["vms"][0]["given"] is False
    assert {"kubevirt", "fabric", "cpu_policy", "devices", "cpu_width"} <= set(record["assumed"])
    assert "PCITOPO_" in record["environment"]
    verdict = json.loads((golden / VM / "verdict.json").read_text())
    assert verdict["verdict"] == "ok" and verdict["accepted"][0]["code"] == "broadcom-flattening"
    prediction = json.loads((golden / VM / "prediction.json").read_text())
    assert len(prediction["devices"]) == 20  # every GPU (8) and NIC function (12)


def test_check_of_fresh_goldens_is_ok_with_no_difference(golden, capsys):
    code, out = check(golden, capsys)
    assert code == 0, out
    assert "guest-visible: 0\nlayout only: 0\ntext only: 0" in out and out.rstrip().endswith("check: ok: nothing the guest sees differs")


def _domain(golden_dir: Path) -> tuple[etree._ElementTree, etree._Element]:
    tree = etree.parse(str(golden_dir / VM / "domain.xml"))
    return tree, tree.getroot().find("devices")


def test_a_moved_device_is_guest_visible_and_named(golden, tmp_path, capsys):
    g = copy(golden, tmp_path)
    tree, devices = _domain(g)
    hostdev = devices.find("hostdev")
    src = hostdev.find("source/address")
    bdf = f"0000:{int(src.get('bus'), 16):02x}:{int(src.get('slot'), 16):02x}.{int(src.get('function'), 16)}"
    addr = hostdev.find("address")
    addr.set("slot", f"0x{int(addr.get('slot'), 16) + 1:02x}")
    tree.write(str(g / VM / "domain.xml"))
    code, out = check(g, capsys)
    assert code == 1, out
    visible = out.split("guest-visible: ", 1)[1].split("layout only:", 1)[0]
    assert visible.startswith("1\n") and f"({bdf}): placed at" in visible, out
    assert "check: failed: 1 difference(s) the guest would see" in out


def test_a_removed_spare_root_port_is_layout_only(golden, tmp_path, capsys):
    g = copy(golden, tmp_path)
    tree, devices = _domain(g)
    ctrls = [c for c in devices.findall("controller") if c.get("type") == "pci"]
    parents = {int(a.get("bus"), 16) for a in devices.iter("address") if a.get("type") == "pci" and a.getparent().tag != "source"}
    spare = [c for c in ctrls if c.get("model") == "pcie-root-port" and int(c.get("index")) not in parents]
    assert spare, "the golden domain has spare root ports (hotplug capacity)"
    devices.remove(spare[-1])
    tree.write(str(g / VM / "domain.xml"))
    code, out = check(g, capsys)
    assert code == 0, out
    assert "guest-visible: 0\n" in out and f"spare ports: {len(spare) - 1} -> {len(spare)} empty pcie-root-port" in out
    assert "(layout or text only, above)" in out


def test_wording_is_text_only_and_update_rewrites(golden, tmp_path, capsys):
    g = copy(golden, tmp_path)
    (g / VM / "verdict.txt").write_text("check: ok: worded otherwise\n")
    code, out = check(g, capsys)
    assert code == 0 and "text only: 1 difference(s)" in out
    assert pcitopo_main(["golden", "check", str(B200), str(g), "--update"]) == 0
    assert (g / VM / "verdict.txt").read_bytes() == (golden / VM / "verdict.txt").read_bytes()


def test_check_is_hermetic(golden, tmp_path, monkeypatch, capsys):
    """No PCITOPO_* variable and no current directory changes the result (PCITOPO_FABRIC turned
    the B200 check into exit 1 through xmlfix)."""
    _, plain = check(golden, capsys)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PCITOPO_FABRIC", str(B200 / "fabric" / "fmpm-l-degraded.json"))
    monkeypatch.setenv("PCITOPO_MODULE_MAP", str(B200 / "fabric" / "module-map.json"))
    monkeypatch.setenv("PCITOPO_CPUINFO", str(ROOT / "tests" / "data" / "cpuinfo-46bits"))
    monkeypatch.setenv("PCITOPO_SYSFS", str(ROOT / "fixtures" / "hgx-h100"))
    code, out = check(Path(os.path.relpath(golden, tmp_path)), capsys, Path(os.path.relpath(B200, tmp_path)))
    assert code == 0 and out == plain


def test_golden_bad_input_is_one_line(tmp_path, capsys):
    assert pcitopo_main(["golden", "check", str(B200), str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pcitopo golden: cannot read file") and "golden.json" in err[-1]


@pytest.mark.parametrize("host", sorted(p.parent.parent.name for p in (ROOT / "fixtures").glob("*/golden/golden.json")))
def test_the_projects_own_goldens_check_clean(host, capsys):
    """`make golden` writes fixtures/<host>/golden with the same command a team's CI uses, for
    every golden host (the Makefile's list, which fixtures/golden.py's must equal)."""
    code, out = check(ROOT / "fixtures" / host / "golden", capsys, ROOT / "fixtures" / host)
    assert code == 0 and "guest-visible: 0\nlayout only: 0\ntext only: 0" in out, out


def test_ci_recipe_pins_this_version_and_runs_the_two_commands():
    """docs/CI.md: the recipe is pinned to the version it documents and names the commands a
    team's CI runs (the project's own gates follow it, in a section of their own)."""
    from pcitopo import __version__

    text = (ROOT / "docs" / "CI.md").read_text().split("\n## ")[0]
    assert f'"pcitopo=={__version__}"' in text
    for command in ("pcitopo capture --from-topo", "pcitopo golden make", "pcitopo golden check", "--update"):
        assert command in text, command


def test_the_makefile_makes_goldens_for_every_golden_host():
    import re

    from testkit import fixture_script

    project_goldens = fixture_script("golden")

    hosts = re.search(r"^GOLDEN_HOSTS := (.*)$", (ROOT / "Makefile").read_text(), re.M)[1].split()
    assert sorted(hosts) == sorted(project_goldens.GOLDEN_HOSTS)
    assert sorted(hosts) == sorted(p.parent.parent.name for p in (ROOT / "fixtures").glob("*/golden/golden.json"))
