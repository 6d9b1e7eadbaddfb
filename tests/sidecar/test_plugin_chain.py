"""Pcitopo through KubeVirt v1.9.0's Plugin pipeline, three defines per boot.

The pipeline (legacy hooks, ``api.DomainSpec``'s re-parse, ``translate.ToLibvirtDomain``, the
plugin's MutateDomain with libvirt-go-xml-module's Marshal/Unmarshal around it) is modelled from
KubeVirt's source in :mod:`testkit.plugin.pipeline`, libvirtxml in :mod:`testkit.plugin.libvirtxml`
(checked against the real module when ``PCITOPO_LIBVIRTXML`` names a build of it, last test).
The plugin is the hook's own door function (``Hooks.mutate_domain``), in process; the grpc-go
client calls the real server in tests/sidecar/test_plugin_goclient.py.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import threading

import pytest
from lxml import etree

from pcitopo.serve.hooks import CallFailed, Hooks, HostCache, JsonLog
from testkit.hookkit import REPO, fixture_domain, fixture_sysfs, placement, vmi_json, xmlfix
from testkit.plugin.libvirtxml import LibvirtxmlError, round_trip
from testkit.plugin.pipeline import as_libvirtxml, boot, with_kubevirt_18866

FIXTURES = ("hgx-b200", "hgx-h100", "dgx-h100")
Q = "{http://libvirt.org/schemas/domain/qemu/1.0}"


class Plugin:
    """pcitopo's plugin door in process, as the server runs it (one Hooks, one host cache)."""

    def __init__(self, fixture: str, annotations: dict[str, str] | None = None, context: str = "Boot"):
        self.log = io.StringIO()
        self.hooks = Hooks(HostCache(fixture_sysfs(fixture)), JsonLog(self.log), threading.Event())
        self.annotations = annotations
        self.context = context

    def __call__(self, domain: bytes) -> bytes:
        return self.hooks.mutate_domain("libvirt", domain, vmi_json(domain, self.annotations), self.context)

    def legacy(self, domain: bytes) -> bytes:
        return self.hooks.on_define_domain("v1alpha3", domain, vmi_json(domain, self.annotations))

    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.log.getvalue().splitlines()]


def settings(xml: bytes) -> dict:
    """Every setting pcitopo writes, as libvirt will read it: our controllers (model, model name,
    target, node, address), every hostdev's source and guest address, maxphysaddr, the
    qemu:override properties, the fw_cfg entries."""
    root = etree.fromstring(xml, etree.XMLParser(remove_blank_text=True))

    def num(v):
        return int(v, 0) if v and v.strip().lower().startswith(("0x",)) or (v or "").isdigit() else v

    def attrs(el):
        return tuple(sorted((k, num(v)) for k, v in el.attrib.items())) if el is not None else None

    ours = []
    for c in root.iter("controller"):
        alias = c.find("alias")
        if alias is not None and alias.get("name", "").startswith("ua-pcitopo-"):
            t = c.find("target")
            ours.append((attrs(c), attrs(c.find("model")), attrs(t), t.findtext("node") if t is not None else None,
                         attrs(c.find("address"))))
    hostdevs = [(attrs(h), attrs(h.find("source/address")), attrs(h.find("address"))) for h in root.iter("hostdev")]
    overrides = sorted((d.get("alias"), p.get("name"), p.get("type"), p.get("value"))
                       for d in root.iter(f"{Q}device") for p in d.iter(f"{Q}property"))
    fwcfg = sorted((e.get("name"), (e.text or "").strip()) for si in root.findall("sysinfo[@type='fwcfg']") for e in si)
    return {"controllers": sorted(ours), "hostdevs": hostdevs, "maxphysaddr": attrs(root.find("cpu/maxphysaddr")),
            "overrides": overrides, "fwcfg": fwcfg}


@pytest.fixture(scope="module")
def xmlfix_out(tmp_path_factory):
    """xmlfix's output for each fixture's KubeVirt domain (the golden input), as libvirtxml reads it."""
    tmp = tmp_path_factory.mktemp("xmlfix")
    out = {}
    for name in FIXTURES:
        r = xmlfix(fixture_domain(name), fixture_sysfs(name), None, tmp)
        assert r.returncode == 0, r.stderr
        out[name] = r.stdout
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_no_gpu_vm_starts_where_a_plugin_exists_without_pcitopo(name):
    """kubevirt#18861 as released: KubeVirt's hostdevs have no mode, ToLibvirtDomain refuses them."""
    b = boot(fixture_domain(name))
    assert b.error == "failed to allocate hotplug ports: Missing 'mode' attribute on domain hostdev" and not b.defines


@pytest.mark.parametrize("name", FIXTURES)
def test_both_doors_on_v190_boot_and_keep_every_setting(name, xmlfix_out):
    """v1.9.0 as released with the Plugins gate: the legacy hook's mode lets the pipeline through,
    the plugin re-makes what the re-parse dropped; three defines, every setting xmlfix writes."""
    plugin = Plugin(name)
    b = boot(fixture_domain(name), legacy=plugin.legacy, plugins=[plugin])
    assert b.error is None and len(b.defines) == 3
    doors = [(r["event"], r["door"], r["outcome"]) for r in plugin.records()]
    assert doors == [("OnDefineDomain", "hook", "rewritten"), ("MutateDomain", "plugin", "rewritten")] * 3
    want = settings(as_libvirtxml(xmlfix_out[name]))
    assert want["maxphysaddr"] and want["overrides"] and want["fwcfg"] and want["controllers"]
    for sent, defined in zip(b.plugin_inputs, b.defines):
        assert settings(defined) == want
        assert defined == as_libvirtxml(plugin(sent))  # what libvirt gets is the plugin's reply, as libvirtxml reads it
    assert placement(b.defines[-1]) == placement(xmlfix_out[name])


@pytest.mark.parametrize("name", FIXTURES)
def test_the_plugin_alone_is_enough_once_kubevirt_writes_mode(name, xmlfix_out):
    """A release with kubevirt PR #18866: no legacy hook at all; the plugin's three calls, each on
    a rebuilt domain, define what xmlfix writes."""
    plugin = Plugin(name)
    b = boot(with_kubevirt_18866(fixture_domain(name)), plugins=[plugin])
    assert b.error is None and len(b.defines) == 3
    want = settings(as_libvirtxml(xmlfix_out[name]))
    assert [settings(d) for d in b.defines] == [want] * 3
    assert b.defines[1] == b.defines[2]


@pytest.mark.parametrize("name", FIXTURES)
def test_the_legacy_hook_alone_starts_the_vm_but_loses_what_the_struct_drops(name):
    """Why the plugin is needed: with a Plugin CR and only the legacy hook, the VM starts (mode
    passes) but libvirt gets KubeVirt's rebuilt struct: maxphysaddr, overrides, model names gone."""
    plugin = Plugin(name)
    b = boot(fixture_domain(name), legacy=plugin.legacy)
    assert b.error is None
    got = settings(b.defines[-1])
    assert got["maxphysaddr"] is None and got["overrides"] == []
    assert all(c[1] is None for c in got["controllers"])  # no <model name>


def test_the_plugin_reply_reads_back_through_libvirtxml_unchanged(xmlfix_out):
    """The reply is libvirtxml-stable: reading it and writing it again changes nothing, and the
    plugin given its own (libvirtxml-marshalled) output returns it as it was."""
    plugin = Plugin("hgx-b200")
    first = as_libvirtxml(plugin(round_trip(with_kubevirt_18866(fixture_domain("hgx-b200")))))
    assert round_trip(first) == first
    assert as_libvirtxml(plugin(first)) == first


def test_libvirtxml_forms_are_accepted():
    """Input as libvirtxml writes it (2-space indent, `<x></x>`, default-namespace override,
    decimal ports) and as api.DomainSpec writes it (tabs, qemu: prefix) place the same."""
    plugin = Plugin("hgx-b200")
    kubevirt_form = with_kubevirt_18866(fixture_domain("hgx-b200"))
    a, b = plugin(kubevirt_form), plugin(round_trip(kubevirt_form))
    assert settings(as_libvirtxml(a)) == settings(as_libvirtxml(b))
    again = plugin(round_trip(a))  # a second call on libvirtxml's form of our own output
    assert settings(as_libvirtxml(again)) == settings(as_libvirtxml(a))
    assert b"<override xmlns=" in round_trip(a)


@pytest.mark.parametrize("context", ["MigrationTarget", "MigrationSource", "Shutdown", ""])
def test_other_contexts_return_the_domain_as_sent_and_say_why(context):
    plugin = Plugin("hgx-b200", context=context)
    domain = round_trip(with_kubevirt_18866(fixture_domain("hgx-b200")))
    assert plugin(domain) == domain
    rec = plugin.records()[-1]
    assert rec["event"] == "MutateDomain" and rec["door"] == "plugin" and rec["outcome"] == "unchanged"
    assert ("cannot live-migrate" in rec["reason"]) == context.startswith("Migration")
    assert rec["level"] == ("info" if context.startswith("Migration") else "warning")


def test_other_contexts_still_give_hostdevs_their_mode():
    plugin = Plugin("hgx-b200", context="MigrationTarget")
    out = plugin(fixture_domain("hgx-b200"))
    assert round_trip(out)  # libvirtxml can read it
    assert plugin.records()[-1]["hostdev_modes_given"] == fixture_domain("hgx-b200").count(b"<hostdev ")


def test_a_refusal_is_one_line_with_the_failure_strategy_left_to_kubevirt():
    """pairing: require on a domain whose GPU got a worse NIC: a CallFailed with one line."""
    plugin = Plugin("hgx-b200", annotations={"pcitopo.kubevirt.io/mmio": "bogus"})
    with pytest.raises(CallFailed) as e:
        plugin(fixture_domain("hgx-b200"))
    assert e.value.code == "INVALID_ARGUMENT" and "\n" not in e.value.details
    assert e.value.details.startswith("pcitopo: config: annotation pcitopo.kubevirt.io/mmio")
    rec = plugin.records()[-1]
    assert rec["door"] == "plugin" and rec["outcome"] == "failed" and rec["level"] == "error"


def test_off_and_passthrough_still_write_mode():
    """mode: off and on-error: passthrough leave the placement alone but give every PCI hostdev
    libvirt's default mode, so KubeVirt's pipeline can read the domain (kubevirt#18861)."""
    for options in ({"pcitopo.kubevirt.io/mode": "off"},):
        plugin = Plugin("hgx-b200", annotations=options)
        b = boot(fixture_domain("hgx-b200"), legacy=plugin.legacy, plugins=[plugin])
        assert b.error is None and len(b.defines) == 3
        assert settings(b.defines[0])["overrides"] == []


LIBVIRTXML = os.environ.get("PCITOPO_LIBVIRTXML")


@pytest.mark.skipif(not LIBVIRTXML, reason="set PCITOPO_LIBVIRTXML to a libvirtxml round-trip binary (docs/SOURCES.md)")
def test_the_libvirtxml_model_matches_the_real_module(tmp_path):
    """Opt-in: the model against libvirt-go-xml-module itself (tests/sidecar/golibvirtxml), on
    every fixture domain, xmlfix's outputs and a plugin chain's defines: the same elements and
    attributes (Go's element order aside), and the same refusals."""
    from collections import Counter

    def items(el, path=""):
        p = f"{path}/{etree.QName(el).localname}"
        out = [(p, tuple(sorted(el.attrib.items())), (el.text or "").strip() if len(el) == 0 else "")]
        if etree.QName(el).localname != "metadata":
            for c in el:
                if isinstance(c.tag, str):
                    out += items(c, p)
        return out

    plugin = Plugin("hgx-b200")
    samples = [p.read_bytes() for p in sorted((REPO / "fixtures").rglob("*.xml")) if b"<domain" in p.read_bytes()[:400]]
    samples += boot(fixture_domain("hgx-b200"), legacy=plugin.legacy, plugins=[plugin]).defines
    for xml in samples:
        real = subprocess.run([LIBVIRTXML, "-"], input=xml, capture_output=True)
        try:
            model = round_trip(xml)
        except LibvirtxmlError as e:
            assert real.returncode != 0 and str(e) in real.stderr.decode()
            continue
        assert real.returncode == 0, real.stderr
        assert Counter(items(etree.fromstring(real.stdout))) == Counter(items(etree.fromstring(model)))
