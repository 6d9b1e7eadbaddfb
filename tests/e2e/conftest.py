"""Fixtures of the e2e tier: one private libvirtd per test session."""

from __future__ import annotations

import os
import shutil

import pytest

from .libvirtd import PrivateLibvirtd
from .paths import SetupMissing, find_kernel, slow_tier_on

REQUIRED_TOOLS = ("qemu-system-x86_64", "libvirtd", "virsh", "busybox", "lspci", "unshare")


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the e2e tier runs a privileged private libvirtd: run as root"
    tools = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if tools:
        return f"missing {', '.join(tools)}: run `bash scripts/setup-debian.sh` (make setup)"
    try:
        find_kernel()
    except SetupMissing as e:
        return str(e)
    return None


def pytest_collection_modifyitems(config, items):
    """``e2e_slow`` boots (OVMF under TCG, minutes each) run only when asked for:
    ``PCITOPO_E2E_SLOW=1`` (``make test-slow`` sets it); see :func:`paths.slow_tier_on`."""
    if slow_tier_on():
        return
    skip = pytest.mark.skip(reason="slow OVMF boot: run with PCITOPO_E2E_SLOW=1 (make test-slow)")
    for item in items:
        if item.get_closest_marker("e2e_slow"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    """Skip (locally) or fail (CI=true) when the setup script has not run."""
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="session")
def libvirtd(e2e_ready) -> PrivateLibvirtd:
    lv = PrivateLibvirtd()
    lv.start()
    try:
        yield lv
    finally:
        lv.stop()
        lv.cleanup(keep_logs=bool(os.environ.get("PCITOPO_E2E_KEEP")))
