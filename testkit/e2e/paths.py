"""Where the e2e tier keeps its cached artefacts (kernel, initramfs, logs)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


SLOW_SWITCH = "PCITOPO_E2E_SLOW"
STACK_SWITCH = "PCITOPO_E2E_STACK"


def e2e_stack():
    """The stack the tier boots on: the Debian 13 root (``debian13``, the default) or, with
    ``PCITOPO_E2E_STACK=debian12``, the machine's own (to compare; tests that need Debian 12 ask
    for it by name). Raises ``testkit.stack.StackMissing`` when it is not set up."""
    from testkit.stack import stack_named

    return stack_named(os.environ.get(STACK_SWITCH) or "debian13")


def slow_tier_on(env: dict[str, str] | None = None) -> bool:
    """Whether the ``e2e_slow`` boots run: only ``PCITOPO_E2E_SLOW=1`` (``make test-slow`` sets
    it). Exact on purpose: ``0``, an empty value or a marker expression such as
    ``-m 'not e2e_slow'`` never turns minutes-long boots on."""
    return (os.environ if env is None else env).get(SLOW_SWITCH) == "1"


class SetupMissing(RuntimeError):
    """Something scripts/setup-debian.sh provides is not there."""


def cache_dir() -> Path:
    """``$PCITOPO_CACHE`` or ``<repo>/.cache/e2e`` (same rule as scripts/setup-debian.sh)."""
    d = Path(os.environ.get("PCITOPO_CACHE") or REPO_ROOT / ".cache" / "e2e")
    d.mkdir(parents=True, exist_ok=True)
    return d


def find_kernel() -> Path:
    """The guest kernel fetched by scripts/setup-debian.sh (newest if several)."""
    found = sorted(cache_dir().glob("vmlinuz-*"))
    if not found:
        raise SetupMissing(
            f"no guest kernel in {cache_dir()}: run `bash scripts/setup-debian.sh`"
        )
    return found[-1]


def host_numa_nodes() -> set[int]:
    """NUMA nodes of this machine (for <numatune> nodesets that must exist here)."""
    try:
        text = Path("/sys/devices/system/node/online").read_text().strip()
    except OSError:
        return {0}
    nodes: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            nodes.update(range(int(a), int(b) + 1))
        elif part:
            nodes.add(int(part))
    return nodes or {0}
