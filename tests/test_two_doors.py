"""Issue 25, item 6: the docs and --explain say which door pcitopo assumes and what reaches
libvirt through it, from one table (pcitopo.kubevirt.doors)."""

from __future__ import annotations

import subprocess

import pytest

from pcitopo.kubevirt.doors import DEFAULT_DOOR, DOOR_NOTES, RELEASES
from testkit.hookkit import BIN, REPO, fixture_sysfs

DEPLOY_MD = (REPO / "docs" / "DEPLOY.md").read_text()


def test_i25_deploy_md_opens_with_the_two_doors():
    head = DEPLOY_MD[: DEPLOY_MD.index("## 1. What you need first")]
    assert "## Two doors: the Plugin and the hook sidecar" in head
    assert head.index("**The Plugin**") < head.index("**The hook sidecar**")
    assert "recommended" in head and "deprecated" in head and "### Moving a cluster" in head


def test_i25_deploy_md_release_table_is_the_door_table():
    rows = [f"| {r.release} | {r.doors} | {r.gates} | {r.survives} |" for r in RELEASES]
    for row in rows:
        assert row in DEPLOY_MD, row


@pytest.mark.parametrize("door", ["plugin", "hook", None])
def test_i25_explain_names_the_door_it_assumes(door, tmp_path):
    args = [str(BIN / "xmlfix"), "--explain", "--sysfs", fixture_sysfs("hgx-b200"), str(REPO / "fixtures/hgx-b200/domain.xml")]
    r = subprocess.run(args + (["--door", door] if door else []), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    text = " ".join(r.stdout.split())
    assert " ".join(DOOR_NOTES[door or DEFAULT_DOOR].split()) in text
    assert DEFAULT_DOOR == "plugin"


def test_i25_an_unknown_door_is_one_line():
    r = subprocess.run([str(BIN / "xmlfix"), "--door", "sidecar", "x.xml"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "invalid choice: 'sidecar'" in r.stderr
