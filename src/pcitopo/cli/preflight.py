"""`pcitopo preflight --target NAME [FILE ...]`: the cluster, read before anything is applied.

    kubectl get kubevirt,plugins.plugin.kubevirt.io,namespaces,nodes,vmis,vms -A -o yaml > cluster.yaml
    pcitopo preflight --target kubevirt-v1.9.0 cluster.yaml      # or: ... -o yaml | pcitopo preflight --target NAME -

Exit 0 when applying the target harms no VM, 1 when it would (each VM named) or when the target
is not for the cluster's release, 4 (unknown) when the dump has no KubeVirt CR or its release is
not one pcitopo read (``--assume-release`` judges it as a read one), 2 for unreadable input (one line). The judgement is
src/pcitopo/kubevirt/cluster_verdict.py's; this module only prints it.
"""

from __future__ import annotations

import argparse
import sys

from pcitopo.program import EXIT_CHECK_FAILED, EXIT_OK, EXIT_UNKNOWN, print_json


def assume_names() -> list[str]:
    """``--assume-release``'s values, lines and main (the patches are accepted too)."""
    from pcitopo.kubevirt.releases import RELEASES

    return [r.newest for r in RELEASES]


def add_preflight_parser(sub) -> None:
    from pcitopo.kubevirt.targets import TARGETS

    p = sub.add_parser(
        "preflight", help="before deploying: what applying a target (deploy/targets/NAME) would do to this cluster's VMs",
        description="Reads what `kubectl get kubevirt,plugins.plugin.kubevirt.io,namespaces,nodes,vmis,vms -A -o yaml` prints (a List, "
        "or multi-document YAML/JSON; no cluster access) and reports the KubeVirt release and gates and whether the target "
        "fits them, the Plugin objects, the GPU nodes the DaemonSet runs on and misses, every VM or VMI with a PCI host "
        "device that would stop starting or lose pcitopo's settings once the target is applied, every VM whose "
        "hooks.kubevirt.io/hookSidecars the target's Sidecar policy would refuse at its next start, and the doors each "
        "opted-in VM needs. Exit 0: no VM harmed; 1: some VM harmed (named) or the target is not for this release; "
        "4: unknown (no KubeVirt CR, or a release pcitopo did not read); 2: unreadable input.")
    p.add_argument("--target", required=True, choices=[t.name for t in TARGETS], metavar="NAME",
                   help="the deploy target, a folder under deploy/targets/: " + ", ".join(t.name for t in TARGETS))
    p.add_argument("--image", metavar="REF", action="append", default=[],
                   help="the pcitopo image your overlay pins (REPOSITORY@sha256:<64 hex>, whatever its name); again for "
                   "each earlier pcitopo image it still admits (an upgrade). Default: the dump's PodTemplate "
                   "pcitopo/pcitopo-image. The hook targets' Sidecar policy admits pcitopo's images and the admitted list")
    p.add_argument("--allow-sidecar", metavar="REF", action="append", default=[],
                   help="judge as if the params admitted this hook sidecar: another team's image, REPOSITORY@sha256:<64 hex>, "
                   "or a hook with no image, configmap:NAMESPACE/CONFIGMAP (repeatable; docs/DEPLOY.md, "
                   "\"Other teams' hook sidecars\")")
    p.add_argument("--component", metavar="NAME", action="append", default=[], choices=["hook-sidecars-policy"],
                   help="an optional component your overlay adds (deploy/components/NAME): hook-sidecars-policy, the "
                   "Sidecar policy, judged as on the hook targets (for kubevirt-main on a cluster that keeps Sidecar on)")
    p.add_argument("--assume-release", metavar="RELEASE", help="judge the cluster's KubeVirt as this release pcitopo "
                   "read (a release it did not read, v1.9.1 or v1.10.0 say, is unknown: exit 4): "
                   + ", ".join(assume_names()))
    p.add_argument("--json", action="store_true", help="the same facts as one JSON document")
    p.add_argument("dump", nargs="*", default=["-"], metavar="FILE",
                   help="cluster dump files, - for standard input (the default)")


def cmd_preflight(args: argparse.Namespace) -> int:
    from pcitopo.kubevirt.cluster import read_dump
    from pcitopo.kubevirt.cluster_verdict import as_json, preflight
    from pcitopo.kubevirt.targets import target

    report = preflight(read_dump(args.dump), target(args.target), assume=args.assume_release, images=tuple(args.image),
                       allow=tuple(args.allow_sidecar), components=tuple(args.component))
    if args.json:
        print_json(as_json(report))
    else:
        sys.stdout.write("\n".join(text_lines(report, args.dump)) + "\n")
    if report.unknown:
        return EXIT_UNKNOWN
    return EXIT_CHECK_FAILED if report.fails else EXIT_OK


def text_lines(report, sources: list[str]) -> list[str]:
    t = report.target
    out = [f"target {t.name}: {t.releases}; doors {', '.join(t.doors)}; gates {', '.join(t.gates)}; "
           f"Plugin objects {', '.join(t.plugin_objects) or 'none'}  (dump: {', '.join(sources)})"]
    if t.plugin_objects:
        from pcitopo.kubevirt.releases import MAIN_COMMIT, MAIN_DATE, PLUGIN_API

        out.append(f"  Plugin API read: {PLUGIN_API}, at kubevirt/kubevirt main {MAIN_COMMIT} ({MAIN_DATE})")
    if report.unknown:
        return out + _unknown_lines(report)
    out += _kubevirt_lines(report)
    out += _node_lines(report)
    out += _workload_lines(report)
    out += _policy_lines(report)
    out += [f"SIDECAR OPEN: {report.sidecar_open}"] if report.sidecar_open else []
    out += [f"note: {n}" for n in report.notes]
    harmed = [(w.name, w.harm) for w in report.harmed] + [(p.name, "stops starting: Sidecar policy") for p in report.refused]
    if harmed:
        out.append(f"verdict: applying {t.name} harms {len(harmed)} VM(s): " + ", ".join(f"{n} ({h})" for n, h in harmed))
    elif report.sidecar_open:
        out.append(f"verdict: applying {t.name} leaves every tenant free to run any hook sidecar: see SIDECAR OPEN above")
    elif report.release_fits is False:
        out.append(f"verdict: {t.name} is not for KubeVirt {report.before.release}: see the kubevirt line above")
    else:
        out.append(f"verdict: ok: applying {t.name} harms no VM")
    return out


def _unknown_lines(report) -> list[str]:
    """Nothing judged: what the dump says, the GPU nodes (they do not hang on the release), why unknown."""
    where = f" ({report.kubevirt})" if report.kubevirt else ""
    out = [f"kubevirt: {report.seen or 'no release'}{where}: not judged"]
    out += _node_lines(report)
    out += [f"note: {n}" for n in report.notes]
    out.append(f"verdict: unknown: {report.unknown}")
    return out


def _policy_lines(report) -> list[str]:
    if not report.target.sidecar_policy and not (report.policy or report.on_pcitopo):
        return []
    out = [f"vms with hooks.kubevirt.io/hookSidecars the target's Sidecar policy refuses at their next start: "
           f"{len(report.refused)}" + (f", {len(report.policy) - len(report.refused)} more to check" if
                                       len(report.policy) > len(report.refused) else "")]
    for p in report.policy:
        out.append(f"  {'HARMED' if p.refusal.certain else 'check '} {p.name} ({p.kind}): {p.refusal.why}")
        if p.refusal.admit:
            out.append(f"    to admit it, vetted, add to the PodTemplate pcitopo/pcitopo-image's metadata.annotations: "
                       f"{p.refusal.admit}")
    return out + _pcitopo_image_lines(report)


def _pcitopo_image_lines(report) -> list[str]:
    """The pcitopo images the policy admits, and which VMs still run each: an upgrade drops an
    earlier image once no VM runs it."""
    images = report.admitted.pcitopo
    if not images:
        return ["pcitopo images the Sidecar policy admits: not known (give --image, or dump podtemplates -n pcitopo)"]
    out = [f"pcitopo images the Sidecar policy admits: {len(images)}"]
    for n, image in enumerate(images):
        vms = report.on_pcitopo.get(image, [])
        role = "pinned" if n == 0 else "earlier, still admitted"
        use = f"{len(vms)} VM(s) run it: {', '.join(vms)}" if vms else "no VM runs it" + ("" if n == 0 else ": drop it")
        out.append(f"  {image} ({role}): {use}")
    return out


def _kubevirt_lines(report) -> list[str]:
    from pcitopo.kubevirt.targets import TARGETS

    b = report.before
    gates = ", ".join(sorted(b.gates)) or "none"
    if report.kubevirt is None:
        head = f"kubevirt: no KubeVirt CR in the dump; judged as {b.release} with no gate"
    else:
        judged = f"{report.seen}, judged as {b.release}" if report.seen and report.seen != b.release else b.release
        head = f"kubevirt: {judged} ({report.kubevirt}), gates {gates}"
    if report.release_fits is False:
        fit = next((x.name for x in TARGETS if x.fits(b.release)), None)
        head += f"; the target does not fit this release ({report.target.releases})" + (f": use {fit}" if fit else "")
    elif report.release_fits:
        head += "; the target fits this release"
    out = [head]
    if report.gates_added:
        out.append(f"  gates: the target's gate patch adds {', '.join(report.gates_added)}")
    plugins = ", ".join(f"{n} ({'pcitopo' if ours else 'not pcitopo'})" for n, ours in report.plugins) or "none"
    out.append(f"plugins: {plugins}; after the target: {', '.join(report.after.plugins) or 'none'}"
               + ("" if report.after.pipeline_runs else " (no Plugin pipeline runs)"))
    return out


def _node_lines(report) -> list[str]:
    from pcitopo.kubevirt.nodes import UNLABELLED_ADVICE

    nodes = report.nodes
    runs = [n for n in nodes if n.daemonset]
    out = [f"gpu nodes: {len(nodes)}; the DaemonSet runs on {len(runs)}, misses {len(nodes) - len(runs)}"]
    for n in nodes:
        what = "runs on" if n.daemonset else "MISSES "
        fix = "" if n.daemonset else f"; {UNLABELLED_ADVICE}"
        out.append(f"  {what} {n.name} ({'; '.join(n.why)}{fix})")
    return out


def _workload_lines(report) -> list[str]:
    loads = report.workloads
    out = [f"vms with a PCI host device: {len(loads)}; harmed by the target: {len(report.harmed)}"]
    for w in loads:
        mark = "HARMED" if w.harm else "down  " if not w.before.starts else "lossy " if w.after.lost else "ok    "
        state = f"{w.harm}: {w.after.line}" if w.harm else (
            w.after.line if w.before.start is w.after.start else f"{w.before.start.value}, then {w.after.line}")
        state = state if w.before.starts else f"already {state}"
        out.append(f"  {mark} {w.name} ({w.kind}; {', '.join(w.devices)}): {state}")
    from pcitopo.kubevirt.cluster_verdict import DOOR_NAMES

    needs = " and ".join(DOOR_NAMES[d] for d in report.doors())
    opted = [w for w in loads if w.opted_in]
    out.append(f"doors on KubeVirt {report.after.release} after the target: {needs} "
               f"({len(opted)} opted-in VM(s) with PCI host devices)")
    for w in opted:
        missing = [d for d in report.doors() if d not in w.has]
        out.append(f"  {w.name}: has {', '.join(w.has) or 'no door'}" + (f"; add {', '.join(missing)}" if missing else ""))
    return out
