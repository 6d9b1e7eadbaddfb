"""Every typed failure the project can raise ends a gRPC call with a code chosen for it.

A kind missing from the server's table would end the call as UNKNOWN, which tells virt-launcher
nothing; this walks every PcitopoError subclass in the project so a new one cannot slip past.
"""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import pcitopo
import pcitopo.cli
from pcitopo.errors import PcitopoError
from pcitopo.serve.hooks import _GRPC_CODE, status_name

DELIBERATE = {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "INTERNAL"}


def _all_error_classes() -> list[type[PcitopoError]]:
    for pkg in (pcitopo, pcitopo.cli):
        for mod in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            importlib.import_module(mod.name)
    seen: list[type[PcitopoError]] = [PcitopoError]
    todo = [PcitopoError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in seen and sub.__module__.startswith("pcitopo."):
                seen.append(sub)
                todo.append(sub)
    return seen


CLASSES = _all_error_classes()


def test_the_walk_finds_the_errors_of_every_layer():
    names = {c.__name__ for c in CLASSES}
    assert {"PcitopoError", "SysfsError", "DoctorError", "OutputError", "FabricError", "InternalError"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__name__}")
def test_every_error_kind_maps_to_a_deliberate_grpc_code(cls):
    assert cls.kind in _GRPC_CODE, f"{cls.__name__} (kind {cls.kind!r}) has no gRPC code: it would end the call as UNKNOWN"
    assert _GRPC_CODE[cls.kind] in DELIBERATE
    assert status_name(cls.__new__(cls)) == _GRPC_CODE[cls.kind]


def test_errors_live_in_topology_errors_except_the_doors_own():
    """House rule: typed errors in src/pcitopo/errors.py (the doors' own failures excepted)."""
    moved = [c for c in CLASSES if c.__module__ in ("pcitopo.checks.doctor", "pcitopo.views.exports")]
    assert moved == []


def test_a_failed_write_and_a_bare_failure_are_not_unknown():
    from pcitopo.errors import OutputError

    assert status_name(OutputError("cannot write x")) == "FAILED_PRECONDITION"
    assert status_name(PcitopoError("x")) == "INTERNAL"


def test_deploy_guide_explains_every_kind_the_hook_can_end_with():
    """docs/VM.md, "When the VM does not start": one row per kind (``output`` is the CLI's
    --prometheus-out/--nfd-out only, ``kubelet`` is ``pcitopo domain``'s prediction of a pod
    kubelet refuses: neither reaches the hook)."""
    from testkit import REPO

    text = (REPO / "docs" / "VM.md").read_text()
    table = text[text.index("## When the VM does not start"):text.index("Other symptoms:")]
    rows = {cell.strip("` ") for line in table.splitlines() if line.startswith("| `")
            for cell in line.split("|")[1].split(",")}
    assert {c.kind for c in CLASSES} - {"output", "kubelet"} <= rows
