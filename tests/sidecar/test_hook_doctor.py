"""The hook runs pcitopo doctor's checks for the devices it places (option doctor)."""

from __future__ import annotations

import json
import subprocess

import pytest

from pcitopo.checks.doctor import DoctorError
from pcitopo.host.sources import MemoryTree, resolve
from pcitopo.host.sysfs import SysfsReader, open_host
from pcitopo.model.tree import Topology
from pcitopo.serve.core import handle_define_domain
from pcitopo.serve.options import DEFAULT_OPTIONS, PREFIX, options_from_annotations
from testkit import REPO
from testkit.hookkit import fixture_domain, fixture_sysfs, vmi_json
from testkit.server_proc import BIN

DOMAIN = fixture_domain("hgx-h100")  # 20 hostdevs, the same BDFs as hgx-h100-faults
ONE_PAIR = fixture_domain("hgx-h100", "one-pair")  # GPU0 and NIC0 (both on vfio-pci)


@pytest.fixture(scope="module")
def faults():
    return open_host(fixture_sysfs("hgx-h100-faults"))


@pytest.fixture(scope="module")
def clean():
    return open_host(fixture_sysfs("hgx-h100"))


def test_the_option_defaults_to_warn_and_takes_three_values():
    assert DEFAULT_OPTIONS.doctor == "warn"
    assert options_from_annotations({f"{PREFIX}doctor": "require"}).doctor == "require"
    with pytest.raises(Exception, match="allowed values: require | warn | off"):
        options_from_annotations({f"{PREFIX}doctor": "strict"})


def test_warn_logs_the_problems_and_starts_the_vm(faults):
    out = handle_define_domain(DOMAIN, vmi_json(DOMAIN), faults)
    assert out.outcome == "rewritten" and out.doctor is not None
    s = out.summary
    assert s["doctor"]["fail"] >= 11
    assert "fail bar 0000:ba:00.0: BAR1 (128 GiB, 64-bit, prefetchable) unassigned" in " | ".join(s["doctor_findings"])
    json.dumps(s)  # the log line stays JSON
    # the checks ran for the placed devices only, and their paths
    placed = {str(d.host) for d in out.result.report.placed}
    targets = {f.bdf for f in out.doctor.findings if f.check in ("vfio-driver", "bar")}
    assert targets == placed


def test_require_stops_the_vm_on_a_failed_check_even_under_passthrough(faults):
    ann = {f"{PREFIX}doctor": "require", f"{PREFIX}on-error": "passthrough"}
    with pytest.raises(DoctorError, match=r"host not ready \(annotation pcitopo.kubevirt.io/doctor is require\)"):
        handle_define_domain(DOMAIN, vmi_json(DOMAIN, ann), faults)


def test_require_starts_a_vm_whose_devices_are_ready(clean):
    out = handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR, {f"{PREFIX}doctor": "require"}), clean)
    assert out.outcome == "rewritten" and out.summary["doctor"]["fail"] == 0 and out.summary["doctor_findings"] == []


def test_off_skips_the_checks(faults):
    out = handle_define_domain(DOMAIN, vmi_json(DOMAIN, {f"{PREFIX}doctor": "off"}), faults)
    assert out.doctor is None and "doctor" not in out.summary


def unprivileged(name: str) -> Topology:
    """The fixture host as the unprivileged sidecar reads it: 64 bytes of every config."""
    tree = MemoryTree.from_tarball(f"{fixture_sysfs(name)}/sysfs.tar.gz")
    for bdf in tree.listdir("bus/pci/devices") or []:
        rel = f"{resolve(tree, f'bus/pci/devices/{bdf}')}/config"
        data = tree.read(rel)
        tree.add_file(rel, data[:64])
    return Topology(SysfsReader(tree))


def gpu_domain(bdf: str, alias: str = "ua-gpu-gpu0") -> bytes:
    """ONE_PAIR with one GPU only, at ``bdf``; ``alias`` ``ua-dra-gpu-<name>`` makes it a DRA GPU
    as KubeVirt's DRA path writes it (dra/gpu_hostdev.go: the same hostdev, another alias)."""
    from lxml import etree

    root = etree.fromstring(ONE_PAIR)
    gpu, nic = root.findall("devices/hostdev")
    nic.getparent().remove(nic)
    dom, rest = bdf.split(":", 1)
    bus, slot_fn = rest.split(":")
    slot, fn = slot_fn.split(".")
    gpu.find("source/address").attrib.update({"domain": f"0x{dom}", "bus": f"0x{bus}", "slot": f"0x{slot}", "function": f"0x{fn}"})
    gpu.find("alias").set("name", alias)
    return etree.tostring(root)


def dra_vmi(domain: bytes, annotations: dict[str, str]) -> bytes:
    """The VMI of a DRA GPU VM (KubeVirt GPUsWithDRA: claimName/requestName, no deviceName)."""
    vmi = json.loads(vmi_json(domain, annotations))
    vmi["spec"]["domain"]["devices"]["gpus"] = [{"name": "gpu0", "claimName": "gpus", "requestName": "gpu0"}]
    vmi["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "one-h100"}]
    return json.dumps(vmi).encode()


REQUIRE = {f"{PREFIX}doctor": "require"}
GPU7 = "0000:db:00.0"  # below 0000:d9:01.0, whose ACS has RR cleared (fixtures/hgx-h100-faults/README.md)


@pytest.fixture(scope="module")
def faults_report(tmp_path_factory) -> str:
    """What the doctor DaemonSet writes on the faults host: `pcitopo doctor --json-out`, with
    the whole config space (the privileged doctor)."""
    out = tmp_path_factory.mktemp("doctor") / "doctor.json"
    r = subprocess.run([str(BIN / "pcitopo"), "doctor", "--sysfs", fixture_sysfs("hgx-h100-faults"), "--json-out", str(out)],
                       capture_output=True, timeout=120)
    assert r.returncode in (0, 1) and out.is_file(), r.stderr
    return str(out)


def test_require_refuses_what_it_cannot_confirm_without_the_doctors_report():
    """Unprivileged, ACS and ATS are unknown; no report answers them: under require the VM does
    not start, and the line names the check it could not confirm."""
    from pcitopo.serve.plugin.doctorfile import DoctorFile

    host = unprivileged("hgx-h100")
    with pytest.raises(DoctorError) as e:
        handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR, REQUIRE), host, doctor_file=DoctorFile("/nonexistent/doctor.json"))
    msg = e.value.reason
    assert msg.startswith("host readiness not confirmed (annotation pcitopo.kubevirt.io/doctor is require): ats NIC0 0000:19:00.0: "
                          "ATS state unknown (needs root); the doctor's report /nonexistent/doctor.json is missing"), msg
    assert "\n" not in msg
    out = handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR), host)  # warn: logged, the VM starts
    assert out.outcome == "rewritten" and out.summary["doctor_unknown"] == ["acs", "ats"]


@pytest.mark.parametrize("alias", ["ua-gpu-gpu0", "ua-dra-gpu-gpu0"], ids=["device-plugin", "dra"])
def test_require_refuses_a_gpu_whose_root_port_fails_acs_from_the_doctors_report(alias, faults_report):
    """GPU7 read unprivileged: its downstream port's ACS is unknown to the hook; the doctor's
    report says RR is cleared. Device plugin or DRA: the domain has the exact device."""
    from pcitopo.serve.plugin.doctorfile import DoctorFile

    domain = gpu_domain(GPU7, alias)
    vmi = dra_vmi(domain, REQUIRE) if "dra" in alias else vmi_json(domain, REQUIRE)
    with pytest.raises(DoctorError) as e:
        handle_define_domain(domain, vmi, unprivileged("hgx-h100-faults"), doctor_file=DoctorFile(faults_report))
    assert e.value.reason.startswith("host not ready (annotation pcitopo.kubevirt.io/doctor is require): acs downstream-port "
                                     "above GPU7 0000:d9:01.0: ACS control 0x59 (SV|CR|UF|DT): RR/CR cleared"), e.value.reason
    print(f"refusal ({alias}): pcitopo: {e.value.kind}: {e.value.reason}")


def test_require_starts_a_ready_gpu_with_the_doctors_report(faults_report):
    from pcitopo.serve.plugin.doctorfile import DoctorFile

    domain = gpu_domain("0000:18:00.0", "ua-dra-gpu-gpu0")  # GPU0: nothing fails on or above it
    out = handle_define_domain(domain, dra_vmi(domain, REQUIRE), unprivileged("hgx-h100-faults"), doctor_file=DoctorFile(faults_report))
    assert out.outcome == "rewritten" and out.summary["doctor"]["unknown"] == 0 and out.summary["doctor"]["fail"] == 0
    assert out.summary["doctor_report"].endswith(f"unknown acs/ats findings from {faults_report}")


def test_require_does_not_trust_a_stale_doctors_report(faults_report, tmp_path):
    import os
    import shutil

    from pcitopo.serve.plugin.doctorfile import DoctorFile

    stale = tmp_path / "doctor.json"
    shutil.copy(faults_report, stale)
    old = os.stat(stale).st_mtime - 7200
    os.utime(stale, (old, old))
    domain = gpu_domain("0000:18:00.0")
    with pytest.raises(DoctorError, match=r"host readiness not confirmed .*: acs .* unknown \(needs root\); the doctor's report "
                                          r".* is stale"):
        handle_define_domain(domain, vmi_json(domain, REQUIRE), unprivileged("hgx-h100-faults"), doctor_file=DoctorFile(str(stale)))


def test_the_refusal_names_no_other_devices_address(faults):
    """GPU3 shares its IOMMU group with NIC5, which may be another VM's: the refusal reaching
    this VM's owner says "another device" (as the node hook's does)."""
    domain = gpu_domain("0000:5d:00.0")
    with pytest.raises(DoctorError) as e:
        handle_define_domain(domain, vmi_json(domain, REQUIRE), faults)
    msg = e.value.reason
    assert "iommu-group GPU3 0000:5d:00.0: IOMMU group 900 also holds another device: " in msg and "5c:00.0" not in msg, msg


def test_the_shim_log_line_carries_the_problems(tmp_path):
    run = subprocess.run(
        [str(BIN / "onDefineDomain"), "--vmi", vmi_json(DOMAIN).decode(), "--domain", DOMAIN.decode(),
         "--sysfs", fixture_sysfs("hgx-h100-faults")],
        capture_output=True, timeout=60)
    assert run.returncode == 0, run.stderr
    record = json.loads(run.stderr.decode().strip().splitlines()[-1])
    assert record["doctor"]["fail"] >= 11 and any(f.startswith("fail acs 0000:17:01.0") for f in record["doctor_findings"])


def test_a_doctor_that_cannot_run_is_logged_under_warn_and_stops_the_vm_under_require(clean):
    """The checks need a sysfs source; on a host model without one they raise inside the
    doctor: an error entry in the log line under warn, a refusal under require."""
    from pcitopo.model.tree import Topology as Topo

    class NoSource:  # a loader with no sysfs behind it, like a guest layout
        def __init__(self, topo):
            self.name, self._t = "no-sysfs", topo

        def load(self, bdf):
            return self._t.find(bdf)

        def all_bdfs(self):
            return self._t.bdfs()

        def numa_nodes(self):
            return self._t.numa_nodes()

    host = Topo(NoSource(clean))
    out = handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR), host)
    assert out.outcome == "rewritten" and out.doctor is None and "error" in out.summary["doctor"]
    with pytest.raises(DoctorError, match=r"^cannot check the host's readiness \(annotation pcitopo.kubevirt.io/doctor is require\): "):
        handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR, REQUIRE), host)


def test_require_under_passthrough_on_an_unreadable_host_does_not_start(tmp_path):
    """on-error: passthrough hands the domain back when the host cannot be read, but
    doctor: require has nothing to check it on: the VM does not start (as pairing: require)."""
    from pcitopo.errors import SysfsError
    from pcitopo.serve.hooks import HostCache

    cache = HostCache(str(tmp_path / "no-sys"))
    passthrough = {f"{PREFIX}on-error": "passthrough"}
    out = handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR, passthrough), cache)
    assert out.outcome == "passthrough" and out.summary["error"] == "sysfs"
    with pytest.raises(DoctorError, match=r"^cannot check the host's readiness \(annotation pcitopo.kubevirt.io/doctor is "
                                          r"require\): sysfs: "):
        handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR, {**passthrough, **REQUIRE}), cache)
    with pytest.raises(SysfsError):  # on-error: fail says the host's own error
        handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR, REQUIRE), cache)


def test_require_under_passthrough_refuses_a_hostdev_the_host_lacks(clean):
    domain = gpu_domain("0000:77:00.0")  # no such device on this host: the rewrite fails
    vmi = vmi_json(domain, {f"{PREFIX}on-error": "passthrough", **REQUIRE})
    with pytest.raises(DoctorError, match=r"the host has no device 0000:77:00.0, a hostdev of this domain"):
        handle_define_domain(domain, vmi, clean)


def test_require_checks_the_devices_under_mode_off_too(faults, tmp_path):
    from pcitopo.serve.hooks import HostCache

    off = {f"{PREFIX}mode": "off"}
    domain = gpu_domain(GPU7)
    out = handle_define_domain(domain, vmi_json(domain, off), HostCache(str(tmp_path / "no-sys")))
    assert out.outcome == "unchanged-off"  # warn: nothing read, as before
    with pytest.raises(DoctorError, match=r"acs downstream-port above GPU7 0000:d9:01.0"):
        handle_define_domain(domain, vmi_json(domain, {**off, **REQUIRE}), faults)
    with pytest.raises(DoctorError, match=r"^cannot check the host's readiness .*: sysfs: "):
        handle_define_domain(domain, vmi_json(domain, {**off, **REQUIRE}), HostCache(str(tmp_path / "no-sys")))
    ok = handle_define_domain(gpu_domain("0000:18:00.0"), vmi_json(gpu_domain("0000:18:00.0"), {**off, **REQUIRE}), faults)
    assert ok.outcome == "unchanged-off" and ok.summary["doctor"]["fail"] == 0


def test_require_over_the_socket_is_failed_precondition():
    from pcitopo.serve.hooks import status_name

    assert status_name(DoctorError("x")) == "FAILED_PRECONDITION"


def test_xmlfix_explain_shows_the_placed_devices_readiness(capsys):
    from pcitopo.cli.main import xmlfix_main

    domain = REPO / "fixtures" / "hgx-h100" / "cases" / "one-pair" / "domain.xml"
    assert xmlfix_main(["--explain", "--sysfs", fixture_sysfs("hgx-h100-faults"), str(domain)]) == 0
    out = capsys.readouterr().out
    section = out[out.index("Host readiness of the placed devices (pcitopo doctor):"):]
    assert "FAIL    acs         downstream-port above host NIC0 0000:17:01.0" in section  # the host's NIC0
    assert section.rstrip().endswith("(1 fail, 0 warn, 0 unknown, 19 ok)")


def test_xmlfix_check_names_failed_doctor_checks_on_stderr(capsys):
    """doctor: warn (the default): --check stays about the topology (not failed) but says, in one
    warning line, that checks failed and which. The fixture's two devices without a NUMA node
    make it unknown (exit 4), not ok."""
    from pcitopo.cli.main import xmlfix_main

    domain = REPO / "fixtures" / "hgx-h100" / "domain.xml"
    assert xmlfix_main(["--check", "--sysfs", fixture_sysfs("hgx-h100-faults"), str(domain)]) == 4
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("xmlfix: check: unknown: sysfs gives no NUMA node for 2 device(s) (0000:aa:00.0, 0000:ab:00.0); ")
    doctor = [line for line in err if "doctor" in line]
    failed = handle_define_domain(DOMAIN, None, open_host(fixture_sysfs("hgx-h100-faults"))).doctor.failed
    first = failed[0]
    assert len(doctor) == 1 and doctor[0].startswith(f"xmlfix: warning: doctor: {len(failed)} fail ({first.check} {first.bdf}, ")
    assert f"and {len(failed) - 3} more" in doctor[0]


# -- once per allocation ---------------------------------------------------------------------------

class CountingTree(MemoryTree):
    """The fixture's tree, counting the reads of each file and link (what the doctor costs)."""

    def __init__(self, tree: MemoryTree):
        self.__dict__.update(tree.__dict__)
        self.reads: dict[str, int] = {}

    def read(self, rel):
        self.reads[rel] = self.reads.get(rel, 0) + 1
        return super().read(rel)

    def readlink(self, rel):
        self.reads[rel] = self.reads.get(rel, 0) + 1
        return super().readlink(rel)

    def count(self, suffix: str) -> int:
        return sum(n for p, n in self.reads.items() if p.endswith(suffix))


def counting_host(name: str) -> tuple[CountingTree, Topology]:
    tree = CountingTree(MemoryTree.from_tarball(f"{fixture_sysfs(name)}/sysfs.tar.gz"))
    return tree, Topology(SysfsReader(tree))


def test_the_checks_run_once_per_allocation_and_read_only_the_driver_links_again():
    """A boot defines the same devices three times: config space, IOMMU groups and
    driver_override are read at the first define only; each later one reads the devices'
    driver links (a rebind is what can change) and nothing else the doctor reads."""
    tree, host = counting_host("hgx-h100")
    first = handle_define_domain(DOMAIN, vmi_json(DOMAIN), host)
    assert tree.count("/config") > 0
    before = dict(tree.reads)
    for _ in range(2):
        again = handle_define_domain(DOMAIN, vmi_json(DOMAIN), host)
    assert again.doctor == first.doctor and again.summary["doctor"] == first.summary["doctor"]
    read_again = {p: n - before.get(p, 0) for p, n in tree.reads.items() if n != before.get(p, 0)}
    assert read_again and all(p.endswith("/driver") for p in read_again), read_again
    assert len(read_again) == len(first.result.report.placed)


def test_a_rebind_between_defines_is_seen_and_undone():
    tree, host = counting_host("hgx-h100")
    gpu0 = f"{resolve(tree, 'bus/pci/devices/0000:18:00.0')}/driver"
    on_vfio = tree.readlink(gpu0)
    assert handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR), host).summary["doctor"]["fail"] == 0
    tree.add_link(gpu0, on_vfio.replace("vfio-pci", "nvidia"))  # the host driver took GPU0 back
    out = handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR), host)
    failed = [f for f in out.doctor.failed]
    assert [(f.check, f.bdf) for f in failed] == [("vfio-driver", "0000:18:00.0")]
    assert "bound to nvidia" in failed[0].message and "/0000:18:00.0/driver/unbind" in failed[0].fix
    assert tree.count("/config") and out.summary["doctor_findings"][0].startswith("fail vfio-driver 0000:18:00.0: bound to nvidia")
    tree.add_link(gpu0, on_vfio)  # and back to vfio-pci
    assert handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR), host).summary["doctor"]["fail"] == 0


def test_a_new_allocation_is_checked_afresh():
    tree, host = counting_host("hgx-h100")
    handle_define_domain(ONE_PAIR, vmi_json(ONE_PAIR), host)
    one_pair = tree.count("/config")
    out = handle_define_domain(DOMAIN, vmi_json(DOMAIN), host)
    assert tree.count("/config") > one_pair
    assert {f.bdf for f in out.doctor.findings if f.check == "bar"} == {str(d.host) for d in out.result.report.placed}


def test_under_passthrough_a_host_cache_still_sees_a_rebind(tmp_path):
    """A domain the rewrite refuses (not q35) goes back unchanged under on-error: passthrough,
    and the doctor still checks its devices; no host cache compared their drivers on that path,
    so the doctor reads the driver links itself."""
    import os

    from pcitopo.serve.hooks import HostCache

    root = tmp_path / "sys"
    MemoryTree.from_tarball(f"{fixture_sysfs('hgx-h100')}/sysfs.tar.gz").write_dir(root)
    cache = HostCache(str(root))
    pc = ONE_PAIR.replace(b'machine="pc-q35-rhel9.6.0"', b'machine="pc-i440fx-rhel7.6.0"')
    vmi = vmi_json(pc, {f"{PREFIX}on-error": "passthrough"})
    first = handle_define_domain(pc, vmi, cache)
    assert first.outcome == "passthrough" and first.summary["doctor"]["fail"] == 0
    dev = os.path.realpath(root / "bus/pci/devices/0000:18:00.0")
    os.unlink(f"{dev}/driver")
    os.symlink(os.path.relpath(root / "bus/pci/drivers/nvidia", dev), f"{dev}/driver")
    second = handle_define_domain(pc, vmi, cache)
    assert [(f.check, f.bdf, f.status) for f in second.doctor.failed] == [("vfio-driver", "0000:18:00.0", "fail")]
