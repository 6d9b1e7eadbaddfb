"""Issue 26, "The operator's day, part 3": the demo on any laptop (finding 1), VM manifests read
like VMIs (2), a dry run that catches a sidecar that is not attached (3), and GPU examples that
are complete and whose "checked against" commands run as written (5, 6, 7). Each test names the
finding it covers; they run the installed console scripts on the fixtures and the shipped files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO as ROOT
from testkit import fixture_script
from pcitopo.topology.host.sources import MemoryTree
from pcitopo.topology.host.sysfs import open_host
from pcitopo.topology.model.cpuinfo import ADDRESS_SIZES_MEMBER

BIN = Path(sys.executable).parent
FIXTURES = ROOT / "fixtures"
generate = fixture_script("generate")


def run(cmd: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / cmd), *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def cpuinfo39(tmp_path: Path) -> str:
    """A laptop's /proc/cpuinfo: 39 bits physical (most Intel laptops)."""
    p = tmp_path / "cpuinfo-39"
    p.write_text("processor\t: 0\naddress sizes\t: 39 bits physical, 48 bits virtual\n")
    return str(p)


# -- finding 1: every fixture carries its node's CPU address width -------------------------------

@pytest.mark.parametrize("name", generate.fixture_names())
def test_f1_every_fixture_records_its_nodes_width(name, tmp_path, monkeypatch):
    """Finding 1: no fixture recorded its node's width, so the running machine's was used. Each
    tarball now holds the `address sizes` line of the CPU its board ships with, whatever machine
    reads it; fixtures/README.md says which CPU and width for each."""
    monkeypatch.setenv("PCITOPO_CPUINFO", cpuinfo39(tmp_path))
    cpu, phys, virt = generate.ADDRESS_SIZES[name]
    recorded = MemoryTree.from_tarball(FIXTURES / name / "sysfs.tar.gz").read(ADDRESS_SIZES_MEMBER)
    assert recorded == f"address sizes\t: {phys} bits physical, {virt} bits virtual\n".encode()
    width = open_host(FIXTURES / name).host_width()
    assert width.bits == phys and "recorded in" in width.origin
    readme = (FIXTURES / "README.md").read_text()
    assert f"| `{name}` | {cpu} | {phys} |" in readme


def test_f1_a_capture_of_a_capture_keeps_the_recorded_width(tmp_path):
    """Finding 1: `pcitopo capture --sysfs fixtures/hgx-b200` wrote this machine's width into the
    capture. Now the fixture's recorded width travels, through a capture of the capture too."""
    env = {"PATH": "/usr/bin:/bin", "PCITOPO_CPUINFO": cpuinfo39(tmp_path)}
    first, second = tmp_path / "node.tar.gz", tmp_path / "again.tar.gz"
    for src, out in ((FIXTURES / "hgx-b200", first), (first, second)):
        r = run("pcitopo", "capture", "--sysfs", str(src), "-o", str(out), env=env)
        assert r.returncode == 0, r.stderr
        assert "recorded the host CPU's physical-address width: 52 bits" in r.stderr
        assert MemoryTree.from_tarball(out).read(ADDRESS_SIZES_MEMBER) == b"address sizes\t: 52 bits physical, 57 bits virtual\n"


def test_f1_make_demo_succeeds_under_a_39_bit_cpuinfo(tmp_path):
    """Finding 1: on a 39-bit laptop `make demo` ended "xmlfix: the assigned devices need 5.00 TiB
    of 64-bit MMIO space ... the host CPU has 39 ... Error 2". The whole demo now runs with the
    running machine's cpuinfo pointed at a 39-bit one ($PCITOPO_CPUINFO), the CLI install taken
    as done (-o: the development install is there)."""
    env = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "PCITOPO_CPUINFO": cpuinfo39(tmp_path), "HOME": str(tmp_path)}
    r = subprocess.run(["make", "--no-print-directory", "-o", ".venv/.installed-cli", "demo"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "host CPU has 39" not in r.stdout + r.stderr and "Error" not in r.stderr
    assert "host width 52 bits, recorded in" in " ".join(r.stdout.split())
