"""Properties of the rewrite over generated host worlds and KubeVirt-shaped domains.

On every example (testkit/strategies/ makes them), through one to three chained
OnDefineDomain calls with libvirt's define additions and KubeVirt's lossy re-parse in between:
- the output validates against libvirt's own RelaxNG schema (loaded once per session);
- the bus, index, chassis and placement rules (docs/SOURCES.md) hold, on the raw output and on the
  domain libvirt defines from it (KubeVirt's hotplug ports and libvirt's additions included);
- the rewrite is idempotent: each output is a fixed point, and every call re-emits the same
  controllers and placements as the first;
- every element the rewrite does not own is unchanged (canonicalised); every controller it
  creates carries our alias; foreign controllers vanish only when they are KubeVirt's empty
  NUMA placement being taken over;
- with guest NUMA cells (and ACPI), every pair of devices is classified in the guest exactly
  as on the host (NCCL always; NVML except the Broadcom PXB→PIX collapse), judged on a guest
  tree derived here from the XML, independently of src/pcitopo/guest/view.py;
- any failure is a PcitopoError subclass with a one-line message, and only for reasons the
  input explains (a device behind a PCIe-to-PCI bridge, more buses than a PCI domain has).

Run ``HYPOTHESIS_PROFILE=fuzz`` for the long run (`make fuzz`): it runs at least 10,000
examples and prints the count.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from pathlib import Path

import conftest_hypothesis as hp
import pytest
from hypothesis import event, given, note, settings, strategies as st
from invariants import (
    check_created_aliases,
    check_rules,
    class_differences,
    crowded_port,
    numa_divergent,
    owned_projection,
    parse,
)
from lxml import etree

from pcitopo.errors import PcitopoError
from pcitopo.guest.rewrite import Why, rewrite_domain
from pcitopo.host.sources import MemoryTree
from pcitopo.host.sysfs import SysfsReader
from pcitopo.libvirt.lenient import with_hostdev_modes
from pcitopo.libvirt.overrides import properties as override_properties
from pcitopo.model.tree import Topology
from pcitopo.serve.core import handle_define_domain
from pcitopo.serve.options import PREFIX, parse_vmi
from testkit.kubevirt_sim import canonical, next_call_input, non_owned_elements
from testkit.strategies import (
    Case,
    as_booted,
    build_domain,
    cases,
    fixture_worlds,
    generated_worlds,
    mutated_domains,
    world_from_topo,
)

SCHEMA = "/usr/share/libvirt/schemas/domain.rng"
RUNS: Counter = Counter()


# -- session fixtures ------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _schema() -> etree.RelaxNG | None:
    if not os.path.exists(SCHEMA):
        return None
    return etree.RelaxNG(file=SCHEMA)


@pytest.fixture(scope="session")
def schema() -> etree.RelaxNG:
    rng = _schema()
    if rng is None:
        why = f"{SCHEMA} missing: install libvirt-clients (scripts/setup-debian.sh, make setup)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return rng


# -- helpers -----------------------------------------------------------------------------------

def assert_typed_one_line(e: BaseException) -> PcitopoError:
    assert isinstance(e, PcitopoError), f"untyped failure {type(e).__name__}: {e}"
    assert type(e) is not PcitopoError, f"bare PcitopoError (no kind): {e}"
    msg = str(e)
    assert msg.strip(), f"{type(e).__name__} with an empty message"
    assert "\n" not in msg and "\r" not in msg, f"multi-line message: {msg!r}"
    assert "Traceback" not in msg
    return e


# Typed failures a valid generated input may legitimately end in, and why.
EXPLAINED_FAILURES = (
    ("unplaceable", re.compile(r"unexpected bridge shape")),  # a device behind a PCIe-to-PCI bridge
    (None, re.compile(r"^out of PCI buses")),  # more bridges than 256 buses
)


def explained(case: Case, e: PcitopoError) -> bool:
    for need, rx in EXPLAINED_FAILURES:
        if rx.search(str(e)) and (need is None or getattr(case, need)):
            return True
    return False


def check_output(inp: bytes, out: bytes, host, schema) -> None:
    """The invariants every single call's output must satisfy."""
    ok = schema.validate(etree.fromstring(out))
    assert ok, f"output is not valid against libvirt's schema: {schema.error_log.last_error}"
    problems = check_rules(out)
    assert not problems, "rules broken in the output:\n  " + "\n  ".join(problems)
    booted = as_booted(out)
    problems = check_rules(booted, hotplug_reserve=False)
    assert not problems, "rules broken once KubeVirt and libvirt added their ports:\n  " + "\n  ".join(problems)
    problems = check_created_aliases(inp, out)
    assert not problems, "\n  ".join(problems)
    assert non_owned_elements(inp) == non_owned_elements(out), "an element the rewrite does not own changed"
    assert parse(inp)[0].hostdev_sources == parse(out)[0].hostdev_sources, "hostdev sources changed or moved"
    again = rewrite_domain(out, host).xml
    assert canonical(again) == canonical(out), "not idempotent: rewriting the output changes it"


def mmio_projection(out: bytes) -> tuple:
    """What the mmio and p2p-clique options write (re-emitted on every call)."""
    root = etree.fromstring(out)
    m = root.find("cpu/maxphysaddr")
    feats = tuple(sorted(f.get("name") for f in root.findall("cpu/feature")))
    props = {a: {n: (p.type, p.value) for n, p in ps.items()} for a, ps in override_properties(root).items()}
    return (dict(m.attrib) if m is not None else None, feats, json.dumps(props, sort_keys=True))


def check_mmio(out: bytes, result) -> None:
    """<maxphysaddr> exactly when the budget needs more than QEMU's default width;
    pref64-reserve only on our root ports, cliques only on hostdev aliases of the domain."""
    root = etree.fromstring(out)
    b = result.report.mmio
    assert (root.find("cpu/maxphysaddr") is not None) == (b.bits is not None), "maxphysaddr without need, or missing"
    ports = {c.find("alias").get("name") for c in root.iter("controller")
             if c.get("model") == "pcie-root-port" and c.find("alias") is not None}
    hostdevs = {h.find("alias").get("name") for h in root.iter("hostdev") if h.find("alias") is not None}
    for alias, ps in override_properties(root).items():
        if "pref64-reserve" in ps:
            assert alias in ports and alias.startswith("ua-pcitopo-"), f"pref64-reserve on {alias}"
            assert b.firmware == "seabios"
        if "x-nv-gpudirect-clique" in ps:
            assert alias in hostdevs, f"clique on {alias}, not a hostdev"


def run_case(case: Case, schema) -> None:
    host = case.world.host
    note(case.xml.decode())
    inp = case.xml
    first = None
    report = None
    for call in range(case.calls):
        try:
            result = rewrite_domain(inp, host)
        except Exception as e:  # noqa: BLE001 - the property is about what escapes
            err = assert_typed_one_line(e)
            assert call == 0, f"call {call + 1} failed after call 1 succeeded: {type(err).__name__}: {err}"
            assert explained(case, err), f"typed error on a valid input: {type(err).__name__}: {err}"
            event(f"explained failure: {err.kind}")
            return
        out = result.xml
        check_output(inp, out, host, schema)
        check_mmio(out, result)
        owned = (owned_projection(out), mmio_projection(out))
        if first is None:
            first = owned
            report = result.report
        else:
            assert owned == first, f"call {call + 1} emits different controllers or placements than call 1"
        inp = next_call_input(out, case.release, decimal_bus=case.decimal_bus and call % 2 == 0)
    assert not case.unplaceable, "a device behind a PCIe-to-PCI bridge was placed"
    p, _ = parse(out)
    n = len(p.hostdev_sources)
    assert len(report.pairs) == n * (n - 1) // 2
    if any(numa_divergent(host, b) for b in p.hostdev_sources):
        event("numa_node missing/-1 on some functions only (unexpressible pairs skipped)")
    if len(crowded_port(host, p.hostdev_sources)):
        event("more than 8 functions below one host port")
    # A numa_node missing or -1 on some functions only: NCCL's raw CPU and the model's
    # inherited node disagree on the host; no guest can show both (see the tests below).
    known = dict(tolerate_numa_divergence=True)
    if case.guest_numa and case.acpi:
        diffs = class_differences(out, host, **known)
        assert not diffs, "guest class differs from host class:\n  " + "\n  ".join(diffs)
        lost = [f"{x.a}-{x.b}: {x.why}" for x in report.fidelity_lost
                if not (numa_divergent(host, x.a) or numa_divergent(host, x.b))]
        assert not lost, "the rewrite's own verification reports lost fidelity:\n  " + "\n  ".join(lost)
        event("guest NUMA: classes compared")
    else:
        # Without guest NUMA the guest cannot show SYS/NODE across host nodes; pairs within
        # one host node must still match.
        same_node = [d for d in class_differences(out, host, **known) if _same_node(host, d)]
        assert not same_node, "pairs within one host NUMA node differ:\n  " + "\n  ".join(same_node)
        event("no guest NUMA: same-node classes compared")
    event(f"layout {case.layout}, {case.calls} call(s), KubeVirt {case.release.value}")


def _same_node(host, diff: str) -> bool:
    a, b = diff.split(": host", 1)[0].split("-", 1)
    fa, fb = host.function(a), host.function(b)
    return host.numa_of(fa) == host.numa_of(fb) and host.numa_of(fa) >= 0


# -- the main property ------------------------------------------------------------------------

@settings(max_examples=hp.budget("rewrite"))
@given(case=cases(generated_worlds(mixed_numa=True)))
def test_generated_worlds(case, schema):
    RUNS["rewrite"] += 1
    for tag in sorted(case.world.tags):
        event(f"world: {tag}")
    event(f"devices: {'1' if len(case.devices) == 1 else '2-4' if len(case.devices) <= 4 else '5+'}")
    run_case(case, schema)


@settings(max_examples=hp.budget("fixtures"))
@given(case=cases(fixture_worlds(), max_devices=20))
def test_fixture_hosts(case, schema):
    """The committed fixture hosts (real layouts: HGX, DGX, B200, PCIe servers) as worlds."""
    RUNS["fixtures"] += 1
    run_case(case, schema)


# -- any input: only typed, one-line failures --------------------------------------------------

@settings(max_examples=hp.budget("mutated"))
@given(mutated=mutated_domains(cases(st.one_of(generated_worlds(), fixture_worlds()), max_devices=6)))
def test_mutated_domains_fail_typed(mutated):
    """Domains with hostile attribute values, texts, dropped or duplicated elements: the rewrite
    either succeeds (and its output parses and rewrites again) or raises a typed one-line error."""
    RUNS["mutated"] += 1
    case, xml = mutated
    note(xml.decode())
    try:
        out = rewrite_domain(xml, case.world.host).xml
    except Exception as e:  # noqa: BLE001
        err = assert_typed_one_line(e)
        event(f"typed: {err.kind}")
        return
    etree.fromstring(out)
    try:
        rewrite_domain(out, case.world.host)
    except Exception as e:  # noqa: BLE001
        assert_typed_one_line(e)
    event("accepted")


@st.composite
def mutated_sysfs(draw):
    """A generated host's sysfs tree with a few entries removed, turned into directories or
    links, given garbage content, or made into symlink loops."""
    world = draw(generated_worlds(bmc=False, max_nodes=2))
    from pcitopo.synth import build_tree, parse_topo

    tree = build_tree(parse_topo(world.topo, "mutated"))
    entries = list(tree.iter_entries())
    victims = draw(st.lists(st.sampled_from([r for r, _ in entries]), min_size=1, max_size=4, unique=True))
    ops = {v: draw(st.sampled_from(("remove", "dir", "garbage", "huge", "loop", "dangling", "empty", "abslink"))) for v in victims}
    out = MemoryTree("mutated")
    for rel, entry in entries:
        op = ops.get(rel)
        kind = type(entry).__name__
        if op == "remove" or any(rel.startswith(v + "/") and ops[v] in ("remove", "loop", "dangling", "garbage") for v in victims):
            continue
        try:
            if op == "dir":
                out.add_dir(rel)
            elif op == "garbage":
                out.add_file(rel, draw(st.binary(max_size=40)))
            elif op == "huge":
                out.add_file(rel, b"0x10de\n" * 1000)
            elif op == "empty":
                out.add_file(rel, b"")
            elif op == "loop":
                out.add_link(rel, rel.rsplit("/", 1)[-1])
            elif op == "dangling":
                out.add_link(rel, "../../nowhere/at/all")
            elif op == "abslink":
                out.add_link(rel, "/etc/passwd")
            elif kind == "_File":
                out.add_file(rel, entry.data)
            elif kind == "_Link":
                out.add_link(rel, entry.target)
            else:
                out.add_dir(rel)
        except PcitopoError:
            pass  # e.g. a file below what is now a file: the tree refuses, skip it
    return world, out, ops


@settings(max_examples=hp.budget("sysfs"))
@given(data=mutated_sysfs())
def test_mutated_sysfs_fail_typed(data):
    """A damaged sysfs (missing, unreadable, oversized, looping entries): reading it and
    rewriting a domain over every function still readable yields typed errors only."""
    RUNS["sysfs"] += 1
    world, tree, ops = data
    note(repr(ops))
    from testkit.kubevirt_sim import DomainSpec, kubevirt_domain

    try:
        host = Topology(SysfsReader(tree))
        devices = [f.bdf for f in host.functions() if not f.is_bridge][:6]
        if not devices:
            event("nothing readable left")
            return
        xml = kubevirt_domain(host, DomainSpec("damaged", tuple(devices)))
        rewrite_domain(xml, host)
        event("accepted")
    except Exception as e:  # noqa: BLE001
        err = assert_typed_one_line(e)
        event(f"typed: {err.kind}")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_annotation_keys = st.sampled_from([f"{PREFIX}mode", f"{PREFIX}on-error", f"{PREFIX}on-eror", f"{PREFIX}", "kubevirt.io/x",
                                    f"{PREFIX}MODE"])
_annotation_values = st.sampled_from(["mirror", "off", "fail", "passthrough", "Mirror", "", " off", "true", "0"]) | st.text(max_size=8)


@st.composite
def vmi_documents(draw) -> bytes:
    kind = draw(st.sampled_from(("json", "vmi", "bytes")))
    if kind == "bytes":
        return draw(st.binary(max_size=60))
    if kind == "json":
        return json.dumps(draw(_json)).encode()
    annotations = draw(st.dictionaries(_annotation_keys, _annotation_values | _json, max_size=3))
    meta = {"name": draw(st.text(max_size=6)), "namespace": "default", "annotations": annotations}
    return json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": meta}).encode()


@settings(max_examples=hp.budget("vmi"))
@given(vmi=vmi_documents())
def test_vmi_json_fails_typed(vmi):
    """Any VMI JSON (or garbage bytes): the options parse or fail with a typed one-line error."""
    RUNS["vmi"] += 1
    try:
        parse_vmi(vmi)
        from pcitopo.serve.options import options_from_vmi

        options_from_vmi(vmi)
        event("accepted")
    except Exception as e:  # noqa: BLE001
        err = assert_typed_one_line(e)
        event(f"typed: {err.kind}")


@settings(max_examples=hp.budget("passthrough"))
@given(mutated=mutated_domains(cases(generated_worlds(bmc=True), max_devices=4)))
def test_passthrough_returns_input_unchanged(mutated):
    """Under on-error: passthrough, a rewrite failure hands back the input as sent (with only
    libvirt's default hostdev mode written where it was missing); a success hands back
    what rewrite_domain returns."""
    RUNS["passthrough"] += 1
    case, xml = mutated
    vmi = json.dumps({"metadata": {"annotations": {f"{PREFIX}on-error": "passthrough"}}}).encode()
    out = handle_define_domain(xml, vmi, case.world.host)
    if out.outcome == "passthrough":
        assert out.xml == with_hostdev_modes(xml)[0]
        assert out.reason and "\n" not in out.reason
        event("passthrough")
    else:
        assert out.outcome == "rewritten"
        assert out.xml == rewrite_domain(xml, case.world.host).xml
        event("rewritten")


# -- bugs the properties found (minimal examples; strict xfail keeps CI green and the bug visible) --

TAKEOVER_TOPO = """\
numa 0 cpus=0-7

rc 0000:00 numa=0
  rp 00:01.0 preset=intel-rp
    ep 01:00.0 preset=cx7-ib functions=2
"""


def test_takeover_leaves_no_index_gaps():
    """Regression (found by test_generated_worlds, fixed in 0764344): taking over KubeVirt's
    PCINUMAAwareTopology layout (pxb + one root port per function) with libvirt's root ports
    above it left index gaps when the mirror needed fewer controllers; libvirt fills gaps with
    root ports on pcie-root that the bus budget did not count."""
    world = world_from_topo(TAKEOVER_TOPO, "takeover")
    xml = build_domain(world, world.assignable, layout="preplaced-defined")
    out = rewrite_domain(xml, world.host).xml
    assert check_rules(out) == []


NUMA_TOPO = """\
numa 0 cpus=0-7

rc 0000:00 numa=0
  rp 00:00.0 preset=intel-rp
    ep 01:00.0 preset=h100
  rp 00:01.0 preset=intel-rp
    ep 02:00.0 preset=h100 omit=numa_node
"""


def test_inconsistent_numa_node_is_explained_not_lost():
    """Regression (found by test_generated_worlds, explained in 0764344): a function without
    numa_node is its own NCCL CPU on the host (SYS to its neighbour, while NVML says PHB); no
    guest can show that, and the report says so instead of calling it a planner bug."""
    world = world_from_topo(NUMA_TOPO, "numa-missing")
    result = rewrite_domain(build_domain(world, world.assignable), world.host)
    assert result.report.fidelity_lost == []
    assert {p.why for p in result.report.pairs} <= {None, Why.UNEXPRESSIBLE}
    assert all(p.detail for p in result.report.pairs if p.why is Why.UNEXPRESSIBLE)


NUMA_SWITCH_TOPO = """\
numa 0 cpus=0-7

rc 0000:00 numa=0
  rp 00:00.0 preset=intel-rp
    us 01:00.0 preset=pex-gen5-oem omit=numa_node
      ds 02:00.0
        ep 03:00.0 preset=h100
  rp 00:01.0 preset=intel-rp
    ep 04:00.0 preset=h100
"""

NUMA_CROSS_RC_TOPO = """\
numa 0 cpus=0-7

rc 0000:00 numa=0
  rp 00:00.0 preset=intel-rp
    ep 01:00.0 preset=h100 omit=numa_node
rc 0000:02 numa=0
  rp 02:00.0 preset=intel-rp
    ep 03:00.0 preset=h100
"""


@pytest.mark.parametrize("topo", [NUMA_SWITCH_TOPO, NUMA_CROSS_RC_TOPO], ids=["switch-without-numa", "across-root-complexes"])
def test_inconsistent_numa_node_is_never_called_a_planner_bug(topo):
    """Regression (found by the properties): NCCL's raw numa_node differing from the model's
    inherited node is unexpressible in a guest, and is reported as such, never as a bug."""
    world = world_from_topo(topo, "numa-missing")
    result = rewrite_domain(build_domain(world, world.assignable), world.host)
    assert [p.reason for p in result.report.pairs if p.why is Why.UNEXPECTED] == []
    assert result.report.fidelity_lost == []


SPLIT_TOPO = """\
numa 0 cpus=0-7

rc 0000:00 numa=0
  rp 00:00.0 preset=intel-rp
    ep 01:00.0 preset=cx7-ib functions=2 vfs=4
"""


def test_more_than_eight_functions_keep_host_class():
    """Regression (found by the fuzz profile, fixed in 0764344): more than 8 functions below
    one host port were split over sibling guest root ports, so pairs across the split read
    PHB in the guest where the host says PIX."""
    world = world_from_topo(SPLIT_TOPO, "split")
    xml = build_domain(world, world.assignable)
    result = rewrite_domain(xml, world.host)
    assert class_differences(result.xml, world.host) == []
    assert result.report.fidelity_lost == []


# -- keep this last: the example count ---------------------------------------------------------

PROPERTIES = ("test_generated_worlds", "test_fixture_hosts", "test_mutated_domains_fail_typed",
              "test_mutated_sysfs_fail_typed", "test_vmi_json_fails_typed", "test_passthrough_returns_input_unchanged")


def test_zz_example_count(request, capsys):
    """Print how many examples the properties above ran in this session; under the fuzz
    profile, when all of them ran, insist on the minimum (hypothesis may stop a property early,
    and that must not pass silently)."""
    total = sum(RUNS.values())
    line = f"hypothesis profile {hp.PROFILE}: {total} examples run (" + ", ".join(f"{k} {v}" for k, v in sorted(RUNS.items())) + ")"
    with capsys.disabled():
        print(f"\n{line}")
    ran = {item.originalname for item in request.session.items if item.module is request.module}
    if hp.PROFILE == "fuzz" and set(PROPERTIES) <= ran:
        assert total >= hp.FUZZ_MINIMUM, f"fuzz profile ran only {total} examples, fewer than {hp.FUZZ_MINIMUM}"


def test_watchdog_buses_are_budgeted():
    """Regression (found by the properties): libvirt puts KubeVirt's i6300esb watchdog behind a
    pcie-to-pci-bridge in a root port (2 buses, libvirt 9.0); the budget counts both."""
    text = (Path(__file__).parent / "hostile/hosts/bus-exhaustion.topo").read_text()
    world = world_from_topo(text, "tight")
    # Drop root-bus GPUs (one bus each) until the planner says the domain just fits.
    for drop in range(1, 10):
        xml = build_domain(world, world.assignable[:-drop], others=("watchdog",))
        try:
            out = rewrite_domain(xml, world.host).xml
            break
        except PcitopoError as e:
            assert str(e).startswith("out of PCI buses"), e
    assert check_rules(as_booted(out), hotplug_reserve=False) == []
