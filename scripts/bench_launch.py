#!/usr/bin/env python3
"""Launch-time benchmark of both backends (docs/benchmarks.md).

Every command runs once per round, round-robin, for RUNS rounds after a
warm-up: the machine's drift (this 2-core VM drifts by a millisecond within
minutes) hits every line alike, which running each command's runs in a
block (hyperfine) does not. Each run is posix_spawn + waitpid of the
command, stdout and stderr to /dev/null; the time includes the spawn and
the exit, as hyperfine -N's does.

Usage: [BASELINE=OLD_SUBSTRAT_SANDBOX] bench_launch.py RUNS BIN_DIR WORKSPACE POLICY_DIR
BIN_DIR holds substrat-run, substrat-init and substrat-sandbox; POLICY_DIR
holds no-cgroups.toml and no-cgroups-no-seccomp.toml (scripts/bench-launch
writes them from policies/worker.toml).
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def plain_bwrap(ws):
    """bwrap with the mounts, namespaces and options `substrat-run --backend
    bwrap` gives it for the worker policy on a Debian 12 host (the same
    order; paths instead of descriptors; /bin/true run directly: no helper,
    no Landlock, no seccomp, no rlimits, no policy read)."""
    argv = ["bwrap", "--unshare-user", "--uid", "0", "--gid", "0", "--unshare-pid",
            "--unshare-ipc", "--unshare-uts", "--unshare-net",
            "--disable-userns", "--assert-userns-disabled", "--hostname", "substrat",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "HOME", os.environ.get("HOME", "/"),
            "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
    for key in ("LANG", "TERM"):
        if key in os.environ:
            argv += ["--setenv", key, os.environ[key]]
    # The policy's binds: optional ones only where the host has them, as
    # the launcher does (it follows /bin -> usr/bin and binds the directory).
    for path in ("/usr", "/bin", "/sbin", "/lib", "/lib64"):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += ["--perms", "1777", "--tmpfs", "/tmp"]
    for path in ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime", "/etc/ssl/certs"):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    argv += ["--bind", ws, ws, "--dev", "/dev", "--proc", "/proc",
             # Protected paths: .cursor read-only; .git pinned (bound onto
             # itself), then hooks and config read-only.
             "--ro-bind", f"{ws}/.cursor", f"{ws}/.cursor",
             "--bind", f"{ws}/.git", f"{ws}/.git",
             "--ro-bind", f"{ws}/.git/hooks", f"{ws}/.git/hooks",
             "--ro-bind", f"{ws}/.git/config", f"{ws}/.git/config",
             "--remount-ro", "/", "--cap-drop", "ALL", "--chdir", ws, "/bin/true"]
    return argv


# Descriptors the "bwrap + substrat-init" line gives bwrap: the helper, run
# as /proc/self/fd/N as the launcher does, the helper's status pipe and the
# file it reads its configuration from.
HELPER_FD, STATUS_FD, CONFIG_FD = 100, 101, 102
HELPER_LINE = "bwrap + substrat-init, same mounts, no launcher"


def helper_config(bins, ws, policy):
    """The helper's configuration for this policy, exactly as the launcher
    writes it (the launcher prints it on request)."""
    argv = [f"{bins}/substrat-run", "--backend", "bwrap", "--policy", policy,
            "--workspace", ws, "--print-helper-config", "--", "/bin/true"]
    return subprocess.run(argv, check=True, capture_output=True).stdout


def bwrap_with_helper(ws):
    """Plain bwrap with the same mounts, running substrat-init before
    /bin/true: what a launch costs without the launcher process (the helper
    applies Landlock, no_new_privs and rlimits and reports, as in a real
    launch)."""
    return plain_bwrap(ws)[:-1] + [
        "--", f"/proc/self/fd/{HELPER_FD}", "--status-fd", str(STATUS_FD),
        "--config-fd", str(CONFIG_FD), "--", "/bin/true"]


def commands(bins, ws, policies):
    run = f"{bins}/substrat-run"
    sandbox = f"{bins}/substrat-sandbox"
    comparable = f"{policies}/no-cgroups-no-seccomp.toml"
    no_cgroups = f"{policies}/no-cgroups.toml"

    def launch(program, backend, policy):
        first = [] if program == run else ["run"]
        return [program, *first, "--backend", backend, "--policy", policy,
                "--workspace", ws, "--", "/bin/true"]

    return [
        ("bare /bin/true", ["/bin/true"]),
        ("unshare, same namespaces", ["unshare", "-Urmpf", "--ipc", "--uts", "--net", "/bin/true"]),
        ("bwrap, same mounts", plain_bwrap(ws)),
        (HELPER_LINE, bwrap_with_helper(ws)),
        ("substrat-run bwrap, no cgroups, no seccomp", launch(run, "bwrap", comparable)),
        ("substrat-sandbox run bwrap, no cgroups, no seccomp", launch(sandbox, "bwrap", comparable)),
        ("substrat-run bwrap, no cgroups", launch(run, "bwrap", no_cgroups)),
        ("substrat-run bwrap, worker", launch(run, "bwrap", "worker")),
        ("substrat-run native, no cgroups, no seccomp", launch(run, "native", comparable)),
        ("substrat-sandbox run native, no cgroups, no seccomp", launch(sandbox, "native", comparable)),
        ("substrat-run native, no cgroups", launch(run, "native", no_cgroups)),
        ("substrat-run native, worker", launch(run, "native", "worker")),
    ] + baseline_lines(ws, comparable)


def baseline_lines(ws, comparable):
    """BASELINE=/path/to/an/older/substrat-sandbox adds its comparable lines,
    measured in the same rounds: before/after without drift."""
    old = os.environ.get("BASELINE")
    if not old:
        return []
    return [(f"baseline run {backend}, {name}",
             [old, "run", "--backend", backend, "--policy", policy,
              "--workspace", ws, "--", "/bin/true"])
            for backend in ("bwrap", "native")
            for (name, policy) in (("no cgroups, no seccomp", comparable), ("worker", "worker"))]


def run_once(argv, devnull, helper):
    """One run; `helper` is (helper fd, status pipe write end, configuration
    file), given to every command at HELPER_FD, STATUS_FD and CONFIG_FD
    (only the line that names them uses them; the launchers close what they
    do not pass on). The configuration is opened anew for each run: the
    helper reads it from the descriptor's current offset."""
    config = os.open(helper[2], os.O_RDONLY)
    start = time.perf_counter_ns()
    pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=[
        (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2),
        (os.POSIX_SPAWN_DUP2, helper[0], HELPER_FD), (os.POSIX_SPAWN_DUP2, helper[1], STATUS_FD),
        (os.POSIX_SPAWN_DUP2, config, CONFIG_FD)])
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter_ns() - start) / 1e6
    os.close(config)
    if status != 0:
        sys.exit(f"bench-launch: {' '.join(argv)} failed (wait status {status}); run it by hand to see why")
    return elapsed


WARM_LINES = {backend: f"warm turn: substrat-run --serve-turns, {backend}, worker policy (cgroups, seccomp)"
              for backend in ("native", "bwrap")}


class WarmSandbox:
    """One warm sandbox of the worker policy (substrat-run --serve-turns):
    a turn is /bin/true sent as a request with its stdio attached, timed
    from the request to the answer (which comes once every process of the
    turn is gone), as a cold launch is timed from spawn to exit. As the
    daemon does, the sandbox is frozen between turns (when the launcher's
    first packet names a freezer group) and thawed before the request,
    inside the timed span."""

    def __init__(self, bins, ws, backend="native"):
        self.line = WARM_LINES[backend]
        self.dir = tempfile.mkdtemp()
        path = os.path.join(self.dir, "turns.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(path)
        listener.listen(1)
        self.launcher = subprocess.Popen(
            [f"{bins}/substrat-run", "--policy", "worker", "--backend", backend,
             "--tty", "never", "--workspace", ws, "--serve-turns", path],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self.control, _ = listener.accept()
        listener.close()
        self.request = json.dumps({"argv": ["/bin/true"]}).encode()
        hello = json.loads(self.control.recv(65536))
        self.freezer = None
        if "freezer" in hello:
            group, version = hello["freezer"]["group"], hello["freezer"]["version"]
            name, frozen, thawed = {"v1": ("freezer.state", "FROZEN", "THAWED"),
                                    "v2": ("cgroup.freeze", "1", "0")}[version]
            self.freezer = (os.path.join(group, name), frozen, thawed)

    def _freezer(self, which):
        if self.freezer:
            with open(self.freezer[0], "w") as f:
                f.write(self.freezer[which])

    def turn(self, devnull):
        start = time.perf_counter()
        self._freezer(2)
        socket.send_fds(self.control, [self.request], [devnull, devnull, devnull])
        reply = json.loads(self.control.recv(65536))
        elapsed = (time.perf_counter() - start) * 1000
        self._freezer(1)
        if reply != {"ended": {"code": 0}}:
            sys.exit(f"bench-launch: {self.line}: {reply}")
        return elapsed

    def close(self):
        self._freezer(2)
        self.control.close()
        self.launcher.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def descendants(pid):
    """`pid` and every process below it."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
            except OSError:
                continue
            ppid = int(stat.rsplit(") ", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def memory_kib(pids):
    """(unique, proportional) memory of `pids` in KiB: private pages, and
    shared ones divided among their sharers (smaps_rollup)."""
    uss = pss = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/smaps_rollup"):
            key, _, value = line.partition(":")
            if key in ("Private_Clean", "Private_Dirty"):
                uss += int(value.split()[0])
            elif key == "Pss":
                pss += int(value.split()[0])
    return uss, pss


def idle_warm_memory(bins, ws, devnull, count=10):
    """Memory per idle warm sandbox: `count` of them, each after one turn;
    the launcher, the holder and init of each."""
    sandboxes = [WarmSandbox(bins, ws) for _ in range(count)]
    for warm in sandboxes:
        warm.turn(devnull)
    time.sleep(0.5)
    totals = [memory_kib(descendants(w.launcher.pid)) for w in sandboxes]
    processes = len(descendants(sandboxes[0].launcher.pid))
    for warm in sandboxes:
        warm.close()
    uss = sum(t[0] for t in totals) / count
    pss = sum(t[1] for t in totals) / count
    print(f"idle warm sandbox ({count} of them, {processes} processes each): "
          f"{uss:.0f} KiB private, {pss:.0f} KiB proportional (PSS) per sandbox")


def drain(fd):
    """Empties the helper's status pipe; returns what was in it."""
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    return data


def main():
    runs, bins, ws, policies = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    for tool in ("bwrap", "unshare"):
        if shutil.which(tool) is None:
            sys.exit(f"bench-launch: {tool} is not on PATH")
    lines = commands(bins, ws, policies)
    devnull = os.open("/dev/null", os.O_WRONLY)
    status_read, status_write = os.pipe()
    os.set_blocking(status_read, False)
    config_path = os.path.join(ws, ".substrat-init-config.json")
    with open(config_path, "wb") as config:
        config.write(helper_config(bins, ws, f"{policies}/no-cgroups-no-seccomp.toml"))
    helper = (os.open(f"{bins}/substrat-init", os.O_RDONLY), status_write, config_path)
    times = {name: [] for name, _ in lines}
    warms = [WarmSandbox(bins, ws, backend) for backend in WARM_LINES]
    for warm in warms:
        times[warm.line] = []
    for round_ in range(runs + 20):
        for warm in warms:
            elapsed = warm.turn(devnull)
            if round_ >= 20:
                times[warm.line].append(elapsed)
        for name, argv in lines:
            elapsed = run_once(argv, devnull, helper)
            report = drain(status_read)
            if name == HELPER_LINE and not report.startswith(b'{"Ready'):
                sys.exit(f"bench-launch: {name}: the helper did not report its setup: {report!r}")
            if round_ >= 20:
                times[name].append(elapsed)
    for warm in warms:
        warm.close()
    idle_warm_memory(bins, ws, devnull)
    reference = statistics.median(times["bwrap, same mounts"])
    print(f"{runs} rounds, interleaved; times in ms, spawn to exit")
    print()
    print("| command | median | p10 | p90 | vs bwrap, same mounts |")
    print("|---|---|---|---|---|")
    for name in [name for name, _ in lines] + list(WARM_LINES.values()):
        t = sorted(times[name])
        median = statistics.median(t)
        p10, p90 = t[len(t) // 10], t[(9 * len(t)) // 10]
        print(f"| {name} | {median:.2f} | {p10:.2f} | {p90:.2f} | {median / reference:.2f}x |")


if __name__ == "__main__":
    main()
