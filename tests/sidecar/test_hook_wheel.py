"""The image, without a container engine: build the wheel from exactly what the Containerfile
copies, install it in a fresh virtual environment, start exactly the Containerfile's
ENTRYPOINT/CMD with its ENV, and talk to it over its socket.

The server runs in a private mount namespace (``unshare``, root only) where a tmpfs sits on
``/var/run/kubevirt-hooks`` as KubeVirt's emptyDir does, so the ENTRYPOINT runs unmodified
with its default socket path; the test reaches that socket through ``/proc/<pid>/root``.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import grpc
import pytest

from testkit.hookkit import REPO, fixture_domain, fixture_sysfs, vmi_json
from testkit.hookproto import info_pb2, info_pb2_grpc, v1alpha3_pb2, v1alpha3_pb2_grpc

CONTAINERFILE = REPO / "Containerfile"
KUBEVIRT_HOOKS = "/var/run/kubevirt-hooks"
IMAGE_VENV = "/opt/pcitopo"


# -- reading the Containerfile ------------------------------------------------------------------

def stages(text: str) -> list[list[tuple[str, str]]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out: list[list[tuple[str, str]]] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        op = op.upper()
        if op == "FROM":
            out.append([])
        if out:
            out[-1].append((op, rest.strip()))
        elif op != "ARG":
            raise AssertionError(f"instruction before FROM: {line}")
    return out


def exec_form(rest: str) -> list[str]:
    value = json.loads(rest)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {rest}"
    return value


def env_of(stage: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for op, rest in stage:
        if op == "ENV":
            for item in shlex.split(rest):
                k, _, v = item.partition("=")
                env[k] = v
    return env


@pytest.fixture(scope="module")
def containerfile():
    st = stages(CONTAINERFILE.read_text())
    assert len(st) >= 2, "multi-stage: a build stage and a final stage"
    return st


def stage_named(stages: list[list[tuple[str, str]]], name: str) -> list[tuple[str, str]]:
    named = [st for st in stages if re.search(rf"\s+AS\s+{re.escape(name)}$", st[0][1], re.I)]
    assert len(named) == 1, f"no stage named {name}"
    return named[0]


def test_the_final_stage_is_slim_wheel_only_unprivileged(containerfile):
    final = containerfile[-1]
    # The image is one layer: the runtime stage's root copied whole, so what that stage removes
    # leaves the image (removed on top of the base's layer, it would still be shipped in it).
    assert final[0][1] == "scratch"
    assert not [op for op, _ in final if op in ("RUN", "ADD")]
    copies = [rest for op, rest in final if op == "COPY"]
    assert len(copies) == 1 and re.fullmatch(r"--from=\S+ / /", copies[0]), copies
    runtime = stage_named(containerfile, copies[0].split()[0].removeprefix("--from="))
    text = CONTAINERFILE.read_text()
    base = dict(re.findall(r"^ARG (\w+)=(\S+)", text, re.M))
    image = re.sub(r"\$\{(\w+)\}", lambda m: base.get(m.group(1), m.group(0)), runtime[0][1])
    # The build and runtime stages on the Debian 12 base with Debian's python3 that
    # scripts/image-base.sh makes, under the name
    # the build script passes.
    assert image.startswith("localhost/pcitopo-base:bookworm-"), image
    assert containerfile[0][0][1].split()[0] == runtime[0][1].split()[0]
    base_script = (REPO / "scripts" / "image-base.sh").read_text()
    assert "NAME=\"localhost/pcitopo-base:$SUITE-$ARCH\"" in base_script and "PACKAGES=python3,python3-venv" in base_script
    runs = " ".join(rest for op, rest in runtime if op == "RUN")
    assert "--no-index" in runs and "--find-links /wheels" in runs, "install from wheels only"
    assert not re.search(r"apt-get|apk |gcc|build-essential|make ", runs), "no compilers or packages in the runtime stage"
    assert "from=build" in runs, "wheels come from the build stage's mount, never a file of the runtime root"
    # What only making the virtual environment and installing packages need goes (through dpkg).
    assert re.search(r"dpkg --purge [^&]*python3-venv", runs) and re.search(r"dpkg --purge [^&]*\bapt\b", runs)
    assert [rest for op, rest in final if op == "USER"] == ["107:107"]
    assert not [rest for op, rest in final if op in ("VOLUME", "EXPOSE")]
    assert exec_form(dict(final)["ENTRYPOINT"])[:2] == ["pcitopo", "serve"]
    assert env_of(final).get("PYTHONDONTWRITEBYTECODE") == "1"


def copied_paths(stage: list[tuple[str, str]]) -> list[str]:
    out = []
    for op, rest in stage:
        if op == "COPY" and "--from" not in rest:
            out += shlex.split(rest)[:-1]
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory, containerfile):
    """The wheel, built as the build stage builds it: from the COPY'd paths alone."""
    src = tmp_path_factory.mktemp("src")
    for rel in copied_paths(containerfile[0]):
        p = REPO / rel.rstrip("/")
        if p.is_dir():
            shutil.copytree(p, src / p.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / p.name)
    out = tmp_path_factory.mktemp("wheels")
    # --no-build-isolation: build with this environment's setuptools, offline.
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(src)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    (whl,) = out.glob("pcitopo-*.whl")
    return whl


def test_the_wheel_carries_the_server_and_the_console_scripts_and_no_generated_code(wheel):
    """The server speaks the hook API through pcitopo.serve.wire: grpcio-tools' output is the
    test kit's (testkit/hookproto) and no ``*_pb2*`` module ships."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = z.read(f"{dist}/entry_points.txt").decode()
    assert {"pcitopo/serve/server.py", "pcitopo/serve/shim.py", "pcitopo/serve/core.py", "pcitopo/serve/wire.py",
            "pcitopo/serve/options.py", "pcitopo/guest/rewrite.py"} <= names
    assert not [n for n in names if "_pb2" in n or "hookproto" in n]
    for line in ("pcitopo = pcitopo.cli.main:pcitopo_main", "onDefineDomain = pcitopo.serve.shim:main",
                 "xmlfix = pcitopo.cli.main:xmlfix_main"):
        assert line in entry_points


def test_the_wheel_installs_one_top_level_package_and_no_test_kit(wheel):
    """The test kit is not for users: the wheel holds one top-level package, pcitopo, whose
    modules are src/pcitopo/'s, whatever a full checkout holds (it is built here from the
    Containerfile's paths; the next test builds it from the whole checkout)."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
    dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {n.split("/")[0] for n in names if n.split("/")[0] != dist} == {"pcitopo"}
    assert {n for n in names if n.startswith("pcitopo/") and n.endswith(".py")} == _package_modules()


def _package_modules() -> set[str]:
    """src/pcitopo/'s modules as a wheel names them: the folder is the import path, no remapping."""
    src = REPO / "src"
    return {str(p.relative_to(src)) for p in (src / "pcitopo").rglob("*.py")}


def test_the_wheel_ships_the_license_text(wheel):
    """pyproject's `license-files` puts LICENSE in the wheel (built from the
    Containerfile's paths, so the image's install has it too) and names it in the metadata."""
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        assert z.read(f"{dist}/licenses/LICENSE") == (REPO / "LICENSE").read_bytes()
        meta = z.read(f"{dist}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert "License-File: LICENSE" in meta.splitlines()


def test_a_wheel_of_the_whole_checkout_ships_only_what_users_run(tmp_path):
    """`pip install .` from a checkout (what README documents) builds its wheel from the whole
    tree: still exactly src/pcitopo/'s modules under pcitopo/, none of testkit/, tests/, bench/
    or fixtures/."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (whl,) = tmp_path.glob("pcitopo-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
    dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    assert {n for n in names if n.endswith(".py")} == _package_modules()
    assert {n.split("/")[0] for n in names if n.split("/")[0] != dist} == {"pcitopo"}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def _requires(meta: str, extra: str | None = None) -> dict[str, str]:
    """Requirement name -> its version specifier, of the runtime (``extra`` None) or of one extra."""
    out = {}
    for m in re.finditer(r"^Requires-Dist: ([\w.-]+)\s*([^;\n]*)(?:;\s*(.*))?$", meta, re.M):
        marker = m.group(3) or ""
        if (extra is None and not marker) or (extra is not None and f'extra == "{extra}"' in marker):
            out[m.group(1).lower()] = m.group(2).strip()
    return out


def test_the_wheel_requires_grpcio_and_not_protobuf(wheel):
    """The package never imports protobuf (the server reads and writes the messages itself), so
    installing it does not pull protobuf in; only the test extras do, for the test kit's clients."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    runtime, test = _requires(meta), _requires(meta, "test")
    assert "grpcio" in runtime and "protobuf" not in runtime, runtime
    assert "protobuf" in test, test


def test_the_requirements_satisfy_the_runtimes_the_generated_code_checks_for(wheel):
    """The test kit's generated modules refuse to import under an older grpcio or another
    protobuf major (they check at import): the requirements of a development install (the
    package's grpcio, the test extras' protobuf) must not let pip pick one."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    runtime, test = _requires(meta), _requires(meta, "test")
    gen_grpc = re.search(r"GRPC_GENERATED_VERSION = '([\d.]+)'", (REPO / "testkit/hookproto/info_pb2_grpc.py").read_text()).group(1)
    gen_pb = _version(re.search(r"Protobuf Python Version: ([\d.]+)", (REPO / "testkit/hookproto/info_pb2.py").read_text()).group(1))
    grpc_min = [_version(s[2:]) for s in runtime["grpcio"].split(",") if s.strip().startswith(">=")]
    pb_spec = [s.strip() for s in test["protobuf"].split(",")]
    pb_min = [_version(s[2:]) for s in pb_spec if s.startswith(">=")]
    pb_max = [_version(s[1:]) for s in pb_spec if s.startswith("<") and not s.startswith("<=")]
    assert grpc_min and grpc_min[0] >= _version(gen_grpc), f"grpcio requirement {runtime['grpcio']!r} allows < {gen_grpc}"
    assert pb_min and pb_min[0] >= gen_pb, f"protobuf requirement {test['protobuf']!r} allows < {'.'.join(map(str, gen_pb))}"
    assert pb_max and pb_max[0] <= (gen_pb[0] + 1,), f"protobuf requirement {test['protobuf']!r} allows another major"


PROGRAM_MODULES = ("pcitopo.serve.server", "pcitopo.serve.shim", "pcitopo.cli.main")
LOADED = f"import sys, {', '.join(PROGRAM_MODULES)}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'google'))"


def test_the_programs_never_load_protobuf():
    """Here protobuf is installed (the test extras), so importing the server, the shim and the
    commands would find it: none of them loads it."""
    r = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def _requirement_closure(names: list[str]) -> set[str]:
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = re.split(r"[\s<>=!~;\[]", todo.pop(), maxsplit=1)[0]
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        for req in md.requires(name) or []:
            if "extra ==" not in req:
                todo.append(req)
    return seen


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel):
    """A fresh virtual environment with our wheel installed and, offline, the wheel's runtime
    dependencies (its Requires-Dist and theirs, no extras) linked in from this environment
    (their files only: never our own package)."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    py = root / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    deps = _requirement_closure(sorted(_requires(meta))) - {"pcitopo"}
    linked = 0
    for key in sorted(deps):
        dist = md.distribution(key)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            assert "pcitopo" not in top and "__editable__" not in top
            if src.exists() and not (site / top).exists():
                (site / top).symlink_to(src)
                linked += 1
    assert linked
    r = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # pip compiles at install by default in the image; do the same here for our package only.
    subprocess.run([str(py), "-m", "compileall", "-q", str(site / "pcitopo")], check=True, timeout=120)
    r = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return root


def clean_env(extra: dict[str, str], venv: Path) -> dict[str, str]:
    """An environment that cannot see the repository: no PYTHONPATH, the venv's bin first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PCITOPO"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    env.update(extra)
    return env


def tree_listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


needs_ns = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                              reason="needs root and unshare for a private mount namespace")


@needs_ns
def test_the_entrypoint_from_the_installed_wheel_serves_kubevirt(containerfile, venv, tmp_path):
    final = containerfile[-1]
    argv = exec_form(dict(final)["ENTRYPOINT"]) + (exec_form(dict(final)["CMD"]) if "CMD" in dict(final) else [])
    image_env = env_of(final)
    # The image's virtual environment is /opt/pcitopo, first on its PATH; here it is ours.
    image_env["PATH"] = image_env["PATH"].replace(IMAGE_VENV, str(venv))
    assert image_env["PATH"].startswith(f"{venv}/bin:")
    env = clean_env({**image_env, "PCITOPO_SYSFS": fixture_sysfs("hgx-b200")}, venv)
    before = tree_listing(venv)
    # The pod: a private mount namespace with an emptyDir-like tmpfs on the hook folder; the
    # ENTRYPOINT replaces the shell (exec), so the PID we hold is the server's.
    # (a fresh tmpfs over /var/run's real directory first: the host's has no kubevirt-hooks,
    # and nothing is created outside the namespace)
    run_dir = os.path.realpath("/var/run")
    assert KUBEVIRT_HOOKS.startswith("/var/run/")
    script = (f"mount -t tmpfs -o mode=0755 run {run_dir} && mkdir -m 0777 {KUBEVIRT_HOOKS} && "
              f"mount -t tmpfs -o mode=0777 hooks {KUBEVIRT_HOOKS} && cd / && exec {shlex.join(argv)}")
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/")
    try:
        # (through the real directory: an absolute symlink such as /var/run -> /run would
        # resolve in our namespace, not the server's)
        sock = Path(f"/proc/{proc.pid}/root{run_dir}{KUBEVIRT_HOOKS[len('/var/run'):]}/pcitopo.sock")
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "no socket"
            time.sleep(0.01)
        exe = os.readlink(f"/proc/{proc.pid}/exe")
        cmdline = open(f"/proc/{proc.pid}/cmdline", "rb").read().split(b"\0")
        assert exe.startswith(str(venv)) or os.path.realpath(exe) == os.path.realpath(venv / "bin" / "python")
        assert cmdline[1:4] == [str(venv / "bin" / "pcitopo").encode(), b"serve", b""]
        assert os.listdir(sock.parent) == ["pcitopo.sock"]
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            info = info_pb2_grpc.InfoStub(ch).Info(info_pb2.InfoParams(), timeout=1.0, wait_for_ready=True)
            assert list(info.versions) == ["v1alpha3", "v1alpha2", "v1alpha1"]
            domain = fixture_domain("hgx-b200")
            out = v1alpha3_pb2_grpc.CallbacksStub(ch).OnDefineDomain(
                v1alpha3_pb2.OnDefineDomainParams(domainXML=domain, vmi=vmi_json(domain)), timeout=60).domainXML
            assert out == (REPO / "fixtures/hgx-b200/expected.xml").read_bytes()
            v1alpha3_pb2_grpc.CallbacksStub(ch).Shutdown(v1alpha3_pb2.ShutdownParams(), timeout=10)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
    records = [json.loads(line) for line in (tmp_path / "server.log").read_text().splitlines()]
    assert [r["event"] for r in records][-2:] == ["Shutdown", "stopped"]
    assert next(r for r in records if r["event"] == "serving")["socket"] == f"{KUBEVIRT_HOOKS}/pcitopo.sock"
    # Read-only root filesystem friendly: running wrote nothing into the installation.
    assert tree_listing(venv) == before


def test_the_installed_programs_import_without_protobuf(venv):
    """The fresh environment holds the wheel's runtime requirements only, so protobuf is not
    there at all: the server, the shim and the commands import all the same."""
    code = f"import importlib.util; print(importlib.util.find_spec('google') is None); {LOADED}"
    r = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                       env=clean_env({}, venv), cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "[]"]


def test_the_installed_shim_and_xmlfix_agree(venv, tmp_path):
    domain = fixture_domain("hgx-b200")
    env = clean_env({"PCITOPO_SYSFS": fixture_sysfs("hgx-b200")}, venv)
    r = subprocess.run(["onDefineDomain", "--vmi", vmi_json(domain).decode(), "--domain", domain.decode()],
                       capture_output=True, env=env, cwd="/", timeout=120)
    assert r.returncode == 0, r.stderr
    (tmp_path / "d.xml").write_bytes(domain)
    x = subprocess.run(["xmlfix", str(tmp_path / "d.xml")], capture_output=True, env=env, cwd="/", timeout=120)
    assert x.returncode == 0, x.stderr
    assert r.stdout == x.stdout == (REPO / "fixtures/hgx-b200/expected.xml").read_bytes()
