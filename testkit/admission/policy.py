"""Evaluate a ValidatingAdmissionPolicy or MutatingAdmissionPolicy's CEL with cel-python, and
apply the JSON patches a mutation yields (RFC 6902, the subset policies write).

What kube-apiserver gives a policy's expressions, and how it is given here:
- ``object``, ``oldObject`` (null on CREATE), ``params``, ``namespaceObject``, ``request`` and
  ``variables`` (each variable sees the ones before it): as JSON values;
- ``matchConditions`` all true, else the policy does not apply; ``validations`` each true;
- the CEL standard library and its macros (``has``, ``exists``, ``all``, ``filter``, ``in``,
  ``matches``, raw strings, ternaries): cel-python's own;
- of the Kubernetes CEL libraries, the functions of cel-go's strings extension our policies call
  (kube-apiserver loads it in every version): ``<string>.replace(old, new)``, every occurrence
  replaced, and ``<list<string>>.join(separator)``, as ``EXTENSIONS`` below does.

What cel-python cannot do, and how it is covered:
- Kubernetes' typed object construction in mutations, ``Object.spec.containers{...}`` and
  ``JSONPatch{...}``: cel-python resolves a type name through the activation and calls it with
  the field initialisers. ``TYPES`` binds ``Object`` (any path below it) and ``JSONPatch`` to
  constructors that build the plain JSON object. Kubernetes also type-checks those fields against
  the resource's schema at admission; the tests validate the patched object against the
  Kubernetes 1.34 schema in strict mode instead, which refuses an unknown or mistyped field.
- ``ApplyConfiguration`` mutations (server-side apply): not used by our policies, refused here.
- Cost limits and static type checking: not modelled.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import celpy
from celpy import celtypes


class _TypeName(celtypes.MessageType):
    """A Kubernetes CEL type name (``Object``, ``Object.spec.containers``, ``JSONPatch``):
    selecting a field names the type below it, calling it with field initialisers builds the
    object."""

    def __init__(self, name: str = "Object") -> None:
        super().__init__()
        self.name = name

    def get(self, field, default=None):  # noqa: D102 (cel-python's member selection)
        return _TypeName(f"{self.name}.{field}")

    def __call__(self, fields=None):
        return celtypes.MapType(dict(fields or {}))

    def __repr__(self) -> str:
        return f"type({self.name})"


def to_json(value: Any) -> Any:
    """A CEL result as plain JSON; an evaluation error raises."""
    if isinstance(value, celpy.CELEvalError):
        raise value
    if value is None or isinstance(value, celtypes.BoolType):
        return None if value is None else bool(value)
    if isinstance(value, (celtypes.IntType, celtypes.UintType)):
        return int(value)
    if isinstance(value, celtypes.DoubleType):
        return float(value)
    if isinstance(value, (celtypes.StringType, str)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    raise TypeError(f"unexpected CEL value {value!r}")


def _replace(s: Any, old: Any, new: Any) -> celtypes.StringType:
    return celtypes.StringType(str(s).replace(str(old), str(new)))


def _join(items: Any, separator: Any = "") -> celtypes.StringType:
    return celtypes.StringType(str(separator).join(str(i) for i in items))


EXTENSIONS = {"replace": _replace, "join": _join}


def evaluate(expression: str, activation: dict[str, Any]) -> Any:
    """Evaluate one CEL expression; ``activation`` holds JSON values (and ``variables``)."""
    env = celpy.Environment()
    program = env.program(env.compile(expression), functions=EXTENSIONS)
    cel_vars = {k: (v if isinstance(v, celtypes.MapType) else celpy.json_to_cel(v)) for k, v in activation.items()}
    cel_vars["Object"] = _TypeName("Object")
    cel_vars["JSONPatch"] = _TypeName("JSONPatch")
    return to_json(program.evaluate(cel_vars))


class Admission:
    """One admission request against one policy: the objects, and every expression's result in
    ``trace`` (name -> value), for the report."""

    def __init__(self, policy: dict, obj: dict, *, old: dict | None = None, params: dict | None = None,
                 namespace: dict | None = None, operation: str = "CREATE") -> None:
        self.spec = policy["spec"]
        self.base = {
            "object": obj, "oldObject": old, "params": params,
            "namespaceObject": namespace,
            "request": {"operation": operation, "kind": {"group": _group(obj), "version": _version(obj), "kind": obj.get("kind")},
                        "namespace": (obj.get("metadata") or {}).get("namespace")},
        }
        self.trace: dict[str, Any] = {}
        self._variables: dict[str, Any] | None = None

    def eval(self, name: str, expression: str) -> Any:
        value = evaluate(expression, {**self.base, "variables": celpy.json_to_cel(self.variables())})
        self.trace[name] = value
        return value

    def variables(self) -> dict[str, Any]:
        if self._variables is None:
            self._variables = {}
            for v in self.spec.get("variables") or []:
                act = {**self.base, "variables": celpy.json_to_cel(self._variables)}
                self._variables[v["name"]] = evaluate(v["expression"], act)
                self.trace[f"variables.{v['name']}"] = self._variables[v["name"]]
        return self._variables

    def matches(self) -> bool:
        """All matchConditions true (evaluated in order, as kube-apiserver stops at a false one)."""
        for c in self.spec.get("matchConditions") or []:
            value = evaluate(c["expression"], self.base)
            self.trace[f"matchConditions.{c['name']}"] = value
            if value is not True:
                return False
        return True

    def denials(self) -> list[str]:
        """A ValidatingAdmissionPolicy's failed validations' messages (empty: admitted)."""
        if not self.matches():
            return []
        out = []
        for i, v in enumerate(self.spec["validations"]):
            if self.eval(f"validations[{i}]", v["expression"]) is not True:
                msg = v.get("message")
                out.append(self.eval(f"validations[{i}].message", v["messageExpression"]) if "messageExpression" in v else msg)
        return out

    def mutated(self) -> dict | None:
        """A MutatingAdmissionPolicy's result: the object after each mutation's JSON patch, or
        None when the policy does not match."""
        if not self.matches():
            return None
        obj = copy.deepcopy(self.base["object"])
        for i, m in enumerate(self.spec["mutations"]):
            if m["patchType"] != "JSONPatch":
                raise NotImplementedError(f"patchType {m['patchType']}: only JSONPatch is evaluated here")
            self.base["object"] = obj
            patch = self.eval(f"mutations[{i}]", m["jsonPatch"]["expression"])
            obj = apply_patch(obj, patch)
        return obj


def _group(obj: dict) -> str:
    api = obj.get("apiVersion", "")
    return api.split("/")[0] if "/" in api else ""


def _version(obj: dict) -> str:
    return obj.get("apiVersion", "").split("/")[-1]


# -- RFC 6902 (add, replace, remove, test) ---------------------------------------------------------

def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _parent(doc: Any, parts: list[str]) -> Any:
    for p in parts[:-1]:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]  # a missing parent raises, as RFC 6902 says
    return doc


def apply_patch(doc: dict, patch: list[dict]) -> dict:
    """Apply ``patch`` to a copy of ``doc``; an operation that cannot apply raises."""
    doc = copy.deepcopy(doc)
    for op in patch:
        parts = _pointer(op["path"])
        parent, last = _parent(doc, parts), parts[-1]
        kind = op["op"]
        if kind == "add" and isinstance(parent, list):
            parent.insert(len(parent) if last == "-" else int(last), copy.deepcopy(op["value"]))
        elif kind == "add":
            parent[last] = copy.deepcopy(op["value"])
        elif kind == "replace":
            if (isinstance(parent, list) and not 0 <= int(last) < len(parent)) or (isinstance(parent, dict) and last not in parent):
                raise KeyError(f"replace: {op['path']} does not exist")
            parent[int(last) if isinstance(parent, list) else last] = copy.deepcopy(op["value"])
        elif kind == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        elif kind == "test":
            if (parent[int(last)] if isinstance(parent, list) else parent[last]) != op["value"]:
                raise ValueError(f"test failed at {op['path']}")
        else:
            raise NotImplementedError(f"JSON patch op {kind}")
    return doc


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True)


# -- kube-apiserver's order for one policy and its binding -----------------------------------------

RESOURCES = {"VirtualMachineInstance": "virtualmachineinstances", "VirtualMachine": "virtualmachines", "Pod": "pods"}


def _selected(constraints: dict, obj: dict, namespace: dict | None, operation: str) -> bool:
    """A policy's matchConstraints or a binding's matchResources: a resource rule for the
    object's group, resource and operation (none given: the policy's), and its namespaceSelector
    (matchLabels, and matchExpressions In, NotIn, Exists, DoesNotExist, as label selectors mean
    them) on the object's namespace."""
    group, resource = _group(obj), RESOURCES[obj["kind"]]
    rules = constraints.get("resourceRules")
    if rules is not None and not any(group in r["apiGroups"] and resource in r["resources"] and operation in r["operations"]
                                     for r in rules):
        return False
    selector = constraints.get("namespaceSelector") or {}
    labels = ((namespace or {}).get("metadata") or {}).get("labels") or {}
    if not all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    tests = {"In": lambda e: labels.get(e["key"]) in e["values"],
             "NotIn": lambda e: e["key"] not in labels or labels[e["key"]] not in e["values"],
             "Exists": lambda e: e["key"] in labels, "DoesNotExist": lambda e: e["key"] not in labels}
    return all(tests[e["operator"]](e) for e in selector.get("matchExpressions") or [])


def admit(policy: dict, binding: dict, obj: dict, *, params_store: dict[tuple[str, str], dict],
          namespace: dict | None = None, old: dict | None = None, operation: str = "CREATE") -> list[str]:
    """A ValidatingAdmissionPolicy and its binding on one request, in kube-apiserver's order
    (k8s.io/apiserver admission/plugin/policy/validating dispatcher.go, then validator.go): the
    matchConstraints; then the binding's params, looked up by name (``params_store``: (namespace,
    name) -> object), a missing one under parameterNotFoundAction Deny refusing the request
    (failurePolicy Fail) before anything else is evaluated; then matchConditions and
    validations. The binding's matchResources narrow the policy's matchConstraints. Returns the
    refusals (empty: admitted)."""
    if not (_selected(policy["spec"]["matchConstraints"], obj, namespace, operation)
            and _selected(binding["spec"].get("matchResources") or {}, obj, namespace, operation)):
        return []
    params = None
    ref = binding["spec"].get("paramRef")
    if ref is not None:
        params = params_store.get((ref.get("namespace", ""), ref["name"]))
        if params is None:
            if ref.get("parameterNotFoundAction") == "Deny" and policy["spec"].get("failurePolicy", "Fail") == "Fail":
                return ["failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction"]
            return []
    return Admission(policy, obj, old=old, params=params, namespace=namespace, operation=operation).denials()
