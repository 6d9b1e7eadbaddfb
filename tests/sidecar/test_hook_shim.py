"""`onDefineDomain --vmi JSON --domain XML`, run the way KubeVirt's sidecar-shim runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pcitopo.libvirt.lenient import with_hostdev_modes
from pcitopo.serve.options import PREFIX
from testkit.hookkit import REPO, fixture_domain, fixture_sysfs, vmi_json
from testkit.server_proc import BIN

DOMAIN = fixture_domain("hgx-b200")
EXPECTED = (REPO / "fixtures/hgx-b200/expected.xml").read_bytes()


def shim(*args, sysfs: str | None = fixture_sysfs("hgx-b200")) -> subprocess.CompletedProcess:
    """As the shim does it: exec.Command("onDefineDomain", "--vmi", vmi, "--domain", xml), the
    sysfs root only through the environment; cwd is not the repository."""
    env = {k: v for k, v in os.environ.items() if k != "PCITOPO_SYSFS"}
    if sysfs is not None:
        env["PCITOPO_SYSFS"] = sysfs
    return subprocess.run([str(BIN / "onDefineDomain"), *args], capture_output=True, env=env, cwd="/", timeout=120)


def one_line(stderr: bytes) -> str:
    lines = stderr.decode().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_the_shim_way_gives_the_same_xml_as_xmlfix():
    r = shim("--vmi", vmi_json(DOMAIN).decode(), "--domain", DOMAIN.decode())
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED
    rec = json.loads(one_line(r.stderr))
    assert rec["door"] == "shim" and rec["outcome"] == "rewritten" and rec["vmi"] == "ml/gpu-vm"
    assert rec["devices_placed"] == DOMAIN.count(b"<hostdev ")


def test_equals_form_any_order_and_a_sysfs_flag():
    r = shim(f"--domain={DOMAIN.decode()}", f"--vmi={vmi_json(DOMAIN).decode()}", "--sysfs", fixture_sysfs("hgx-b200"), sysfs=None)
    assert r.returncode == 0, r.stderr
    assert r.stdout == EXPECTED


def test_the_domain_bytes_come_back_exactly_when_nothing_is_to_be_done():
    """Off and passthrough hand back what the shim passed, non-ASCII included, with only libvirt's
    default hostdev mode written where it was missing."""
    dom = DOMAIN.replace(b"<devices>", "<description>Gr\u00fc\u00dfe \u2013 GPU VM</description><devices>".encode(), 1)
    off = vmi_json(dom, {f"{PREFIX}mode": "off"})
    r = subprocess.run([str(BIN / "onDefineDomain"), b"--vmi", off, b"--domain", dom], capture_output=True, cwd="/", timeout=60)
    assert r.returncode == 0 and r.stdout == with_hostdev_modes(dom)[0]
    bad = dom.replace(b'bus="0x1b" slot="0x00"', b'bus="0x77" slot="0x00"', 1)
    r = shim("--vmi", vmi_json(bad, {f"{PREFIX}on-error": "passthrough"}).decode(), "--domain", bad.decode())
    assert r.returncode == 0 and r.stdout == with_hostdev_modes(bad)[0]
    assert json.loads(one_line(r.stderr))["outcome"] == "passthrough"


@pytest.mark.parametrize(
    "args,needle",
    [
        ((), "--domain is required"),
        (("--vmi", "{}"), "--domain is required"),
        (("--domain",), "--domain needs a value"),
        (("--domain", "<x/>", "--version", "v1alpha2"), "unknown option --version"),
        (("positional",), "unexpected argument 'positional'"),
        (("--domain", "<d/>", "--domain", "<d/>"), "--domain given twice"),
        (("--domain", "<domain><devices>"), "domain: malformed domain XML"),
        (("--domain", DOMAIN.decode(), "--vmi", json.dumps({"metadata": {"annotations": {f"{PREFIX}mode": "fast"}}})),
         "config: annotation pcitopo.kubevirt.io/mode is 'fast'; allowed values: mirror | off"),
        (("--domain", DOMAIN.decode(), "--vmi", "{"), "vmi: VMI JSON is malformed"),
        (("--domain", DOMAIN.replace(b'bus="0x1b" slot="0x00"', b'bus="0x77" slot="0x00"', 1).decode()), "0000:77:00.0"),
    ],
)
def test_failures_exit_2_with_one_line_and_no_xml(args, needle):
    r = shim(*args)
    assert r.returncode == 2 and r.stdout == b""
    line = one_line(r.stderr)
    assert line.startswith("onDefineDomain: ") and needle in line, line


def test_sysfs_from_the_environment():
    r = shim("--domain", DOMAIN.decode(), sysfs="/nonexistent/sysfs")
    assert r.returncode == 2 and one_line(r.stderr).startswith("onDefineDomain: sysfs: /nonexistent/sysfs")
    r = shim("--domain", DOMAIN.decode(), sysfs=fixture_sysfs("hgx-b200"))
    assert r.returncode == 0 and r.stdout == EXPECTED


def test_help_is_usage_on_stdout():
    r = shim("--help")
    assert r.returncode == 0 and r.stdout.startswith(b"usage: onDefineDomain --vmi JSON --domain XML")


def test_the_shim_never_loads_grpc():
    """One process per call: it pays for every import, so it loads only what the rewrite needs."""
    code = (
        "import sys, io, contextlib; from pcitopo.serve.shim import main\n"
        "buf = io.BytesIO()\n"
        "class Out:\n    buffer = buf\n"
        "sys.stdout = Out()\n"
        f"rc = main(['--domain', {DOMAIN.decode()!r}, '--sysfs', {fixture_sysfs('hgx-b200')!r}])\n"
        "sys.stdout = sys.__stdout__\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.stdout.strip() == "0 []", r.stdout + r.stderr
