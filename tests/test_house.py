"""House rules that can be checked mechanically (issues 10 and 17): in the library (topology/)
and the doors (sidecar/), generated code (sidecar/hookproto) aside, and (issue 26 finding 13) in
the test kit (testkit/) and the benchmarks (bench/), no function longer than 60 lines, no module
longer than 450, no folder of more than 12 modules; topology/ keeps only its
``__init__`` and errors at the top, the rest in rooms whose imports go one way (ORDER); no
import cycle among the project's modules; nothing edits ``sys.path`` outside a conftest.py; no
file refers to documents outside the repository."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 450
MAX_FOLDER_MODULES = 12
GENERATED = ("hookproto",)


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


def _product_files(package: str) -> list[Path]:
    files = [p for p in sorted((ROOT / package).rglob("*.py")) if not set(GENERATED) & set(p.parts)]
    assert files
    return files


@pytest.mark.parametrize("package", ["topology", "kubevirt", "sidecar"])
def test_no_function_longer_than_60_lines(package):
    too_long = [x for p in _product_files(package) for x in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert too_long == []


@pytest.mark.parametrize("package", ["topology", "kubevirt", "sidecar"])
def test_no_module_longer_than_450_lines(package):
    lengths = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in _product_files(package)}
    too_long = [f"{p} ({n} lines)" for p, n in lengths.items() if n > MAX_MODULE_LINES]
    assert too_long == []


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


@pytest.mark.parametrize("package", ["topology", "kubevirt", "sidecar"])
def test_no_folder_of_more_than_12_modules(package):
    assert crowded_folders([p.relative_to(ROOT) for p in _product_files(package)]) == []


# Issue 26 finding 13: the same three measures reach the test kit and the benchmark scripts,
# which had grown past them (testkit/synth.py 815 lines, testkit/strategies.py 608,
# bench/perf.py 506 with a 173-line measure()).
SUPPORT = ("testkit", "bench")


def size_violations(files: list[Path], root: Path = ROOT) -> list[str]:
    """Every breach of the three measures among ``files`` (paths relative to ``root``)."""
    out = [x for p in files for x in long_functions((root / p).read_text(), str(p))]
    out += [f"{p} ({n} lines)" for p in files if (n := len((root / p).read_text().splitlines())) > MAX_MODULE_LINES]
    return out + crowded_folders(files)


@pytest.mark.parametrize("folder", SUPPORT)
def test_f13_testkit_and_bench_keep_the_size_rules(folder):
    files = [p.relative_to(ROOT) for p in _product_files(folder)]
    assert size_violations(files) == []


def test_f13_the_measure_sees_each_breach_in_a_subpackage(tmp_path):
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


def test_topology_top_level_holds_only_its_init_and_errors():
    """Every other module lives in a room (see ORDER), so a newcomer finds it by folder name."""
    top = sorted(p.name for p in (ROOT / "topology").glob("*.py"))
    assert top == ["__init__.py", "errors.py"]


PACKAGES = ("topology", "kubevirt", "sidecar", "testkit")
# What a wheel installs: one top-level package, pcitopo, holding the three folders (pyproject.toml).
INSTALLED = "pcitopo"
INSTALLED_PACKAGES = ("topology", "kubevirt", "sidecar")


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
        # The installed names (pcitopo, pcitopo.cli) are the folders' names here.
        names = [n.removeprefix(f"{INSTALLED}.") for n in names]
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    return out


def bare_imports(path: Path) -> list[str]:
    """Absolute imports of ``topology`` or ``sidecar`` by their folder name instead of their
    installed name (``pcitopo``, ``pcitopo.cli``): from a checkout they would load
    the same files a second time as other modules (two ``PcitopoError`` classes)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        out += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names if n.split(".")[0] in INSTALLED_PACKAGES]
    return out


def test_the_project_is_imported_by_its_installed_names():
    files = [p for pkg in PACKAGES + ("tests", "bench", "fixtures", "proto") for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert bare_imports(ROOT / "tests" / "test_house.py") == []  # the measure reads files
    assert [x for p in files for x in bare_imports(p)] == []


def module_graph() -> dict[str, set[str]]:
    files = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            files[name] = p
    graph = {}
    for name, p in files.items():
        # "from pkg import mod" names a module; "from mod import func" names the module itself.
        deps = {d if d in files else d.rsplit(".", 1)[0] for d in project_imports(p, name)}
        graph[name] = {d for d in deps if d in files and d != name and not name.startswith(d + ".") and d not in PACKAGES}
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
    assert "topology.guest.rewrite" in graph["sidecar.core"]  # the graph really holds the project's edges
    assert find_cycle(graph) is None


# topology/'s rooms in the order the data flows, bottom first: a module may import from its own
# room and the rooms before it, never from a later one (docs/ARCHITECTURE.md draws the same).
ORDER = ("errors", "model", "host", "paths", "libvirt", "synth", "guest", "checks", "views")


def room_of(module: str) -> str | None:
    """``topology.guest.plan`` -> ``guest``; ``topology.errors`` -> ``errors``; None outside
    topology/ or for the package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "topology" and len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]], order: tuple[str, ...] = ORDER) -> list[str]:
    """Every import in topology/ that goes from a room to a later one in ``order``."""
    rank = {room: i for i, room in enumerate(order)}
    return sorted(
        f"{m} -> {d}" for m, deps in graph.items() if room_of(m) in rank
        for d in deps if room_of(d) in rank and rank[room_of(d)] > rank[room_of(m)]
    )


def test_the_order_check_sees_an_upward_import():
    graph = {"topology.model.tree": {"topology.errors"}, "topology.guest.plan": {"topology.model.tree"}}
    assert upward_imports(graph) == []
    graph["topology.model.tree"].add("topology.guest.plan")
    assert upward_imports(graph) == ["topology.model.tree -> topology.guest.plan"]


def test_every_room_is_in_the_order():
    rooms = {p.stem if p.is_file() else p.name for p in (ROOT / "topology").iterdir()
             if p.name != "__init__.py" and (p.suffix == ".py" or (p / "__init__.py").is_file())}
    assert rooms == set(ORDER)


def test_topology_imports_go_one_way_between_rooms():
    graph = module_graph()
    assert "topology.model.tree" in graph["topology.guest.plan"]  # the graph holds topology's edges
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


# Calls that spell XML (paths, tags): topology/libvirt/'s business, not a computing module's.
XML_CALLS = frozenset({"find", "findall", "iterfind", "findtext", "xpath", "Element", "SubElement"})


def xml_spellings(source: str, name: str) -> list[str]:
    """Every call of an lxml spelling method (``x.find("cpu")``, ``etree.Element("feature")``)."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in XML_CALLS:
            out.append(f"{name}:{node.lineno} .{node.func.attr}()")
    return out


def test_the_measure_sees_an_xml_spelling():
    assert xml_spellings("cpu = root.find('cpu')\nel = etree.Element('feature')\n", "t.py") == [
        "t.py:1 .find()", "t.py:2 .Element()"]
    assert xml_spellings("d = {}.get('x')\n", "t.py") == []


def test_mmio_computes_domain_spells():
    """src/pcitopo/guest/mmio.py decides what the MMIO budget needs; the <os>/<cpu>/<memory> spellings it
    reads and writes (and the memory-unit table) live in src/pcitopo/libvirt/machine.py."""
    path = ROOT / "topology" / "guest" / "mmio.py"
    text = path.read_text()
    assert xml_spellings(text, "src/pcitopo/guest/mmio.py") == []
    assert "_UNITS" not in text and '"kib"' not in text
# -- nothing in the library or the doors that only tests use -------------------------------------

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


def test_no_test_only_code_in_the_library_or_the_doors():
    """Test helpers live in testkit/, dead
    constants go: the product's modules hold only what the product uses."""
    sources = {str(p.relative_to(ROOT)): p.read_text() for d in ("topology", "kubevirt", "sidecar") for p in (ROOT / d).rglob("*.py") if not set(GENERATED) & set(p.parts)}
    entry_points = (ROOT / "pyproject.toml").read_text()
    found = [u for u in unused_names(sources, entry_points) if u.split(": ")[1] not in TEST_ONLY_OK]
    assert found == []


# The three rooms, one per question: what the host is (topology), what KubeVirt does (kubevirt),
# how pcitopo is called (sidecar). Imports go that way only.
ROOMS = ("topology", "kubevirt", "sidecar")


def backward_room_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {r: i for i, r in enumerate(ROOMS)}
    top = lambda m: m.split(".")[0]  # noqa: E731
    return sorted(f"{m} -> {d}" for m, deps in graph.items() if top(m) in rank
                  for d in deps if top(d) in rank and rank[top(d)] > rank[top(m)])


def test_the_room_check_sees_a_backward_import():
    assert backward_room_imports({"kubevirt.doors": {"topology.errors"}}) == []
    assert backward_room_imports({"kubevirt.doors": {"sidecar.cli"}}) == ["kubevirt.doors -> sidecar.cli"]


def test_the_three_rooms_import_one_way():
    graph = module_graph()
    assert "kubevirt.doors" in graph["kubevirt.manifest"]  # the graph holds kubevirt's edges
    assert backward_room_imports(graph) == []
