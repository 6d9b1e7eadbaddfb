"""Process tweaks for ``pcitopo serve``: they keep the long-running server's resident memory
small and flat (measured with bench/perf.py and bench/load.py). Only the server door calls
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

# glibc's mallopt parameter number for the arena cap (malloc.h: M_ARENA_MAX).
_M_ARENA_MAX = -8


def keep_openssl_out() -> None:
    """Make ``import ssl`` (and _ssl, _hashlib) raise ImportError in this process, unless
    already imported."""
    for name in OPENSSL_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def limit_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives every thread that allocates its own malloc arena (up to 8 per core): with
    gRPC's threads and the worker pool, freed memory then sits in many arenas. Capping them
    keeps resident memory flat under concurrent calls. Must run before the threads exist; a
    no-op where the C library is not glibc or the operator already set MALLOC_ARENA_MAX."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(_M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


def tune_server_process() -> None:
    """Both of the above; call first thing in the server process."""
    keep_openssl_out()
    limit_malloc_arenas()
