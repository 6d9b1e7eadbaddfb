"""A VMI as people paste it: ``kubectl get vmi NAME -o yaml`` as well as
``-o json``, for ``xmlfix --vmi``. KubeVirt itself always hands the hook JSON, so the gRPC
door never comes here, and PyYAML is imported only when the input is not JSON (the sidecar's
memory budget stays as it was)."""

from __future__ import annotations

import json
import re

from pcitopo.topology.errors import ConfigError


def vmi_as_json(data: bytes, name: str) -> bytes:
    """The VMI as JSON bytes: JSON input unchanged, YAML converted (safe loader: plain data
    only); a list of exactly one VMI (``kubectl get vmi -o yaml`` without a name) is unwrapped.
    An empty file (what ``kubectl get vmi missing -o yaml > vmi.yaml`` leaves) is an error, not
    a VMI without annotations."""
    if not data.strip():
        raise ConfigError(f"VMI {name} is empty (kubectl writes nothing when the VMI does not exist): "
                          "give `kubectl get vmi NAME -o yaml` of an existing VMI")
    if data.lstrip()[:1] in (b"{", b"["):
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
    _check_annotations(doc, data, name)
    try:
        return json.dumps(doc, default=str).encode()
    except (TypeError, ValueError) as e:
        raise ConfigError(f"VMI {name}: {e}") from None


def _check_annotations(doc: dict, data: bytes, name: str) -> None:
    """Annotation values are strings. YAML reads an unquoted ``off``, ``no``, ``true`` or ``1``
    as a boolean or a number: say so in YAML's terms, with the line to write instead."""
    meta = doc.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    if not isinstance(annotations, dict):
        return  # parse_vmi judges the shape
    for key, value in annotations.items():
        if isinstance(value, (bool, int, float)):
            raw = _raw_value(data, str(key)) or json.dumps(value)
            what = "a boolean" if isinstance(value, bool) else "a number"
            raise ConfigError(f"VMI {name}: YAML reads the unquoted {raw} of annotation {key} as {what}, but "
                              f'annotations are strings: quote it ({key}: "{raw}")')


def _raw_value(data: bytes, key: str) -> str | None:
    """The value as written after ``key:`` in the YAML text, for the message."""
    m = re.search(rb"^[ \t-]*['\"]?" + re.escape(key.encode()) + rb"['\"]?[ \t]*:[ \t]*([^\s#]+)", data, re.M)
    return m.group(1).decode("utf-8", "replace") if m else None
