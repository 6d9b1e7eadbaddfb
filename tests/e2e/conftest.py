"""Fixtures of the e2e tier: one private libvirtd per test session, from the Debian 13 root
(``libvirtd``), and one from the machine's Debian 12 for the tests that say they need it
(``libvirtd_debian12``). The versions of every stack used are printed at the end of the run."""

from __future__ import annotations

import os
import shutil

import pytest

from testkit.e2e.libvirtd import PrivateLibvirtd
from testkit.e2e.paths import SetupMissing, e2e_stack, find_kernel, slow_tier_on
from testkit.stack import DEBIAN12, Stack, StackMissing

# the initramfs's guest userland (busybox, lspci) comes from the machine; the stacks are checked
# by PrivateLibvirtd itself
REQUIRED_TOOLS = ("busybox", "lspci", "unshare", "nsenter", "chroot")
STACK_TOOLS = ("qemu-system-x86_64", "libvirtd", "virsh")

# every stack a daemon of this session ran, for the summary at the end
USED: dict[str, Stack] = {}


def _missing(stack: Stack | None = None) -> str | None:
    if os.geteuid() != 0:
        return "the e2e tier runs a privileged private libvirtd: run as root"
    tools = [t for t in REQUIRED_TOOLS if shutil.which(t) is None]
    if stack is not None and stack.root is None:
        tools += [t for t in STACK_TOOLS if shutil.which(t) is None]
    if tools:
        return f"missing {', '.join(tools)}: run `bash scripts/setup-debian.sh` (make setup)"
    try:
        find_kernel()
    except SetupMissing as e:
        return str(e)
    return None


def _skip_or_fail(why: str) -> None:
    """Skip locally; fail under CI, where `make test` sets everything up."""
    if os.environ.get("CI"):
        pytest.fail(why)
    pytest.skip(why)


def pytest_collection_modifyitems(config, items):
    """``e2e_slow`` boots (OVMF under TCG, minutes each) run only when asked for:
    ``PCITOPO_E2E_SLOW=1`` (``make test-slow`` sets it); see :func:`paths.slow_tier_on`."""
    if slow_tier_on():
        return
    skip = pytest.mark.skip(reason="slow boot: run with PCITOPO_E2E_SLOW=1 (make test-slow)")
    for item in items:
        if item.get_closest_marker("e2e_slow"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def e2e_ready() -> None:
    """Skip (locally) or fail (CI=true) when the setup script has not run."""
    why = _missing()
    if why:
        _skip_or_fail(why)


def _daemon(stack: Stack):
    why = _missing(stack)
    if why:
        _skip_or_fail(why)
    lv = PrivateLibvirtd(stack=stack)
    lv.start()
    USED[stack.name] = stack
    try:
        yield lv
    finally:
        lv.stop()
        lv.cleanup(keep_logs=bool(os.environ.get("PCITOPO_E2E_KEEP")))


@pytest.fixture(scope="session")
def e2e_stack_used(e2e_ready) -> Stack:
    """The stack of the ``libvirtd`` fixture: Debian 13's root unless PCITOPO_E2E_STACK says."""
    try:
        return e2e_stack()
    except StackMissing as e:
        _skip_or_fail(str(e))


@pytest.fixture(scope="session")
def libvirtd(e2e_stack_used) -> PrivateLibvirtd:
    yield from _daemon(e2e_stack_used)


@pytest.fixture(scope="session")
def libvirtd_debian12(e2e_ready) -> PrivateLibvirtd:
    """The machine's own libvirt 9.0 / QEMU 7.2 / SeaBIOS 1.16.2 / OVMF 2022.11, for a test that
    must boot on it (its docstring says why)."""
    yield from _daemon(DEBIAN12)


def pytest_terminal_summary(terminalreporter):
    """The "tested with" line of every stack this session booted on (also without -s)."""
    for stack in USED.values():
        terminalreporter.write_line(f"[e2e stack] {stack.versions().line()}")
