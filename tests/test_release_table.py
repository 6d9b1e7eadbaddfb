"""One release table (pcitopo.kubevirt.releases), and only releases whose source
was read are judged.

- docs/DEPLOY.md's targets, doors and re-parse tables are rendered here from the package's table
  and must appear in the page as written;
- v1.9.1, v1.10.0, a vendor build and an unparseable version are ``unknown`` (exit 4) in
  ``pcitopo preflight``, ``xmlfix --check`` and ``pcitopo domain``, and ``--assume-release v1.9.0``
  judges them as v1.9.0;
- ``--kubevirt main`` is accepted everywhere a release is; a dump without a KubeVirt CR is unknown;
  two KubeVirt CRs and an unknown ``--assume-release`` are one line, exit 2;
- ``xmlfix --explain`` takes its door from the VM and the release: never the Plugin on v1.9.0.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from pcitopo.kubevirt import releases
from pcitopo.kubevirt.targets import TARGETS

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
DEPLOY_MD = (ROOT / "docs" / "DEPLOY.md").read_text()
DUMPS = ROOT / "fixtures" / "clusters"
STRANGER = DUMPS / "v1.9.0-stranger.yaml"
B200 = ROOT / "fixtures" / "hgx-b200"
DOMAIN = B200 / "examples" / "vmi-gpu" / "domain.xml"
VMI = ROOT / "deploy" / "vmi-gpu.yaml"
MAIN_BUILD = "v1.9.0-beta.0.1264+d923fdb815cd20"  # KubeVirt's own version of a build of the commit read
UNREAD = ("v1.9.1", "v1.10.0", "v1.9.0-vendor.3", "1.9.0~custom build")
DOOR_NAMES = {"hook": "hook sidecar", "plugin": "Plugin"}


# -- the table, and the page's copies of it ------------------------------------------------------

def markdown_targets() -> list[str]:
    return [f"| `{t.name}` | {t.releases} | {', '.join(DOOR_NAMES[d] for d in t.doors)} | {', '.join(t.gates)} | "
            f"{', '.join(f'`{p}`' for p in t.plugin_objects) or 'none'} |" for t in releases.TARGETS]


def markdown_doors() -> list[str]:
    return [f"| {r.releases} | {r.doors} | {r.gates} | {r.survives} |" for r in releases.DOOR_ROWS]


def markdown_reparse() -> list[str]:
    def kept(yes: bool, absent: str = "dropped") -> str:
        return "kept" if yes else absent

    return [f"| {g.label} | {kept(g.controller_target, 'no field')} | {kept(g.controller_target)} | "
            f"{kept(g.target_hotplug)} | {'kept (re-read after the struct)' if g.commandline_restored else 'dropped'} |"
            for g in releases.REPARSE]


@pytest.mark.parametrize("render", [markdown_targets, markdown_doors, markdown_reparse], ids=lambda f: f.__name__)
def test_deploy_md_tables_are_the_release_table(render):
    rows = render()
    text = "\n".join(rows)
    assert text in DEPLOY_MD, "\n" + text  # every row, in the table's order, as one block


def test_no_markdown_in_the_table():
    for row in releases.DOOR_ROWS:
        assert "**" not in row.doors + row.survives + row.releases
    assert "**" not in "".join(releases.DOOR_NOTES.values())
    assert "replace('**'" not in (ROOT / "src" / "pcitopo" / "kubevirt" / "doors.py").read_text()


def test_the_targets_are_the_tables():
    assert [(t.name, t.doors, t.gates, t.plugin_objects) for t in TARGETS] == \
        [(t.name, t.doors, t.gates, t.plugin_objects) for t in releases.TARGETS]


def test_only_read_releases_resolve():
    assert releases.resolve("v1.8.4").name == "v1.8" and releases.resolve("1.6").name == "v1.6"
    assert releases.resolve("v1.9.0").target == "kubevirt-v1.9.0"
    assert releases.resolve(MAIN_BUILD).name == "main"  # a build of the commit read
    assert not releases.resolve("main").writes_mode and releases.resolve("main+pr18866").writes_mode
    for version, like in [("v1.9.1", "v1.9"), ("v1.10.0", "v1.9"), ("v1.9.0-vendor.3", "v1.9"), ("v1.8.5", "v1.8"),
                          ("v1.10.0-alpha.0", "main"), ("v1.9.0-beta.0.1300+0123abc", "main"), ("garbage", None),
                          ("v1.5.3", None)]:
        with pytest.raises(releases.ReleaseUnknown) as e:
            releases.resolve(version)
        assert e.value.resembles == like, version


def test_the_main_commit_is_stated_in_the_target_and_the_page():
    kustomization = (ROOT / "deploy" / "targets" / "kubevirt-main" / "kustomization.yaml").read_text()
    assert releases.MAIN_COMMIT in kustomization and releases.MAIN_COMMIT in DEPLOY_MD
    assert re.fullmatch(r"[0-9a-f]{40}", releases.MAIN_COMMIT)


# -- unknown in every command, and --assume-release ---------------------------------------------

def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=300, input=stdin)


def dump_of(tmp_path: Path, version: str, source: Path = STRANGER) -> Path:
    out = tmp_path / "cluster.yaml"
    out.write_text(source.read_text().replace("observedKubeVirtVersion: v1.9.0", f"observedKubeVirtVersion: '{version}'"))
    return out


@pytest.mark.parametrize("version", UNREAD)
def test_preflight_on_an_unread_release_is_unknown_then_judged_as_assumed(version, tmp_path):
    dump = str(dump_of(tmp_path, version))
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", dump)
    last = r.stdout.splitlines()[-1]
    assert r.returncode == 4 and last.startswith(f"verdict: unknown: KubeVirt {version} is not a KubeVirt release"), r.stdout
    assert "the target fits" not in r.stdout and "--assume-release" in last
    r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--assume-release", "v1.9.0", dump)
    assert r.returncode == 0, r.stdout
    assert f"kubevirt: {version}, judged as v1.9.0" in r.stdout and "the target fits this release" in r.stdout
    assert f"note: KubeVirt {version} judged as v1.9.0 (--assume-release)" in r.stdout


def test_the_plugin_target_on_v1_10_0_is_unknown_never_fits(tmp_path):
    """The old assumption: the first release after v1.9 carries PR #18866, so kubevirt-main 'fits'."""
    r = run("pcitopo", "preflight", "--target", "kubevirt-main", str(dump_of(tmp_path, "v1.10.0")))
    assert r.returncode == 4 and "fits" not in r.stdout and "HARMED" not in r.stdout
    assert f"at kubevirt/kubevirt main {releases.MAIN_COMMIT}" in r.stdout
    assert "(or main+pr18866 if they list kubevirt PR #18866)" in r.stdout.splitlines()[-1]


def test_preflight_on_a_later_main_cannot_tell_the_plugin_api(tmp_path):
    r = run("pcitopo", "preflight", "--target", "kubevirt-main", str(dump_of(tmp_path, "v1.10.0-alpha.0.55+0123abcd")))
    assert r.returncode == 4
    note = next(ln for ln in r.stdout.splitlines() if ln.startswith("note: "))
    for needle in ("domainHooks", "launcherHooks", "VEP 190 Alpha 2", "kubevirt/enhancements#407", "PR #19160",
                   releases.MAIN_COMMIT):
        assert needle in note


@pytest.mark.parametrize("version", UNREAD)
def test_xmlfix_check_on_an_unread_release_is_unknown(version, tmp_path):
    base = ["xmlfix", "--check", "--sysfs", str(B200), "--vmi", str(VMI)]
    for where in (["--kubevirt", version], ["--cluster", str(dump_of(tmp_path, version))]):
        if where[0] == "--kubevirt" and not releases.is_version(version):
            continue  # not a version at all on the command line: exit 2 (below)
        r = run(*base, *where, str(DOMAIN))
        assert r.returncode == 4, r.stderr
        assert f"xmlfix: check: unknown: kubevirt: KubeVirt {version} is not a KubeVirt release" in r.stderr
        r = run(*base, *where, "--assume-release", "v1.9.0", str(DOMAIN))
        assert r.returncode == 0 and "on KubeVirt v1.9.0 (gates Sidecar" in r.stderr, r.stderr


@pytest.mark.parametrize("version", UNREAD)
def test_pcitopo_domain_on_an_unread_release_is_unknown(version, tmp_path):
    base = ["pcitopo", "domain", "--vmi", str(VMI), "--sysfs", str(B200), "--cluster", str(dump_of(tmp_path, version))]
    r = run(*base)
    assert r.returncode == 4 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"pcitopo domain: unknown: KubeVirt {version} is not")
    r = run(*base, "--assume-release", "v1.9.0")
    assert r.returncode == 0 and r.stdout.startswith("<domain"), r.stderr
    assert f"KubeVirt v1.9.0 (KubeVirt {version} judged as v1.9.0 (--assume-release))" in r.stderr


def test_main_is_a_release_wherever_one_is(tmp_path):
    r = run("xmlfix", "--check", "--sysfs", str(B200), "--vmi", str(VMI), "--kubevirt", "main", str(DOMAIN))
    assert r.returncode == 0 and "on KubeVirt main (" in r.stderr.splitlines()[-1], r.stderr
    r = run("pcitopo", "domain", "--vmi", str(VMI), "--sysfs", str(B200), "--kubevirt", "main")
    assert r.returncode == 0 and "KubeVirt main (--kubevirt)" in r.stderr
    r = run("pcitopo", "preflight", "--target", "kubevirt-main", str(dump_of(tmp_path, MAIN_BUILD)))
    assert "the target fits this release" in r.stdout
    # main as read writes no hostdev mode: its Plugin object stops the strangers' VMs, as on v1.9.0
    assert r.returncode == 1 and "research/train-0 (stops starting)" in r.stdout.splitlines()[-1]


def test_a_dump_without_a_kubevirt_cr_is_unknown_even_when_a_release_is_assumed():
    for extra in ((), ("--assume-release", "v1.9.0")):
        r = run("pcitopo", "preflight", "--target", "kubevirt-v1.9.0", *extra, str(DUMPS / "no-kubevirt.yaml"))
        assert r.returncode == 4 and r.stdout.splitlines()[-1].startswith("verdict: unknown: the dump has no KubeVirt CR")


@pytest.mark.parametrize("args,said", [
    (["pcitopo", "preflight", "--target", "kubevirt-v1.9.0", "--assume-release", "v1.10.0", str(STRANGER)],
     "--assume-release v1.10.0: not a release pcitopo read"),
    (["pcitopo", "domain", "--vmi", str(VMI), "--sysfs", str(B200), "--kubevirt", "newest"],
     "--kubevirt newest: not a KubeVirt release"),
    (["xmlfix", "--check", "--vmi", str(VMI), "--sysfs", str(B200), "--assume-release", "v1.9.0-vendor.3", str(DOMAIN)],
     "--assume-release v1.9.0-vendor.3: not a release pcitopo read"),
])
def test_an_unknown_release_string_on_the_command_line_is_one_line(args, said):
    r = run(*args)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.stderr


def test_two_kubevirt_crs_are_one_line(tmp_path):
    cr = STRANGER.read_text()
    both = tmp_path / "two.yaml"
    both.write_text(cr + "---\n" + (DUMPS / "v1.8.0.yaml").read_text())
    for args in (["pcitopo", "preflight", "--target", "kubevirt-v1.9.0", str(both)],
                 ["xmlfix", "--check", "--vmi", str(VMI), "--sysfs", str(B200), "--cluster", str(both), str(DOMAIN)],
                 ["pcitopo", "domain", "--vmi", str(VMI), "--sysfs", str(B200), "--cluster", str(both)]):
        r = run(*args)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "2 KubeVirt CRs" in r.stderr, (args, r.stderr)


# -- --explain's door, and --help ---------------------------------------------------------------

def explain_door(tmp_path: Path, *extra: str, doors: str = "label") -> str:
    """The door line of --explain for the example VMI with ``doors``: label (no hook annotation) or hook (no label)."""
    text = VMI.read_text()
    drop = "hooks.kubevirt.io/hookSidecars" if doors == "label" else "pcitopo.kubevirt.io/plugin:"
    text = "\n".join(ln for ln in text.splitlines() if drop not in ln) + "\n"
    if doors == "hook":
        text = text.replace("  labels:\n", "  labels: {}\n", 1)
    vmi = tmp_path / "vmi.yaml"
    vmi.write_text(text)
    r = run("xmlfix", "--explain", "--sysfs", str(B200), "--vmi", str(vmi), *extra, str(DOMAIN))
    assert r.returncode == 0, r.stderr
    return next(ln for ln in r.stdout.splitlines() if ln.startswith("door: "))


def test_explain_never_recommends_the_plugin_on_v1_9_0(tmp_path):
    """The VM asks for the Plugin by its label alone; on v1.9.0 (the dump's, or assumed) and on
    main as read a Plugin object stops VMs, so the door explained is the hook sidecar."""
    for extra in ((), ("--cluster", str(STRANGER)), ("--kubevirt", "v1.9.0"), ("--kubevirt", "main"),
                  ("--cluster", str(dump_of(tmp_path, "v1.10.0")))):
        assert explain_door(tmp_path, *extra).startswith("door: the hook sidecar"), extra
    assert explain_door(tmp_path, "--kubevirt", "main+pr18866").startswith("door: the pcitopo Plugin")
    # where the Plugin is the door, a VM with the hook alone is explained its hook
    assert explain_door(tmp_path, "--kubevirt", "main+pr18866", doors="hook").startswith("door: the hook sidecar")


def test_xmlfix_help_says_the_doors_in_the_tables_words():
    r = run("xmlfix", "--help")
    text = " ".join(r.stdout.split())
    assert "v1.6-v1.8" not in text and "v1.9+" not in text
    assert f"plugin, the pcitopo Plugin ({releases.DOOR_ROWS[3].releases})" in text
    assert f"hook, the hook sidecar ({releases.DOOR_ROWS[0].releases}; {releases.DOOR_ROWS[1].releases})" in text
