"""What a cluster does with the objects a deploy target renders, where the tests need it: which
nodes a DaemonSet's node affinity selects (Kubernetes' rules), and what virt-handler does at a
node hook point with the Plugin objects that exist (KubeVirt's ``CallNodeHooks``)."""

from __future__ import annotations

from dataclasses import dataclass

from testkit.admission.policy import evaluate

# -- node affinity (Kubernetes, "Assigning Pods to Nodes"; k8s.io/component-helpers
#    scheduling/corev1/nodeaffinity) ------------------------------------------------------------

def _expression_matches(expr: dict, labels: dict[str, str]) -> bool:
    key, op, values = expr["key"], expr["operator"], expr.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    raise NotImplementedError(f"node selector operator {op}")  # Gt/Lt: not used by deploy/


def _term_matches(term: dict, labels: dict[str, str]) -> bool:
    """A term matches when all of its expressions do; a term with none matches no node."""
    exprs = term.get("matchExpressions") or []
    if term.get("matchFields"):
        raise NotImplementedError("matchFields")
    return bool(exprs) and all(_expression_matches(e, labels) for e in exprs)


def schedules_on(pod_spec: dict, labels: dict[str, str]) -> bool:
    """Whether a pod with this spec may run on a node with these labels: its nodeSelector (every
    pair) and its required node affinity (any term) both hold."""
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    required = (((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    return any(_term_matches(t, labels) for t in required["nodeSelectorTerms"])


# -- virt-handler's node hooks (KubeVirt v1.9.0 and main, pkg/virt-handler/plugins/manager.go,
#    CallNodeHooks) ----------------------------------------------------------------------------

@dataclass(frozen=True)
class HookCall:
    plugin: str
    socket: str
    failure_strategy: str
    served: bool


def call_node_hooks(plugins: list[dict], hook_point: str, vmi: dict, serving: set[str],
                    *, plugin_condition: bool = True) -> tuple[str | None, list[HookCall]]:
    """What virt-handler does at ``hook_point`` for ``vmi``: every node hook of every Plugin that
    permits the point and whose condition holds (CEL on the VMI through its json names; an empty
    condition holds), called in the alphabetical order of the Plugins' names. A call to a socket
    not in ``serving`` fails (the dial fails); under failureStrategy Ignore that is logged and
    skipped, under Fail (the default) it is the hook point's error. A condition that does not
    evaluate is an error whatever the strategy. ``plugin_condition``: main also applies
    ``spec.condition`` to node hooks (v1.9.0 does not). Returns (error or None, the calls made)."""
    matches = []
    for plugin in plugins:
        name, spec = plugin["metadata"]["name"], plugin["spec"]
        if plugin_condition and spec.get("condition") and evaluate(spec["condition"], {"vmi": vmi}) is not True:
            continue
        for hook in spec.get("nodeHooks") or []:
            if hook_point not in hook["permittedHooks"]:
                continue
            if hook.get("condition") and evaluate(hook["condition"], {"vmi": vmi}) is not True:
                continue
            matches.append((name, hook))
    matches.sort(key=lambda m: m[0])  # sort.SliceStable by plugin name
    calls = []
    for name, hook in matches:
        strategy = hook.get("failureStrategy") or "Fail"
        call = HookCall(name, hook["socket"], strategy, hook["socket"] in serving)
        calls.append(call)
        if not call.served and strategy != "Ignore":
            return f"node hook {hook_point} from plugin {name} failed: failed to dial plugin {name} at {hook['socket']}", calls
    return None, calls
