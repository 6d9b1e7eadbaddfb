"""Process tweaks for ``pcitopo serve``: they keep the long-running server's resident memory
small and flat (measured with bench/perf.py and bench/load.py). Only the server calls
:func:`tune_server_process`, before anything imports grpc or pydantic; a library user's
process, the shim and ``xmlfix`` are left alone.
"""

from __future__ import annotations

import os
import sys

# Standard-library modules that load OpenSSL (libssl/libcrypto: ~4 MiB resident, measured with
# bench/perf.py) and that the server never needs: it serves plain gRPC on a Unix socket (grpcio
# carries its own TLS, BoringSSL, unused here), and hashlib and hmac fall back to Python's
# built-in hashes without _hashlib. asyncio (which grpcio imports) and hmac (which pydantic
# imports) import them only inside try/except ImportError.
OPENSSL_MODULES = ("ssl", "_ssl", "_hashlib")

# glibc's mallopt parameter numbers (malloc.h): the arena cap, and the size from which a block
# is its own mmap (returned to the system when freed).
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
# Set, the threshold stops glibc's dynamic raise (to the largest block freed, up to 32 MiB), which
# otherwise moves every later multi-MiB gRPC message into the heap, where it stays resident
# (measured: the node hook's RSS climbed ~25 MiB over four 7 MiB calls, ~1 MiB with it set).
MMAP_THRESHOLD = 256 * 1024


def keep_openssl_out() -> None:
    """Make ``import ssl`` (and _ssl, _hashlib) raise ImportError in this process, unless
    already imported."""
    for name in OPENSSL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own malloc arena (up to 8 per core): with
    gRPC's threads and the worker pool, freed memory then sits in many arenas. Capping them
    keeps resident memory flat under concurrent calls; a fixed mmap threshold gives large
    messages back when freed. Must run before the threads exist; a no-op where the C library is
    not glibc, and each one where the operator already set its environment variable."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        if "MALLOC_ARENA_MAX" not in os.environ:
            libc.mallopt(_M_ARENA_MAX, arenas)
        if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
            libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    except (OSError, AttributeError):
        pass


def tune_server_process() -> None:
    """Both of the above; call first thing in the server process."""
    keep_openssl_out()
    limit_malloc_arenas()
