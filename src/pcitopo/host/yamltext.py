"""YAML as people hand it to pcitopo (VM and VMI manifests, cluster dumps, the KubeVirt CR, the
kubelet's config), read by one function with two bounds PyYAML does not have:

- no aliases: PyYAML keeps ``*alias`` as a shared reference, so a 679-byte "billion laughs"
  document is a few KB parsed and gigabytes once anything walks or serialises it. ``kubectl``
  never writes anchors, so a document with an alias is refused in one line, before it is built;
- at most :data:`MAX_DEPTH` nested collections: a 100k-deep ``[[[...]]]`` overflows Python's
  recursion, which would be an internal error instead of bad input.

Both are checked on the parser's event stream (libyaml's when PyYAML has it), which holds no
document, so neither check costs memory.
"""

from __future__ import annotations

from typing import Any

from pcitopo.errors import ConfigError, quoted

# A Kubernetes object nests about 15 deep (a VM's spec.template.spec.domain.devices.hostDevices[0]
# is 8); Python's recursion limit (1000) is what must never be reached.
MAX_DEPTH = 200


def yaml_documents(data: bytes | str, what: str) -> list[Any]:
    """Every document of the YAML text (``---`` separates them), empty ones left out (safe
    loader: plain data only); one line naming ``what`` (and the line) when it is not YAML,
    uses an alias or nests deeper than :data:`MAX_DEPTH`."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        _refuse_aliases_and_depth(yaml, yaml.parse(data, Loader=loader), what)
        return [d for d in yaml.load_all(data, Loader=loader) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        if "nesting depth" in str(getattr(e, "problem", "")):  # libyaml's scanner looks ahead past our count
            raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels{where}: not a Kubernetes object") from None
        raise ConfigError(f"{what} is neither JSON nor YAML{where}: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:  # a bound missed above; still the input's fault, still one line
        raise ConfigError(f"{what} nests too deep to read") from None


def _refuse_aliases_and_depth(yaml: Any, events: Any, what: str) -> None:
    depth = 0
    for ev in events:
        if isinstance(ev, yaml.AliasEvent):
            raise ConfigError(f"{what} uses a YAML alias (*{quoted(ev.anchor, 40)}){_line(ev)}: aliases are not "
                              "accepted (a few of them expand to gigabytes); write the values out")
        if isinstance(ev, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"{what} nests deeper than {MAX_DEPTH} levels{_line(ev)}: not a Kubernetes object")
        elif isinstance(ev, yaml.CollectionEndEvent):
            depth -= 1


def _line(ev: Any) -> str:
    mark = getattr(ev, "start_mark", None)
    return f" at line {mark.line + 1}" if mark is not None else ""
