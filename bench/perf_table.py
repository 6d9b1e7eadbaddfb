"""The table ``bench/perf.py`` prints (and writes to bench/RESULTS.md): the machine and inputs,
one row per measurement, the server's memory, then the ratios against the targets."""

from __future__ import annotations

from harness import mib  # bench/harness.py: the script's own folder is first on sys.path
from perf_inputs import CONCURRENCY, H100, HOST, OUR_ANNOTATIONS, ROOT

MIB_LIMIT = 56.0  # the memory budget: a 64M container less headroom (docs/DEPLOY.md, Memory budget)


def ms(x: float) -> str:
    return f"{x * 1000:.2f} ms" if x < 1 else f"{x:.3f} s"


def render(res: dict, command: str) -> str:
    out: list[str] = []
    header(out, res, command)
    timings(out, res["rows"])
    memory(out, res)
    targets(out, res)
    return "\n".join(out) + "\n"


def header(out: list[str], res: dict, command: str) -> None:
    """The command, the machine, the code under test and the inputs."""
    m, inp = res["machine"], res["inputs"]
    out.append(f"command: `{command}`")
    out.append("")
    out.append(f"- machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory']}, Linux {m['kernel']}, {m['python']}")
    out.append(f"- libraries: {m['libs']}")
    out.append(f"- commit {m['commit']}, {m['date']}; load average before {res['load_before']}, after {res['load_after']}")
    code = res["code"]
    where = "this checkout" if code["root"] == str(ROOT) else f"{code['root']} (harness, fixtures and venv from this checkout)"
    out.append(f"- code under test: {where}: pcitopo {code['version']} imported from {code['imported']}; "
               f"the server reports {code['server_version']}")
    out.append(f"- input: fixtures/{HOST}/domain.xml ({inp['domain_bytes']} B, {inp['hostdevs']} hostdevs), "
               f"VMI JSON {inp['vmi_bytes']} B with {', '.join(OUR_ANNOTATIONS)}; sysfs materialised as directories; "
               f"floor reads {inp['floor_files']} files + {inp['floor_links']} links")
    out.append(f"- 24-device input (1h, 2h, 3h): fixtures/{H100}/domain.xml plus the host's 4 NVSwitches "
               f"({inp['d24_bytes']} B, {inp['d24_hostdevs']} hostdevs: 8 GPUs, 8 compute NICs, 2 dual-port storage NICs, "
               f"4 NVSwitches), VMI JSON {inp['vmi24_bytes']} B; floor reads {inp['floor24_files']} files + "
               f"{inp['floor24_links']} links")
    out.append("")


def timings(out: list[str], r: dict) -> None:
    """One row per timed measurement, numbered as in bench/perf.py's docstring."""
    out.append("| # | measurement | median | p99 | n |")
    out.append("|---|---|---:|---:|---:|")

    def row(num: str, label: str, key: str) -> None:
        x = r[key]
        out.append(f"| {num} | {label} | {ms(x['median'])} | {ms(x['p99'])} | {x['n']} |")

    row("1", "floor: lxml parse+serialise + plain sysfs reads (rounds with 3, 4)", "floor")
    row("1a", "  of which lxml parse+serialise", "floor_lxml")
    row("1b", "  of which sysfs reads (open/read, readlink)", "floor_sysfs")
    row("1h", f"floor of the 24-device VM on {H100} (rounds with 3h)", "floor24")
    row("2", "rewrite in-process, cold host model (hgx-b200)", "rewrite_cold")
    row("2b", "hook handler in-process, warm model + VMI options (what serve runs per call)", "handler_warm")
    row("2c", "  the same on a plain host model kept across calls (no HostCache; the doctor's findings kept per allocation)",
        "handler_model")
    row("2h", f"  the hook handler on the 24-device VM, warm model ({H100})", "handler_warm24")
    row("3", f"OnDefineDomain over the socket, new connection per call (rounds with 1, 4): "
        f"{r['socket']['median'] / r['floor']['median']:.2f}x the floor", "socket")
    row("3n", f"  the same, an allocation the server has not seen (a new one each call; rounds with 1, 3, 4): "
        f"{r['socket_new']['median'] / r['floor']['median']:.2f}x the floor", "socket_new")
    row("3a", f"  the same, {r['socket_seq']['n']} calls in a row (the RSS figures below)", "socket_seq")
    row("3h", f"OnDefineDomain over the socket, the 24-device VM on {H100} (rounds with 1h): "
        f"{r['socket24']['median'] / r['floor24']['median']:.2f}x its floor", "socket24")
    row("3ha", f"  the same, {r['socket24_seq']['n']} calls in a row", "socket24_seq")
    row("3b", "OnDefineDomain over the socket, one connection reused", "socket_reused")
    row("3c", "first OnDefineDomain after start (cold model)", "first_call")
    row("4", "shim: one onDefineDomain process per call (rounds with 1, 3)", "shim")
    row("5a", "rewrite cold, hgx-h100 (89 functions; rounds with 5b)", "rewrite_h100")
    row("5b", "rewrite cold, sriov-4k (4,185 functions), same domain", "rewrite_4k")
    row("6", "xmlfix CLI wall", "xmlfix")
    row("7", "pcitopo serve: exec -> first answered Info", "first_info")
    row("7s", "  of which exec -> socket file exists", "first_socket")
    row("8", "pcitopo topo --vfs --json, sriov-4k (4,096 VFs; peak RSS below)", "topo_vfs_json")



def memory(out: list[str], res: dict) -> None:
    """The server's resident memory at given moments, and its CPU."""
    r, mem = res["rows"], res["memory"]

    def memrow(label: str, st: dict, hwm: bool = False) -> None:
        rss = st["VmHWM"] if hwm else st["VmRSS"]
        extra = f"; sampled max VmRSS {mib(st['sampled_peak']):.1f}" if "sampled_peak" in st else ""
        out.append(f"| 7 | RSS {label} | {mib(rss):.1f} MiB | anon {mib(st['RssAnon']):.1f} + file {mib(st['RssFile']):.1f}"
                   f" + shmem {mib(st.get('RssShmem', 0)):.1f} (current){extra} | threads {st['Threads']}, fds {st['fds']} |")

    memrow("idle (VmRSS)", mem["idle"])
    memrow("peak of a VM boot, Info + 3 calls, VMI with pcitopo annotations (VmHWM)", mem["boot"], hwm=True)
    memrow("peak of a VM boot, Info + 3 calls, VMI without (VmHWM)", mem["boot_plain"], hwm=True)
    memrow(f"after {mem['calls']} calls, VMI with pcitopo annotations (VmRSS)", mem["after_calls"])
    memrow(f"after {mem['calls']} calls, VMI without pcitopo annotations (VmRSS)", mem["after_calls_plain"])
    memrow(f"after {mem['calls24']} calls of the 24-device VM, {H100} server (VmRSS)", mem["after_calls24"])
    memrow(f"peak during {CONCURRENCY} concurrent calls (VmHWM)", mem["burst"], hwm=True)
    memrow("after the burst (VmRSS)", mem["after_burst"])
    out.append(f"| 8 | peak RSS of pcitopo topo --vfs --json, sriov-4k (ru_maxrss) | {mib(res['topo_vfs_json_maxrss']):.1f} MiB | "
               f"the largest of {r['topo_vfs_json']['n']} runs | |")
    out.append("")
    out.append("RSS is VmRSS = anonymous + file-backed (shared library pages) + shmem: every resident page, as a memory "
               "cgroup charges it at least (a cgroup also charges page cache the process read, which the kernel can reclaim: "
               f"by the end of the boot the server had read {mem['boot_read_mib']:.1f} MiB with read(), bytecode and sysfs included).")
    out.append(f"CPU of the server: {mem['cpu_start_s']:.2f} s from exec to idle, {mem['cpu_first_call_ms']:.0f} ms for the first call "
               f"(cold host model), {mem['cpu_ms_per_call']:.1f} ms per call after that "
               f"({mem['cpu_ms_per_call24']:.1f} ms per call of the 24-device VM); "
               f"{CONCURRENCY} concurrent calls took {mem['burst']['wall_s']:.2f} s wall, {mem['burst']['errors']} errors; "
               f"{res['starts_with_refused_dial']} of {r['first_info']['n']} starts refused a dial made within 1 ms "
               "of the socket appearing.")
    out.append("")


def targets(out: list[str], res: dict) -> None:
    """The targets, each met or missed."""
    r, mem = res["rows"], res["memory"]
    out.append("| target | measured | |")
    out.append("|---|---:|---|")
    med = {k: v["median"] for k, v in r.items()}

    def target(label: str, value: str, ok: bool) -> None:
        out.append(f"| {label} | {value} | {'met' if ok else '**missed**'} |")

    x = med["socket"] / med["floor"]
    target("(3) <= 1.3x (1), default options, floor measured in the same rounds", f"{x:.2f}x", x <= 1.3)
    x = med["socket24"] / med["floor24"]
    target(f"(3h) <= 1.3x (1h), the 24-device VM on {H100}, floor measured in the same rounds", f"{x:.2f}x", x <= 1.3)
    x = med["socket_new"] / med["floor"]
    out.append(f"| (3n) the first call of an allocation (reported: a VM boot's later calls and equal allocations are (3)) | {x:.2f}x | |")
    x = med["shim"] / med["socket"]
    target("(4) >= 20x (3)", f"{x:.1f}x", x >= 20)
    x = med["rewrite_4k"] / med["rewrite_h100"]
    target("(5) sriov-4k / hgx-h100 <= 1.2x", f"{x:.2f}x", x <= 1.2)
    for label, key in (("idle", "idle"), (f"after {mem['calls']} calls, VMI with pcitopo annotations", "after_calls"),
                       (f"after {mem['calls']} calls, VMI without", "after_calls_plain"),
                       (f"after {mem['calls24']} calls of the 24-device VM", "after_calls24")):
        v = mib(mem[key]["VmRSS"])
        target(f"RSS {label} <= {MIB_LIMIT:.0f} MiB", f"{v:.1f} MiB", v <= MIB_LIMIT)
    v = mib(mem["burst"]["VmHWM"])
    out.append(f"| peak RSS under {CONCURRENCY} concurrent calls (reported) | {v:.1f} MiB | {v / (64e6 / 2**20):.0%} of 64M |")
    target("first Info <= 0.2 s after exec (median; p99 beside)", f"{med['first_info']:.3f} s (p99 {r['first_info']['p99']:.3f} s)",
           med["first_info"] <= 0.2)
    target("first Info within virt-launcher's 1 s deadline (p99)", f"{r['first_info']['p99']:.3f} s", r["first_info"]["p99"] <= 1.0)
    target("xmlfix <= 0.5 s wall", f"{med['xmlfix']:.3f} s", med["xmlfix"] <= 0.5)
    out.append("")
    out.append("Medians and ratios are the figures to compare; p99 of fewer than 100 samples is the slowest sample. "
               "This machine is shared: other people's tests run on the same 2 cores (see the load average).")
