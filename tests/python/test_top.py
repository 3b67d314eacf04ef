"""`substrat-sandbox top` through a real terminal: tmux runs it on a pane
of its own size, the test reads the screen tmux keeps (capture-pane) and
types keys (send-keys), and checks what the daemon did with the CLI."""

import shutil
import subprocess
import time

import pytest

from test_broker_mcp import daemon  # noqa: F401  (the fixture)

SERVER = "substrat-top-test"
ATTACK = "hi \x1b]0;pwned\x07 \u202eevil"


def tmux(*args):
    return subprocess.run(["tmux", "-L", SERVER, *args], capture_output=True, text=True)


def screen():
    return tmux("capture-pane", "-p", "-t", "top").stdout


def wait_for(what, test, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        shown = screen()
        if test(shown):
            return shown
        time.sleep(0.1)
    pytest.fail(f"top never showed {what}; the screen:\n{screen()}")


def state_of(daemon, name):  # noqa: F811
    return next(a["state"] for a in daemon("list")["agents"] if a["name"] == name)


@pytest.fixture
def top(daemon, substrat_bin):  # noqa: F811
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (scripts/setup installs it)")
    tmux("kill-server")
    command = f"{substrat_bin} top --state-dir {daemon.state_dir} --interval 200"
    started = tmux("new-session", "-d", "-s", "top", "-x", "140", "-y", "40", command)
    assert started.returncode == 0, started.stderr
    yield daemon
    tmux("kill-server")


def test_top_shows_the_team_and_acts_on_it(top, substrat_bin):
    daemon = top

    def daemon_bin():
        return substrat_bin

    daemon("create", "lead", "--role", "worker")
    daemon("create", "w1", "--role", "worker", "--parent", "lead")
    daemon("send", "lead", ATTACK)
    shown = wait_for("the tree with the lead's queued turn", lambda s: "└ w1" in s and "queued" in s)
    assert "2 agent(s)" in shown and "upstreams: none" in shown

    # The lead's details: its message escaped, the window's title untouched.
    tmux("send-keys", "-t", "top", "Enter")
    shown = wait_for("the lead's details", lambda s: "lead (worker)" in s and "from operator" in s)
    assert "hi \\x1b]0;pwned\\x07 \\u{202e}evil" in shown, shown
    assert "pwned" not in tmux("display-message", "-p", "-t", "top", "#{pane_title}").stdout

    # w1 suspended and resumed with keys, as the daemon records it.
    tmux("send-keys", "-t", "top", "Down", "s")
    wait_for("w1 suspended", lambda s: "w1 suspended" in s)
    assert state_of(daemon, "w1") == "suspended"
    tmux("send-keys", "-t", "top", "r")
    wait_for("w1 resumed", lambda s: "w1 resumed" in s)
    assert state_of(daemon, "w1") == "idle"

    # Its diff in a pane of its own (w1 has no layer: `agent diff` says so).
    tmux("send-keys", "-t", "top", "d")
    shown = wait_for("w1's diff pane", lambda s: "diff of w1 (esc closes)" in s)
    expected = subprocess.run([daemon_bin(), "agent", "diff", "w1", "--state-dir", daemon.state_dir],
                              capture_output=True, text=True)
    first = (expected.stdout + expected.stderr).splitlines()[0][:60]
    assert first in shown, (first, shown)
    tmux("send-keys", "-t", "top", "Escape")
    wait_for("the diff pane closed", lambda s: "diff of w1 (esc closes)" not in s)

    # A kill waits for y; another key cancels it.
    tmux("send-keys", "-t", "top", "K", "n")
    wait_for("the kill cancelled", lambda s: "kill cancelled" in s)
    assert state_of(daemon, "w1") == "idle"
    tmux("send-keys", "-t", "top", "K", "y")
    wait_for("w1 killed", lambda s: "w1 killed" in s)
    assert state_of(daemon, "w1") == "failed"  # killed by the operator: failed, with that reason

    tmux("send-keys", "-t", "top", "q")
    deadline = time.time() + 10
    while tmux("has-session", "-t", "top").returncode == 0:
        assert time.time() < deadline, "top did not end on q"
        time.sleep(0.1)


def test_top_refuses_without_a_terminal(daemon, substrat_bin):  # noqa: F811
    done = subprocess.run([substrat_bin, "top", "--state-dir", daemon.state_dir], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert done.returncode == 2
    assert "top draws on a terminal" in done.stderr
