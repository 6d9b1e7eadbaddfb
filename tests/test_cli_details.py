"""Small promises of the commands' output with no better home: virtctl lines that can be pasted,
the firmware named, one label per device, the dot picture's title, the NCCL file's note, the
demo's closing story, the command reference's command list (the pcieRoot rule is in test_pairs.py)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from pcitopo.cli.main import xmlfix_main
from testkit import REPO as ROOT

DOCS = ROOT / "docs"

# virtctl scp's options that take a value (pkg/virtctl/ssh AddCommandlineArgs, and kubectl's -n)
_VIRTCTL_VALUED = {"-n", "--namespace", "-i", "--identity-file", "-p", "--port", "-l", "--username",
                   "-t", "--local-ssh-opts", "--known-hosts", "--kubeconfig", "--context"}


def _scp_positionals(line: str) -> list[str]:
    args = shlex.split(line)[2:]  # after "virtctl scp"
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a.startswith("-"):
            skip = a in _VIRTCTL_VALUED  # "--namespace=ml" carries its value
        else:
            out.append(a)
    return out


def test_virtctl_scp_lines_have_a_source_and_a_destination():
    """`virtctl scp` takes exactly two positional arguments (kubevirt/kubevirt
    pkg/virtctl/scp/scp.go: templates.ExactArgs("scp", 2)); GUEST.md gave it three."""
    docs = [ROOT / "README.md", *DOCS.glob("*.md")]
    found = []
    for doc in docs:
        for line in doc.read_text().splitlines():
            if re.match(r"\s*(\$ )?virtctl scp ", line):
                found.append((doc.name, line))
                args = _scp_positionals(line.strip().removeprefix("$ "))
                assert len(args) == 2, (doc.name, line, args)
                assert sum(":" in a for a in args) == 1, (doc.name, line)  # one side is the VM
    assert len(found) >= 2, found  # the guest tool and the prediction, one command each


def _deploy_launcher_table() -> dict[str, dict[str, str]]:
    """DEPLOY.md's "What virt-launcher itself ships" table (KubeVirt releases): release -> column -> version."""
    text = (DOCS / "DEPLOY.md").read_text()
    section = text[text.index("## KubeVirt releases"):]
    rows = [ln for ln in section.split("| KubeVirt | QEMU", 1)[1].splitlines() if ln.startswith("| v")]
    head = ["KubeVirt", "QEMU", "libvirt", "SeaBIOS", "edk2"]
    table = {}
    for ln in rows:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        table[cells[0]] = dict(zip(head, cells))
    return table


def _explain(capsys, fixture: str = "hgx-b200", *extra: str) -> str:
    """``xmlfix --explain`` of a fixture's golden input, its folded lines joined again."""
    src = ROOT / "fixtures" / fixture
    assert xmlfix_main(["--explain", *extra, "--sysfs", str(src), str(src / "domain.xml")]) == 0
    return re.sub(r"\n {4,}", " ", capsys.readouterr().out)


def test_explain_names_the_firmware_virt_launcher_ships(capsys):
    """`--explain` said "OVMF 2025.02, as KubeVirt 1.8-1.9's virt-launcher ships it" while DEPLOY
    section 12 says edk2 20241117 (kubevirt/kubevirt hack/rpm-deps.sh, EDK2_VERSION 0:20241117-8.el9
    at v1.8.0 and v1.9.0). One constant each now, and the doc's table is held to them."""
    from pcitopo.guest.mmio import EDK2_VERSION, FIRMWARE_OF
    from pcitopo.guest.seabios import VERSION as SEABIOS_VERSION

    table = _deploy_launcher_table()
    v18_19 = [r for r in table if r.startswith(("v1.8.", "v1.9."))]
    assert v18_19, table
    for release in v18_19:
        assert table[release]["edk2"] == EDK2_VERSION, release
        assert table[release]["SeaBIOS"] == SEABIOS_VERSION, release
    assert "1.8-1.9" in FIRMWARE_OF
    text = _explain(capsys)
    assert f"ovmf (edk2 {EDK2_VERSION}, {FIRMWARE_OF}): rule: " in text
    assert f"seabios (SeaBIOS {SEABIOS_VERSION}, {FIRMWARE_OF}): " in text
    assert "OVMF 2025.02, as" not in text


def _h100_domain(tmp_path, cells: str) -> str:
    """GPU0, NIC0, GPU4 and NIC6 of hgx-h100 (NUMA nodes 0 and 1) as virt-launcher writes them:
    ``cells`` "none" (no guest NUMA), "one" (a cell for node 0 only) or "both"."""
    from lxml import etree

    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Bdf
    from testkit.kubevirt_sim import DomainSpec, kubevirt_domain

    host = open_host(ROOT / "fixtures" / "hgx-h100")
    devs = tuple(Bdf.parse(b) for b in ("0000:18:00.0", "0000:19:00.0", "0000:9a:00.0", "0000:9b:00.0"))
    root = etree.fromstring(kubevirt_domain(host, DomainSpec("vm", devs, guest_numa=cells != "none")))
    if cells == "one":
        for el in root.findall("cpu/numa/cell")[1:] + root.findall("numatune/memnode")[1:]:
            el.getparent().remove(el)
    out = tmp_path / f"domain-{cells}.xml"
    out.write_bytes(etree.tostring(root))
    return str(out)


def _dot_title(dot: str) -> list[str]:
    """The picture's title, one line a list item (DOT's ``\\n`` line breaks)."""
    label = re.search(r'^  label="(.*?)"; labelloc=t', dot, re.M).group(1)
    return label.split("\\n")


@pytest.mark.parametrize("cells", ["none", "one", "both"])
def test_dot_title_is_the_check_verdict(tmp_path, capsys, cells):
    """The --dot title counted ``fidelity_lost`` ("NCCL 3/6 ... 4 pair(s) lost" against --check's
    3 differences without guest cells) and ignored cells (6/6 with one cell, while --check exits
    1 on NUMA). It now says what --check decides and its verdict, from the one function."""
    dom = _h100_domain(tmp_path, cells)
    sysfs = str(ROOT / "fixtures" / "hgx-h100")
    rc = xmlfix_main(["--check", "--sysfs", sysfs, dom])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    state, verdict = re.match(r"xmlfix: check: (ok|failed): (.*)", last).groups()
    assert (rc == 1) == (state == "failed")
    assert xmlfix_main(["--dot", "--sysfs", sysfs, dom]) == 0
    title = _dot_title(capsys.readouterr().out)
    assert title[1] == f"check: {state}"
    assert title[2:-1] == [p.replace(" (above)", " (xmlfix --check says why)") for p in verdict.split("; ")]
    assert not any("lost" in line for line in title)
    if cells != "both":
        assert state == "failed" and any(line.startswith("NUMA: ") for line in title)
    if cells == "none":
        assert "NCCL: 3/6 pairs as on the host, 3 SYS→PHB (no guest NUMA cells)" in title


def test_explain_never_gives_two_devices_one_label(tmp_path, capsys):
    """One --explain named 0000:27:00.0 NIC0 in its legend and NIC2 in its pairing note, where
    "the host's NIC0" was 0000:1b:00.0. The legend and matrices number the VM's own devices (as
    the guest's nvidia-smi does); host-numbered labels are written ``host NIC0`` everywhere
    (model/labels.py ``host_label``). Here: hgx-b300's GPU0 with NIC1, its best being NIC0."""
    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Bdf
    from testkit.kubevirt_sim import DomainSpec, kubevirt_domain

    src = ROOT / "fixtures" / "hgx-b300"
    dom = tmp_path / "d.xml"
    dom.write_bytes(kubevirt_domain(open_host(src), DomainSpec("pairs", (Bdf.parse("0000:1a:00.0"), Bdf.parse("0000:39:00.0")))))
    assert xmlfix_main(["--explain", "--sysfs", str(src), str(dom)]) == 0
    cap = capsys.readouterr()
    text = re.sub(r"\n {4,}", " ", cap.out + cap.err)
    names: dict[str, set[str]] = {}  # every "LABEL (BDF)" and "LABEL: BDF" the output pairs up
    for label, bdf in re.findall(r"((?:host )?(?:GPU|NIC)\d+)(?: \(|: )([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.\d)", text):
        names.setdefault(label, set()).add(bdf)
    assert all(len(bdfs) == 1 for bdfs in names.values()), names
    assert names["NIC0"] == {"0000:39:00.0"} and names["host NIC1"] == {"0000:39:00.0"}
    assert names["host NIC0"] == {"0000:17:00.0"}
    assert "(host GPU0)" in text  # the verdict's pairing part


@pytest.mark.parametrize("fixture", ["hgx-h100", "dgx-h100", "hgx-b200", "hgx-b300"])
def test_golden_domains_pass_through_only_vfio_bound_devices(fixture, capsys):
    """The hgx-h100 and dgx-h100 golden domains passed through storage NICs the fixture had on
    mlx5_core, so `xmlfix --check` always warned "doctor: 4 fail (vfio-driver ...)". Every
    device a golden domain passes through is on vfio-pci in its fixture; --check warns nothing."""
    from lxml import etree

    from pcitopo.host.sysfs import open_host
    from pcitopo.model.tree import Bdf

    src = ROOT / "fixtures" / fixture
    host = open_host(src)
    addrs = etree.parse(str(src / "domain.xml")).findall("devices/hostdev/source/address")
    bdfs = [Bdf.parse(f"{int(a.get('domain'), 16):04x}:{int(a.get('bus'), 16):02x}:{int(a.get('slot'), 16):02x}."
                      f"{int(a.get('function'), 16)}") for a in addrs]
    assert len(bdfs) >= 16
    assert [str(b) for b in bdfs if host.function(b).driver != "vfio-pci"] == []
    assert xmlfix_main(["--check", "--sysfs", str(src), str(src / "domain.xml")]) == 0
    err = capsys.readouterr().err
    assert "warning" not in err and "xmlfix: check: ok: " in err


def test_nccl_file_note_counts_the_vms_gpus_and_nics(capsys):
    """A note said "18 GPUs and NICs" for a 20-device VM (it counted the file's PCI devices, a
    dual-function BlueField-3 once). It now counts the placed GPU and NIC functions the file
    describes, as the legend does: 8 and 12 on hgx-b200's golden domain."""
    text = _explain(capsys)
    legend = re.findall(r"^  (GPU|NIC)\d+: ", text, re.M)
    gpus, nics = legend.count("GPU"), legend.count("NIC")
    assert (gpus, nics) == (8, 12)
    assert f"NCCL's topology file for this guest ({gpus} GPU(s) and {nics} NIC(s), the host's link speeds)" in text


def test_make_demo_ends_with_the_story_in_five_lines():
    """`make demo` printed 328 lines with the verdict at line 87, and under EFI a SeaBIOS line
    ("model 24/28 BARs placed") that read as a failure. It ends with host, guest, verdict, doctor
    and picture lines now (xmlfix --summary, then the picture), and says SeaBIOS is not used."""
    import subprocess
    import sys
    from pathlib import Path

    makefile = (ROOT / "Makefile").read_text()
    demo = makefile.split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    steps = [ln.strip() for ln in demo.splitlines() if "$(BIN)/" in ln]
    assert "xmlfix --summary --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml" in steps[-2]
    assert "xmlfix --dot --sysfs fixtures/hgx-b200 fixtures/hgx-b200/domain.xml" in steps[-1]
    assert 'echo "picture: build/hgx-b200.svg' in demo.split("xmlfix --dot", 1)[1]
    bin_dir = Path(sys.executable).parent
    args = ["--sysfs", "fixtures/hgx-b200", "fixtures/hgx-b200/domain.xml"]
    summary = subprocess.run([str(bin_dir / "xmlfix"), "--summary", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0 and summary.stderr == ""
    lines = summary.stdout.splitlines()
    assert [ln.split(":", 1)[0] for ln in lines] == ["host", "guest", "verdict", "doctor"]
    assert "8 GPUs, 12 NICs" in lines[0] and "8 GPUs and 12 NICs" in lines[1] and "firmware ovmf" in lines[1]
    check = subprocess.run([str(bin_dir / "xmlfix"), "--check", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert lines[2] == "verdict: check ok: " + check.stderr.strip().split("xmlfix: check: ok: ", 1)[1]
    assert lines[3] == "doctor:  ready for GPUDirect RDMA in VMs (0 fail, 0 warn, 0 unknown, 197 ok)"
    explain = subprocess.run([str(bin_dir / "xmlfix"), "--explain", *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    text = re.sub(r"\n {4,}", " ", explain.stdout)  # --explain folds at 100 columns
    seabios = [ln for ln in text.splitlines() if "seabios" in ln.lower()]
    assert seabios and all("BARs placed" not in ln for ln in seabios), seabios
    assert "not this domain's firmware (it boots OVMF)" in " ".join(seabios)


def test_the_cli_reference_documents_every_pcitopo_command(capsys):
    """The README's command list once missed `pairs` and `guest`. docs/CLI.md documents every
    subcommand the CLI's argparse parser has (bare `pcitopo` prints them), and only those: one
    `usage: pcitopo NAME` block each."""
    from pcitopo.cli.main import pcitopo_main

    assert pcitopo_main([]) == 2
    usage = capsys.readouterr().err
    commands = set(re.search(r"\{([a-z,-]+)\}", usage).group(1).split(","))
    assert {"pairs", "guest", "topo", "serve"} <= commands
    reference = (DOCS / "CLI.md").read_text()
    documented = set(re.findall(r"^usage: pcitopo ([a-z-]+) ", reference, re.M))
    assert documented == commands, (commands - documented, documented - commands)


def test_xmlfix_warns_when_the_vmi_is_not_the_domains(tmp_path, capsys):
    """xmlfix said nothing when the VMI's name differed from the domain's <name>: KubeVirt names
    a domain <namespace>_<name> (kubevirt/kubevirt pkg/virt-launcher/virtwrap/api/schema.go
    VMINamespaceKeyFunc), so another name means another VM's dumpxml beside this VMI."""
    src = ROOT / "fixtures" / "hgx-h100"
    dom = src / "cases" / "one-pair" / "domain.xml"
    name = re.search(rb"<name>([^<]+)</name>", dom.read_bytes()).group(1).decode()
    ns, vm = name.split("_", 1)

    def warnings(meta: dict) -> list[str]:
        vmi = tmp_path / "vmi.json"
        # both doors: on v1.9.0 (what --check assumes) the Plugin label alone would not start
        both = {"labels": {"pcitopo.kubevirt.io/plugin": "true"},
                "annotations": {"hooks.kubevirt.io/hookSidecars": '[{"image": "pcitopo"}]'}}
        vmi.write_text(json.dumps({"metadata": {**both, **meta}}))
        assert xmlfix_main(["--check", "--vmi", str(vmi), "--sysfs", str(src), str(dom)]) == 0
        return [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("xmlfix: warning: vmi: ")]

    assert warnings({"namespace": ns, "name": vm}) == []
    assert warnings({"name": vm}) == []  # no namespace given: only the name is compared
    (line,) = warnings({"namespace": ns, "name": "other-vm"})
    assert (f"the VMI is {ns}/other-vm, whose domain KubeVirt names {ns}_other-vm, but the domain's <name> is "
            f"{name}") in line
    (line,) = warnings({"namespace": "prod", "name": vm})
    assert f"KubeVirt names prod_{vm}" in line
    assert warnings({}) == []  # a VMI without a name: nothing to compare
