"""The measurements of ``bench/perf.py`` (its docstring numbers them), in the order they run:
in-process figures, server starts, one server through a VM boot, calls in rounds, in a row and
all at once, a server whose VMI carries no annotation, then the CLI processes."""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Callable

from harness import (  # bench/harness.py: the script's own folder is first on sys.path
    CODE,
    PeakSampler,
    Server,
    Stat,
    code_env,
    cpu_seconds,
    define_new_connection,
    interleaved,
    loadavg,
    machine_facts,
    proc_status,
    run_wall,
    run_wall_rss,
    sample,
    timed,
)
from perf_inputs import CONCURRENCY, OUR_ANNOTATIONS, ROOT, Inputs, allocations, ensure_bytecode, load_inputs, read_bytes

from testkit.server_proc import BIN


def measure(args: argparse.Namespace) -> dict:
    ensure_bytecode()
    res: dict = {"machine": machine_facts(), "load_before": loadavg(), "args": vars(args).copy()}
    inp = load_inputs()
    res["code"] = code_facts(inp.b200)
    res["inputs"] = inp.facts()
    rows: dict[str, Stat] = {}
    in_process(inp, args.samples, rows)
    res["starts_with_refused_dial"] = starts(inp, args.starts, rows)
    mem = one_server(inp, args, rows)
    mem.update(plain_server(inp, args))
    res["memory"] = mem
    res["topo_vfs_json_maxrss"] = processes(inp, args.samples, rows)
    res["load_after"] = loadavg()
    res["rows"] = {k: {"median": v.median, "p99": v.p99, "min": v.min, "n": v.n, "warmup": v.warmup} for k, v in rows.items()}
    return res


def code_facts(sysfs: str) -> dict:
    """Which src/pcitopo/ is measured: the tree asked for, the package this process imported
    (its folder and version) and the version a ``pcitopo serve`` child says it serves (its
    ``serving`` log line): with ``--tree DIR``, DIR/src/pcitopo/ in both."""
    import pcitopo

    with Server(sysfs) as s:
        s.first_info()
        serving = [line for line in s.log_lines() if line.get("event") == "serving"]
    return {"root": str(CODE["root"]), "imported": os.path.dirname(pcitopo.__file__), "version": pcitopo.__version__,
            "server_version": serving[0].get("pcitopo_version") if serving else None}


def floor_calls(inp: Inputs, domain: bytes | None = None, files: list[str] | None = None, links: list[str] | None = None
                ) -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    """(1) the floor: lxml parse + serialise of the domain, plain reads of its sysfs files and
    links; and the two together. (1h) the same for another domain and its files (the 24-device one)."""
    from lxml import etree

    domain = inp.domain if domain is None else domain
    files = inp.files if files is None else files
    links = inp.links if links is None else links

    def lxml_floor() -> None:
        etree.tostring(etree.fromstring(domain))

    def sysfs_floor() -> None:
        for p in files:
            with open(p, "rb") as fh:
                fh.read()
        for p in links:
            os.readlink(p)

    def floor() -> None:
        lxml_floor()
        sysfs_floor()

    return lxml_floor, sysfs_floor, floor


def in_process(inp: Inputs, n: int, rows: dict[str, Stat]) -> None:
    """(1a, 1b) the floor's halves; (2) the rewrite on a cold host model; (2b) what the server
    runs per call (warm model); (2c) the same on a plain model kept across calls; (5) host
    size, interleaved (the ratio is the figure)."""
    from pcitopo.guest.rewrite import rewrite_domain
    from pcitopo.host.sysfs import open_host
    from pcitopo.serve.core import handle_define_domain
    from pcitopo.serve.hooks import HostCache  # what serve keeps across calls: the model, the doctor's findings

    lxml_floor, sysfs_floor, _ = floor_calls(inp)
    rows["floor_lxml"] = sample(lxml_floor, n)
    rows["floor_sysfs"] = sample(sysfs_floor, n)
    rows["rewrite_cold"] = sample(lambda: rewrite_domain(inp.domain, open_host(inp.b200)), n)
    warm = HostCache(inp.b200)
    warm()
    rows["handler_warm"] = sample(lambda: handle_define_domain(inp.domain, inp.vmi, warm), n)
    warm24 = HostCache(inp.h100)
    rows["handler_warm24"] = sample(lambda: handle_define_domain(inp.d24, inp.vmi24, warm24), n)
    # a model kept without the server's HostCache (a library user, the in-process profile of the
    # hook): the per-allocation work, the doctor's findings included, is kept with the model
    kept = open_host(inp.b200)
    rows["handler_model"] = sample(lambda: handle_define_domain(inp.domain, inp.vmi, kept), n)
    rows.update(interleaved({
        "rewrite_h100": lambda: rewrite_domain(inp.h100_domain, open_host(inp.h100)),
        "rewrite_4k": lambda: rewrite_domain(inp.h100_domain, open_host(inp.s4k)),
    }, n, warmup=3))


def starts(inp: Inputs, count: int, rows: dict[str, Stat]) -> int:
    """(7a) exec -> first answered Info, ``count`` times; returns how many starts refused a dial
    made right after the socket appeared."""
    starts_info, starts_sock, refused = [], [], 0
    for _ in range(count):
        with Server(inp.b200) as s:
            st = s.first_info()
        starts_info.append(st.info_s)
        starts_sock.append(st.socket_s)
        refused += bool(st.refused)
    rows["first_info"] = Stat(starts_info)
    rows["first_socket"] = Stat(starts_sock)
    return refused


def one_server(inp: Inputs, args: argparse.Namespace, rows: dict[str, Stat]) -> dict:
    """(3) and (7b): one server through a VM boot, calls in rounds with (1) and (4), calls in a
    row, one connection reused, then CONCURRENCY calls at once; (3h) a second server, on
    hgx-h100 with the 24-device VM, in the same rounds, then its calls in a row. Returns the
    memory figures."""
    mem: dict = {}
    with Server(inp.b200) as s, Server(inp.h100) as s24:
        boot(s, inp, rows, mem)
        boot24(s24, inp)
        rounds(s, s24, inp, args.samples, rows)
        in_a_row(s, inp, args, rows, mem)
        cpu0 = cpu_seconds(s24.pid)
        rows["socket24_seq"] = sample(lambda: define_new_connection(s24.target, inp.d24, inp.vmi24), args.calls, warmup=1)
        mem["cpu_ms_per_call24"] = (cpu_seconds(s24.pid) - cpu0) / (args.calls + 1) * 1000
        mem["after_calls24"] = proc_status(s24.pid)
        mem["calls24"] = args.calls + args.samples + 5
        burst(s, inp, mem)
    return mem


def boot24(s24: Server, inp: Inputs) -> None:
    """The 24-device server's VM boot: Info, then 3 calls (the first must be the library's answer)."""
    s24.first_info()
    assert define_new_connection(s24.target, inp.d24, inp.vmi24) == inp.expected24, "the 24-device answer differs from the library's"
    for _ in range(2):
        define_new_connection(s24.target, inp.d24, inp.vmi24)


def boot(s: Server, inp: Inputs, rows: dict[str, Stat], mem: dict) -> None:
    """Idle memory, the first call (cold model), then a VM boot's later calls."""
    s.first_info()
    time.sleep(0.5)
    mem["idle"] = proc_status(s.pid)
    cpu_idle = cpu_seconds(s.pid)
    t0 = time.perf_counter()
    first = define_new_connection(s.target, inp.domain, inp.vmi)
    rows["first_call"] = Stat([time.perf_counter() - t0])
    mem["cpu_first_call_ms"] = (cpu_seconds(s.pid) - cpu_idle) * 1000
    mem["cpu_start_s"] = cpu_idle
    assert first == inp.expected, "the server's answer differs from the library's"
    for _ in range(2):  # a VM boot: Info, then 1 to 3 OnDefineDomain calls
        define_new_connection(s.target, inp.domain, inp.vmi)
    mem["boot"] = proc_status(s.pid)
    mem["boot_read_mib"] = read_bytes(s.pid) / 2**20


def rounds(s: Server, s24: Server, inp: Inputs, n: int, rows: dict[str, Stat]) -> None:
    """1, 3, 3n, 4, 1h, 3h in rounds (floor, a call over the socket, one with a new allocation, a
    shim process, the 24-device floor and call), so their ratios compare figures taken under the
    same background load."""
    from testkit.hookkit import vmi_json

    def one_call() -> None:
        define_new_connection(s.target, inp.domain, inp.vmi)

    # 3n: a VM given devices the server has not derived anything for (the domain less one
    # hostdev, a different one each call: more shapes than the model remembers)
    shapes = [(d, vmi_json(d, annotations=OUR_ANNOTATIONS)) for d in allocations(inp.domain)]
    turn = iter(range(10**9))

    def new_allocation() -> None:
        d, v = shapes[next(turn) % len(shapes)]
        define_new_connection(s.target, d, v)

    shim_env = code_env(PCITOPO_SYSFS=inp.b200)
    shim_argv = [str(BIN / "onDefineDomain"), "--vmi", inp.vmi.decode(), "--domain", inp.domain.decode()]
    rows.update(interleaved({"floor": floor_calls(inp)[2], "socket": one_call, "socket_new": new_allocation,
                             "shim": lambda: run_wall(shim_argv, shim_env),
                             "floor24": floor_calls(inp, inp.d24, inp.files24, inp.links24)[2],
                             "socket24": lambda: define_new_connection(s24.target, inp.d24, inp.vmi24)}, n))


def in_a_row(s: Server, inp: Inputs, args: argparse.Namespace, rows: dict[str, Stat], mem: dict) -> None:
    """(3a) ``args.calls`` calls in a row, a new connection each (CPU and RSS after them); (3b) one
    connection reused."""
    import grpc

    from testkit.hookproto import v1alpha3_pb2, v1alpha3_pb2_grpc

    n, calls = args.samples, args.calls
    cpu0 = cpu_seconds(s.pid)
    rows["socket_seq"] = sample(lambda: define_new_connection(s.target, inp.domain, inp.vmi), calls, warmup=1)
    mem["cpu_ms_per_call"] = (cpu_seconds(s.pid) - cpu0) / (calls + 1) * 1000
    mem["after_calls"] = proc_status(s.pid)
    mem["calls"] = calls + n + 5
    with grpc.insecure_channel(s.target) as ch:
        stub = v1alpha3_pb2_grpc.CallbacksStub(ch)
        req = v1alpha3_pb2.OnDefineDomainParams(domainXML=inp.domain, vmi=inp.vmi)
        rows["socket_reused"] = sample(lambda: stub.OnDefineDomain(req, timeout=60), max(n, min(calls, 200)))


def burst(s: Server, inp: Inputs, mem: dict) -> None:
    """(7b) CONCURRENCY calls released together: peak memory, wall time, and every answer right."""
    barrier = threading.Barrier(CONCURRENCY)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            barrier.wait(60)
            if define_new_connection(s.target, inp.domain, inp.vmi) != inp.expected:
                raise AssertionError("wrong answer under load")
        except BaseException as e:  # counted below
            errors.append(e)

    threads = [threading.Thread(target=call) for _ in range(CONCURRENCY)]
    with PeakSampler(s.pid) as peak:
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        wall = time.perf_counter() - t0
    mem["burst"] = proc_status(s.pid)
    mem["burst"].update(wall_s=wall, errors=len(errors), sampled_peak=peak.peak)
    time.sleep(0.5)
    mem["after_burst"] = proc_status(s.pid)
    if errors:
        raise SystemExit(f"{len(errors)} of {CONCURRENCY} concurrent calls failed: {errors[0]!r}")


def plain_server(inp: Inputs, args: argparse.Namespace) -> dict:
    """(7c) the same number of calls with a VMI that carries no pcitopo annotation (defaults)."""
    mem: dict = {}
    with Server(inp.b200) as s:
        s.first_info()
        for _ in range(3):
            define_new_connection(s.target, inp.domain, inp.vmi_plain)
        mem["boot_plain"] = proc_status(s.pid)
        for _ in range(args.calls + args.samples + 2):
            define_new_connection(s.target, inp.domain, inp.vmi_plain)
        mem["after_calls_plain"] = proc_status(s.pid)
    return mem


def processes(inp: Inputs, n: int, rows: dict[str, Stat]) -> int:
    """(6) ``xmlfix`` wall time; (8) ``pcitopo topo --vfs --json`` on the 4,096-VF host: wall time,
    and the peak RSS of the largest run (returned)."""
    xmlfix_argv = [str(BIN / "xmlfix"), "--sysfs", inp.b200, str(inp.domain_path)]
    rows["xmlfix"] = timed(lambda: run_wall(xmlfix_argv, code_env()), n, warmup=1)
    topo_argv = [str(BIN / "pcitopo"), "topo", "--vfs", "--json", "--sysfs", str(ROOT / "fixtures" / "sriov-4k")]
    topo_runs = [run_wall_rss(topo_argv, code_env()) for _ in range(max(1, n // 10))]
    rows["topo_vfs_json"] = Stat([t for t, _ in topo_runs], 0)
    return max(rss for _, rss in topo_runs)
