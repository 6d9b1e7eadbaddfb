"""Item 6: the docs and --explain say which door pcitopo assumes and what reaches
libvirt through it, from one table (pcitopo.kubevirt.doors)."""

from __future__ import annotations

import subprocess

import pytest

from pcitopo.kubevirt.releases import DOOR_NOTES, DOOR_ROWS
from testkit.hookkit import REPO, fixture_sysfs
from testkit.server_proc import BIN

DEPLOY_MD = (REPO / "docs" / "DEPLOY.md").read_text()


def test_deploy_md_says_once_which_door_each_release_takes():
    """The page opens with the targets and their quick starts; the doors are one passage, the
    Plugin (recommended) before the hook sidecar (deprecated), and nothing elsewhere says that a
    Plugin door needs no hook on v1.9.0 (what once contradicted it, 1,000 lines apart)."""
    reference = DEPLOY_MD.index("# Reference")
    assert DEPLOY_MD.index("## Targets") < DEPLOY_MD.index("## Quick start") < reference
    doors = DEPLOY_MD[DEPLOY_MD.index("## Two doors"):]
    doors = doors[:doors.index("\n## ", 4)]
    assert DEPLOY_MD.count("## Two doors") == 1 and DEPLOY_MD.index("## Two doors") > reference
    assert doors.index("**The Plugin**") < doors.index("**The hook sidecar**")
    assert "recommended" in doors and "deprecated" in doors
    assert "no Plugin object" in doors and "Another vendor's Plugin object" in doors
    assert "does not use it" not in DEPLOY_MD and "Moving a cluster" not in DEPLOY_MD


def test_deploy_md_release_table_is_the_door_table():
    rows = [f"| {r.releases} | {r.doors} | {r.gates} | {r.survives} |" for r in DOOR_ROWS]
    for row in rows:
        assert row in DEPLOY_MD, row


@pytest.mark.parametrize("door", ["plugin", "hook", None])
def test_explain_names_the_door_it_assumes(door, tmp_path):
    args = [str(BIN / "xmlfix"), "--explain", "--sysfs", fixture_sysfs("hgx-b200"), str(REPO / "fixtures/hgx-b200/domain.xml")]
    r = subprocess.run(args + (["--door", door] if door else []), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    # without --door, nothing names a release: v1.9.0 is assumed, where a Plugin object stops VMs
    assert " ".join(DOOR_NOTES[door or "hook"].split()) in text


def test_an_unknown_door_is_one_line():
    r = subprocess.run([str(BIN / "xmlfix"), "--door", "sidecar", "x.xml"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid choice: 'sidecar'" in r.stderr
