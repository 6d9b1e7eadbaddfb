"""The command-line programs as a user runs them: exit codes, one-line errors, golden JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO as ROOT

BIN = Path(sys.executable).parent


def run(cmd: str, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=ROOT, input=stdin, capture_output=True, timeout=120)


@pytest.mark.parametrize("name", ["hgx-b200", "hgx-h100"])
def test_topo_json_is_the_golden_contract(name):
    r = run("pcitopo", "topo", "--json", "--sysfs", f"fixtures/{name}")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (ROOT / "fixtures" / name / "topo.json").read_bytes()
    data = json.loads(r.stdout)
    n = len(data["devices"])
    assert len(data["pairs"]) == n * (n - 1) // 2
    assert {"bdf", "kind", "numa"} <= set(data["devices"][0])
    assert {"a", "b", "nccl", "nvml", "nvlink"} == set(data["pairs"][0])


def test_topo_matrix_and_tree_and_named_bdfs():
    r = run("pcitopo", "topo", "--sysfs", "fixtures/hgx-h100")
    out = r.stdout.decode()
    assert r.returncode == 0 and "GPU0" in out and "NV18" in out and "NIC Legend" not in out
    assert "GPU0: 0000:18:00.0" in out and "NUMA Affinity" in out
    r = run("pcitopo", "topo", "--tree", "--sysfs", "fixtures/hgx-b200")
    assert r.returncode == 0 and b"two-level top" in r.stdout and b"<GPU0>" in r.stdout
    r = run("pcitopo", "topo", "--json", "--sysfs", "fixtures/dgx-h100", "0000:18:00.0", "0000:1b:00.0")
    pair = json.loads(r.stdout)["pairs"][0]
    assert (pair["nccl"], pair["nvml"]) == ("PXB", "PXB")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["topo", "--sysfs", "/nonexistent"], b"no such sysfs directory or capture"),
        (["topo", "--sysfs", "fixtures/hgx-h100", "0000:77:00.0"], b"no PCI function 0000:77:00.0"),
        (["topo", "--sysfs", "fixtures/hgx-h100", "banana"], b"not a PCI address"),
        (["topo", "--bogus"], b"unrecognized arguments"),
    ],
)
def test_pcitopo_errors_are_one_line_exit_2(args, needle):
    r = run("pcitopo", *args)
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and b"Traceback" not in r.stderr


def test_xmlfix_rewrites_and_checks(tmp_path):
    d = ROOT / "fixtures" / "hgx-h100"
    r = run("xmlfix", "--sysfs", "fixtures/hgx-h100", str(d / "domain.xml"))
    assert r.returncode == 0 and r.stdout == (d / "expected.xml").read_bytes()
    r = run("xmlfix", "--sysfs", "fixtures/hgx-h100", "-", stdin=(d / "domain.xml").read_bytes())
    assert r.stdout == (d / "expected.xml").read_bytes()
    assert run("xmlfix", "--check", "--sysfs", "fixtures/hgx-h100", str(d / "expected.xml")).returncode == 0
    # --check judges what the guest will see, not whether the input
    # already has the layout: the unplaced domain passes, since the hook gives full fidelity.
    r = run("xmlfix", "--check", "--sysfs", "fixtures/hgx-h100", str(d / "domain.xml"))
    assert r.returncode == 0 and b"check: ok" in r.stderr
    r = run("xmlfix", "--diff", "--sysfs", "fixtures/hgx-h100", str(d / "domain.xml"))
    assert r.returncode == 0 and b"+\t\t<controller" in r.stdout or b"+" in r.stdout
    out = tmp_path / "out.xml"
    assert run("xmlfix", "-o", str(out), "--sysfs", "fixtures/hgx-h100", str(d / "domain.xml")).returncode == 0
    assert out.read_bytes() == (d / "expected.xml").read_bytes()


def test_xmlfix_check_fails_when_fidelity_is_lost():
    d = ROOT / "fixtures" / "hgx-h100" / "cases" / "no-numa"
    r = run("xmlfix", "--check", "--sysfs", "fixtures/hgx-h100", str(d / "expected.xml"))
    assert r.returncode == 1 and b"pair(s) differ" in r.stderr


@pytest.mark.parametrize("name", ["hgx-b200", "hgx-h100", "dgx-h100"])
def test_xmlfix_explain_shows_guest_equal_to_host(name):
    r = run("xmlfix", "--explain", "--sysfs", f"fixtures/{name}", f"fixtures/{name}/domain.xml")
    out = r.stdout.decode()
    assert r.returncode == 0
    assert "Guest PCI tree" in out and "pci0000:" in out
    nccl = out.split("NCCL view")[1].split("Device Legend")[0]
    assert ">" not in nccl, "NCCL classes must be equal host to guest"
    if name == "hgx-b200":
        assert "PXB>PIX*" in out and "Broadcom two-level complex collapsed" in out
    else:
        assert "Every pair reads the same in the guest as on the host" in out


@pytest.mark.parametrize(
    "content,needle",
    [
        (b"<domain><devices>", b"malformed domain XML"),
        (b"<notadomain/>", b"not <domain>"),
        (b"", b"empty"),
    ],
)
def test_xmlfix_bad_input_is_one_line_exit_2(tmp_path, content, needle):
    f = tmp_path / "d.xml"
    f.write_bytes(content)
    r = run("xmlfix", "--sysfs", "fixtures/hgx-h100", str(f))
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1 and b"Traceback" not in r.stderr


def test_nvlink_table_is_overridable(tmp_path):
    table = tmp_path / "nvlink.json"
    table.write_text('{"boards": [{"name": "no nvlink", "gpus": ["10de:2330"], "links": 0}]}')
    r = run("pcitopo", "topo", "--json", "--sysfs", "fixtures/hgx-h100", "--nvlink-table", str(table),
            "0000:18:00.0", "0000:2a:00.0")
    assert json.loads(r.stdout)["pairs"][0]["nvlink"] in (0, None)
    default = run("pcitopo", "topo", "--json", "--sysfs", "fixtures/hgx-h100", "0000:18:00.0", "0000:2a:00.0")
    assert json.loads(default.stdout)["pairs"][0]["nvlink"] == 18
    table.write_text('{"boards": [{"name": "x", "links": "many"}]}')
    r = run("pcitopo", "topo", "--sysfs", "fixtures/hgx-h100", "--nvlink-table", str(table))
    assert r.returncode == 2 and b"NVLink table" in r.stderr and len(r.stderr.splitlines()) == 1


def test_a_bdf_named_twice_is_one_device():
    r = run("pcitopo", "topo", "--json", "--sysfs", "fixtures/hgx-h100", "18:00.0", "0000:18:00.0", "19:00.0")
    data = json.loads(r.stdout)
    assert [d["bdf"] for d in data["devices"]] == ["0000:18:00.0", "0000:19:00.0"] and len(data["pairs"]) == 1


@pytest.mark.parametrize("picture", ["--tree", "--dot"])
def test_tree_and_dot_refuse_nvlink_inputs_they_would_ignore(picture):
    """The pictures show PCIe only: a --fabric, --module-map or --nvlink-table given with them was
    loaded and silently ignored; now it is one line and exit 2. The same file as a node-wide
    default ($PCITOPO_FABRIC) is no mistake and is not even read."""
    import os

    fab = "fixtures/hgx-h100/fabric/fmpm-l-vfio.json"
    r = run("pcitopo", "topo", picture, "--sysfs", "fixtures/hgx-h100", "--fabric", fab)
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode() == f"pcitopo topo: --fabric has no effect with {picture} (the picture shows PCIe only): drop it\n"
    r = run("pcitopo", "topo", picture, "--sysfs", "fixtures/hgx-h100", "--nvlink-table", "missing.json")
    assert r.returncode == 2 and b"--nvlink-table has no effect" in r.stderr
    env = dict(os.environ, PCITOPO_FABRIC="/nonexistent/fabric.json")
    r = subprocess.run([str(BIN / "pcitopo"), "topo", picture, "--sysfs", "fixtures/hgx-h100"], cwd=ROOT, env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
