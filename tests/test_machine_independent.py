"""Every --json output is versioned, `xmlfix --check --json` carries the verdict, the
human outputs work in any locale, the outputs name the node however its path was typed, and a
planned node's capture needs only the installed package."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo import SCHEMA, __version__
from testkit import REPO as ROOT

BIN = Path(sys.executable).parent
B200 = "fixtures/hgx-b200"
FABRIC = ["--fabric", f"{B200}/fabric/fmpm-l.json", "--module-map", f"{B200}/fabric/module-map.json"]


def run(cmd: str, *args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=cwd, capture_output=True, timeout=300,
                          env={**os.environ, **(env or {})})


JSON_OUTPUTS = {
    "topo": ("pcitopo", "topo", "--json", "--sysfs", B200),
    "pairs": ("pcitopo", "pairs", "--json", "--sysfs", B200),
    "partitions": ("pcitopo", "partitions", "--json", "--sysfs", B200, *FABRIC),
    "doctor": ("pcitopo", "doctor", "--json", "--sysfs", B200),
    "preflight": ("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--json", "fixtures/clusters/v1.8.0.yaml"),
    "xmlfix": ("xmlfix", "--json", "--sysfs", B200, f"{B200}/domain.xml"),
    "xmlfix-check": ("xmlfix", "--check", "--json", "--sysfs", B200, f"{B200}/domain.xml"),
}


@pytest.mark.parametrize("name", sorted(JSON_OUTPUTS))
def test_every_json_output_carries_version_and_schema(name):
    r = run(*JSON_OUTPUTS[name])
    doc = json.loads(r.stdout)
    assert list(doc)[:2] == ["pcitopo", "schema"], name
    assert doc["pcitopo"] == __version__ and doc["schema"] == SCHEMA


def test_xmlfix_check_json_carries_the_verdict():
    from pcitopo.guest.verdict import ACCEPTED_CODES, REASON_CODES

    r = run("xmlfix", "--check", "--json", "--sysfs", B200, f"{B200}/domain.xml")
    assert r.returncode == 0
    check = json.loads(r.stdout)["check"]
    assert check["verdict"] == "ok" and check["reasons"] == []
    assert len(check["pairs"]) == 190 and {"a", "b", "host", "guest", "differs"} <= set(check["pairs"][0])
    flattened = [p for p in check["pairs"] if p["host"]["nvml"] == "PXB" and p["guest"]["nvml"] == "PIX" and not p["nvlink"]]
    assert check["accepted"] == [{"code": "broadcom-flattening", "text": ACCEPTED_CODES["broadcom-flattening"],
                                  "pairs": [f"{p['a']}-{p['b']}" for p in flattened]}] and len(flattened) == 12
    assert len(check["gdr"]) == 8 and all(g["gdr"] and not g["lost"] for g in check["gdr"])
    # a failing domain: each reason a code of the one table, plus its sentence
    r = run("xmlfix", "--check", "--json", "--sysfs", "fixtures/hgx-h100", "fixtures/hgx-h100/cases/no-numa/domain.xml")
    check = json.loads(r.stdout)["check"]
    assert r.returncode == 1 and check["verdict"] == "failed"
    assert [x["code"] for x in check["reasons"]] == ["pair-class", "no-guest-numa"]
    assert all(x["code"] in REASON_CODES and x["text"] for x in check["reasons"])
    assert any(p["host"]["nccl"] == "SYS" and p["guest"]["nccl"] == "PHB" for p in check["pairs"])


def test_a_reason_code_outside_the_table_is_refused():
    from pcitopo.guest.verdict import Reason

    with pytest.raises(ValueError, match="REASON_CODES"):
        Reason("made-up", "text")


def test_version_names_the_commit_in_a_checkout_and_not_outside():
    from pcitopo.program import git_commit

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    r = run("pcitopo", "--version")
    assert r.stdout.decode().strip() == f"pcitopo {__version__} (git {head[:12]})"
    assert git_commit(str(ROOT / "fixtures")) is None


LOCALES = {
    "C": {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
    "latin-1": {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": "iso-8859-1"},
}


@pytest.mark.parametrize("locale", sorted(LOCALES))
def test_human_outputs_work_in_any_locale(locale):
    env = LOCALES[locale]
    for args in (("--explain",), ("--summary",), ("--dot",), ("--check",)):
        r = run("xmlfix", *args, "--sysfs", B200, f"{B200}/domain.xml", env=env)
        assert r.returncode == 0, (args, r.stderr)
        assert b"internal error" not in r.stderr and b"\\u" not in r.stdout + r.stderr
    utf8 = run("xmlfix", "--check", "--sysfs", B200, f"{B200}/domain.xml").stderr.decode()
    assert "PXB→PIX" in utf8
    assert r.stderr.decode("ascii") == utf8.replace("→", "->")  # the same verdict, ASCII arrows
    r = run("pcitopo", "topo", "--tree", "--sysfs", B200, env=env)
    assert r.returncode == 0 and b"`-- " in r.stdout


def test_topo_json_does_not_depend_on_how_the_path_was_typed(tmp_path):
    here = run("pcitopo", "topo", "--json", "--sysfs", B200)
    there = run("pcitopo", "topo", "--json", "--sysfs", str(ROOT / B200) + "/", cwd=tmp_path)
    assert here.returncode == 0 and here.stdout == there.stdout
    assert json.loads(here.stdout)["host"].startswith("hgx-b200/sysfs.tar.gz sha256:")
    for cmd, args in (("pcitopo", ("pairs", "--json")), ("xmlfix", ("--summary",))):
        tail = (f"{B200}/domain.xml",) if cmd == "xmlfix" else ()
        a = run(cmd, *args, "--sysfs", B200, *tail)
        b = run(cmd, *args, "--sysfs", str(ROOT / B200), *(str(ROOT / t) for t in tail), cwd=tmp_path)
        assert a.stdout == b.stdout and str(ROOT).encode() not in b.stdout


def test_tree_calls_a_single_level_gen4_switch_one_level():
    from pcitopo.synth import host_from_topo
    from pcitopo.views.report import tree_text

    host = host_from_topo("""
        numa 0 cpus=0-3
        rc 0000:15 numa=0
          rp 15:01.0 preset=intel-rp
            us 16:00.0 preset=pex-gen4
              ds 17:00.0 preset=pex-gen4
                ep 18:00.0 preset=h100
    """)
    text = tree_text(host)
    assert "two-level" not in text and "(Broadcom Gen4 switch, one level)" in text


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """pcitopo as `pip install .` puts it (not editable), its dependencies from the test venv."""
    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("src")
    subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True)
    src = build / "pcitopo"
    subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True)
    import shutil

    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".venv", ".git", ".cache", "build", "*.egg-info", "fixtures", "tests",
                                                              "testkit", "bench", "docs", "deploy", ".hypothesis"))
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--target", str(target), str(src)], capture_output=True, timeout=600)
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    return target


def test_capture_from_topo_with_only_the_installed_package(installed, tmp_path):
    topo = tmp_path / "planned.topo"
    topo.write_text((ROOT / B200 / "host.topo").read_text())
    env = {**os.environ, "PYTHONPATH": str(installed)}
    code = ("import sys, pcitopo as t\n"
            "assert t.__file__.startswith(sys.argv[1]), t.__file__\n"
            "try:\n    import testkit\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('testkit importable')\n"
            "from pcitopo.cli.main import pcitopo_main\n"
            "sys.exit(pcitopo_main(sys.argv[2:]))\n")

    def pcitopo(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, str(installed), *args], cwd=tmp_path, env=env,
                              capture_output=True, timeout=300)

    r = pcitopo("capture", "--from-topo", "planned.topo", "-o", "node.tar.gz")
    assert r.returncode == 0, r.stderr
    assert b"captured 83 PCI functions and 4 NUMA nodes" in r.stderr and b"52 bits" in r.stderr
    mine = pcitopo("topo", "--json", "--sysfs", "node.tar.gz")
    fixture = run("pcitopo", "topo", "--json", "--sysfs", B200)
    assert json.loads(mine.stdout)["pairs"] == json.loads(fixture.stdout)["pairs"]
    (tmp_path / "bad.topo").write_text("numa 0 cpus=0-3\ncpu phys-bits=twelve\n")
    r = pcitopo("capture", "--from-topo", "bad.topo", "-o", "bad.tar.gz")
    assert r.returncode == 2 and r.stderr.decode().strip() == "pcitopo capture: bad.topo line 2: phys-bits='twelve' is not a number"
    (tmp_path / "nowidth.topo").write_text("numa 0 cpus=0-3\nrc 0000:15 numa=0\n  rp 15:01.0 preset=intel-rp\n")
    r = pcitopo("capture", "--from-topo", "nowidth.topo", "-o", "n.tar.gz")
    assert r.returncode == 0 and re.search(rb"nowidth.topo has no `cpu phys-bits=N` line", r.stderr)
