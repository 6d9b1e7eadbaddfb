"""pcitopo doctor: config-space parsing, each check passing and failing, the planted-fault
fixture, the JSON contract, fleet outputs (Prometheus text, NFD features), exit codes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from pcitopo.checks.doctor import CHECKS, STATUSES, run_checks
from pcitopo.cli.main import pcitopo_main
from pcitopo.errors import SysfsError
from pcitopo.host.capture import capture
from pcitopo.host.configspace import (
    ACS_DT,
    EXT_CAP_ACS,
    EXT_CAP_ATS,
    NEEDS_ROOT,
    ConfigSpace,
    ConfigUnknown,
)
from pcitopo.host.sources import MemoryTree, Unreadable, resolve
from pcitopo.host.sysfs import DOCTOR_ATTRS, SysfsReader, open_host
from pcitopo.model.bars import IORESOURCE_MEM, IORESOURCE_MEM_64, IORESOURCE_PREFETCH, Bar, parse_resource
from pcitopo.model.tree import Topology
from pcitopo.synth import build_tree, parse_topo
from pcitopo.synth.doctorfiles import build_config
from pcitopo.views.exports import nfd_text, pix_facts, prometheus_text
from testkit import FIXTURES, REPO as ROOT

# What fixtures/hgx-h100-faults plants (its README lists the same): (check, bdf) of every fail.
PLANTED = {
    ("acs", "0000:17:01.0"),          # DT off (0x1d) above NIC0
    ("ats", "0000:29:00.0"),          # ATS present, disabled
    ("vfio-driver", "0000:3a:00.0"),  # GPU2 on nvidia
    ("iommu-group", "0000:5c:00.0"),  # NIC5 and GPU3 share group 900
    ("iommu-group", "0000:5d:00.0"),
    ("link", "0000:9a:00.0"),         # GPU4 trained x8
    ("numa", "0000:aa:00.0"),         # rc a7 without a NUMA node
    ("numa", "0000:ab:00.0"),
    ("bar", "0000:ba:00.0"),          # GPU6 BAR1 unassigned
    ("ats", "0000:da:00.0"),          # no ATS capability
    ("acs", "0000:d9:01.0"),          # RR cleared
}


def host_of(text: str) -> Topology:
    return Topology(SysfsReader(build_tree(parse_topo(textwrap.dedent(text), "t.topo"))))


def doctor(text: str, bdfs=None):
    from pcitopo.model.tree import Bdf

    return run_checks(host_of(text), [Bdf.parse(b) for b in bdfs] if bdfs else None)


def by_check(report, check: str, bdf: str | None = None):
    found = [f for f in report.findings if f.check == check and (bdf is None or f.bdf == bdf)]
    assert found, (check, bdf)
    return found


PAIR = """\
numa 0 cpus=0-3
numa 1 cpus=4-7
rc 0000:15 numa=0
  rp 15:01.0 preset=intel-rp {rp}
    us 16:00.0 preset=pex-gen5-oem {us}
      ds 17:00.0 {ds0}
        ep 18:00.0 preset=h100 {gpu}
      ds 17:01.0 {ds1}
        ep 19:00.0 preset=cx7-ib {nic}
rc 0000:80 numa=1
  rp 80:01.0 preset=intel-rp
    ep 81:00.0 preset=nvme {nvme}
"""


def pair(**kw) -> str:
    """PAIR with extra keys per line; the NIC is on vfio-pci unless nic= says driver=."""
    keys = ("rp", "us", "ds0", "ds1", "gpu", "nic", "nvme")
    values = {k: kw.get(k, "") for k in keys}
    if "driver=" not in values["nic"]:
        values["nic"] = f"driver=vfio-pci {values['nic']}"
    return PAIR.format(**values)


# -- config space ---------------------------------------------------------------------------------

def _cfg(caps) -> ConfigSpace:
    return ConfigSpace(build_config(0x1000, 0xC030, 0x060400, bridge=True, ext_caps=caps))


def test_acs_and_ats_registers_are_read_at_plus_six():
    cs = _cfg([(0x100, 0x0001, b""), (0x148, EXT_CAP_ACS, b"\x7f\x00\x5d\x00"), (0x480, EXT_CAP_ATS, b"\x20\x00\x00\x80")])
    assert cs.ext_capabilities() == {0x0001: 0x100, EXT_CAP_ACS: 0x148, EXT_CAP_ATS: 0x480}
    assert cs.acs_control() == 0x5D and cs.acs_control() & ACS_DT
    assert cs.ats_control() == 0x8000


def test_absent_capabilities_and_conventional_pci_are_none():
    assert _cfg([(0x100, 0x0001, b"")]).acs_control() is None
    assert _cfg([]).ats_control() is None  # header 0 at 0x100: no extended capabilities
    assert ConfigSpace(bytes(256)).acs_control() is None  # conventional PCI: no extended space


@pytest.mark.parametrize("data, why", [
    (bytes(64), NEEDS_ROOT),
    (bytes(10), "truncated"),
    (bytes(300), "truncated"),
    (b"", "truncated"),
])
def test_short_config_space_is_unknown(data, why):
    with pytest.raises(ConfigUnknown, match=why):
        ConfigSpace(data).acs_control()


def test_hostile_lists_are_unknown_never_endless():
    loop = bytearray(build_config(1, 2, 0x060400, bridge=True, ext_caps=[(0x100, 1, b""), (0x200, 1, b"")]))
    loop[0x200:0x204] = (1 | 1 << 16 | 0x100 << 20).to_bytes(4, "little")  # 0x200 -> 0x100 again
    with pytest.raises(ConfigUnknown, match="loops"):
        ConfigSpace(bytes(loop)).ext_capabilities()
    past = bytearray(build_config(1, 2, 0x060400, bridge=True, ext_caps=[(0x100, 1, b"")]))
    past[0x100:0x104] = (1 | 1 << 16 | 0xFFC << 20).to_bytes(4, "little")
    past[0xFFC:0x1000] = (EXT_CAP_ACS | 1 << 16).to_bytes(4, "little")
    with pytest.raises(ConfigUnknown, match="past the end"):
        ConfigSpace(bytes(past)).acs_control()
    below = bytearray(build_config(1, 2, 0x060400, bridge=True, ext_caps=[(0x100, 1, b"")]))
    below[0x100:0x104] = (1 | 1 << 16 | 0x40 << 20).to_bytes(4, "little")  # points into the header
    with pytest.raises(ConfigUnknown, match="outside"):
        ConfigSpace(bytes(below)).ext_capabilities()


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=4096), st.integers(0, 4095), st.integers(0, 0xFFFFFFFF))
def test_any_bytes_give_an_answer_or_unknown(noise, at, word):
    data = bytearray(build_config(1, 2, 0x060400, bridge=True))
    data[: len(noise)] = noise
    data[at & ~3: (at & ~3) + 4] = word.to_bytes(4, "little")
    for cs in (ConfigSpace(bytes(data)), ConfigSpace(bytes(noise))):
        for read in (cs.acs_control, cs.ats_control):
            try:
                value = read()
            except ConfigUnknown:
                continue
            assert value is None or 0 <= value <= 0xFFFF


# -- BARs -----------------------------------------------------------------------------------------

def test_resource_lines_parse_into_bars():
    text = ("0x0000000091000000 0x0000000091ffffff 0x0000000000040200\n"
            "0x0000000000000000 0x0000001fffffffff 0x000000000014220c\n"
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n")
    b0, b1, b2 = parse_resource(text)
    assert (b0.size, b0.is_mem, b0.is_64bit, b0.prefetchable, b0.assigned) == (16 << 20, True, False, False, True)
    assert (b1.size, b1.is_64bit, b1.prefetchable, b1.assigned) == (128 << 30, True, True, False)
    assert (b2.size, b2.assigned) == (0, True)
    assert Bar(1, 0, 0, IORESOURCE_MEM | IORESOURCE_PREFETCH | IORESOURCE_MEM_64).size == 0


@pytest.mark.parametrize("text", ["0x1 0x2\n", "0x1 0xzz 0x0\n", "0x10 0x1 0x200\n", "-0x10 0x1 0x200\n"])
def test_malformed_resource_is_a_sysfs_error(text):
    with pytest.raises(SysfsError):
        parse_resource(text)


# -- the fixtures ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["hgx-h100", "hgx-b200"])
def test_clean_fixtures_pass_every_check(name):
    report = run_checks(open_host(FIXTURES / name))
    assert report.summary()["fail"] == 0 and report.summary()["unknown"] == 0, [f for f in report.findings if f.status != "ok"]
    assert {f.check for f in report.findings} == set(CHECKS)


def test_planted_faults_are_found_on_their_devices_and_nothing_else_fails():
    report = run_checks(open_host(FIXTURES / "hgx-h100-faults"))
    assert {(f.check, f.bdf) for f in report.failed} == PLANTED
    assert {f.check for f in report.failed} == set(CHECKS) - {"iommu"}
    # the hostile config space on the storage NIC's root port: unknown, and only that
    assert [(f.check, f.bdf) for f in report.findings if f.status == "unknown"] == [("acs", "0000:c7:01.0")]
    readme = (FIXTURES / "hgx-h100-faults" / "README.md").read_text()
    for check, bdf in PLANTED:
        assert f"`{check}` | `{bdf}`" in readme


def test_a_capture_doctors_like_the_host(tmp_path):
    out = tmp_path / "host.tar.gz"
    capture(FIXTURES / "hgx-h100-faults", out)
    assert run_checks(open_host(out)).as_json() == run_checks(open_host(FIXTURES / "hgx-h100-faults")).as_json()
    tree = MemoryTree.from_tarball(out)
    gpu = resolve(tree, "bus/pci/devices/0000:18:00.0")
    assert {a for a in DOCTOR_ATTRS} <= set(tree.listdir(gpu) or [])
    assert tree.read("kernel/iommu_groups/900/type") == b"DMA-FQ\n"
    assert set(tree.listdir("kernel/iommu_groups/900/devices") or []) == {"0000:5c:00.0", "0000:5d:00.0"}
    assert tree.listdir("class/iommu")


# -- each check, passing and failing ----------------------------------------------------------------

def test_iommu_on_identity_and_off():
    assert by_check(doctor(pair()), "iommu")[0].status == "ok"
    assert by_check(doctor(pair(gpu="iommu-type=identity")), "iommu")[0].status == "warn"
    off = pair(**{k: "omit=iommu_group" for k in ("rp", "us", "ds0", "ds1", "gpu", "nic", "nvme")})
    off = off.replace("rp 80:01.0 preset=intel-rp", "rp 80:01.0 preset=intel-rp omit=iommu_group")
    report = doctor(off)
    assert by_check(report, "iommu")[0].status == "fail" and by_check(report, "iommu")[0].bdf is None
    assert by_check(report, "iommu-group", "0000:18:00.0")[0].status == "fail"


def test_vfio_driver():
    assert by_check(doctor(pair()), "vfio-driver", "0000:18:00.0")[0].status == "ok"
    bad = by_check(doctor(pair(gpu="driver=nvidia")), "vfio-driver", "0000:18:00.0")[0]
    assert bad.status == "fail" and "driver_override" in bad.fix
    assert by_check(doctor(pair(gpu="driver=none override=vfio-pci")), "vfio-driver", "0000:18:00.0")[0].status == "ok"
    assert by_check(doctor(pair(gpu="driver=nvidia override=vfio-pci")), "vfio-driver", "0000:18:00.0")[0].status == "warn"
    # a NIC with a GPU beside it must be on vfio-pci; a lone host NIC may keep its driver ...
    assert by_check(doctor(pair(nic="driver=mlx5_core")), "vfio-driver", "0000:19:00.0")[0].status == "fail"
    lone = pair(gpu="class=0x010802 ids=144d:a80a", nic="driver=mlx5_core")  # no GPU at all
    assert by_check(doctor(lone), "vfio-driver", "0000:19:00.0")[0].status == "ok"
    # ... unless named: a named device is one the operator means to pass through
    assert by_check(doctor(lone, ["19:00.0"]), "vfio-driver", "0000:19:00.0")[0].status == "fail"


def test_iommu_group():
    assert by_check(doctor(pair()), "iommu-group", "0000:18:00.0")[0].status == "ok"
    shared = doctor(pair(gpu="iommu=50", nic="iommu=50"))
    bad = by_check(shared, "iommu-group", "0000:18:00.0")[0]
    assert bad.status == "fail" and "0000:19:00.0 (NIC0)" in bad.message
    # the bridges above a device may share its group (no ACS below them)
    assert by_check(doctor(pair(ds0="iommu=51", gpu="iommu=51")), "iommu-group", "0000:18:00.0")[0].status == "ok"


def test_acs():
    report = doctor(pair())
    assert by_check(report, "acs", "0000:17:00.0")[0].status == "ok"
    assert by_check(report, "acs", "0000:16:00.0")[0].message.startswith("no ACS capability")  # upstream port
    dt = by_check(doctor(pair(ds0="fault=acs-dt-off")), "acs", "0000:17:00.0")[0]
    assert dt.status == "fail" and "0x1d" in dt.message and "ECAP_ACS+0x6.w=0x005d" in dt.fix
    assert by_check(doctor(pair(rp="fault=acs-rr-off")), "acs", "0000:15:01.0")[0].status == "fail"
    short = by_check(doctor(pair(ds0="fault=config-short")), "acs", "0000:17:00.0")[0]
    assert (short.status, short.message) == ("unknown", "ACS control unknown (needs root)")
    for hostile in ("config-loop", "config-truncated", "config-past-end"):
        assert by_check(doctor(pair(ds0=f"fault={hostile}")), "acs", "0000:17:00.0")[0].status == "unknown"


def test_ats():
    assert by_check(doctor(pair()), "ats", "0000:19:00.0")[0].status == "ok"
    hidden = by_check(doctor(pair(nic="fault=no-ats")), "ats", "0000:19:00.0")[0]
    assert hidden.status == "fail" and "mlxconfig -y -d 0000:19:00.0 set ATS_ENABLED=true" in hidden.fix
    # the capability is there, so the firmware offers ATS already: the fix is the kernel's side only
    off = by_check(doctor(pair(nic="fault=ats-off")), "ats", "0000:19:00.0")[0]
    assert off.status == "fail" and "pci=noats" in off.fix and "mlxconfig" not in off.fix
    assert by_check(doctor(pair(nic="fault=config-short")), "ats", "0000:19:00.0")[0].status == "unknown"
    assert not [f for f in doctor(pair()).findings if f.check == "ats" and f.bdf == "0000:18:00.0"]  # NICs only


def test_link():
    assert by_check(doctor(pair()), "link", "0000:18:00.0")[0].status == "ok"
    assert by_check(doctor(pair(gpu="cur-width=8")), "link", "0000:18:00.0")[0].status == "fail"
    assert by_check(doctor(pair(gpu="cur-speed=2.5")), "link", "0000:18:00.0")[0].status == "warn"  # idle GPU
    assert by_check(doctor(pair(ds1="cur-speed=16")), "link", "0000:17:01.0")[0].status == "fail"


def test_numa():
    assert by_check(doctor(pair()), "numa", "0000:18:00.0")[0].status == "ok"
    bad = pair().replace("rc 0000:15 numa=0", "rc 0000:15 numa=-1")
    assert by_check(doctor(bad), "numa", "0000:18:00.0")[0].status == "fail"
    assert by_check(doctor(pair(gpu="numa=-1")), "numa", "0000:18:00.0")[0].status == "warn"  # bridge above knows
    single = "\n".join(line for line in bad.splitlines() if not line.startswith("numa 1")).replace("numa=1", "numa=0")
    assert by_check(doctor(single), "numa", "0000:18:00.0")[0].status == "ok"


def test_bar():
    assert by_check(doctor(pair()), "bar", "0000:18:00.0")[0].status == "ok"
    bad = by_check(doctor(pair(gpu="fault=bar-unassigned")), "bar", "0000:18:00.0")[0]
    assert bad.status == "fail" and "BAR1 (128 GiB, 64-bit, prefetchable)" in bad.message


def test_named_devices_and_only_their_paths():
    report = doctor(pair(), ["81:00.0"])
    assert {f.bdf for f in report.findings} == {None, "0000:81:00.0", "0000:80:01.0"}


# -- contract, outputs, exit codes ------------------------------------------------------------------

def test_json_contract(capsys):
    assert pcitopo_main(["doctor", "--json", "--sysfs", str(FIXTURES / "hgx-h100-faults")]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"pcitopo", "schema", "checks", "summary"} and set(doc["summary"]) == set(STATUSES)
    for c in doc["checks"]:
        assert set(c) == {"check", "status", "bdf", "message", "fix"}
        assert c["check"] in CHECKS and c["status"] in STATUSES
        assert c["bdf"] is None if c["check"] == "iommu" else re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", c["bdf"])
    assert sum(doc["summary"].values()) == len(doc["checks"])


def test_exit_codes_and_human_output(capsys):
    assert pcitopo_main(["doctor", "--sysfs", str(FIXTURES / "hgx-b200")]) == 0
    assert capsys.readouterr().out.startswith("verdict: ready")
    assert pcitopo_main(["doctor", "--sysfs", str(FIXTURES / "hgx-h100-faults")]) == 1
    lines = capsys.readouterr().out.splitlines()
    # one line per kind: the two devices sharing a group and the two without a NUMA node are one
    # line each; then the unknown and the verdict
    assert lines[-1].startswith("verdict: NOT READY") and len(lines) == len(PLANTED) - 2 + 2
    assert any(line.startswith("FAIL    iommu-group 1 GPU, 1 NIC sharing an IOMMU group with other devices (-v names them): "
                               "GPU3, NIC5  fix: ") for line in lines)
    assert any(line.startswith("FAIL    numa        1 GPU, 1 NIC with numa_node -1 on a 2-node host") for line in lines)
    assert any(line.startswith("FAIL    bar         GPU6 0000:ba:00.0: ") and "fix: " in line for line in lines)
    assert pcitopo_main(["doctor", "--sysfs", str(FIXTURES / "hgx-b200"), "12:34.5"]) == 2
    assert pcitopo_main(["doctor", "--sysfs", "/nonexistent"]) == 2
    assert "not a PCI address" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:  # argparse: one line, exit 2, like every bad input
        pcitopo_main(["doctor", "--json", "--nfd"])
    assert usage.value.code == 2 and "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["hgx-b200", "hgx-h100-faults"])
def test_prometheus_output_parses(name, capsys):
    from prometheus_client.parser import text_string_to_metric_families

    pcitopo_main(["doctor", "--prometheus", "--sysfs", str(FIXTURES / name)])
    text = capsys.readouterr().out
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"pcitopo_check_status", "pcitopo_checks", "pcitopo_gdr_ready", "pcitopo_gpu_nic_pix_pairs"} <= set(families)
    status = families["pcitopo_check_status"].samples
    assert all(set(s.labels) == {"check", "bdf", "label"} and s.value in (0, 1, 2, 3) for s in status)
    fails = {(s.labels["check"], s.labels["bdf"]) for s in status if s.value == 2}
    assert fails == (PLANTED if name == "hgx-h100-faults" else set())
    pix = {s.labels["view"]: s.value for s in families["pcitopo_gpu_nic_pix_pairs"].samples}
    # B200: NCCL flattens the two-level Broadcom complex (PIX to both NICs of the pair)
    assert pix == ({"nccl": 16, "nvml": 8} if name == "hgx-b200" else {"nccl": 8, "nvml": 8})


NFD_LINE = re.compile(r"pcitopo\.kubevirt\.io/[a-z0-9]([a-z0-9-]*[a-z0-9])?=[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")


@pytest.mark.parametrize("name, ready", [("hgx-b200", "true"), ("hgx-h100", "true"), ("hgx-h100-faults", "false")])
def test_nfd_output_is_key_value_lines(name, ready, tmp_path, capsys):
    out = tmp_path / "pcitopo"
    prom = tmp_path / "pcitopo.prom"
    pcitopo_main(["doctor", "--nfd", "--sysfs", str(FIXTURES / name), "--nfd-out", str(out), "--prometheus-out", str(prom)])
    text = capsys.readouterr().out
    assert out.read_text() == text and prom.read_text().startswith("# HELP")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pcitopo", "pcitopo.prom"]  # no temporary left
    features = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        assert NFD_LINE.fullmatch(line), line
        k, v = line.split("=", 1)
        features[k] = v
    assert features["pcitopo.kubevirt.io/gdr-ready"] == ready
    assert features["pcitopo.kubevirt.io/all-gpus-have-pix-nic"] == "true"
    assert features["pcitopo.kubevirt.io/check-acs"] == ("fail" if ready == "false" else "ok")


def test_fleet_facts_count_only_checked_devices():
    report = run_checks(open_host(FIXTURES / "hgx-h100"))
    pix = pix_facts(open_host(FIXTURES / "hgx-h100"), report.targets)
    assert (pix.gpus, pix.nics, pix.pairs_nccl, pix.gpus_with_pix_nic) == (8, 12, 8, 8)
    assert "pcitopo_gdr_ready 1" in prometheus_text(report, pix)
    assert "gdr-ready=true" in nfd_text(report, pix)


@pytest.mark.live
@pytest.mark.skipif(not shutil.which("setpriv") or not Path("/sys/bus/pci/devices").is_dir(), reason="needs setpriv and PCI in /sys")
def test_an_unprivileged_read_of_live_config_space_is_unknown_needs_root(tmp_path):
    """The kernel gives a reader without CAP_SYS_ADMIN 64 bytes of config space: read one
    device's config as nobody (with cat, the way the unprivileged sidecar reads), put those
    bytes in a captured tree, and the doctor says unknown (needs root) instead of guessing."""
    devices = sorted(Path("/sys/bus/pci/devices").iterdir())
    cap = tmp_path / "live.tar.gz"
    capture("/sys", cap)
    tree = MemoryTree.from_tarball(cap)
    nic = next((d.name for d in devices if (d / "class").read_text().startswith("0x02")), None)
    if nic is None:
        pytest.skip("no network controller on this machine")
    unpriv = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", f"/sys/bus/pci/devices/{nic}/config"],
                            capture_output=True, check=True, timeout=30).stdout
    assert len(unpriv) == 64
    tree.add_file(f"{resolve(tree, f'bus/pci/devices/{nic}')}/config", unpriv)
    from pcitopo.model.tree import Bdf

    report = run_checks(Topology(SysfsReader(tree)), [Bdf.parse(nic)])
    ats = by_check(report, "ats")[0]
    assert (ats.status, ats.message) == ("unknown", "ATS state unknown (needs root)")


# -- the DaemonSet ---------------------------------------------------------------------------------

DAEMONSET = ROOT / "deploy" / "base" / "doctor.yaml"


def test_the_daemonset_passes_kubernetes_schema_validation():
    kv = pytest.importorskip("kubernetes_validate")
    import yaml

    docs = [d for d in yaml.safe_load_all(DAEMONSET.read_text()) if d]
    assert [d["kind"] for d in docs] == ["DaemonSet"]
    for doc in docs:
        kv.validate(doc, kv.latest_version(), strict=True)  # raises on a typo or a wrong type
    bad = json.loads(json.dumps(docs[0]))
    bad["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesytem"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, kv.latest_version(), strict=True)


def test_the_daemonset_runs_the_real_command_with_what_it_needs(tmp_path, capsys):
    import yaml

    ds = list(yaml.safe_load_all(DAEMONSET.read_text()))[0]
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    argv = c["command"] + c["args"]  # the doctor is the container's one process (no shell)
    assert argv[:2] == ["pcitopo", "doctor"]
    every = argv.index("--every")
    assert int(argv[every + 1]) == 600
    del argv[every:every + 2]  # one pass here
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    hostpaths = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert hostpaths[mounts["/host/sys"]] == "/sys" and argv[argv.index("--sysfs") + 1] == "/host/sys"
    assert hostpaths[mounts["/features.d"]] == "/etc/kubernetes/node-feature-discovery/features.d"
    assert c["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]  # config space past 64 bytes
    # the same arguments, pointed at a fixture and a scratch directory, work
    real = {"/host/sys": str(FIXTURES / "hgx-b200"), "/textfile/pcitopo.prom": str(tmp_path / "pcitopo.prom"),
            "/features.d/pcitopo": str(tmp_path / "pcitopo"), "/var/run/pcitopo/doctor.json": str(tmp_path / "doctor.json")}
    assert hostpaths[mounts["/var/run/pcitopo"]] == "/var/run/pcitopo"  # where the node hook reads it
    assert pcitopo_main([real.get(a, a) for a in argv[1:]]) == 0
    assert json.loads((tmp_path / "doctor.json").read_text())["checks"]
    assert (tmp_path / "pcitopo").read_text().count("pcitopo.kubevirt.io/gdr-ready=true") == 1
    assert "pcitopo_gdr_ready 1" in (tmp_path / "pcitopo.prom").read_text()


def test_the_cli_references_sample_run_is_what_the_command_prints(capsys):
    text = (ROOT / "docs" / "CLI.md").read_text()
    block = text[text.index("```console\n$ pcitopo doctor"):]
    block = block[len("```console\n"): block.index("\n```")]
    runs = [chunk for chunk in block.split("$ ")[1:]]
    for chunk in runs:
        cmd, _, shown = chunk.partition("\n")
        if not cmd.startswith("pcitopo doctor"):
            continue
        pcitopo_main(cmd.split()[1:])
        assert capsys.readouterr().out == shown.rstrip("\n") + "\n", cmd


def test_labels_are_host_wide_whichever_devices_are_named():
    """A device's label is its number among all the host's GPUs/NICs (as `pcitopo topo` and
    `partitions` print it), not its rank among the BDFs given: 0000:9a:00.0 is GPU4 either way."""
    from pcitopo.model.labels import default_devices, label_devices
    from pcitopo.model.tree import Bdf

    topo = open_host(str(FIXTURES / "hgx-h100-faults"))
    topo_labels = {str(lab.function.bdf): lab.label for lab in label_devices(topo, default_devices(topo))}
    assert topo_labels["0000:9a:00.0"] == "GPU4"
    for named in (None, ["0000:9a:00.0"], ["0000:ba:00.0", "0000:29:00.0", "0000:9a:00.0"]):
        report = run_checks(topo, [Bdf.parse(b) for b in named] if named else None)
        got = {f.bdf: f.label for f in report.findings if f.bdf in topo_labels}
        assert got and all(topo_labels[b] == lab for b, lab in got.items()), named


class _CountingTree(MemoryTree):
    """A real in-memory tree that counts reads per file and can refuse one path the way a
    directory source refuses a file it may not open (an Unreadable with the errno's text)."""

    def __init__(self, tree: MemoryTree, refuse: str | None = None):
        self.__dict__.update(tree.__dict__)
        self.reads: dict[str, int] = {}
        self.refuse = refuse

    def read(self, rel):
        self.reads[rel] = self.reads.get(rel, 0) + 1
        if self.refuse is not None and rel == self.refuse:
            return Unreadable("Permission denied")
        return super().read(rel)


def test_the_bar_check_uses_the_readers_bars_and_reads_resource_once():
    """The reader parses ``resource`` into PciFunction.bars; the doctor uses that, not a second
    read and parse of its own (the two could disagree)."""
    tree = _CountingTree(build_tree(parse_topo(textwrap.dedent(pair(gpu="fault=bar-unassigned")), "t.topo")))
    report = run_checks(Topology(SysfsReader(tree)), None)
    assert by_check(report, "bar", "0000:18:00.0")[0].status == "fail"
    resources = {p: n for p, n in tree.reads.items() if p.endswith("/resource")}
    assert any(p.endswith("/0000:18:00.0/resource") for p in resources) and set(resources.values()) == {1}


def test_an_unreadable_config_is_not_called_needs_root():
    """Anyone may read ``config``; without CAP_SYS_ADMIN the kernel returns 64 bytes, and that
    length alone means "needs root". A file that cannot be opened says its own reason."""
    base = build_tree(parse_topo(textwrap.dedent(pair()), "t.topo"))
    ds = resolve(base, "bus/pci/devices/0000:17:00.0")
    report = run_checks(Topology(SysfsReader(_CountingTree(base, refuse=f"{ds}/config"))), None)
    acs = by_check(report, "acs", "0000:17:00.0")[0]
    assert (acs.status, acs.message, acs.fix) == ("unknown", "ACS control unknown (config unreadable (Permission denied))", None)


def test_hostile_files_give_unknown_or_a_diagnosis_never_a_crash():
    tree = build_tree(parse_topo(textwrap.dedent(pair()), "t.topo"))
    gpu = resolve(tree, "bus/pci/devices/0000:18:00.0")
    nic = resolve(tree, "bus/pci/devices/0000:19:00.0")
    ds = resolve(tree, "bus/pci/devices/0000:17:00.0")
    tree.add_file(f"{gpu}/resource", "0x1 not hex at all\n")
    tree.add_link(f"{ds}/config", "../../../../../../dev/zero")  # a link where a file belongs
    tree.add_file(f"{nic}/config", b"\xff" * 4096)  # every header 0xffffffff
    tree.add_file(f"{nic}/driver_override", "x" * 10_000)  # larger than any attribute
    from pcitopo.model.tree import Bdf

    report = run_checks(Topology(SysfsReader(tree)), None)
    bar = by_check(report, "bar", "0000:18:00.0")[0]
    assert bar.status == "unknown" and "not 'start end flags' in hex" in bar.message
    assert by_check(report, "acs", "0000:17:00.0")[0].status == "unknown"
    ats = by_check(report, "ats", "0000:19:00.0")[0]
    assert ats.status == "unknown" and "does not respond" in ats.message
    assert by_check(report, "vfio-driver", "0000:19:00.0")[0].status == "ok"  # bound to vfio-pci
    assert report.summary()["unknown"] >= 2 and Bdf.parse("19:00.0")


@pytest.mark.parametrize("key, fragment", [
    ("fault=acs-everything", "unknown fault 'acs-everything'"),
    ("iommu-type=translated", "iommu-type='translated' is not one of DMA, DMA-FQ, identity"),
])
def test_bad_doctor_keys_in_a_description_name_the_line(key, fragment):
    from pcitopo.synth import TopoError

    with pytest.raises(TopoError, match=re.escape(f"t.topo line 7: {fragment}")):
        host_of(pair(gpu=key))


# -- the report on a screen, and fixes that fit the state they fix ----------------------------------

def iommu_off_h100(tmp_path) -> Path:
    """fixtures/hgx-h100 as a node with the IOMMU off, captured without root (64 bytes of
    config space): the node of the trial that printed 154 lines."""
    from pcitopo.host.capture import capture_tree
    from pcitopo.synth.doctorfiles import iommu_off

    spec = iommu_off(parse_topo((FIXTURES / "hgx-h100" / "host.topo").read_text(), "hgx-h100"))
    out = tmp_path / "iommu-off.tar.gz"
    # captured as `pcitopo capture` captures a live sysfs: it records that a link it lacks is
    # absent (a plain copy is unknown instead: tests/test_device_requests.py)
    capture_tree(build_tree(spec), 52)[0].write_tarball(out)
    return out


def test_an_iommu_off_node_fits_on_a_screen_and_verbose_lists_every_device(tmp_path, capsys):
    node = iommu_off_h100(tmp_path)
    assert pcitopo_main(["doctor", "--sysfs", str(node)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 30, "\n".join(lines)
    assert lines[0].startswith("FAIL    iommu       host: IOMMU off")
    driver = next(line for line in lines if " vfio-driver " in line)
    # every GPU and every NIC a GPU sits at PXB or closer to, on one line, with one fix for all
    assert "8 GPUs, 8 NICs bound to no driver, not vfio-pci: GPU0-7, NIC0-2,5-8,11  fix: once the IOMMU is on" in driver
    assert "driver/unbind" not in driver and driver.count("for d in ") == 1
    assert any(line.startswith("FAIL    iommu-group 8 GPUs, 12 NICs in no IOMMU group") for line in lines)
    assert any(line.startswith("UNKNOWN acs         10 root ports, 8 upstream ports, 16 downstream ports with ACS control "
                               "unknown (needs root): above GPU0-7, NIC0-11") for line in lines)
    report = run_checks(open_host(node))
    assert len(report.failed) > 30  # the findings are all still there, per device: in --json and -v
    assert pcitopo_main(["doctor", "-v", "--sysfs", str(node)]) == 1
    assert len(capsys.readouterr().out.splitlines()) == len(report.findings) + 1


def _device_dir(tree: MemoryTree, bdf: str) -> str:
    return resolve(tree, f"bus/pci/devices/{bdf}")


def fix_problems(tree: MemoryTree, f) -> list[str]:
    """What in ``f``'s fix commands does not fit the tree they are meant for: a sysfs path the
    kernel would not have there, a tool pointed at a device without what it sets."""
    from pcitopo.host.configspace import ConfigSpace

    run = f.remedy.run if f.remedy else ""
    out = []
    for path in re.findall(r"/sys/\S+", run):
        rel = path.removeprefix("/sys/").rstrip(";")
        if rel == "bus/pci/drivers_probe":
            continue  # the PCI bus always has it
        m = re.fullmatch(r"bus/pci/devices/([0-9a-f:.]+)/(.+)", rel)
        if m is None:
            out.append(f"{path}: not a device file")
            continue
        d = _device_dir(tree, m.group(1))
        if m.group(2) == "driver/unbind":  # a driver's own file: there only when a driver holds the device
            if tree.readlink(f"{d}/driver") is None:
                out.append(f"{path}: no driver holds {m.group(1)}")
        elif not isinstance(tree.read(f"{d}/{m.group(2)}"), bytes):
            out.append(f"{path}: no such file")
    for bdf in re.findall(r"setpci -s (\S+) ECAP_ACS", run):
        if ConfigSpace(tree.read(f"{_device_dir(tree, bdf)}/config")).acs_control() is None:
            out.append(f"setpci: {bdf} has no ACS capability")
    for bdf in re.findall(r"mlxconfig -y -d (\S+) ", run):
        if tree.read(f"{_device_dir(tree, bdf)}/vendor") != b"0x15b3\n":
            out.append(f"mlxconfig: {bdf} is not a Mellanox/NVIDIA NIC")
    return out


# (what the tree is, the .topo keys on the GPU/NIC/bridge, the finding checked, what its fix must say)
FIX_STATES = [
    ("bound to a host driver", {"gpu": "driver=nvidia"}, ("vfio-driver", "0000:18:00.0"), "driver/unbind"),
    ("bound to no driver", {"gpu": "driver=none"}, ("vfio-driver", "0000:18:00.0"), "drivers_probe"),
    ("no driver and no IOMMU group", {"gpu": "driver=none omit=iommu_group"}, ("vfio-driver", "0000:18:00.0"), "once the IOMMU is on"),
    ("override set, another driver holds it", {"gpu": "driver=nvidia override=vfio-pci"}, ("vfio-driver", "0000:18:00.0"),
     "driver/unbind"),
    ("ACS DT off", {"ds0": "fault=acs-dt-off"}, ("acs", "0000:17:00.0"), "ECAP_ACS+0x6.w=0x005d"),
    ("ACS RR off", {"rp": "fault=acs-rr-off"}, ("acs", "0000:15:01.0"), "ECAP_ACS+0x6.w="),
    ("no ATS capability", {"nic": "fault=no-ats"}, ("ats", "0000:19:00.0"), "ATS_ENABLED=true"),
    ("ATS present, disabled", {"nic": "fault=ats-off"}, ("ats", "0000:19:00.0"), "pci=noats"),
    ("numa_node -1 below a bridge that has one", {"gpu": "numa=-1"}, ("numa", "0000:18:00.0"), "/numa_node"),
    ("numa_node -1 everywhere", {}, ("numa", "0000:18:00.0"), "BIOS"),
    ("config space cut at 64 bytes", {"ds0": "fault=config-short"}, ("acs", "0000:17:00.0"), "as root"),
    ("link trained narrow", {"gpu": "cur-width=8"}, ("link", "0000:18:00.0"), "reseat"),
    ("BAR unassigned", {"gpu": "fault=bar-unassigned"}, ("bar", "0000:18:00.0"), "pci=realloc"),
    ("group shared", {"gpu": "iommu=50", "nic": "iommu=50"}, ("iommu-group", "0000:18:00.0"), "ACS"),
]


@pytest.mark.parametrize("state, keys, which, says", FIX_STATES, ids=[s[0] for s in FIX_STATES])
def test_each_fix_fits_the_state_it_fixes(state, keys, which, says):
    text = pair(**keys)
    if state == "numa_node -1 everywhere":
        text = text.replace("rc 0000:15 numa=0", "rc 0000:15 numa=-1")
    tree = build_tree(parse_topo(textwrap.dedent(text), "t.topo"))
    report = run_checks(Topology(SysfsReader(tree)))
    f = by_check(report, *which)[0]
    assert f.status in ("fail", "warn", "unknown") and f.fix and says in f.fix, f
    assert fix_problems(tree, f) == []
    # and no other fix on that host names what is not there
    assert [p for g in report.findings if g.status != "ok" for p in fix_problems(tree, g)] == []


def test_the_fix_checker_sees_a_wrong_fix():
    """The old fix for an unbound device (``driver/unbind`` with no driver) is refused."""
    from pcitopo.checks.findings import Finding, Fix

    tree = build_tree(parse_topo(textwrap.dedent(pair(gpu="driver=none")), "t.topo"))
    wrong = Fix(run="echo 0000:18:00.0 > /sys/bus/pci/devices/0000:18:00.0/driver/unbind")
    assert fix_problems(tree, Finding("vfio-driver", "fail", "0000:18:00.0", "x", wrong.text(), remedy=wrong))


def test_one_line_for_many_devices_runs_each_devices_own_fix(tmp_path):
    """The loop of a grouped line, expanded, is every device's own commands."""
    from pcitopo.views.doctor_report import group_fix

    report = run_checks(open_host(iommu_off_h100(tmp_path)))
    failed = [f for f in report.failed if f.check == "vfio-driver"]
    line = group_fix(failed)
    body = line[line.index("; do ") + 5: line.rindex("; done")]
    assert line.split(" for d in ")[1].split(";")[0].split() == [f.bdf for f in failed]
    assert [body.replace("$d", f.bdf) for f in failed] == [f.remedy.run for f in failed]


def test_labels_compact_into_ranges():
    from pcitopo.views.doctor_report import compact

    assert compact(["GPU0", "GPU1", "GPU2", "NIC0", "NIC2", "NIC3", "GPU7"]) == "GPU0-2,7, NIC0,2-3"
    assert compact(["NIC@0000:17:00.2", "GPU0", "NIC@0000:17:00.2"]) == "NIC@0000:17:00.2, GPU0"


def test_json_out_writes_the_json_report_atomically(tmp_path, capsys):
    out = tmp_path / "doctor.json"
    assert pcitopo_main(["doctor", "--json", "--json-out", str(out), "--sysfs", str(FIXTURES / "hgx-h100-faults")]) == 1
    shown = capsys.readouterr().out
    assert out.read_text() == shown and json.loads(shown)["summary"]["fail"] == len(PLANTED)
    assert pcitopo_main(["doctor", "--json-out", str(out), "--sysfs", str(FIXTURES / "hgx-b200")]) == 0
    assert capsys.readouterr().out.startswith("verdict: ready")  # the human report on stdout, the JSON in the file
    assert json.loads(out.read_text())["summary"]["fail"] == 0
    assert [p.name for p in tmp_path.iterdir()] == ["doctor.json"]  # no temporary left
    assert pcitopo_main(["doctor", "--json-out", str(tmp_path / "no" / "such" / "dir.json"), "--sysfs", str(FIXTURES / "hgx-b200")]) == 2


def test_summary_does_not_call_a_vm_on_a_host_that_is_not_ready_ok(capsys):
    from pcitopo.cli.main import xmlfix_main

    domain = str(FIXTURES / "hgx-h100" / "domain.xml")
    xmlfix_main(["--summary", "--sysfs", str(FIXTURES / "hgx-h100-faults"), domain])
    lines = capsys.readouterr().out.splitlines()
    verdict, doctor_line = lines[2], lines[3]
    assert doctor_line.startswith("doctor:  NOT READY")
    assert verdict.startswith("verdict: not ok: host not ready (15 doctor check(s) failed); ") and "check ok" not in verdict.split(";")[0]
    xmlfix_main(["--summary", "--sysfs", str(FIXTURES / "hgx-h100"), domain])
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("verdict: check ok: ") and lines[3].startswith("doctor:  ready")


def test_a_diagnosis_changed_after_the_doctor_made_it_is_shown_by_its_own_words(tmp_path):
    """The node hook puts the doctor report's status, message and fix on its own findings
    (dataclasses.replace): those are shown as they are, never under the kind or fix they had."""
    from dataclasses import replace

    from pcitopo.checks.findings import DoctorReport
    from pcitopo.views.doctor_report import report_text

    report = run_checks(open_host(iommu_off_h100(tmp_path)))
    acs = [f for f in report.findings if f.check == "acs"]
    changed = [replace(f, status="fail", message="ACS control 0x1d (the doctor's report)", fix="setpci from the report")
               if i == 0 else f for i, f in enumerate(acs)]
    text = report_text(DoctorReport(report.host, tuple(changed)))
    first = acs[0]
    assert f"FAIL    acs         {first.label} {first.bdf}: ACS control 0x1d (the doctor's report)  fix: setpci from the report" \
        in text.splitlines()
    assert first.label.startswith("root-port above")  # the others keep their line, one root port fewer
    assert "UNKNOWN acs         8 upstream ports, 16 downstream ports, 9 root ports with ACS control unknown (needs root)" in text


def test_the_json_out_file_is_what_the_unprivileged_node_hook_reads(tmp_path):
    """The contract between the doctor DaemonSet and the node hook: the root doctor's
    --json-out file fills in the acs/ats checks an unprivileged read leaves unknown."""
    from pcitopo.serve.plugin.doctorfile import DoctorFile, with_doctor_file

    out = tmp_path / "doctor.json"
    assert pcitopo_main(["doctor", "--json-out", str(out), "--sysfs", str(FIXTURES / "hgx-h100-faults")]) == 1
    tree = MemoryTree.from_tarball(FIXTURES / "hgx-h100-faults" / "sysfs.tar.gz")
    for bdf in tree.listdir("bus/pci/devices") or []:  # the node hook's view: 64 bytes of config space
        rel = f"{_device_dir(tree, bdf)}/config"
        tree.add_file(rel, tree.read(rel)[:64])
    unprivileged = run_checks(Topology(SysfsReader(tree)))
    assert {f.status for f in unprivileged.findings if f.check in ("acs", "ats")} == {"unknown"}
    merged, note = with_doctor_file(unprivileged, DoctorFile(str(out)))
    assert note and note.endswith(str(out))
    assert {(f.check, f.bdf) for f in merged.failed if f.check in ("acs", "ats")} == {
        (c, b) for c, b in PLANTED if c in ("acs", "ats")}
