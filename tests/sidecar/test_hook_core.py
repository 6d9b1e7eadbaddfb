"""The door-agnostic handler with the real rewrite on the fixture hosts."""

from __future__ import annotations

import pytest

from testkit.hookkit import fixture_domain, fixture_sysfs, vmi_json
from sidecar.config import PREFIX
from sidecar.core import InternalError, handle_define_domain
from topology.errors import ConfigError, DomainError, PcitopoError, SysfsError
from topology.rewrite import rewrite_domain
from topology.sysfs import open_host

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
    assert s["devices_placed"] == len(out.result.report.placed) == dom.count(b"<hostdev ") == 20 and s["pxbs"] >= 1 and s["switches"] >= 1 and s["fidelity_lost"] == 0
    assert out.vmi.ref == "ml/gpu-vm"


def test_host_may_be_a_callable_and_mode_off_never_calls_it(b200):
    dom = fixture_domain("hgx-b200")
    calls = []

    def host():
        calls.append(1)
        return b200

    assert handle_define_domain(dom, None, host).outcome == "rewritten" and calls == [1]
    out = handle_define_domain(dom, vmi_json(dom, {f"{PREFIX}mode": "off"}), host)
    assert out.outcome == "unchanged-off" and out.xml is dom and calls == [1]
    assert "pcitopo.kubevirt.io/mode" in out.reason


def test_mode_off_works_where_sysfs_cannot_be_read():
    dom = fixture_domain("hgx-b200")
    out = handle_define_domain(dom, vmi_json(dom, {f"{PREFIX}mode": "off"}), lambda: open_host("/nonexistent"))
    assert out.xml == dom


def test_failure_raises_by_default_and_passes_through_when_asked(b200):
    dom = with_foreign_hostdev(fixture_domain("hgx-b200"))
    with pytest.raises(DomainError) as ei:
        handle_define_domain(dom, vmi_json(dom), b200)
    assert "0000:77:00.0" in ei.value.reason
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), b200)
    assert out.outcome == "passthrough" and out.xml == dom and out.result is None
    assert out.reason.startswith("domain: ") and "0000:77:00.0" in out.reason


def test_unreadable_sysfs_is_a_sysfs_error_or_a_passthrough():
    dom = fixture_domain("hgx-b200")
    host = lambda: open_host("/nonexistent/sysfs")  # noqa: E731
    with pytest.raises(SysfsError):
        handle_define_domain(dom, vmi_json(dom), host)
    out = handle_define_domain(dom, vmi_json(dom, PASSTHROUGH), host)
    assert out.outcome == "passthrough" and out.xml == dom and out.reason.startswith("sysfs: ")


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
    assert out.outcome == "passthrough" and out.xml == dom and out.reason.startswith("internal: ")
