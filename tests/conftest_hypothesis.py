"""Hypothesis profiles for the property tier (imported by the test modules that use them; the
name says what it is, but it is a plain module, not a pytest conftest).

    HYPOTHESIS_PROFILE=ci    (default) bounded, derandomized: the same examples every CI run
    HYPOTHESIS_PROFILE=dev   bounded, random, with the example database: for local runs
    HYPOTHESIS_PROFILE=fuzz  `make fuzz`: >= 10,000 generated examples in total, random

Each property draws its own number of examples from :func:`budget` so the tier's cost stays
predictable: CI runs the whole property tier in well under a minute on two cores.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")

_COMMON = dict(
    deadline=None,  # no timing assertions: the CI machine's speed is not a property
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    print_blob=True,
)

settings.register_profile("ci", derandomize=True, database=None, **_COMMON)
settings.register_profile("dev", **_COMMON)
settings.register_profile("fuzz", **_COMMON)

# Examples per property and profile. The fuzz column sums to 12,000 (>= 10,000 required).
_BUDGETS: dict[str, dict[str, int]] = {
    "ci": {"rewrite": 80, "fixtures": 25, "mutated": 120, "sysfs": 60, "vmi": 150, "passthrough": 40},
    "dev": {"rewrite": 200, "fixtures": 50, "mutated": 300, "sysfs": 150, "vmi": 300, "passthrough": 100},
    "fuzz": {"rewrite": 6000, "fixtures": 1000, "mutated": 2500, "sysfs": 1000, "vmi": 1000, "passthrough": 500},
}
FUZZ_MINIMUM = 10_000

if PROFILE not in _BUDGETS:
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: want one of {', '.join(_BUDGETS)}")
settings.load_profile(PROFILE)


def budget(name: str) -> int:
    """How many examples the property ``name`` runs under the current profile."""
    return _BUDGETS[PROFILE][name]
