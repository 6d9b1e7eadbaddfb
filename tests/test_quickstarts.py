"""The quick starts of docs/DEPLOY.md, run as written and in order, with a cluster dump standing in
for the cluster.

Each quick start is one fenced block after ``<!-- quickstart: TARGET -->``. bash runs it (``set -e``)
in a scratch folder that sees this checkout's ``deploy/``, with ``sha256:<digest>`` replaced by a
digest. ``pcitopo`` and ``xmlfix`` are the real ones and must succeed. ``kubectl`` is
:func:`stand_in`, which does what each command would do to a cluster, offline, on the objects of
a dump from ``fixtures/clusters/`` (:class:`Cluster`):

- ``get KINDS -A -o yaml``: the dump's objects of those kinds (a kind the release does not serve,
  Plugins before v1.9, fails as kubectl does); ``get KIND NAME…``: NotFound unless present;
  ``get -f FILE… --ignore-not-found -o name``: those of the files' objects that exist;
  ``-o jsonpath={.a.b}``: that field, as kubectl prints it (nothing when it is missing);
  ``-o go-template=`` the one template the page uses, the index of a gate in the featureGates list;
- ``apply -k DIR``: the real ``kubectl kustomize DIR``; every object valid against Kubernetes'
  strict schemas and every pcitopo image reference pinned by the overlay's digest; a VM or VMI is
  held to each ValidatingAdmissionPolicy already applied (cel-python); the objects join the state;
  ``create -f FILE``: the same, and AlreadyExists for an object the state has (nothing is overwritten);
- ``patch kubevirt … --type=json|merge``: RFC 6902 or 7386 on the dump's KubeVirt CR;
- ``rollout status``, ``wait``: the object must exist; ``logs -c C``: C must be the container the
  target's door logs in (no VM runs here);
- ``label namespace``; ``delete -k|-f|KIND NAME``: the objects leave the state, and at the end the
  state must be the dump again (the roll back is complete);
- ``debug node/N … -- pcitopo capture …``: the real ``pcitopo capture`` of a fixture host.

Any other verb fails the quick start: a new cluster command needs a mapping here.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pcitopo.kubevirt.targets import TARGETS, parse_version, target
from testkit import REPO as ROOT

DEPLOY_MD = (ROOT / "docs" / "DEPLOY.md").read_text()
DIGEST = "sha256:" + "4f2c0d3b" * 8  # the digest the dumps' pcitopo VM runs (fixtures/clusters)
IMAGE = "registry.example.com/pcitopo"
K8S = "1.36.0"
CLUSTERS = ROOT / "fixtures" / "clusters"
NODE = ROOT / "fixtures" / "hgx-b200"  # the GPU node `kubectl debug node/…` captures
# The dump each quick start reads (fixtures/clusters/, built by hand from KubeVirt's types; its
# README says how), and the release it is relabelled as where no dump of that release exists.
DUMP = {"kubevirt-v1.6-v1.8": ("v1.8.0.yaml", None), "kubevirt-v1.9.0": ("v1.9.0-stranger.yaml", None),
        "kubevirt-main": ("v1.9.0-stranger.yaml", "v1.10.0-alpha.0")}
KINDS = {"kubevirt": "KubeVirt", "plugins.plugin.kubevirt.io": "Plugin", "nodes": "Node",
         "vmis": "VirtualMachineInstance", "vmi": "VirtualMachineInstance", "vms": "VirtualMachine",
         "vm": "VirtualMachine", "validatingadmissionpolicy": "ValidatingAdmissionPolicy",
         "daemonset": "DaemonSet", "namespace": "Namespace", "namespaces": "Namespace"}
CUSTOM_KINDS = {"KubeVirt", "Plugin", "VirtualMachine", "VirtualMachineInstance"}  # no Kubernetes schema
CONTAINER_OF_DOOR = {"hook": "hook-sidecar-0", "plugin": "pcitopo"}


# -- reading the page --------------------------------------------------------------------------

def quickstarts() -> dict[str, str]:
    return dict(re.findall(r"<!-- quickstart: (\S+) -->\n```sh\n(.*?)```", DEPLOY_MD, re.S))


def commands(block: str) -> list[tuple[str, str]]:
    """(why, command) pairs in order; a here-document stays with its command."""
    out: list[tuple[str, str]] = []
    why, lines = "", iter(block.splitlines())
    for line in lines:
        if line.startswith("#"):
            why = line.lstrip("# ")
        elif line.strip():
            heredoc = re.search(r"<<'?(\w+)'?", line)
            while heredoc and not line.endswith("\n" + heredoc[1]):
                line += "\n" + next(lines)
            out.append((why, line))
    return out


def test_the_page_opens_with_one_quick_start_per_target_of_at_most_40_lines():
    head = DEPLOY_MD[:DEPLOY_MD.index("# Reference")]
    for t in TARGETS:
        assert f"| `{t.name}` |" in head.split("## Quick start")[0], f"{t.name} missing from the targets table"
    assert set(quickstarts()) == {t.name for t in TARGETS}
    for section in head.split("\n## Quick start")[1:]:
        heading, block = section.split("```sh\n")[0], section.split("```sh\n")[1].split("\n```")[0]
        assert heading.count("\n") + block.count("\n") + 3 <= 40, section.splitlines()[0]  # heading to closing fence
        steps = [why.split(":")[0] for why, _ in commands(block)]
        assert steps[0] == "Preflight" and "Apply" in steps and "Verify" in steps and steps[-1] == "Roll back", steps


# -- the cluster, offline ----------------------------------------------------------------------

def dump_for(name: str) -> list[dict]:
    """The cluster before the quick start."""
    path, version = DUMP[name]
    items = yaml.safe_load((CLUSTERS / path).read_text())["items"]
    for item in items:
        if item["kind"] == "KubeVirt" and version:
            item["status"]["observedKubeVirtVersion"] = item["status"]["targetKubeVirtVersion"] = version
    return items


def release(objects: dict) -> tuple[int, int, int]:
    (cr,) = [o for o in objects.values() if o["kind"] == "KubeVirt"]
    return parse_version(cr["status"]["observedKubeVirtVersion"])


def key(obj: dict) -> str:
    return "/".join((obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]))


def merge_patch(live: object, patch: object) -> object:
    """RFC 7386, what `kubectl patch --type merge` sends: objects merge, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(live) if isinstance(live, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strings(obj: object):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from strings(v)
    elif isinstance(obj, str):
        yield obj


def validate(doc: dict) -> None:
    """Strict schema of what kube-apiserver would store; every pcitopo image pinned by the digest."""
    if doc["kind"] not in CUSTOM_KINDS:
        import kubernetes_validate

        kubernetes_validate.validate(doc, K8S, strict=True)
    for s in strings(doc):
        for ref in re.findall(rf"{re.escape(IMAGE)}[@:][\w.:-]+", s):
            assert ref == f"{IMAGE}@{DIGEST}", f"{key(doc)}: unpinned {ref}"


def option(args: list[str], *names: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE``."""
    for i, a in enumerate(args):
        for n in names:
            if a == n:
                return args[i + 1]
            if a.startswith(n + "="):
                return a[len(n) + 1:]
    return None


def options(args: list[str], name: str) -> list[str]:
    """Every value of a repeatable ``-f VALUE``."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]


def positional(args: list[str]) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-n", "-o", "-c", "-p", "-l", "-k", "-f", "--type", "--patch-file", "--tail", "--for",
                   "--timeout", "--image"):
            skip = True
        elif not a.startswith("-"):
            out.append(a)
    return out


class Cluster:
    """What the quick start's kubectl commands do to a cluster, on the dump's objects (kept in a
    JSON file between the stand-in's calls)."""

    def __init__(self, state: Path) -> None:
        self.state = state
        s = json.loads(state.read_text())
        self.name, self.objects, self.workdir = s["target"], s["objects"], Path(s["workdir"])
        self.target = target(self.name)
        self.version = release(self.objects)

    @classmethod
    def start(cls, name: str, workdir: Path) -> Cluster:
        objects = {key(o): o for o in dump_for(name)}
        # The namespaces the dump's objects live in exist; the example VM's, `ml`, allows hook
        # sidecars, as the page asks before its quick starts.
        for ns in {o["metadata"].get("namespace") for o in objects.values()} - {None, ""} | {"ml"}:
            objects.setdefault(f"Namespace//{ns}", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        objects["Namespace//ml"]["metadata"].setdefault("labels", {})["pcitopo.kubevirt.io/hook-sidecars"] = "allowed"
        state = workdir / ".cluster.json"
        state.write_text(json.dumps({"target": name, "objects": objects, "before": objects, "workdir": str(workdir)}))
        return cls(state)

    def save(self, **extra) -> None:
        s = json.loads(self.state.read_text())
        s.update(objects=self.objects, **extra)
        self.state.write_text(json.dumps(s))

    def kinds(self, resource: str) -> list[str]:
        kinds = [KINDS[r] for r in resource.split(",")]
        if "Plugin" in kinds:
            assert self.version >= (1, 9, 0), 'the server doesn\'t have a resource type "plugins"'
        return kinds

    def find(self, kinds: list[str], ns: str | None, names: list[str]) -> list[dict]:
        found = [o for o in self.objects.values() if o["kind"] in kinds
                 and (ns is None or o["metadata"].get("namespace", "") == ns)]
        for name in names:
            assert any(o["metadata"]["name"] == name for o in found), f'Error from server (NotFound): {name!r} not found'
        return [o for o in found if not names or o["metadata"]["name"] in names]

    def do_get(self, args: list[str]) -> str:
        words = positional(args)
        ns = None if "-A" in args else (option(args, "-n") or "")
        if options(args, "-f"):  # the files' objects, as they are in the cluster
            keys = [key(d) for f in options(args, "-f") for d in yaml.safe_load_all((self.workdir / f).read_text()) if d]
            found = [self.objects[k] for k in keys if k in self.objects]
            assert len(found) == len(keys) or "--ignore-not-found" in args, "Error from server (NotFound)"
        else:
            found = self.find(self.kinds(words[0]), ns if len(words) > 1 else None, words[1:])
        out = option(args, "-o")
        if out == "yaml":
            return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": found})
        if out == "name":
            return "".join(f"{o['kind'].lower()}.{o['apiVersion'].split('/')[0]}/{o['metadata']['name']}\n"
                           if "/" in o["apiVersion"] else f"{o['kind'].lower()}/{o['metadata']['name']}\n" for o in found)
        if out and out.startswith("jsonpath="):
            (obj,) = found
            text = re.sub(r"\{\.([\w.]+)\}", lambda m: jsonpath_field(obj, m[1]), out[len("jsonpath="):])
            return text.replace('{"\\n"}', "\n")
        if out and out.startswith("go-template="):
            return gate_index(found, out[len("go-template="):])
        return "\n".join(o["metadata"]["name"] for o in found) + "\n"

    def rendered(self, args: list[str]) -> list[dict]:
        if option(args, "-k"):
            r = subprocess.run([os.environ["REAL_KUBECTL"], "kustomize", option(args, "-k")], cwd=self.workdir,
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, r.stderr
            return [d for d in yaml.safe_load_all(r.stdout) if d]
        return [d for f in options(args, "-f") for d in yaml.safe_load_all((self.workdir / f).read_text()) if d]

    def do_create(self, args: list[str]) -> str:
        """`kubectl create`: refuses an object that exists (AlreadyExists), so it never overwrites."""
        docs = [d for f in options(args, "-f") for d in yaml.safe_load_all((self.workdir / f).read_text()) if d]
        taken = [key(d) for d in docs if key(d) in self.objects]
        assert not taken, f"Error from server (AlreadyExists): {', '.join(taken)}"
        return self.do_apply(args)

    def do_apply(self, args: list[str]) -> str:
        for doc in self.rendered(args):
            validate(doc)
            if doc["kind"] in ("VirtualMachine", "VirtualMachineInstance"):
                self.admit(doc)
            assert doc["kind"] != "KubeVirt", "a target applies the KubeVirt CR's gates by patch, not by apply"
            self.objects[key(doc)] = doc
        return ""

    def do_patch(self, args: list[str]) -> str:
        kind, name = positional(args)[:2]
        k = key({"kind": KINDS[kind], "metadata": {"name": name, "namespace": option(args, "-n") or ""}})
        raw = option(args, "-p") or (self.workdir / option(args, "--patch-file")).read_text()
        if option(args, "--type") == "json":
            from testkit.admission.policy import apply_patch

            self.objects[k] = apply_patch(self.objects[k], json.loads(raw))
        else:
            assert option(args, "--type") == "merge", args
            self.objects[k] = merge_patch(self.objects[k], yaml.safe_load(raw))
        return ""

    def do_delete(self, args: list[str]) -> str:
        if option(args, "-k") or option(args, "-f"):
            docs = self.rendered(args)
        else:
            words = positional(args)
            docs = self.find(self.kinds(words[0]), None, words[1:])
        assert "KubeVirt" not in {d["kind"] for d in docs}, "this delete would delete KubeVirt itself"
        for doc in docs:
            gone = self.objects.pop(key(doc), None) is None
            assert not gone or "--ignore-not-found" in args, f"Error from server (NotFound): {key(doc)}"
        return ""

    def do_kustomize(self, args: list[str]) -> str:
        """Renders only (no cluster): the real `kubectl kustomize`."""
        docs = self.rendered(["-k", positional(args)[0]])
        return yaml.safe_dump_all(docs)

    def do_rollout(self, args: list[str]) -> str:
        kind, name = positional(args)[1].split("/")
        self.find([KINDS[kind]], option(args, "-n") or "", [name])
        return ""

    def do_wait(self, args: list[str]) -> str:
        """A VMI becomes Ready once its VM exists (virt-controller starts it); nothing runs here."""
        if options(args, "-f"):
            self.do_get(args)  # every object of the file exists
            return ""
        kind, name = positional(args)[0].split("/")
        self.find(["VirtualMachine", "VirtualMachineInstance"], option(args, "-n") or "", [name])
        return ""

    def do_label(self, args: list[str]) -> str:
        kind, name, *pairs = positional(args)
        (obj,) = self.find([KINDS[kind]], "", [name])
        labels = obj["metadata"].setdefault("labels", {})
        for pair in pairs:
            labels.pop(pair[:-1], None) if pair.endswith("-") else labels.update([pair.split("=", 1)])
        if not labels:
            del obj["metadata"]["labels"]
        return ""

    def do_snapshot(self, args: list[str]) -> str:
        """Not kubectl: the test's mark before the roll back, to check what the target put there."""
        self.save(applied=copy.deepcopy(self.objects))
        return ""

    def do_logs(self, args: list[str]) -> str:
        container = option(args, "-c")
        assert container in {CONTAINER_OF_DOOR[d] for d in self.target.doors}, container
        name = (option(args, "-l") or "").removeprefix("vm.kubevirt.io/name=")
        self.find(["VirtualMachine"], option(args, "-n") or "", [name])  # the VM the quick start made
        return ""

    def admit(self, obj: dict) -> None:
        """kube-apiserver's ValidatingAdmissionPolicies of the state, on an object being created,
        through each binding (its matchResources and params, testkit.admission.policy.admit)."""
        from testkit.admission.policy import admit

        ns = obj["metadata"].get("namespace", "")
        namespace = self.objects.get(f"Namespace//{ns}", {"metadata": {"name": ns}})
        store = {(o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
                 for o in self.objects.values() if o["kind"] == "PodTemplate"}
        for binding in [o for o in self.objects.values() if o["kind"] == "ValidatingAdmissionPolicyBinding"]:
            policy = self.objects[f"ValidatingAdmissionPolicy//{binding['spec']['policyName']}"]
            denials = admit(policy, binding, obj, params_store=store, namespace=namespace)
            assert not denials, (policy["metadata"]["name"], denials)


def jsonpath_field(obj: object, path: str) -> str:
    """One ``{.a.b}`` as kubectl prints it: JSON for a list or map, nothing for a missing field."""
    for part in path.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else None
    if obj is None:
        return ""
    return json.dumps(obj, separators=(",", ":")) if isinstance(obj, (list, dict)) else str(obj)


def gate_index(found: list[dict], template: str) -> str:
    """The page's one go-template: the index of a gate in a list field (nothing when absent)."""
    m = re.fullmatch(r'\{\{range \$i, \$g := \.([\w.]+)\}\}\{\{if eq \$g "(\w+)"\}\}\{\{\$i\}\}\{\{end\}\}\{\{end\}\}', template)
    assert m, f"go-template {template!r}: no offline mapping"
    (obj,) = found
    for part in m[1].split("."):
        obj = obj[part]  # a missing map on the way is an error in kubectl's template too
    return "".join(str(i) for i, g in enumerate(obj or []) if g == m[2])


def debug_capture(args: list[str]) -> bytes:
    """`kubectl debug node/N … -- pcitopo capture … -o -`: the same capture, of a fixture host."""
    command = args[args.index("--") + 1:]
    assert command[:2] == ["pcitopo", "capture"] and command[-2:] == ["-o", "-"], command
    return subprocess.run(["pcitopo", "capture", "--sysfs", str(NODE), "-o", "-"], capture_output=True,
                          check=True).stdout


def stand_in(argv: list[str]) -> int:
    """The quick start's ``kubectl``: one call, on the state file in $QUICKSTART_STATE."""
    try:
        if argv and argv[0] == "debug":
            sys.stdout.buffer.write(debug_capture(argv))
            return 0
        cluster = Cluster(Path(os.environ["QUICKSTART_STATE"]))
        verb = next(a for a in argv if not a.startswith("-") and a not in (option(argv, "-n"),))
        handler = getattr(cluster, "do_" + verb, None)
        assert handler is not None, f"kubectl {verb}: no offline mapping for this command"
        rest = argv[:argv.index(verb)] + argv[argv.index(verb) + 1:]
        sys.stdout.write(handler(rest))
        cluster.save()
        return 0
    except AssertionError as e:
        print(f"kubectl (stand-in): {e}", file=sys.stderr)
        state = Path(os.environ["QUICKSTART_STATE"])  # kept, so that `|| echo` in a block cannot hide it
        s = json.loads(state.read_text())
        state.write_text(json.dumps({**s, "errors": [*s.get("errors", []), f"kubectl {' '.join(argv)}: {e}"]}))
        return 1


def bin_dir(tmp_path: Path) -> Path:
    """kubectl is the stand-in; pcitopo and xmlfix are this checkout's."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "kubectl"
    script.write_text(f"#!{sys.executable}\nimport sys\nsys.path[:0] = [{str(ROOT)!r}, {str(ROOT / 'tests')!r}]\n"
                      "from test_quickstarts import stand_in\nsys.exit(stand_in(sys.argv[1:]))\n")
    script.chmod(0o755)
    return bindir


def run_quickstart(name: str, tmp_path: Path, edit=None, during: str = "") -> tuple[subprocess.CompletedProcess, dict]:
    """Run the quick start of ``name`` on its dump (``edit`` changes the dump's objects first;
    ``during`` runs, as shell, just before the roll back: what someone else does meanwhile)."""
    pytest.importorskip("celpy")
    pytest.importorskip("kubernetes_validate")
    real = shutil.which("kubectl")
    if real is None:
        pytest.skip("needs kubectl (kustomize v5)")
    work = tmp_path / "checkout"
    work.mkdir()
    for folder in ("deploy", "docs", "fixtures"):
        os.symlink(ROOT / folder, work / folder)
    cluster = Cluster.start(name, work)
    if edit is not None:
        edit(cluster.objects)
        s = json.loads(cluster.state.read_text())
        cluster.state.write_text(json.dumps({**s, "objects": cluster.objects, "before": cluster.objects}))
    block = quickstarts()[name].replace("sha256:<digest>", DIGEST)
    marker = "\n# Roll back"
    script = block.replace(marker, f"\nkubectl snapshot\n{during}" + marker, 1)
    env = {**os.environ, "PATH": f"{bin_dir(tmp_path)}:{Path(sys.executable).parent}:/usr/bin:/bin",
           "REAL_KUBECTL": real, "QUICKSTART_STATE": str(cluster.state)}
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env, capture_output=True,
                       text=True, timeout=900)
    return r, json.loads(cluster.state.read_text())


@pytest.mark.parametrize("name", [t.name for t in TARGETS])
def test_quick_start_runs_in_order_and_its_roll_back_restores_the_cluster(name, tmp_path):
    r, state = run_quickstart(name, tmp_path)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}\nstdout (tail):\n{r.stdout[-1500:]}"
    assert not state.get("errors"), state["errors"]
    check_target_state(target(name), state["before"], state["applied"])
    assert state["objects"] == state["before"], "the roll back leaves the cluster as it was"


def the_cr(objects: dict) -> dict:
    (cr,) = [o for o in objects.values() if o["kind"] == "KubeVirt"]
    return cr


def someone_elses_train(objects: dict) -> None:
    """A VM of the example's name and namespace that belongs to someone else."""
    objects["VirtualMachine/ml/train"] = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                         "metadata": {"name": "train", "namespace": "ml", "labels": {"team": "vision"}},
                                         "spec": {"runStrategy": "Halted", "template": {"spec": {"domain": {"devices": {}}}}}}


@pytest.mark.parametrize("name", [t.name for t in TARGETS])
def test_an_existing_vm_of_the_same_name_stops_the_quick_start_before_it_changes_anything(name, tmp_path):
    r, state = run_quickstart(name, tmp_path, edit=someone_elses_train)
    assert r.returncode != 0 and "virtualmachine.kubevirt.io/train" in r.stderr, r.stderr[-2000:]
    assert "applied" not in state, "it stopped before the roll back mark"
    assert state["objects"] == state["before"], "nothing was created, the other VM is untouched"
    assert state["objects"]["VirtualMachine/ml/train"]["metadata"]["labels"] == {"team": "vision"}


def no_feature_gates(objects: dict) -> None:
    del the_cr(objects)["spec"]["configuration"]["developerConfiguration"]["featureGates"]


@pytest.mark.parametrize("name", [t.name for t in TARGETS])
def test_a_cr_without_a_feature_gates_list_gets_the_gate_and_loses_it_again(name, tmp_path):
    r, state = run_quickstart(name, tmp_path, edit=no_feature_gates)
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stderr[-3000:]}"
    assert not state.get("errors"), state["errors"]
    applied = the_cr(state["applied"])["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert applied == list(target(name).gates)
    assert state["objects"] == state["before"], "the list it made is gone again"


OTHER_GATE = ("kubectl -n kubevirt patch kubevirt kubevirt --type=json -p "
              "'[{\"op\":\"add\",\"path\":\"/spec/configuration/developerConfiguration/featureGates/-\",\"value\":\"VMExport\"}]'\n")


@pytest.mark.parametrize("name", [t.name for t in TARGETS])
def test_a_gate_someone_else_adds_during_the_trial_is_kept_by_the_roll_back(name, tmp_path):
    """On a CR whose list lacks the target's gate, and one without a list: after the roll back
    the other team's gate is there and the target's is not; nothing else differs."""
    def without_the_targets_gate(objects: dict) -> None:
        gates = the_cr(objects)["spec"]["configuration"]["developerConfiguration"]["featureGates"]
        gates[:] = [g for g in gates if g not in target(name).gates]

    for edit in (without_the_targets_gate, no_feature_gates):
        work = tmp_path / edit.__name__
        work.mkdir()
        r, state = run_quickstart(name, work, edit=edit, during=OTHER_GATE)
        before, after = the_cr(state["before"]), the_cr(state["objects"])
        gates = after["spec"]["configuration"]["developerConfiguration"]["featureGates"]
        assert "VMExport" in gates and not set(target(name).gates) & set(gates), gates
        assert r.returncode == 0 and not state.get("errors"), r.stderr[-2000:]
        assert {k: v for k, v in state["objects"].items() if v["kind"] != "KubeVirt"} == \
               {k: v for k, v in state["before"].items() if v["kind"] != "KubeVirt"}, "everything else as before"
        assert before["spec"]["configuration"]["developerConfiguration"].get("featureGates", []) + ["VMExport"] == gates


def check_target_state(t, before: dict, applied: dict) -> None:
    """Before the roll back: the target's gates are on, its Plugin objects (only those) exist, its
    DaemonSets run."""
    (cr,) = [o for o in applied.values() if o["kind"] == "KubeVirt"]
    gates = cr["spec"]["configuration"]["developerConfiguration"]["featureGates"]
    assert set(t.gates) <= set(gates) and len(gates) == len(set(gates)), gates
    plugins = {o["metadata"]["name"] for o in applied.values() if o["kind"] == "Plugin"}
    assert plugins - {o["metadata"]["name"] for o in before.values() if o["kind"] == "Plugin"} == set(t.plugin_objects)
    assert any(o["kind"] == "DaemonSet" for o in applied.values())


def test_the_plugin_quick_start_stops_at_its_preflight_on_v1_9_0(tmp_path):
    """Run on a v1.9.0 cluster, the `kubevirt-main` quick start's first step exits 1 and names the
    stranger's GPU VMI that its Plugin object would stop (kubevirt#18861), before anything is applied."""
    (line,) = [c for _, c in commands(quickstarts()["kubevirt-main"]) if c.startswith("pcitopo preflight")]
    (tmp_path / "cluster.yaml").write_text((CLUSTERS / "v1.9.0-stranger.yaml").read_text())
    r = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert "research/train-0" in r.stdout
    shown = re.search(r"<!-- preflight-main-on-v1.9.0 -->\n```\n\$ [^\n]*\n(.*?)```", DEPLOY_MD, re.S)[1]
    assert set(shown.splitlines()) <= set(r.stdout.splitlines()), "DEPLOY.md quotes lines preflight does not print"


def test_the_stand_in_refuses_a_vm_the_targets_policy_refuses(tmp_path, monkeypatch):
    """The mapping is not a rubber stamp: the hook target's policy, applied through the stand-in,
    refuses the pinned example VM in a namespace that does not allow hook sidecars."""
    pytest.importorskip("celpy")
    pytest.importorskip("kubernetes_validate")
    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl (kustomize v5)")
    monkeypatch.setenv("REAL_KUBECTL", shutil.which("kubectl"))
    os.symlink(ROOT / "deploy", tmp_path / "deploy")
    pin = f'images: [{{name: {IMAGE}, newName: {IMAGE}, digest: "{DIGEST}"}}]\n'
    for folder, text in (("site", "resources: [../deploy/targets/kubevirt-v1.9.0]\n"),
                         ("vm", "resources: [../deploy]\ntransformers: [../deploy/pin-image]\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "kustomization.yaml").write_text(text + pin)
    cluster = Cluster.start("kubevirt-v1.9.0", tmp_path)
    cluster.do_apply(["-k", "site"])
    cluster.do_label(["namespace", "ml", "pcitopo.kubevirt.io/hook-sidecars-"])
    with pytest.raises(AssertionError, match="pcitopo-hook-sidecars"):
        cluster.do_apply(["-k", "vm"])
    cluster.do_label(["namespace", "ml", "pcitopo.kubevirt.io/hook-sidecars=allowed"])
    cluster.do_apply(["-k", "vm"])
