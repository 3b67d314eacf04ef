"""Progress on a long wait, on a terminal only: `check --prove` over two
policies run in a tmux pane (a real terminal) shows its progress line on
stderr; the same run piped writes no byte of it, and its report is the
same either way (but the proofs' timings)."""

import re
import shutil
import subprocess
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
