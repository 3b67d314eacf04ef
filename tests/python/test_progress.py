"""Progress on a long wait, on a terminal only: `check --prove` over two
policies run in a tmux pane (a real terminal) shows its progress line on
stderr; the same run piped writes no byte of it, and its report is the
same either way (but the proofs' timings)."""

import json
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time

import pytest

SERVER = "substrat-progress-test"


def tmux(*args):
    return subprocess.run(["tmux", "-L", SERVER, *args], capture_output=True, text=True)


def masked(report):
    return re.sub(rb"\(\d+\.\d s\)", b"(T s)", report)


def test_check_prove_shows_progress_on_a_terminal_only(substrat_bin, tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/setup installs it)")
    check = f"{substrat_bin} check --prove worker strict"
    # Piped: stderr and stdout are files.
    piped = subprocess.run(check.split(), capture_output=True)
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == b"", piped.stderr
    assert b"proving" not in piped.stdout and b"\r" not in piped.stdout
    # On a terminal: stderr is the pane; every byte the pane got is kept.
    seen, report, done = tmp_path / "seen", tmp_path / "report", tmp_path / "done"
    tmux("kill-server")
    started = tmux("new-session", "-d", "-s", "p", "-x", "120", "-y", "20",
                   f"sleep 1; {check} > {report}; touch {done}; sleep 30")
    assert started.returncode == 0, started.stderr
    try:
        tmux("pipe-pane", "-o", "-t", "p", f"cat >> {seen}")
        deadline = time.time() + 60
        while not done.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert done.exists(), "check --prove did not end in the pane"
        time.sleep(0.3)
    finally:
        tmux("kill-server")
    shown = seen.read_bytes()
    assert b"proving [1/2] worker" in shown, shown
    assert b"proving [2/2] strict" in shown, shown
    assert b"\r\x1b[2K" in shown, "the line is erased when done"
    assert masked(report.read_bytes()) == masked(piped.stdout)


def on_a_terminal(command, tmp_path):
    """Every byte `command` writes to a tmux pane (its stdout to a file)."""
    seen, out, done = tmp_path / "seen", tmp_path / "out", tmp_path / "done"
    tmux("kill-server")
    started = tmux("new-session", "-d", "-s", "p", "-x", "120", "-y", "20",
                   f"sleep 1; {command} > {out}; touch {done}; sleep 30")
    assert started.returncode == 0, started.stderr
    try:
        tmux("pipe-pane", "-o", "-t", "p", f"cat >> {seen}")
        deadline = time.time() + 60
        while not done.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert done.exists(), f"{command} did not end in the pane"
        time.sleep(0.3)
    finally:
        tmux("kill-server")
    return seen.read_bytes(), out.read_bytes()


def test_apply_of_a_large_layer_shows_progress_on_a_terminal_only(substrat_bin, tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/setup installs it)")
    layers = {}
    for kind in ("piped", "tty"):
        ws, layer = tmp_path / f"ws-{kind}", tmp_path / f"layer-{kind}"
        ws.mkdir()
        made = subprocess.run(
            [str(substrat_bin), "run", "--policy", "worker", "--workspace", str(ws),
             "--workspace-mode", "overlay", "--keep-layer", str(layer), "--",
             "sh", "-c", "for i in $(seq 300); do echo $i > f$i; done"],
            capture_output=True, text=True)
        if made.returncode != 0 and "overlay" in made.stderr:
            pytest.skip(f"no overlay workspace here: {made.stderr.strip()}")
        assert made.returncode == 0, made.stderr
        # What apply writes is what the owner reviewed.
        reviewed = subprocess.run([str(substrat_bin), "workspace", "diff", "--stat", str(layer)],
                                  capture_output=True, text=True)
        assert reviewed.returncode == 0, reviewed.stderr
        layers[kind] = (ws, layer)
    ws, layer = layers["piped"]
    piped = subprocess.run([str(substrat_bin), "workspace", "apply", str(layer)],
                           capture_output=True)
    assert piped.returncode == 0, piped.stderr
    assert b"applying [" not in piped.stderr and b"\r" not in piped.stderr, piped.stderr
    ws, layer = layers["tty"]
    shown, out = on_a_terminal(f"{substrat_bin} workspace apply {layer}", tmp_path)
    assert b"applying [1/300] " in shown, shown
    assert b"\r\x1b[2K" in shown, shown
    assert len(list(ws.iterdir())) == 300
    assert out == piped.stdout


def daemon_setup(tmp_path):
    """A daemon's command with two upstream servers (time and shifty,
    Python servers from scripts/setup), and its state directory."""
    from test_upstreams import write_setup
    policies, config = write_setup(tmp_path, "a tool")
    servers = json.loads(config.read_text())["mcpServers"]
    kept = {name: servers[name] for name in ("time", "shifty")}
    config.write_text(json.dumps({"mcpServers": kept}))
    return lambda state, *extra: [
        "daemon", "--state-dir", str(state), "--policies", str(policies), "--upstreams", str(config), *extra]


def wait_for(done, what, seconds=60):
    deadline = time.time() + seconds
    while not done():
        assert time.time() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def daemon_in_pane(substrat_bin, args, seen, until):
    """The daemon run in a tmux pane (stderr the terminal) until `until`
    holds of every byte the pane got; the bytes."""
    tmux("kill-server")
    command = " ".join([str(substrat_bin), *args])
    started = tmux("new-session", "-d", "-s", "p", "-x", "200", "-y", "40",
                   "-e", "SUBSTRAT_LOG=info,rmcp=error", f"sleep 1; {command}; sleep 30")
    assert started.returncode == 0, started.stderr
    try:
        tmux("pipe-pane", "-o", "-t", "p", f"cat >> {seen}")
        wait_for(lambda: seen.exists() and until(seen.read_bytes()), "the daemon's start shows", 90)
        time.sleep(0.3)
    finally:
        tmux("kill-server")
    return seen.read_bytes()


def test_the_daemons_start_draws_progress_around_its_log_on_a_terminal_only(substrat_bin, tmp_path):
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/setup installs it)")
    from test_upstreams import peers_installed
    if not peers_installed():
        pytest.skip("the MCP peers are not installed (scripts/setup installs them under .cache/peers)")
    daemon = daemon_setup(tmp_path)
    # State directories short enough for the agents' socket paths.
    short = pathlib.Path(tempfile.mkdtemp(prefix="sp-", dir="/tmp"))
    try:
        states(substrat_bin, daemon, tmp_path, short)
    finally:
        shutil.rmtree(short, ignore_errors=True)


def states(substrat_bin, daemon, tmp_path, short):
    summary = b"upstream servers started"
    shown = daemon_in_pane(substrat_bin, daemon(short / "tty"), tmp_path / "seen",
                           lambda b: summary in b)
    assert b"starting upstreams [0/2]" in shown, shown
    assert re.search(rb"starting upstreams \[1/2\] (time|shifty)", shown), shown
    assert re.search(rb"starting upstreams \[2/2\] (time|shifty)", shown), shown
    # A log line after the line is drawn: the line erased first, drawn
    # again after it.
    assert re.search(rb"starting upstreams \[\d/2\][^\r]*\r\x1b\[2K[^\r]*upstream server up[^\r]*\r?\n"
                     rb"starting upstreams \[\d/2\]", shown), shown
    # Erased (and not drawn again) before the summary line.
    at = shown.index(summary)
    before = shown[:at]
    assert before.rfind(b"\r\x1b[2K") > before.rfind(b"starting upstreams"), before[-300:]
    assert b"starting upstreams" not in shown[at:], shown[at:]
    # A JSON log on the same terminal: no line.
    shown = daemon_in_pane(substrat_bin, daemon(short / "json", "--log-format", "json"),
                           tmp_path / "seen-json", lambda b: b'"broker ready"' in b and b.count(b"upstream server up") >= 2)
    assert b"starting upstreams" not in shown and b"\x1b[2K" not in shown, shown
    # Piped: stderr a file, the log as it was (no line, no summary).
    state = short / "piped"
    err = tmp_path / "stderr"
    env = {**os.environ, "SUBSTRAT_LOG": "info,rmcp=error"}
    with open(err, "wb") as sink:
        proc = subprocess.Popen([str(substrat_bin), *daemon(state)], stderr=sink, env=env)
        try:
            wait_for(lambda: err.read_bytes().count(b"upstream server up") >= 2, "both servers are up", 90)
            time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(timeout=20)
    logged = err.read_bytes()
    assert b"broker ready" in logged, logged
    assert b"starting upstreams" not in logged and b"\r" not in logged and summary not in logged, logged
