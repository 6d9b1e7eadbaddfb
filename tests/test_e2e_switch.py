"""The switch for the slow e2e boots (``e2e_slow``) is exact: only ``PCITOPO_E2E_SLOW=1`` turns
them on. It was a substring test: ``-m 'not e2e_slow'`` or ``PCITOPO_E2E_SLOW=0`` turned the
minutes-long OVMF boots on. Checked with ``--setup-plan``, which applies the skips and boots nothing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testkit import REPO as ROOT

SLOW_NAME = "test_every_bar_assigned_and_no_setting_lowers_the_count[oci-b200-seabios]"
SLOW = f"tests/e2e/test_mmio_boot.py::{SLOW_NAME}"


def plan(env_value: str | None, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PCITOPO_E2E_SLOW"}
    if env_value is not None:
        env["PCITOPO_E2E_SLOW"] = env_value
    r = subprocess.run([sys.executable, "-m", "pytest", SLOW, "--setup-plan", "-rs", "-q", "-p", "no:cacheprovider", *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.mark.parametrize("env_value, args", [
    ("0", ()),
    ("", ()),
    ("yes", ()),
    (None, ("-m", "e2e_slow")),
    ("0", ("-m", "e2e_slow")),
    (None, ("-m", "e2e or not e2e_slow")),
])
def test_anything_but_one_leaves_the_slow_boots_skipped(env_value, args):
    out = plan(env_value, *args)
    assert "1 skipped" in out and "run with PCITOPO_E2E_SLOW=1 (make test-slow)" in out


def test_one_turns_them_on():
    out = plan("1")
    assert "skipped" not in out and SLOW_NAME in out


def test_make_test_slow_sets_the_switch():
    make = (ROOT / "Makefile").read_text()
    recipe = make[make.index("\ntest-slow:"):].split("\n")[2]
    assert recipe.startswith("\tPCITOPO_E2E_SLOW=1 ") and "-m 'e2e_slow or image_slow'" in recipe
