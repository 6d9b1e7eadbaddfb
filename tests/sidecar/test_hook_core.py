"""The door-agnostic handler with the real rewrite on the fixture hosts."""

from __future__ import annotations

import pytest
from lxml import etree

from pcitopo.errors import ConfigError, DomainError, PcitopoError, SysfsError
from pcitopo.guest.rewrite import rewrite_domain
from pcitopo.host.sysfs import open_host
from pcitopo.libvirt.lenient import with_hostdev_modes
from pcitopo.serve.core import InternalError, handle_define_domain
from pcitopo.serve.options import PREFIX
from testkit import REPO
from testkit.hookkit import fixture_domain, fixture_sysfs, vmi_json

PASSTHROUGH = {f"{PREFIX}on-error": "passthrough"}


@pytest.fixture(scope="module")
def b200():
    return open_host(fixture_sysfs("hgx-b200"))


def with_foreign_hostdev(xml: bytes) -> bytes:
    """A hostdev whose source BDF the host does not have."""
    return xml.replace(b'bus="0x1b" slot="0x00"', b'bus="0x77" slot="0x00"', 1)


def test_rewritten_equals_the_one_rewrite_function(b200):
    dom = fixture_domain("hgx-b200")
    out = handle_define_domain(dom, vmi_json(dom), b200)
    assert out.outcome == "rewritten" and out.reason is None
    assert out.xml == rewrite_domain(dom, b200).xml
    assert out.result is not None and out.result.xml == out.xml
    s = out.summary
    assert (s["devices_placed"] == len(out.result.report.placed) == dom.count(b"<hostdev ") == 20
            and s["pxbs"] >= 1 and s["switches"] >= 1 and s["fidelity_lost"] == 0)
    assert out.vmi.ref == "ml/gpu-vm"


def test_host_may_be_a_callable_and_mode_off_never_calls_it(b200):
    dom = fixture_domain("hgx-b200")
    calls = []

    def host():
        calls.append(1)
        return b200

    assert handle_define_domain(dom, None, host).outcome == "rewritten" and calls == [1]
    out = handle_define_domain(dom, vmi_json(dom, {f"{PREFIX}mode": "off"}), host)
    assert out.outcome == "unchanged-off" and out.xml == moded(dom) and calls == [1]
    assert "pcitopo.kubevirt.io/mode" in out.reason


def moded(dom: bytes) -> bytes:
    """What mode: off and on-error: passthrough hand back: the domain, with libvirt's default
    mode='subsystem' written on the PCI hostdevs that lack it, nothing else changed."""
    out = with_hostdev_modes(dom)[0]
    root, back = etree.fromstring(dom), etree.fromstring(out)
    assert all(hd.get("mode") == "subsystem" for hd in back.iter("hostdev"))
    for hd in [*root.iter("hostdev"), *back.iter("hostdev")]:
        hd.attrib.pop("mode", None)
    assert etree.tostring(back) == etree.tostring(root), "more than mode changed"
    return out


def test_off_and_passthrough_write_only_the_hostdev_mode():
    dom = fixture_domain("hgx-b200")
    out = moded(dom)
    assert out != dom and out.count(b'<hostdev mode="subsystem" type="pci"') == dom.count(b"<hostdev ")
    assert with_hostdev_modes(out) == (out, 0)  # nothing more to add: the same bytes back


def test_mode_off_works_where_sysfs_cannot_be_read():
    dom = fixture_domain("hgx-b200")
    out = handle_define_domain(dom, vmi_json(dom, {f"{PREFIX}mode": "off"}), lambda: open_host("/nonexistent"))
    assert out.xml == moded(dom)


def test_failure_raises_by_default_and_passes_through_when_asked(b200):
    dom = with_foreign_hostdev(fixture_domain("hgx-b200"))
    with pytest.raises(DomainError) as ei:
        handle_define_domain(dom, vmi_json(dom), b200)
    assert "0000:77:00.0" in ei.value.reason
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), b200)
    assert out.outcome == "passthrough" and out.xml == moded(dom) and out.result is None
    assert out.reason.startswith("domain: ") and "0000:77:00.0" in out.reason


def test_unreadable_sysfs_is_a_sysfs_error_or_a_passthrough():
    dom = fixture_domain("hgx-b200")
    host = lambda: open_host("/nonexistent/sysfs")  # noqa: E731
    with pytest.raises(SysfsError):
        handle_define_domain(dom, vmi_json(dom), host)
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), host)
    assert out.outcome == "passthrough" and out.xml == moded(dom) and out.reason.startswith("sysfs: ")


@pytest.mark.parametrize("doc", [b"", b"   \n"])
def test_never_returns_empty_bytes_even_under_passthrough(b200, doc):
    with pytest.raises(DomainError):
        handle_define_domain(doc, vmi_json(fixture_domain("hgx-b200"), PASSTHROUGH), b200)


def test_passthrough_returns_malformed_input_byte_for_byte(b200):
    bad = b"<domain><devices>"
    out = handle_define_domain(bad, vmi_json(fixture_domain("hgx-b200"), PASSTHROUGH), b200)
    assert out.xml == bad and out.outcome == "passthrough"


def test_bad_options_fail_whatever_on_error_says(b200):
    dom = fixture_domain("hgx-b200")
    with pytest.raises(ConfigError) as ei:
        handle_define_domain(dom, vmi_json(dom, {**PASSTHROUGH, f"{PREFIX}mode": "mirorr"}), b200)
    assert "pcitopo.kubevirt.io/mode" in str(ei.value)
    with pytest.raises(ConfigError):
        handle_define_domain(dom, b"{oops", b200)


def test_a_bug_becomes_a_one_line_internal_error_under_the_same_policy():
    """A door handing the rewrite something that is not a host model: not one of our typed
    errors inside, so core wraps it."""
    dom = fixture_domain("hgx-b200")
    with pytest.raises(InternalError) as ei:
        handle_define_domain(dom, None, lambda: object())
    assert isinstance(ei.value, PcitopoError) and ei.value.kind == "internal" and "\n" not in str(ei.value)
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), lambda: object())
    assert out.outcome == "passthrough" and out.xml == moded(dom) and out.reason.startswith("internal: ")


# -- on-error: passthrough does not switch off nvlink/doctor: require (the docs say "whatever
#    on-error says"): the checks run on the domain's hostdev sources the host has -------------

H100_FOREIGN = fixture_domain("hgx-h100").replace(b'bus="0x18" slot="0x00"', b'bus="0x77" slot="0x00"', 1)


@pytest.fixture(scope="module")
def h100():
    return open_host(fixture_sysfs("hgx-h100"))


@pytest.fixture(scope="module")
def h100_fabric(h100):
    from pcitopo.paths.fabric import load_fabric

    # no active partition: the seven GPUs the host has get no NVLink
    return load_fabric(str(REPO / "fixtures" / "hgx-h100" / "fabric" / "fmpm-l.json"), None, h100)


def test_nvlink_require_stops_a_passthrough(h100, h100_fabric):
    from pcitopo.errors import NvlinkError

    ann = {**PASSTHROUGH, f"{PREFIX}nvlink": "require"}
    with pytest.raises(NvlinkError, match="no fabric partition") as ei:
        handle_define_domain(H100_FOREIGN, vmi_json(H100_FOREIGN, ann), h100, h100_fabric)
    assert "0000:2a:00.0" in ei.value.reason and "0000:77:00.0" not in ei.value.reason  # only GPUs the host has
    with pytest.raises(NvlinkError, match="no fabric file"):  # require without a fabric file, as after a rewrite
        handle_define_domain(H100_FOREIGN, vmi_json(H100_FOREIGN, ann), h100, None)


def test_nvlink_warn_on_a_passthrough_logs_the_verdict(h100, h100_fabric):
    ann = {**PASSTHROUGH, f"{PREFIX}nvlink": "warn", f"{PREFIX}doctor": "off"}
    out = handle_define_domain(H100_FOREIGN, vmi_json(H100_FOREIGN, ann), h100, h100_fabric)
    assert out.outcome == "passthrough" and out.xml == moded(H100_FOREIGN)
    assert out.summary["nvlink"] == "not-a-partition" and "no fabric partition" in out.summary["nvlink_reason"]


def test_doctor_require_stops_a_passthrough():
    from pcitopo.checks.doctor import DoctorError

    faults = open_host(fixture_sysfs("hgx-h100-faults"))
    ann = {**PASSTHROUGH, f"{PREFIX}doctor": "require"}
    with pytest.raises(DoctorError, match=r"host not ready \(annotation pcitopo.kubevirt.io/doctor is require\)"):
        handle_define_domain(H100_FOREIGN, vmi_json(H100_FOREIGN, ann), faults)
    out = handle_define_domain(H100_FOREIGN, vmi_json(H100_FOREIGN, PASSTHROUGH), faults)  # warn: logged
    assert out.outcome == "passthrough" and out.summary["doctor"]["fail"] >= 11 and out.doctor is not None
    checked = {f.bdf for f in out.doctor.findings if f.check == "vfio-driver"}
    assert len(checked) == 19 and "0000:77:00.0" not in {str(b) for b in checked}


def test_doctor_require_refuses_a_passthrough_with_a_device_it_cannot_check(h100):
    """A ready host, but one of the domain's hostdevs is not on it: under require nothing may go
    unchecked, so the VM does not start; under warn the rest is checked and logged."""
    from pcitopo.checks.doctor import DoctorError

    ann = {**PASSTHROUGH, f"{PREFIX}doctor": "require"}
    one = fixture_domain("hgx-h100", "one-pair").replace(b'bus="0x18" slot="0x00"', b'bus="0x77" slot="0x00"', 1)
    with pytest.raises(DoctorError, match=r"the host has no device 0000:77:00.0, a hostdev of this domain"):
        handle_define_domain(one, vmi_json(one, ann), h100)
    out = handle_define_domain(one, vmi_json(one, PASSTHROUGH), h100)
    assert out.outcome == "passthrough" and out.summary["doctor"]["fail"] == 0


def test_require_on_a_passthrough_whose_host_cannot_be_read():
    """Nothing to check the GPUs against: nvlink: require cannot confirm NVLink, and doctor:
    require cannot confirm the host's readiness, so each stops the VM (one line naming why);
    doctor: warn logs that it could not run."""
    from pcitopo.errors import DoctorError, NvlinkError

    dom = fixture_domain("hgx-h100")
    host = lambda: open_host("/nonexistent/sysfs")  # noqa: E731
    with pytest.raises(NvlinkError, match=r"cannot check the GPUs' NVLink .*: sysfs: "):
        handle_define_domain(dom, vmi_json(dom, {**PASSTHROUGH, f"{PREFIX}nvlink": "require"}), host)
    with pytest.raises(DoctorError, match=r"cannot check the host's readiness .*: sysfs: "):
        handle_define_domain(dom, vmi_json(dom, {**PASSTHROUGH, f"{PREFIX}doctor": "require"}), host)
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), host)
    assert out.outcome == "passthrough" and out.summary["doctor"]["error"].startswith("sysfs: ")


def test_a_bug_in_the_nvlink_check_is_one_line_and_require_decides(h100):
    """A fabric door (a callable) failing with something that is not one of our typed errors:
    under require an InternalError (the VM stops, one line), under warn a logged
    ``internal-error`` and the VM starts, after a rewrite and after a passthrough alike."""
    def broken_fabric():
        raise RuntimeError("fabric\nreader broke")

    dom = fixture_domain("hgx-h100")
    for doc, extra in ((dom, {}), (H100_FOREIGN, PASSTHROUGH)):
        with pytest.raises(InternalError) as ei:
            handle_define_domain(doc, vmi_json(doc, {**extra, f"{PREFIX}nvlink": "require"}), h100, broken_fabric)
        assert ei.value.kind == "internal" and str(ei.value) == "NVLink check: RuntimeError: fabric reader broke"
        out = handle_define_domain(doc, vmi_json(doc, {**extra, f"{PREFIX}nvlink": "warn"}), h100, broken_fabric)
        assert out.summary["nvlink"] == "internal-error" and out.summary["nvlink_reason"].startswith("NVLink check: RuntimeError")
    assert out.outcome == "passthrough"


def test_a_host_model_that_is_not_one_still_passes_through_under_doctor_warn():
    dom = fixture_domain("hgx-h100")
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), lambda: object())
    assert out.outcome == "passthrough" and out.summary["doctor"]["error"].startswith("internal: AttributeError")
    from pcitopo.errors import NvlinkError

    with pytest.raises(NvlinkError, match="internal: AttributeError"):
        handle_define_domain(dom, vmi_json(dom, {**PASSTHROUGH, f"{PREFIX}nvlink": "require"}), lambda: object())


def test_the_hook_errors_live_in_topology_errors():
    import pcitopo.errors as errors
    import pcitopo.serve.core
    import pcitopo.serve.options

    assert pcitopo.serve.core.InternalError is errors.InternalError and errors.InternalError.kind == "internal"
    assert pcitopo.serve.options.VmiError is errors.VmiError and errors.VmiError.kind == "vmi"
    assert issubclass(errors.VmiError, errors.ConfigError)
