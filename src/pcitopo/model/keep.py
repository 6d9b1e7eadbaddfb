"""What a layer keeps about a host model between calls, held by that layer.

The hook keeps one host model across calls (src/pcitopo/serve/hooks.py ``HostCache``), and the
layers above the model derive facts from it that do not change while it lives: NCCL paths and
pair classes (paths/), labels (model/), NCCL's tree (nccl/), and what follows from the model plus
one allocation (the plan, the guest tree, the MMIO sizing: guest/; the doctor's findings:
checks/). Each layer declares a :class:`PerModel` of its own typed state; the model does not
know about any of it. The state is found by the model object's identity and goes with the model
(a weak reference): a rebind or a new capture gives a new model, and the new one starts empty.

A kept value must not hold the model itself (the model would never go): the one that needs it
(NCCL's tree over the model, src/pcitopo/nccl/price.py) holds it through ``weakref.proxy``.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from pcitopo.model.tree import Topology

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# What follows from a model and one allocation, kept for this many allocations per kind: a
# sidecar serves one VM, so one allocation, and one more for a VM whose devices change. `make
# bench` on hgx-b200 (its server answers 50 calls cycling through 20 allocations among its
# 1,055): resident memory after them 52.0 MiB with 2, 56.5 MiB with 8 (over the 56 MiB budget).
ALLOCATIONS_KEPT = 2


class PerModel(Generic[T]):
    """One layer's state for each model: ``make(model)`` the first time a model is asked for,
    the same object for the rest of the model's life. Threads may race to make it: the first
    one stored is the one every caller gets."""

    def __init__(self, make: Callable[[Topology], T]):
        self._make = make
        self._of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def __call__(self, model: Topology) -> T:
        try:
            return self._of[model]
        except KeyError:
            value = self._make(model)
            with self._lock:
                return self._of.setdefault(model, value)

    def __contains__(self, model: object) -> bool:
        return model in self._of


class Recent(Generic[K, V]):
    """The values of the ``keep`` most recently asked keys (a key: everything ``compute`` reads
    besides the model the holder belongs to). What it returns is shared between calls: callers
    must not change it."""

    def __init__(self, keep: int = ALLOCATIONS_KEPT):
        self.keep = keep
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, compute: Callable[[], V]) -> V:
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        value = compute()  # outside the lock: it may ask other holders, and takes its time
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.keep:
                self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)


def recent(keep: int = ALLOCATIONS_KEPT) -> PerModel[Recent]:
    """A layer's per-allocation results for each model, the last ``keep`` allocations."""
    return PerModel(lambda _model: Recent(keep))


__all__ = ["ALLOCATIONS_KEPT", "PerModel", "Recent", "recent"]
