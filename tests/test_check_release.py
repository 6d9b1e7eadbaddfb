"""`xmlfix --check` judges the VMI as the named KubeVirt release would: `--cluster FILE` (a dump:
release, gates, Plugin objects) or `--kubevirt VERSION`; without them it says which release it
assumed. The example VMI (deploy/vmi-gpu.yaml) on its stand-in HGX B200 node, with its doors
changed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
B200 = ROOT / "fixtures" / "hgx-b200"
DOMAIN = B200 / "examples" / "vmi-gpu" / "domain.xml"
DUMPS = ROOT / "fixtures" / "clusters"
EXAMPLE = (ROOT / "deploy" / "vmi-gpu.yaml").read_text()
ANNOTATION = next(ln for ln in EXAMPLE.splitlines() if ln.strip().startswith("hooks.kubevirt.io/hookSidecars:"))
LABEL = next(ln for ln in EXAMPLE.splitlines() if ln.strip().startswith("pcitopo.kubevirt.io/plugin:"))


def vmi(tmp_path: Path, doors: str) -> Path:
    """The example with ``doors``: both, label, hook, or bad-json (both, the annotation's JSON broken)."""
    text = EXAMPLE
    if doors == "label":
        text = text.replace(ANNOTATION + "\n", "")
    elif doors == "hook":
        text = text.replace(LABEL + "\n", "").replace("  labels:\n", "  labels: {}\n", 1)
    elif doors == "bad-json":
        text = text.replace(ANNOTATION, ANNOTATION.replace("}]'", "}'"))
    out = tmp_path / f"{doors}.yaml"
    out.write_text(text)
    return out


def check(tmp_path: Path, doors: str, *extra: str) -> subprocess.CompletedProcess:
    args = [str(BIN / "xmlfix"), "--check", "--sysfs", str(B200), "--vmi", str(vmi(tmp_path, doors)), *extra, str(DOMAIN)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


def verdict(r: subprocess.CompletedProcess) -> str:
    return r.stderr.splitlines()[-1]


def test_v190_with_a_plugin_object_and_no_pcitopo_hook_does_not_start(tmp_path):
    r = check(tmp_path, "label", "--cluster", str(DUMPS / "v1.9.0-foreign-plugin.yaml"))
    assert r.returncode == 1
    assert r.stderr.splitlines()[0].startswith("xmlfix: check: kubevirt: does not start: KubeVirt v1.9.0 runs Plugin objects "
                                               "(acme-netplug) for every VM and refuses gpus gpu0")
    assert verdict(r).endswith("judged on KubeVirt v1.9.0 (gates Sidecar, Plugins; Plugin objects acme-netplug); kubevirt (above)")


def test_v190_with_a_plugin_object_and_the_hook_alone_loses_settings(tmp_path):
    r = check(tmp_path, "hook", "--cluster", str(DUMPS / "v1.9.0-foreign-plugin.yaml"))
    assert r.returncode == 1
    # the rewritten domain carries all three, so all three are named
    assert r.stderr.splitlines()[0].startswith(
        "xmlfix: check: kubevirt: starts without maxphysaddr, qemu:override, controller model names: with Plugin objects "
        "(acme-netplug) KubeVirt v1.9.0 re-reads the hook sidecar's reply")


@pytest.mark.parametrize("where", [(), ("--kubevirt", "v1.6.0"), ("--kubevirt", "v1.8.0"), ("--kubevirt", "main+pr18866"),
                                   ("--door", "hook"), ("--door", "plugin"),
                                   ("--cluster", str(DUMPS / "v1.9.0-stranger.yaml")),
                                   ("--cluster", str(DUMPS / "main-pcitopo-plugin.yaml"), "--assume-release", "main+pr18866")])
def test_invalid_hook_sidecars_json_does_not_start_on_any_release_or_door(tmp_path, where):
    r = check(tmp_path, "bad-json", *where)
    assert r.returncode == 1, r.stderr
    assert "KubeVirt cannot parse hooks.kubevirt.io/hookSidecars: not valid JSON" in r.stderr.splitlines()[0]
    assert "not start" in r.stderr.splitlines()[0] and verdict(r).startswith("xmlfix: check: failed: ")


@pytest.mark.parametrize("doors,where,release", [
    ("hook", ("--kubevirt", "v1.8.0"), "KubeVirt v1.8.0 (gates Sidecar; no Plugin object), assumed: release from --kubevirt"),
    ("hook", ("--cluster", str(DUMPS / "v1.8.0.yaml")), "KubeVirt v1.8.0 (gates Sidecar; no Plugin object)"),
    ("both", ("--cluster", str(DUMPS / "v1.9.0-both-plugins.yaml")),
     "KubeVirt v1.9.0 (gates Sidecar, Plugins; Plugin objects acme-netplug, pcitopo)"),
    # a later main, judged as main with PR #18866 once its notes are checked
    ("label", ("--cluster", str(DUMPS / "main-pcitopo-plugin.yaml"), "--assume-release", "main+pr18866"),
     "KubeVirt main+pr18866 (gates Plugins; Plugin objects pcitopo), assumed: KubeVirt v1.10.0-alpha.0 judged as main+pr18866 "
     "(--assume-release)"),
    ("label", ("--kubevirt", "main+pr18866"),
     "KubeVirt main+pr18866 (gates Plugins; Plugin objects pcitopo), assumed: release from --kubevirt"),
])
def test_what_starts_with_every_setting_passes(tmp_path, doors, where, release):
    r = check(tmp_path, doors, *where)
    assert r.returncode == 0, r.stderr
    assert verdict(r).startswith("xmlfix: check: ok: NCCL: ")
    assert f"; starts with all of pcitopo's settings on {release}" in verdict(r)


def test_without_a_release_the_verdict_says_which_it_assumed(tmp_path):
    r = check(tmp_path, "both")
    assert r.returncode == 0 and verdict(r).endswith(
        "starts with all of pcitopo's settings on KubeVirt v1.9.0 (gates Sidecar, Plugins; Plugin objects pcitopo), "
        "assumed: no --cluster or --kubevirt; the pcitopo Plugin object, as its label implies")
    # the label alone, on the release assumed, is the case the issue found passing
    r = check(tmp_path, "label")
    assert r.returncode == 1 and "kubevirt: does not start" in r.stderr and "assumed: no --cluster or --kubevirt" in verdict(r)


def test_door_hook_still_asks_for_the_hook_and_assumes_no_plugin(tmp_path):
    r = check(tmp_path, "label", "--door", "hook")
    assert r.returncode == 1
    assert r.stderr.splitlines()[0] == ("xmlfix: check: sidecar: not attached: no hooks.kubevirt.io/hookSidecars annotation; "
                                        "the VM would boot with KubeVirt's own flat placement")
    assert check(tmp_path, "hook", "--door", "hook").returncode == 0
    # --door plugin: the pcitopo Plugin object is assumed, so on v1.9.0 the hook is needed as well
    r = check(tmp_path, "label", "--door", "plugin")
    assert r.returncode == 1 and "kubevirt: does not start" in r.stderr


@pytest.mark.parametrize("args,said", [
    (["--kubevirt", "latest"], "--kubevirt latest: not a KubeVirt release such as v1.9.0 or main"),
    (["--assume-release", "v1.9.1"], "--assume-release v1.9.1: not a release pcitopo read"),
    (["--cluster", str(DUMPS / "no-kubevirt.yaml")], "has no KubeVirt CR with status.observedKubeVirtVersion: give --kubevirt"),
    (["--cluster", "/nonexistent.yaml"], "cluster dump /nonexistent.yaml: No such file or directory"),
])
def test_a_release_that_cannot_be_read_is_one_line_exit_2(tmp_path, args, said):
    r = check(tmp_path, "both", *args)
    assert r.returncode == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_cluster_and_kubevirt_need_a_vmi_to_judge():
    r = subprocess.run([str(BIN / "xmlfix"), "--check", "--sysfs", str(B200), "--kubevirt", "v1.9.0", str(DOMAIN)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "use them with --check --vmi FILE" in r.stderr
