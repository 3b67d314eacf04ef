#!/usr/bin/env python3
"""Agent CLIs in sandboxes (docs/benchmarks.md): for Claude Code, Codex and
Gemini CLI, the time from the daemon starting a turn to the CLI's first
model request (at the scripted model, through the gateway), and the memory
of a running agent (the proportional set size of its launcher and
everything below it: the sandbox's processes and the CLI), while the model
holds its first answer back.

Usage: bench_clis.py RUNS BIN_DIR   (scripts/bench-clis builds and runs it)
"""

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AGENTS = os.path.join(REPO, ".cache/agents/npm/node_modules/.bin")
KEYS = [("anthropic", "ANTHROPIC_API_KEY"), ("openai", "OPENAI_API_KEY"), ("gemini", "GEMINI_API_KEY")]


def wait(what, seconds, done):
    start = time.time()
    while not done():
        if time.time() - start > seconds:
            raise SystemExit(f"bench: timed out waiting until {what}")
        time.sleep(0.02)


def pss_kib(pid):
    """The process's proportional set size: shared pages split among the
    processes sharing them, so a tree's sum counts each page once."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree(root):
    """root and every process below it."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def launcher_of(agent_id):
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"--agent-id" in argv and agent_id.encode() in argv and argv[0].endswith(b"substrat-run"):
            return int(entry)
    return None


def one_turn(cli, bin_dir):
    with tempfile.TemporaryDirectory() as root:
        ws = os.path.join(root, "ws")
        os.mkdir(ws)
        script = os.path.join(root, "script.json")
        with open(script, "w") as f:
            json.dump([{"when": "BENCH", "slow_step": 0, "slow_s": 3, "final": "done"}], f)
        log = os.path.join(root, "model.log")
        model = subprocess.Popen(
            ["python3", os.path.join(REPO, "tests/model/scripted_model.py"), "--script", script, "--log", log],
            stdout=subprocess.PIPE, text=True)
        port = int(model.stdout.readline().split()[1])
        env = dict(os.environ, PATH=f"{AGENTS}:{os.environ['PATH']}", SUBSTRAT_LOG="error")
        argv = [os.path.join(bin_dir, "substrat-sandbox"), "daemon", "--provider", cli,
                "--backend", "native", "--state-dir", os.path.join(root, "state"),
                "--policies", os.path.join(REPO, "policies")]
        for api, var in KEYS:
            argv += ["--model-upstream", f"{api}=http://127.0.0.1:{port}"]
            env[var] = "sk-bench"
        daemon = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        try:
            control = os.path.join(root, "state/control.sock")
            wait("the daemon listens", 60, lambda: os.path.exists(control))
            time.sleep(0.2)
            out = subprocess.run([os.path.join(bin_dir, "substrat-sandbox"), "agent", "spawn", "a",
                                  "--workspace", ws, "--json", "--state-dir", os.path.join(root, "state"),
                                  "BENCH"], capture_output=True, text=True, check=True)
            agent_id = json.loads(out.stdout).get("id")
            db = os.path.join(root, "state/state.db")
            # The scripted model creates its log at the first request.
            wait("the first model request", 120, lambda: os.path.exists(log))
            # While the model holds its answer: the running agent's memory.
            launcher = launcher_of(agent_id) if agent_id else None
            if launcher is None:
                raise SystemExit(f"bench: no launcher found for agent {agent_id}")
            memory = sum(pss_kib(p) for p in tree(launcher))
            wait("the turn's end", 120, lambda: turn_done(db))
            with sqlite3.connect(db) as conn:
                started = conn.execute("SELECT started_at FROM turns ORDER BY seq LIMIT 1").fetchone()[0]
            with open(log) as f:
                first = json.loads(f.readline())
            return first["arrived_ms"] - started, memory
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=30)
            model.kill()
            model.wait()


def turn_done(db):
    try:
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT status FROM turns ORDER BY seq LIMIT 1").fetchone()
        return row is not None and row[0] in ("done", "failed")
    except sqlite3.Error:
        return False


def main():
    runs, bin_dir = int(sys.argv[1]), sys.argv[2]
    print(f"{runs} turns per CLI, native backend, as {'root' if os.geteuid() == 0 else 'a user'}")
    print("| CLI | turn start to first model request, median (min-max) | running agent's memory, median |")
    print("|---|---|---|")
    for cli in ("claude", "codex", "gemini"):
        if not os.path.exists(os.path.join(AGENTS, cli)):
            print(f"| {cli} | not installed | |")
            continue
        starts, memories = [], []
        for _ in range(runs):
            start, memory = one_turn(cli, bin_dir)
            starts.append(start)
            memories.append(memory)
        print(f"| {cli} | {statistics.median(starts):.0f} ms ({min(starts)}-{max(starts)}) | "
              f"{statistics.median(memories) / 1024:.0f} MiB |")


if __name__ == "__main__":
    main()
