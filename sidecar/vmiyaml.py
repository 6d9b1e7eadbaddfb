"""A VMI as people paste it: ``kubectl get vmi NAME -o yaml`` as well as
``-o json``, for ``xmlfix --vmi``. KubeVirt itself always hands the hook JSON, so the gRPC
door never comes here, and PyYAML is imported only when the input is not JSON (the sidecar's
memory budget stays as it was)."""

from __future__ import annotations

import json

from topology.errors import ConfigError


def vmi_as_json(data: bytes, name: str) -> bytes:
    """The VMI as JSON bytes: JSON input unchanged, YAML converted (safe loader: plain data
    only); a list of exactly one VMI (``kubectl get vmi -o yaml`` without a name) is unwrapped."""
    if data.lstrip()[:1] in (b"{", b"[", b""):
        return data  # JSON (or meant as JSON): parse_vmi judges it, with its own messages
    try:
        json.loads(data)
        return data
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass
    import yaml  # only here: see the module docstring

    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"VMI {name} is neither JSON nor YAML{where}: {getattr(e, 'problem', None) or e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("items"), list):
        if len(doc["items"]) != 1:
            raise ConfigError(f"VMI {name} is a list of {len(doc['items'])} objects: give one VMI (kubectl get vmi NAME -o yaml)")
        doc = doc["items"][0]
    if not isinstance(doc, dict):
        raise ConfigError(f"VMI {name} is YAML but not an object (got {type(doc).__name__})")
    try:
        return json.dumps(doc, default=str).encode()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"VMI {name}: {e}") from None
