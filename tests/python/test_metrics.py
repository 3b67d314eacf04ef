"""`GET /metrics` on the daemon's HTTP endpoint (`--roles-http`, its
bearer token): the OpenMetrics text prometheus-client writes, scraped
before and after a stand-in turn; the series move as the team works."""

import json
import os
import pathlib
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

TOKEN = "metrics-test-token-4d1f"
PLAN = {"turns": [{"steps": [{"call": "check_inbox"}, {"call": "check_inbox"}, {"reply": "done"}]}]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port, token=TOKEN):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    assert text.rstrip().endswith("# EOF")
    return samples


def test_the_series_move_as_the_team_works(substrat_bin):
    root = pathlib.Path(tempfile.mkdtemp())
    state, ws = root / "state", root / "ws"
    ws.mkdir()
    port = free_port()
    daemon = subprocess.Popen(
        [str(substrat_bin), "daemon", "--provider", "stand-in", "--state-dir", str(state),
         "--roles-http", f"127.0.0.1:{port}", "--roles-http-token-env", "METRICS_TOKEN"],
        env={**os.environ, "METRICS_TOKEN": TOKEN, "SUBSTRAT_LOG": "warn,rmcp=error"},
    )
    try:
        deadline = time.time() + 10
        while not (state / "control.sock").exists():
            assert time.time() < deadline, "the daemon did not start"
            time.sleep(0.05)
        before = scrape(port)
        assert before.get('substrat_agents{state="idle"}', 0) == 0
        try:
            scrape(port, token="wrong")
            raise AssertionError("a scrape with the wrong token was answered")
        except urllib.error.HTTPError as e:
            assert e.code == 401

        def agent(*args):
            out = subprocess.run([str(substrat_bin), "agent", *args, "--json", "--state-dir", str(state)],
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stderr
            return json.loads(out.stdout)

        agent("spawn", "lead", "--workspace", str(ws), f"go\n```substrat-plan\n{json.dumps(PLAN)}\n```")
        deadline = time.time() + 60
        while True:
            turns = agent("inspect", "lead")["activity"]["recent_turns"]
            if turns and turns[0]["status"] in ("done", "failed"):
                break
            assert time.time() < deadline, turns
            time.sleep(0.2)
        after = scrape(port)
    finally:
        daemon.terminate()
        assert daemon.wait(timeout=20) == 0

    def moved(name):
        return after.get(name, 0) - before.get(name, 0)

    assert moved('substrat_turns_total{provider="stand-in",outcome="done",reason="none"}') == 1, after
    assert moved('substrat_turn_seconds_count{provider="stand-in"}') == 1
    assert moved('substrat_tool_calls_total{tool="check_inbox",decision="allowed"}') == 2, after
    assert moved('substrat_tool_call_seconds_count{decision="allowed"}') == 2
    launches = [n for n in after if n.startswith("substrat_launches_total{") and 'outcome="started"' in n]
    assert sum(moved(n) for n in launches) == 1, after
    assert sum(moved(n) for n in after if n.startswith("substrat_launch_seconds_count{")) == 1, after
    assert after['substrat_agents{state="idle"}'] == 1
    assert after["substrat_queued_turns"] == 0 and after["substrat_running_turns"] == 0
    # The state database's calls: the turn was claimed and recorded.
    assert moved('substrat_db_calls_total{op="write",outcome="ok"}') >= 2, after
    assert moved('substrat_db_calls_total{op="read",outcome="ok"}') >= 1, after
    assert not [n for n in after if n.startswith("substrat_db_calls_total") and 'outcome="error"' in n]


def test_the_dashboard_asks_only_for_series_the_daemon_exposes():
    """packaging/grafana/substrat-sandbox.json: every series its queries
    name is one `metrics.rs` registers (a renamed metric fails here)."""
    import re

    from conftest import REPO

    dashboard = json.loads((REPO / "packaging" / "grafana" / "substrat-sandbox.json").read_text())
    source = (REPO / "crates" / "broker" / "src" / "metrics.rs").read_text()
    registered = set(re.findall(r'r\.register\(\s*"([a-z_]+)"', source))
    assert len(registered) >= 15, registered
    exposed = set()
    for name in registered:
        exposed |= {f"substrat_{name}{suffix}" for suffix in ("", "_total", "_bucket", "_count", "_sum")}
    asked = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            asked |= set(re.findall(r"substrat_[a-z_]+", target["expr"]))
    assert asked and asked <= exposed, asked - exposed
    # Every registered family is on the dashboard.
    assert {n for n in registered if not any(a.startswith(f"substrat_{n}") for a in asked)} == set()
