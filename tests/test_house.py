"""House rules that can be checked mechanically: in the package (src/pcitopo/), the test kit
(testkit/, its generated code aside) and the benchmarks (bench/), no function longer than 60
lines, no module longer than 450, no folder of more than 12 modules; the package's top holds
only its ``__init__``, errors and the programs' plumbing, the rest in rooms whose imports go one
way (ORDER); no two modules share a basename; no import cycle among the project's modules;
nothing edits ``sys.path`` outside a conftest.py; no file refers to documents outside the
repository; only the commands parse command lines; the MMIO budget and KubeVirt's model spell
no XML."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
MAX_FOLDER_MODULES = 12
GENERATED = ("hookproto",)  # testkit/hookproto: grpcio-tools output (proto/generate.py)


def long_functions(source: str, name: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """Every function (methods and nested ones included) spanning more than ``limit`` lines,
    from its ``def`` line to its last line."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                out.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_the_measure_sees_a_long_function():
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}", "t.py") == [f"t.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions(f"def f():\n{body[: body.rindex('    x')]}", "t.py") == []
    nested = "class C:\n    def m(self):\n" + "".join("    " + line + "\n" for line in body.splitlines())
    assert [x.split()[1] for x in long_functions(nested, "t.py")] == ["m"]


PACKAGE = ROOT / "src" / "pcitopo"
# The installed package, then the support folders held to the same three measures.
FOLDERS = ("src/pcitopo", "testkit", "bench")


def _product_files(folder: str) -> list[Path]:
    files = [p for p in sorted((ROOT / folder).rglob("*.py")) if not set(GENERATED) & set(p.parts)]
    assert files
    return files




def crowded_folders(files: list[Path], limit: int = MAX_FOLDER_MODULES) -> list[str]:
    """Folders holding more than ``limit`` modules (``__init__.py`` aside: it is the folder's
    own, not one more thing to look through)."""
    from collections import Counter

    counts = Counter(p.parent for p in files if p.name != "__init__.py")
    return sorted(f"{d} ({n} modules)" for d, n in counts.items() if n > limit)


def test_the_measure_sees_a_crowded_folder():
    files = [Path(f"pkg/m{i}.py") for i in range(MAX_FOLDER_MODULES)] + [Path("pkg/__init__.py")]
    assert crowded_folders(files) == []
    assert crowded_folders(files + [Path("pkg/one_more.py")]) == [f"pkg ({MAX_FOLDER_MODULES + 1} modules)"]


def size_violations(files: list[Path], root: Path = ROOT) -> list[str]:
    """Every breach of the three measures among ``files`` (paths relative to ``root``)."""
    out = [x for p in files for x in long_functions((root / p).read_text(), str(p))]
    out += [f"{p} ({n} lines)" for p in files if (n := len((root / p).read_text().splitlines())) > MAX_MODULE_LINES]
    return out + crowded_folders(files)


@pytest.mark.parametrize("folder", FOLDERS)
def test_the_package_the_kit_and_bench_keep_the_size_rules(folder):
    files = [p.relative_to(ROOT) for p in _product_files(folder)]
    assert size_violations(files) == []


def test_the_size_measure_sees_each_breach_in_a_subpackage(tmp_path):
    """What the support folders are held to, on a made-up kit whose subpackage (walked like
    testkit/synth/) has one long module, one long function and one module too many."""
    sub = tmp_path / "kit" / "sub"
    sub.mkdir(parents=True)
    files = [Path("kit/sub/__init__.py")] + [Path(f"kit/sub/m{i}.py") for i in range(MAX_FOLDER_MODULES + 1)]
    for p in files:
        (tmp_path / p).write_text("x = 1\n")
    (sub / "m0.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (sub / "m1.py").write_text("def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES)))
    assert size_violations(files, tmp_path) == [
        f"kit/sub/m1.py:1 f ({MAX_FUNCTION_LINES + 1} lines)",
        f"kit/sub/m0.py ({MAX_MODULE_LINES + 1} lines)",
        f"kit/sub ({MAX_FOLDER_MODULES + 1} modules)",
    ]
    (sub / "m0.py").write_text("x = 1\n" * MAX_MODULE_LINES)
    (sub / "m1.py").unlink()
    assert size_violations([p for p in files if p.name != "m1.py"], tmp_path) == []


def test_the_package_top_holds_only_its_init_errors_and_program():
    """Every other module lives in a room (see ORDER), so a newcomer finds it by folder name."""
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "errors.py", "program.py"]


def twin_basenames(files: list[Path]) -> list[str]:
    """Basenames (``__init__.py`` aside) that more than one module carries."""
    from collections import Counter

    counts = Counter(p.name for p in files if p.name != "__init__.py")
    return sorted(n for n, k in counts.items() if k > 1)


def test_the_twin_finder_sees_a_twin():
    assert twin_basenames([Path("a/tree.py"), Path("b/tree.py"), Path("a/__init__.py"), Path("b/__init__.py")]) == ["tree.py"]
    assert twin_basenames([Path("a/tree.py"), Path("b/view.py")]) == []


def test_no_two_modules_share_a_basename():
    """One name, one idea: grep and an editor's file finder land on the module meant."""
    assert twin_basenames(list(PACKAGE.rglob("*.py"))) == []


# Where the project's modules live, by import name: the package under src/, the test kit at the top.
IMPORT_ROOTS = {"pcitopo": ROOT / "src", "testkit": ROOT}


def project_imports(path: Path, module: str) -> set[str]:
    """Project modules ``module`` imports at any depth of its body (lazy imports count: a cycle
    through a function-level import is still a cycle of the design)."""
    out: set[str] = set()
    package = module.rsplit(".", 1)[0] if not path.name == "__init__.py" else module
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            names = [stem] + [f"{stem}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in IMPORT_ROOTS)
    return out


def module_graph() -> dict[str, set[str]]:
    files = {}
    for top, base in IMPORT_ROOTS.items():
        for p in sorted((base / top).rglob("*.py")):
            parts = p.relative_to(base).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = p
    graph = {}
    for name, p in files.items():
        # "from pkg import mod" names a module; "from mod import func" names the module itself.
        deps = {d if d in files else d.rsplit(".", 1)[0] for d in project_imports(p, name)}
        graph[name] = {d for d in deps if d in files and d != name and not name.startswith(d + ".") and d not in IMPORT_ROOTS}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for d in sorted(graph.get(n, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (c := visit(d)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := visit(n)):
            return c
    return None


def test_the_cycle_finder_sees_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    graph = module_graph()
    assert "pcitopo.guest.rewrite" in graph["pcitopo.serve.core"]  # the graph really holds the project's edges
    assert find_cycle(graph) is None


# The package's rooms in the order the data flows, bottom first: a module may import from its own
# room and the rooms before it, never from a later one (docs/ARCHITECTURE.md draws the same). The
# hardware (model, host, paths, nccl), libvirt's vocabulary, the synthetic hosts, the guest plan
# and rewrite, the checks and their views, KubeVirt's model, then the servers KubeVirt calls and
# the commands.
ORDER = ("errors", "program", "model", "host", "paths", "nccl", "libvirt", "synth", "guest",
         "checks", "views", "kubevirt", "serve", "cli")


def room_of(module: str) -> str | None:
    """``pcitopo.guest.plan`` -> ``guest``; ``pcitopo.errors`` -> ``errors``; None outside
    the package or for the package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "pcitopo" and len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]], order: tuple[str, ...] = ORDER) -> list[str]:
    """Every import in the package that goes from a room to a later one in ``order``."""
    rank = {room: i for i, room in enumerate(order)}
    return sorted(
        f"{m} -> {d}" for m, deps in graph.items() if room_of(m) in rank
        for d in deps if room_of(d) in rank and rank[room_of(d)] > rank[room_of(m)]
    )


def test_the_order_check_sees_an_upward_import():
    graph = {"pcitopo.model.tree": {"pcitopo.errors"}, "pcitopo.guest.plan": {"pcitopo.model.tree"}}
    assert upward_imports(graph) == []
    graph["pcitopo.model.tree"].add("pcitopo.guest.plan")
    assert upward_imports(graph) == ["pcitopo.model.tree -> pcitopo.guest.plan"]
    assert upward_imports({"pcitopo.kubevirt.doors": {"pcitopo.cli.main"}}) == ["pcitopo.kubevirt.doors -> pcitopo.cli.main"]


def test_every_room_is_in_the_order():
    rooms = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert rooms == set(ORDER)


def test_imports_go_one_way_between_rooms():
    graph = module_graph()
    assert "pcitopo.model.tree" in graph["pcitopo.guest.plan"]  # the graph holds the package's edges
    assert "pcitopo.kubevirt.doors" in graph["pcitopo.kubevirt.manifest"]
    assert upward_imports(graph) == []


def _project_files(suffixes: tuple[str, ...]) -> list[Path]:
    import subprocess

    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / f for f in out.splitlines() if f.endswith(suffixes) and (ROOT / f).is_file()]


def test_nothing_edits_sys_path_outside_conftest():
    offenders = []
    for p in _project_files((".py",)):
        if p.name.startswith("conftest"):
            continue
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.Attribute) and node.attr == "path" and getattr(node.value, "id", None) == "sys":
                offenders.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def test_no_reference_to_documents_outside_the_repository():
    import re

    outside = re.compile(r"shared/brief|\.\./shared|\bthe brief\b|\bbrief 0\d")
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in _project_files((".py", ".md", ".proto", ".toml", ".yaml", ".yml", ".sh", "Makefile", "Containerfile", ".topo"))
        if p.name != "test_house.py"
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert hits == []


# Command lines are parsed by the commands: cli/ and the programs' plumbing (program.py's Parser)
# import argparse, the rooms below them take typed requests. serve/ has no parser of its own
# (`pcitopo serve`'s options are cli/main.py's).
ARGPARSE_OK = ("cli", "program.py")


def argparse_importers(files: dict[str, str]) -> list[str]:
    """The modules of ``files`` (path inside src/pcitopo -> source) that import argparse."""
    out = []
    for name, source in files.items():
        for node in ast.walk(ast.parse(source, name)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) else []
            if any(n and n.split(".")[0] == "argparse" for n in names):
                out.append(name)
                break
    return out


def test_the_measure_sees_an_argparse_import():
    assert argparse_importers({"a.py": "import argparse\n", "b.py": "from argparse import Namespace\n",
                               "c.py": "import json\n"}) == ["a.py", "b.py"]


def test_only_the_commands_parse_command_lines():
    files = {str(p.relative_to(PACKAGE)): p.read_text() for p in _product_files("src/pcitopo")}
    assert "cli/main.py" in argparse_importers(files)  # the measure reads the package
    assert [n for n in argparse_importers(files) if n.split("/")[0] not in ARGPARSE_OK] == []


# Calls that spell XML (paths, tags): src/pcitopo/libvirt/'s business, not a computing module's.
XML_CALLS = frozenset({"find", "findall", "iterfind", "findtext", "xpath", "Element", "SubElement", "iter"})


def xml_spellings(source: str, name: str) -> list[str]:
    """Every call of an lxml spelling method (``x.find("cpu")``, ``etree.Element("feature")``)."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in XML_CALLS:
            out.append(f"{name}:{node.lineno} .{node.func.attr}()")
    return out


def test_the_measure_sees_an_xml_spelling():
    assert xml_spellings("cpu = root.find('cpu')\nel = etree.Element('feature')\nfor a in root.iter('address'):\n    pass\n",
                         "t.py") == ["t.py:1 .find()", "t.py:2 .Element()", "t.py:3 .iter()"]
    assert xml_spellings("d = {}.get('x')\n", "t.py") == []


def test_mmio_computes_domain_spells():
    """src/pcitopo/guest/mmio.py decides what the MMIO budget needs; the <os>/<cpu>/<memory> spellings it
    reads and writes (and the memory-unit table) live in src/pcitopo/libvirt/machine.py."""
    path = PACKAGE / "guest" / "mmio.py"
    text = path.read_text()
    assert xml_spellings(text, "src/pcitopo/guest/mmio.py") == []
    assert "_UNITS" not in text and '"kib"' not in text


# Calls in src/pcitopo/kubevirt/ the measure sees by their method's name that spell no XML, with why.
KUBEVIRT_NOT_XML = {
    "launcher/allocation.py .find()": "Topology.find (src/pcitopo/model/tree.py): a PCI function by its BDF, or None",
}


def lxml_imports(source: str, name: str) -> list[str]:
    """Every import of lxml (``import lxml``, ``from lxml import etree``)."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) else []
        out += [f"{name}:{node.lineno}" for n in names if n and n.split(".")[0] == "lxml"]
    return out


def test_the_lxml_import_measure_sees_one():
    assert lxml_imports("import json\nfrom lxml import etree\nimport lxml.etree\n", "t.py") == ["t.py:2", "t.py:3"]


def test_kubevirt_computes_the_launcher_domain_libvirt_spells():
    """src/pcitopo/kubevirt/ decides what virt-launcher's domains hold (the converter, the defines,
    the re-parse per release); the elements it finds and makes are spelled in src/pcitopo/libvirt/
    (device_elements.py, machine.py, marshal.py, reread.py, define_sim.py, lenient.py), and it imports no lxml."""
    spelled, imports = [], []
    for p in _product_files("src/pcitopo/kubevirt"):
        rel = str(p.relative_to(PACKAGE / "kubevirt"))
        text = p.read_text()
        spelled += [s for s in xml_spellings(text, rel) if f"{rel} {s.split(' ', 1)[1]}" not in KUBEVIRT_NOT_XML]
        imports += lxml_imports(text, rel)
    assert spelled == []
    assert imports == []
    for allowed in KUBEVIRT_NOT_XML:  # each exception is still there, so the list cannot go stale
        rel, call = allowed.split(" ")
        assert any(s.endswith(call) for s in xml_spellings((PACKAGE / "kubevirt" / rel).read_text(), rel)), allowed


# -- nothing in the package that only tests use -------------------------------------

# Public names the product code does not call but that are deliberate API, with why.
TEST_ONLY_OK = {
    "describe_options": "src/pcitopo/serve/options.py: the options table the docs are checked against",
}


def unused_names(sources: dict[str, str], also: str = "") -> list[str]:
    """Top-level public functions, classes and constants of ``sources`` that no product code
    (``sources`` themselves, ``also``) names beyond their definition; ``__all__`` lists aside."""
    import re

    text = "\n".join(re.sub(r"__all__\s*=\s*\[.*?\]", "", t, flags=re.S) for t in sources.values()) + also
    out = []
    for name, source in sources.items():
        for node in ast.parse(source, name).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined = [node.name]
            elif isinstance(node, ast.Assign):
                defined = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                defined = []
            out += [f"{name}: {n}" for n in defined
                    if not n.startswith("_") and len(re.findall(rf"\b{re.escape(n)}\b", text)) <= 1]
    return out


def test_the_unused_name_finder_sees_one():
    assert unused_names({"a.py": "X = 1\ndef f():\n    return Y\nY = 2\n"}) == ["a.py: X", "a.py: f"]


def test_no_test_only_code_in_the_package():
    """Test helpers live in testkit/, dead
    constants go: the product's modules hold only what the product uses."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for p in _product_files("src/pcitopo")}
    entry_points = (ROOT / "pyproject.toml").read_text()
    found = [u for u in unused_names(sources, entry_points) if u.split(": ")[1] not in TEST_ONLY_OK]
    assert found == []
