"""pcitopo's test kit: support code that ``tests/``, ``bench/`` and ``fixtures/`` share.

- ``.topo`` host descriptions → sysfs-shaped trees (the fixtures' source) are the product's now,
  :mod:`pcitopo.synth` (`pcitopo capture --from-topo`);
- :mod:`testkit.kubevirt_sim`: what KubeVirt and libvirt do to a domain around the hook (the
  first call's shape is the product's, ``pcitopo.kubevirt.launcher``: one model of KubeVirt);
- :mod:`testkit.kubevirt_vmi`: the deploy/ examples and their nodes, and the product's
  prediction (``pcitopo domain``) as the tests call it;
- :mod:`testkit.strategies`: Hypothesis strategies over generated hosts and domains;
- :mod:`testkit.hookkit`: VMI JSON, a virt-launcher-like client, ``xmlfix`` as a process;
- :mod:`testkit.server_proc`: ``pcitopo serve`` (or any argv) as a child process.
- :mod:`testkit.stack`: the QEMU/libvirt/firmware stacks the guest-boot tier runs (the Debian 13
  root ``make setup`` builds, the machine's Debian 12) and the versions each carries.
- here, :func:`needs_tool` and :func:`tool_or_skip`: a test that needs a program from the system
  (kubectl, virsh, lspci, dot, ...) skips, naming it, where it is missing (``make check``).

It is part of the development install (``pip install -e '.[test]'``, what ``make setup`` runs;
its third-party needs, Hypothesis and pytest, come with the ``test`` extra) and is meant to be
used from a checkout: :data:`REPO` is the checkout this package sits in. The sidecar image does
not ship it: the Containerfile's build stage copies only the product's folders, and
``tests/sidecar/test_hook_wheel.py`` checks that the wheel built from them holds them and nothing
else.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pytest is imported where a test uses these helpers, not by bench/ or fixtures/
    import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "fixtures"


def fixture_script(name: str) -> ModuleType:
    """``fixtures/<name>.py`` (``generate``, ``golden``) as a module, loaded once by its path:
    the scripts stay plain scripts, and tests call their functions without touching ``sys.path``."""
    module_name = f"testkit._fixtures_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, FIXTURES / f"{name}.py")
        assert spec is not None and spec.loader is not None, name
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses look their module up while it loads
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[module_name]
            raise
    return sys.modules[module_name]


def spdx_problems(path: Path) -> str:
    """What ``pyspdxtools -i`` (spdx-tools, the ``test`` extra) says about an SPDX document:
    empty when it is valid. The tool exits 0 with nothing on stdout or stderr then."""
    import subprocess

    tool = Path(sys.executable).with_name("pyspdxtools")
    r = subprocess.run([str(tool), "-i", str(path)], capture_output=True, text=True, timeout=600)
    return "" if r.returncode == 0 and not (r.stdout + r.stderr).strip() else f"exit {r.returncode}: {r.stdout}{r.stderr}"


# Programs from the system, not from the virtualenv: ``make check`` (the virtualenv alone) skips
# the tests that need one and names it; ``make test`` installs them (scripts/setup-debian.sh,
# scripts/setup-kubectl.sh) and runs those tests too.
def _needs(absent: list[str], why: str) -> str:
    return f"needs {', '.join(absent)} on PATH" + (f" ({why})" if why else "")


def needs_tool(*tools: str, why: str = "") -> pytest.MarkDecorator:
    """A mark (on a test, or a module's ``pytestmark``) that skips when any of ``tools`` is not on PATH."""
    import pytest

    absent = [t for t in tools if shutil.which(t) is None]
    return pytest.mark.skipif(bool(absent), reason=_needs(absent, why))


def tool_or_skip(tool: str, why: str = "") -> str:
    """The path of ``tool`` on PATH, for a test or fixture; the test is skipped when there is none."""
    __tracebackhide__ = True  # the skip is reported at the test's line, not here
    import pytest

    path = shutil.which(tool)
    if path is None:
        pytest.skip(_needs([tool], why))
    return path
