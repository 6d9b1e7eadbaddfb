"""`pcitopo topo --dot` and `xmlfix --explain --dot` draw the host tree and
the predicted guest tree in one Graphviz picture, and Graphviz (Debian's `graphviz`) renders it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from testkit import REPO as ROOT

BIN = Path(sys.executable).parent
NODE = re.compile(r'^\s*"(host|guest):([^"]+)" \[(.*)\];$')


def run(cmd: str, *args: str) -> str:
    r = subprocess.run([str(BIN / cmd), *args], cwd=ROOT, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.decode()


@pytest.fixture(scope="module")
def dot_bin() -> str:
    path = shutil.which("dot")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail("Graphviz `dot` missing: run scripts/setup-debian.sh")
        pytest.skip("Graphviz `dot` missing: run scripts/setup-debian.sh")
    return path


def nodes(dot: str) -> dict[tuple[str, str], dict[str, str]]:
    out = {}
    for line in dot.splitlines():
        m = NODE.match(line)
        if m:
            attrs = dict(re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|[^,\]]+)', m.group(3)))
            out[(m.group(1), m.group(2))] = {k: v.strip('"') for k, v in attrs.items()}
    return out


def render_svg(dot_bin: str, dot: str) -> str:
    r = subprocess.run([dot_bin, "-Tsvg"], input=dot.encode(), capture_output=True, timeout=120)
    assert r.returncode == 0 and not r.stderr, r.stderr
    return r.stdout.decode()


def test_topo_dot_renders_with_graphviz(dot_bin):
    """The DOT of `pcitopo topo --dot` parses and renders with Graphviz."""
    dot = run("pcitopo", "topo", "--dot", "--sysfs", "fixtures/hgx-b200")
    svg = render_svg(dot_bin, dot)
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("GPU0", "NIC11", "predicted guest", "pci0000:15 · NUMA 0", "expander bus e0 · guest cell 0"):
        assert text in svg, text


def test_pairs_share_a_colour_on_both_sides_and_switches_are_boxes():
    """Each GPU–NIC pair its own colour, the same in host and guest; switches are
    boxes; root complexes are clusters labelled with the NUMA node / guest cell."""
    dot = run("pcitopo", "topo", "--dot", "--sysfs", "fixtures/hgx-b200")
    ns = nodes(dot)
    host = {k[1]: v for k, v in ns.items() if k[0] == "host"}
    guest = {v["label"].split("\\n")[0]: v for k, v in ns.items() if k[0] == "guest" and "fillcolor" in v and "label" in v}
    gpus = {v["label"].split("\\n")[0]: v["fillcolor"] for v in host.values() if v["label"].startswith("GPU")}
    nics = {v["label"].split("\\n")[0]: v["fillcolor"] for v in host.values() if v["label"].startswith("NIC")}
    assert len(gpus) == 8 and len(set(gpus.values())) == 8  # one colour per pair
    # hgx-b200: GPUi pairs with the ConnectX-7 on its own Broadcom switch (PIX).
    for gpu, nic in {"GPU0": "NIC0", "GPU1": "NIC1", "GPU2": "NIC4", "GPU7": "NIC11"}.items():
        assert gpus[gpu] == nics[nic]
        assert guest[gpu]["fillcolor"] == guest[nic]["fillcolor"] == gpus[gpu]
    assert nics["NIC2"] == "#ffffff"  # the BlueField-3 on its own root port pairs with no GPU
    switches = [v for v in host.values() if v.get("shape") == "box"]
    assert len(switches) == 12 and all(v["label"].startswith("switch ") for v in switches)
    assert sum(1 for v in ns.values() if v.get("shape") == "box" and "QEMU" in v.get("label", "")) == 4
    assert 'label="pci0000:37 · NUMA 1"' in dot and 'label="expander bus f9 · guest cell 3"' in dot


def test_xmlfix_explain_dot_shows_the_domains_guest(dot_bin):
    """`xmlfix --explain --dot` draws the guest of the given domain (here one without
    guest NUMA cells: its expander buses say so)."""
    dot = run("xmlfix", "--explain", "--dot", "--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/cases/no-numa/domain.xml")
    assert dot.startswith("digraph pcitopo {") and "<domain" not in dot
    assert "no guest cell" in dot and "guest cell 0" not in dot
    render_svg(dot_bin, dot)
    one_pair = run("xmlfix", "--dot", "--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/cases/one-pair/domain.xml")
    labels = [v["label"].split("\\n")[0] for k, v in nodes(one_pair).items()
              if k[0] == "host" and v.get("shape") == "ellipse" and "fillcolor" in v]
    assert sorted(labels) == ["GPU0", "NIC0"]
    render_svg(dot_bin, one_pair)


@pytest.mark.parametrize(
    "argv, named",
    [
        (("xmlfix", "--dot", "--json"), b"--json"),
        (("xmlfix", "--explain", "--dot", "--json"), b"--json"),
        (("xmlfix", "--dot", "--diff"), b"--dot"),
        (("pcitopo", "topo", "--dot", "--json"), b"--json and --dot"),
        (("pcitopo", "topo", "--dot", "--tree"), b"--tree and --dot"),
    ],
)
def test_dot_is_one_document_and_never_mixed_with_another_output(argv, named):
    """--dot prints one Graphviz document, so with --json,
    --diff or --tree it is a one-line error (exit 2) naming the clash, and stdout stays empty."""
    cmd, *rest = argv
    domain = ["fixtures/hgx-b200/domain.xml"] if cmd == "xmlfix" else []
    r = subprocess.run([str(BIN / cmd), *rest, "--sysfs", "fixtures/hgx-b200", *domain], cwd=ROOT, capture_output=True, timeout=120)
    assert r.returncode == 2 and r.stdout == b""
    assert named in r.stderr and len(r.stderr.strip().splitlines()) == 1
