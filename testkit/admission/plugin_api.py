"""The Plugin CR's fields as KubeVirt v1.9.0 defines them
(``staging/src/kubevirt.io/api/plugin/v1alpha1/types.go``). A CRD, so no Kubernetes schema set
has it: ``structure_errors`` checks every field name, type and enum against ``PLUGIN_API``."""

from __future__ import annotations

import re

# field -> (type, required); a dict type is a nested struct, a list of one dict a list of
# structs; enums by name.
HOOK_POINTS = {"PreVMStart", "PostVMStart", "PreVMStop", "PostVMStop", "PreMigrationSource", "PreMigrationTarget",
               "PostMigrationTarget"}
STRATEGY = {"Fail", "Ignore"}
ADMISSION_REF = {"name": (str, True)}
DOMAIN_HOOK = {"cel": ({"expression": (str, True)}, False), "sidecar": ({"socketPath": (str, True)}, False),
               "condition": (str, False), "failureStrategy": (STRATEGY, False), "timeout": ("duration", False)}
NODE_HOOK = {"socket": (str, True), "permittedHooks": ([HOOK_POINTS], True), "condition": (str, False),
             "failureStrategy": (STRATEGY, False), "timeout": ("duration", False)}
PLUGIN_API = {
    "condition": (str, False), "failureStrategy": (STRATEGY, False),
    "domainHooks": ([DOMAIN_HOOK], False), "nodeHooks": ([NODE_HOOK], False),
    "mutatingAdmissionPolicies": ([ADMISSION_REF], False), "validatingAdmissionPolicies": ([ADMISSION_REF], False),
    "mutatingAdmissionWebhooks": ([ADMISSION_REF], False), "validatingAdmissionWebhooks": ([ADMISSION_REF], False),
}
# metav1.Duration: Go's time.ParseDuration
DURATION = re.compile(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+")


def structure_errors(value, typ, path: str) -> list[str]:
    if isinstance(typ, dict):
        if not isinstance(value, dict):
            return [f"{path}: not an object"]
        errs = [f"{path}.{k}: unknown field" for k in value if k not in typ]
        errs += [f"{path}.{k}: missing" for k, (_, req) in typ.items() if req and k not in value]
        return errs + [e for k, v in value.items() if k in typ for e in structure_errors(v, typ[k][0], f"{path}.{k}")]
    if isinstance(typ, list):
        if not isinstance(value, list) or not value:
            return [f"{path}: not a non-empty list"]
        return [e for i, v in enumerate(value) for e in structure_errors(v, typ[0], f"{path}[{i}]")]
    if isinstance(typ, set):
        return [] if value in typ else [f"{path}: {value!r} not one of {sorted(typ)}"]
    if typ == "duration":
        return [] if isinstance(value, str) and DURATION.fullmatch(value) else [f"{path}: {value!r} not a duration"]
    return [] if isinstance(value, typ) and value else [f"{path}: not a non-empty {typ.__name__}"]


def plugin_errors(doc: dict) -> list[str]:
    """A Plugin object's deviations from v1.9.0's API (cluster-scoped: no namespace)."""
    errs = [] if (doc.get("apiVersion"), doc.get("kind")) == ("plugin.kubevirt.io/v1alpha1", "Plugin") else ["not a Plugin"]
    errs += [f"{k}: unknown field" for k in doc if k not in {"apiVersion", "kind", "metadata", "spec"}]
    errs += [f"metadata.{k}: not allowed" for k in doc.get("metadata") or {} if k not in {"name", "labels", "annotations"}]
    return errs + structure_errors(doc.get("spec"), PLUGIN_API, "spec")
